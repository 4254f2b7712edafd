"""Reading the logs an exporter turns into another format: the session's reader, one log at a
time, a refused log left out with a warning (as the frames do)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

from ..errors import SessionError
from ..records import parse_time
from ..session import LogReadWarning, read_log

__all__ = ["Logs", "Run", "find", "nanos", "runs"]

Logs: TypeAlias = "str | os.PathLike[str] | Iterable[str | os.PathLike[str]]"
"""What an exporter reads: a log file, a directory (recursive ``*.jsonl``), or a list."""


class Run(NamedTuple):
    """One session log as read by :func:`boxmaker.session.read_log` (current schema)."""

    path: Path
    data: Any

    @property
    def session(self) -> str:
        """The session id."""
        sid: str = self.data.session_id
        return sid

    @property
    def records(self) -> list[dict[str, Any]]:
        """The records after the baseline (JSON objects, checked by the records' rule)."""
        records: list[dict[str, Any]] = self.data.records
        return records


def find(source: Logs) -> list[Path]:
    """The ``*.jsonl`` files ``source`` names, in order (directories searched recursively,
    sorted).

    Raises:
        SessionError: a path does not exist, or a directory holds no ``*.jsonl``.
    """
    items: Iterable[Any] = [source] if isinstance(source, str | os.PathLike) else source
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
            if not found:
                raise SessionError(f"{path}: no session logs (*.jsonl) in this directory")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        else:
            raise SessionError(f"{path}: no such file or directory")
    return out


def runs(source: Logs) -> Iterator[Run]:
    """Each log of ``source`` the session reads, one at a time; a log it refuses is left out
    with a :class:`~boxmaker.session.LogReadWarning` in its words.

    Raises:
        SessionError: as :func:`find`.
    """
    for path in find(source):
        try:
            data = read_log(path)
        except SessionError as exc:
            warnings.warn(f"{exc}; the log is left out", LogReadWarning, stacklevel=3)
            continue
        yield Run(path, data)


def nanos(time: str) -> int:
    """A log time (ISO 8601 with an offset) as nanoseconds since the Unix epoch (UTC)."""
    t = parse_time(time)
    return (int(t.timestamp()) * 1_000_000 + t.microsecond) * 1000
