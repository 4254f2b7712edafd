"""Which logs a source names, and which of them are read: the one source iterator.

Every consumer of session logs (both frame engines, ``frames.forks``, every exporter,
``batch``, ``report``, ``score``, ``compare``, the tap's what-if) asks this module which logs
a *source* names and reads them through it, so they accept, refuse and leave out the same
logs, with the same warnings, once per call:

1. :func:`find_logs`: a source is a log file, a directory (searched recursively for
   ``*.jsonl``, sorted; a batch folder, one holding ``manifest.ndjson``, names its ``logs/``
   only, never a task file beside them), an open :class:`~boxmaker.session.Session`, a
   :class:`Log` already read, or a list of these.
2. Each file is read by :func:`~boxmaker.session.read_log` (read-only, never repaired): a log
   it refuses is left out with a :class:`~boxmaker.session.LogReadWarning` in its words.
3. Of several logs with one session id (a backup copy, a copied folder), one is the session:
   the one named ``<session id>.jsonl``, else the first written (the oldest modification
   time, then the path); the others are copies, each left out with one warning naming the
   log it copies, and never counted. Which log is the session never depends on the order
   the source lists them.

:func:`read_logs` gives the accepted logs as :class:`Log` values; :func:`vet_logs` passes each
through a caller's function (in worker processes for big inputs: the DuckDB engine).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeAlias, TypeVar

from tqdm import tqdm

from .. import _json
from ..errors import SessionError
from ..records import record_to_json
from ._file import LogReadWarning, read_log
from ._session import Session

__all__ = [
    "PARALLEL_BYTES",
    "Log",
    "Source",
    "Vetted",
    "find_logs",
    "open_log",
    "read_logs",
    "vet_logs",
]


class Log(NamedTuple):
    """One session log as read: its session id, file, baseline JSON, schema and the JSON
    records after the baseline (upgraded to the current schema, each checked by
    :data:`boxmaker.records.RULES`: :func:`~boxmaker.session.read_log`'s ``records``).

    A :class:`Log` is itself a source item: a consumer that read logs once passes them on
    (``frames.load(logs)``) and nothing is read or warned about twice.
    """

    session: str
    path: str
    head: dict[str, Any]
    records: list[Any]
    schema: int = 0


Source: TypeAlias = (
    "str | os.PathLike[str] | Session | Log | Iterable[str | os.PathLike[str] | Session | Log]"
)
"""What a reader of logs takes: a log file, a directory (recursive ``*.jsonl``), an open
:class:`~boxmaker.session.Session`, a :class:`Log` already read, or a list of these."""

_Item: TypeAlias = "Path | Session | Log"

BATCH_MANIFEST = "manifest.ndjson"
"""The file that makes a folder a batch folder (:mod:`boxmaker.batch` writes it)."""


def _items(source: Source) -> list[Any]:
    single = isinstance(source, str | os.PathLike | Session | Log)
    return [source] if single else list(source)  # type: ignore[arg-type]


def find_logs(source: Source, *, strict: bool = True) -> list[_Item]:
    """The logs a source names, before any is read: files as given, directories searched
    recursively for ``*.jsonl`` (sorted), sessions and :class:`Log` values as they are.

    Args:
        source: see :data:`Source`.
        strict: raise for a path that names no log; ``False`` (``boxmaker report``, which
            lists what it left out) leaves it out with a :class:`LogReadWarning` instead.

    Raises:
        SessionError: with ``strict``, a path that does not exist, or a directory without any
            ``*.jsonl`` (an analysis of nothing would read as "no usage").
    """
    out: list[_Item] = []
    for item in _items(source):
        if isinstance(item, Session | Log):
            out.append(item)
            continue
        path = Path(item)
        if path.is_dir() and (path / BATCH_MANIFEST).is_file() and (path / "logs").is_dir():
            path = path / "logs"  # a batch folder: its runs' logs
        if path.is_dir():
            found = sorted(p for p in path.rglob("*.jsonl") if p.is_file())
            if not found and strict:
                raise SessionError(f"{path}: no session logs (*.jsonl) in this directory")
            out.extend(found)
        elif path.is_file():
            out.append(path)
        elif strict:
            raise SessionError(f"{path}: no such file or directory")
        else:
            warnings.warn(f"{path}: no such file or directory", LogReadWarning, stacklevel=2)
    return out


def open_log(item: _Item) -> Log:
    """One item of :func:`find_logs` as a :class:`Log`: a file read by
    :func:`~boxmaker.session.read_log` (read-only), a session's records as JSON.

    Raises:
        SessionError: as :func:`~boxmaker.session.read_log`.
    """
    if isinstance(item, Log):
        return item
    if isinstance(item, Session):
        head = {"type": "baseline", "schema": item.schema, **record_to_json(item.baseline)}
        records = [record_to_json(r) for r in item.records]
        return Log(item.id, str(item.path), head, records, item.schema)
    data = read_log(item, repair=False)
    return Log(data.session_id, str(item), data.head, data.records, data.schema)


def read_logs(source: Source, *, strict: bool = True) -> Iterator[Log]:
    """The logs of ``source`` that are read, one at a time, as :class:`Log` values.

    A log :func:`~boxmaker.session.read_log` refuses, and every copy of a session (see the
    module's rule 3), is left out with one :class:`LogReadWarning`.

    Raises:
        SessionError: with ``strict``, as :func:`find_logs`.
    """
    return vet_logs(source, open_log, workers=1, strict=strict)


class Vetted(Protocol):
    """What a vetting function of :func:`vet_logs` returns: at least the log's session id and
    path."""

    @property
    def session(self) -> str: ...

    @property
    def path(self) -> str: ...


V = TypeVar("V", bound=Vetted)

PARALLEL_BYTES = 64 * 2**20
"""Below this many bytes of log files (or with one file) :func:`vet_logs` with ``workers=None``
reads in this process: starting worker processes costs more than it saves."""


def vet_logs(
    source: Source,
    vet: Callable[[_Item], V],
    *,
    workers: int | None = 1,
    progress: bool | None = None,
    strict: bool = True,
) -> Iterator[V]:
    """The logs of ``source`` that are read, each passed through ``vet``, in order.

    ``vet`` reads one item of :func:`find_logs` (with :func:`open_log`, that is
    :func:`~boxmaker.session.read_log`) and returns what the caller keeps of it; it raises
    :class:`~boxmaker.errors.SessionError` for a log the session refuses, which is left out
    with a :class:`LogReadWarning` in the session's words. Of several logs of one session the
    one the module's rule 3 names is kept, the others are left out as copies, each with one
    warning.

    Args:
        source: see :data:`Source`.
        vet: a module-level function (or a :func:`functools.partial` of one) when
            ``workers`` is not 1: files are then vetted in worker processes and what they
            warned (:class:`LogReadWarning` only) is warned again here, in the logs' order.
        workers: processes that read files at once (1: this process; ``None``: the CPUs this
            process may use, when the files hold at least :data:`PARALLEL_BYTES` and there are
            two or more; sessions and :class:`Log` values are always read in this process).
        progress: a tqdm bar of the logs read, on stderr (``None``: when the files hold at
            least :data:`PARALLEL_BYTES`, a read of several seconds).
        strict: as for :func:`find_logs`.

    Raises:
        SessionError: with ``strict``, as :func:`find_logs`.
    """
    items = _sessions_first(find_logs(source, strict=strict))
    big = _big(items)
    seen: dict[str, str] = {}  # session id -> the log it was read from
    bar = tqdm(
        total=len(items),
        desc="reading logs",
        unit="log",
        file=sys.stderr,
        leave=False,
        disable=not (big if progress is None else progress),
    )
    try:
        for value, error, told in _vet_each(items, vet, _workers(items, workers, big)):
            bar.update()
            for message in told:
                warnings.warn(message, LogReadWarning, stacklevel=3)
            if value is not None and value.session in seen:
                error = (
                    f"{value.path}: a copy of session {value.session}, which is read from "
                    f"{seen[value.session]}"
                )
            if error is not None or value is None:
                warnings.warn(f"{error}; the log is left out", LogReadWarning, stacklevel=3)
                continue
            seen[value.session] = value.path
            yield value
    finally:
        bar.close()


# -- which of several logs of one session is the session ---------------------------------------


def _head_id(item: _Item) -> str | None:
    """The session id a log names (its baseline's ``session_id``, else its file stem), read
    from the first line only; ``None`` when the first line is no baseline object (the reader
    refuses that log anyway)."""
    if isinstance(item, Log):
        return item.session
    if isinstance(item, Session):
        return item.id
    try:
        with item.open("rb") as f:
            first = f.readline()
        head = _json.loads(first)
    except (OSError, ValueError, RecursionError):
        return None
    if type(head) is not dict:
        return None
    sid = head.get("session_id", item.stem)
    return sid if isinstance(sid, str) else None


def _preference(item: _Item, sid: str) -> tuple[int, int, str]:
    """Sort key of the logs of one session: in memory first, then the file named
    ``<sid>.jsonl``, then the oldest modification time, then the path."""
    if not isinstance(item, Path):
        return (0, 0, "")
    try:
        mtime = item.stat().st_mtime_ns
    except OSError:
        mtime = 0
    return (1 if item.name == f"{sid}.jsonl" else 2, mtime, str(item))


def _sessions_first(items: list[_Item]) -> list[_Item]:
    """``items`` with the logs of each session id in the order of :func:`_preference`, at
    the place of the session's first log, so that the first log of a session the reader
    accepts is the session and the later ones are its copies. A list of one log per session
    (the usual case) is returned as it is, without stat calls."""
    ids = [_head_id(item) for item in items]
    known = [sid for sid in ids if sid is not None]
    if len(set(known)) == len(known):
        return items
    groups: dict[str, list[int]] = {}
    for k, sid in enumerate(ids):
        if sid is not None:
            groups.setdefault(sid, []).append(k)
    order: list[_Item] = []
    placed: set[str] = set()
    for k, sid in enumerate(ids):
        if sid is None:
            order.append(items[k])
        elif sid not in placed:
            placed.add(sid)
            members = [items[j] for j in groups[sid]]
            order.extend(sorted(members, key=lambda it, s=sid: _preference(it, s)))  # type: ignore[misc]
    return order


# -- reading, here or in worker processes -----------------------------------------------------


def _big(items: list[_Item]) -> bool:
    """Whether the files of ``items`` hold :data:`PARALLEL_BYTES` or more (two or more)."""
    files = [item for item in items if isinstance(item, Path)]
    size = 0
    for path in files if len(files) >= 2 else ():
        with contextlib.suppress(OSError):
            size += path.stat().st_size
        if size >= PARALLEL_BYTES:
            return True
    return False


def _workers(items: list[_Item], workers: int | None, big: bool) -> int:
    if workers is not None:
        return max(1, workers)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not big or not cpus or cpus < 2:
        return 1
    return min(cpus, sum(isinstance(item, Path) for item in items), 8)


_Outcome: TypeAlias = "tuple[V | None, str | None, list[str]]"
"""A vetted log, or why it is left out, and the :class:`LogReadWarning` messages its reading
gave (from a worker process; empty when read here, where they were warned already)."""


def _here(vet: Callable[[_Item], V], item: _Item) -> _Outcome[V]:
    try:
        return vet(item), None, []
    except SessionError as exc:
        return None, str(exc), []


def _vet_each(items: list[_Item], vet: Callable[[_Item], V], workers: int) -> Iterator[_Outcome[V]]:
    if workers == 1:
        for item in items:
            yield _here(vet, item)
        return
    with ProcessPoolExecutor(workers) as pool:
        futures = [
            pool.submit(_caught, vet, item) if isinstance(item, Path) else item for item in items
        ]
        for pending in futures:
            if isinstance(pending, Session | Log):
                yield _here(vet, pending)
            else:
                yield pending.result()


def _caught(vet: Callable[[_Item], V], item: Path) -> _Outcome[V]:
    """``vet(item)`` in a worker process: its result or why it refused, and its warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LogReadWarning)
        try:
            value: V | None = vet(item)
            error = None
        except SessionError as exc:
            value, error = None, str(exc)
    told = [str(w.message) for w in caught if issubclass(w.category, LogReadWarning)]
    return value, error, told
