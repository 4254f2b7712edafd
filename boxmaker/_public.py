"""The public path of the names a package face re-exports (private, as httpx does it).

Code lives in private modules (``boxmaker/session/_file.py``); each part's ``__init__`` is its
public face and re-exports the names users import (``from boxmaker.session import read_log``).
:func:`publish` sets ``__module__`` of each of those names to the face, so reprs, pickles,
tracebacks' type names and generated docs show the path users import from, and a module can
move inside its package without users noticing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

__all__ = ["publish"]


def publish(namespace: dict[str, Any], names: Iterable[str]) -> None:
    """Set ``__module__`` of each class and function in ``names`` to the face's own name.

    Args:
        namespace: the face's ``globals()`` (its ``__name__`` is the public path).
        names: the face's ``__all__``.

    Only objects defined inside the face's package are renamed (a name re-exported from another
    part keeps its own public path); constants and instances have no ``__module__`` to set.
    """
    public = namespace["__name__"]
    for name in names:
        obj = namespace[name]
        module = getattr(obj, "__module__", None)
        if isinstance(module, str) and module.startswith(public + "._"):
            with contextlib.suppress(AttributeError, TypeError):  # a builtin: leave it
                obj.__module__ = public
