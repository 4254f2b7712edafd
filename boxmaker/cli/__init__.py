"""The ``boxmaker`` command (``main``). ``python -m boxmaker.cli`` runs it too.

Public submodule: :mod:`boxmaker.cli.doctor` (``boxmaker doctor``: probes of a
llama-server).
"""

from .._public import publish
from ._main import main

__all__ = ["main"]

publish(globals(), __all__)
