"""Old import paths of modules that moved into their part's package, kept for one release.

Before 0.2, every module sat at the top of the package (``boxmaker.stream``,
``boxmaker.logfile``, ``boxmaker.plots``, ...). Each now lives in the package of its part
(``boxmaker.client._stream._decoder``, ``boxmaker.session._file``, ``boxmaker.frames.plots``);
import public names from the part's face (``from boxmaker.session import read_log``).
:class:`RelocatedFinder` makes ``import boxmaker.stream`` (and ``from boxmaker import stream``)
give the module at its new home, with a :class:`DeprecationWarning` that names it, as
inspect_ai's ``relocated_module_attribute`` does for names. Nothing on disk names a module
path (logs and cassettes hold none), so only code needs the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

__all__ = ["RELOCATED", "RelocatedFinder", "install"]

RELOCATED: dict[str, str] = {
    f"boxmaker.{old}": f"boxmaker.{new}"
    for old, new in {
        "fastjson": "_json",
        "config_ports": "config._ports",
        "config_checks": "config._checks",
        "logfile": "session._file",
        "migrations": "session._migrations",
        "approval": "tools.approval",
        "mcp_port": "tools.mcp",
        "transcript": "view._transcript",
        "render": "view._render",
        "cancel": "client._cancel",
        "thinking_cap": "client._thinking_cap",
        "infer_errors": "client._errors",
        "sse": "client._stream._sse",
        "chunks": "client._stream._chunks",
        "fast_chunks": "client._stream._fast",
        "think_tags": "client._stream._think_tags",
        "completion": "client._stream._completion",
        "stream": "client._stream._decoder",
        "forensics": "cache._forensics",
        "loopguard": "turn._guard",
        "columns": "frames._columns",
        "frame_rows": "frames._rows",
        "plots": "frames.plots",
        "report": "frames.report",
        "widget_transcript": "widgets._draw",
        "pytest_plugin": "cassettes.pytest_plugin",
        "batchplan": "batch._plan",
        "batchrun": "batch._run",
        "batchview": "batch._view",
        "doctor": "cli.doctor",
        "terminal": "cli._terminal",
        "cassettes.inspection": "cassettes._inspection",
        "cassettes.matching": "cassettes._matching",
        "cassettes.scrub": "cassettes._scrub",
        "cassettes.serializer": "cassettes._serializer",
        "cassettes.streams": "cassettes._streams",
        "cassettes.transport": "cassettes._transport",
    }.items()
}
"""Old module path -> the module that holds the same code now."""


class RelocatedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A meta path finder that answers an old path of :data:`RELOCATED` with the new module."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        """The spec of an old path (loaded by this finder), or ``None`` for any other name."""
        if fullname not in RELOCATED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """The module at its new home (imported if need be), after a DeprecationWarning."""
        new = RELOCATED[spec.name]
        face = ".".join(part for part in new.split(".") if not part.startswith("_"))
        warnings.warn(
            f"{spec.name} moved to {new}: import its public names from {face}; "
            "the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module was imported at its new home."""


def install() -> None:
    """Put one :class:`RelocatedFinder` on ``sys.meta_path`` (once per process)."""
    if not any(isinstance(f, RelocatedFinder) for f in sys.meta_path):
        sys.meta_path.append(RelocatedFinder())
