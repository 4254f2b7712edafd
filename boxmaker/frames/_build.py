"""Session logs as pandas frames: usage, turns, cache losses, limit hits, tool calls, summary.

Every function takes a *source*: one log path, a directory (searched recursively for
``*.jsonl``), a :class:`~boxmaker.session.Session`, or a list of any of these, and returns a
:class:`pandas.DataFrame` whose columns are defined as data in :mod:`boxmaker.frames`
(:data:`COLUMNS`: name, dtype, unit, where the value comes from, what it means); each
function's docstring ends with its column table, generated from the same list, and
:func:`describe` gives it as a frame. Units are in the names (``_tokens``, ``_ms``, ``_chars``,
``_per_s``); times are UTC (``datetime64[ns, UTC]``); kinds are categoricals; counts are
nullable ``Int64``.

Files are read by :func:`boxmaker.session.read_log`, the reader :meth:`Session.open` uses,
read-only (a log is never modified here), so the frames accept and refuse the same logs.
A path that names no log (misspelled, or a directory without any ``*.jsonl``) raises
:class:`~boxmaker.errors.SessionError`; then, log by log:

- a torn last line (no newline) is dropped with a :class:`LogReadWarning`;
- a log of an older schema is upgraded in memory by :mod:`boxmaker.session`;
- records of a type this version does not know are skipped with a warning (counted in
  ``summary().unknown_records``);
- a line that repeats an earlier record (a record written twice) is read once, with
  the same warning :meth:`Session.open` gives;
- a log that :meth:`Session.open` refuses (unreadable, no baseline, a schema this version does
  not read, a line that breaks the records' one rule, :data:`boxmaker.records.RULES`: a missing
  field, a wrong type, a value outside its ``Literal``, a bad or out-of-range time, an unsafe
  session id) is left out with a warning in the session's words (file, line, field, value),
  and the other logs are still read.

Warnings are :class:`~boxmaker.session.LogReadWarning` (a :class:`UserWarning`, re-exported
here); turn them into errors with ``warnings.simplefilter("error", LogReadWarning)``.

How a turn ended and whether a tool ran are read from the records' data (``TurnEnd``,
``ToolResult.not_run``), never from the texts the loop wrote. For speed no record objects are
built: each file is parsed with one ``json.loads``, :mod:`boxmaker.frames` cuts the
records into turns and one small row writer per frame fills its column lists, and each frame
is constructed once.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, TypeAlias, TypeVar

import numpy as np
import pandas as pd
from tqdm import tqdm

from ..errors import SessionError
from ..records import parse_time
from ..session import LogReadWarning, Session
from ._columns import COLUMNS, ENDING_LIMITS, ROW_RECORD, TIME, TURN_OUTCOMES, Column, ratio
from ._columns import doc_table as _doc_table
from ._rows import HIDDEN, Log, Rows, file_log, session_log

__all__ = [
    "COLUMNS",
    "ENDING_LIMITS",
    "TURN_OUTCOMES",
    "Column",
    "Engine",
    "Frames",
    "LogReadWarning",
    "Source",
    "cache_losses",
    "describe",
    "find_logs",
    "limit_hits",
    "load",
    "requests",
    "summary",
    "tool_calls",
    "turns",
]

Source: TypeAlias = "str | os.PathLike[str] | Session | Iterable[str | os.PathLike[str] | Session]"
"""What the frame functions read: a log file, a directory (recursive ``*.jsonl``), a
:class:`Session`, or a list of these."""

_KEY = {"turns": "_turn_row", "summary": "_session_row"}
"""The hidden column that ties another frame's rows to a row of this frame."""


# -- finding and reading logs ------------------------------------------------------------------


def find_logs(source: Source) -> list[Path | Session]:
    """The logs a source names, in order: files as given, directories searched recursively
    for ``*.jsonl`` (sorted), :class:`Session` objects as they are.

    A path that does not exist is left out with a :class:`LogReadWarning` (the lenient
    finder, for ``boxmaker report`` which lists what it left out; the frame functions raise
    :class:`~boxmaker.errors.SessionError` for such a path instead).
    """
    items: Iterable[Any] = [source] if isinstance(source, str | os.PathLike | Session) else source
    out: list[Path | Session] = []
    for item in items:
        if isinstance(item, Session):
            out.append(item)
            continue
        path = Path(item)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*.jsonl") if p.is_file()))
        elif path.is_file():
            out.append(path)
        else:
            warnings.warn(f"{path}: no such file or directory", LogReadWarning, stacklevel=2)
    return out


# -- building frames -------------------------------------------------------------------------


def _dtype(name: str) -> Any:
    """The pandas dtype object of a :class:`Column` dtype name."""
    return pd.api.types.pandas_dtype(name)


def _array(values: list[Any], column: Column) -> Any:
    if column.dtype == TIME:
        texts = pd.Series(values, dtype=object)
        times = pd.to_datetime(texts, utc=True, format="ISO8601", errors="coerce")
        times = times.astype(_dtype(TIME))
        missed = times.isna() & texts.notna()
        if missed.any():  # ISO 8601 forms pandas does not read (a week date, a decimal comma):
            # the times the session reads (read_log checked each by the records' rule)
            fixed = pd.Series([parse_time(t) for t in texts[missed]], index=texts.index[missed])
            times[missed] = fixed.astype(_dtype(TIME))
        return times.array
    if column.dtype == "category":
        known = list(column.categories)
        extra = sorted(set(values) - set(known) - {None})
        return pd.Categorical(values, categories=pd.Index(known + extra, dtype="str"))
    return pd.array(values, dtype=_dtype(column.dtype))


def _base(rows: Rows, frame: str) -> pd.DataFrame:
    """A frame with its reader-filled and field columns, and the hidden ones."""
    cols = rows.cols[frame]
    data: dict[str, Any] = {}
    for c in COLUMNS[frame]:
        if c.name in cols:
            data[c.name] = _array(cols[c.name], c)
    for hidden in HIDDEN:
        data[hidden] = np.asarray(cols[hidden], dtype=np.int64)
    return pd.DataFrame(data, copy=False)


def _finish(frame: str, df: pd.DataFrame, parts: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Add the aggregated and derived columns, in the order of :data:`COLUMNS`."""
    key = _KEY.get(frame)
    for c in COLUMNS[frame]:
        if c.agg is not None and key is not None:
            other, column = c.agg
            src = parts[other]
            if c.where is not None:
                src = src[src[c.where[0]] == c.where[1]]
            src = src[src[key] >= 0]
            src = src[_same_origin(src, df, key, c.copied)]
            grouped = src.groupby(key)
            values = grouped.size() if column is None else grouped[column].sum()
            full = values.reindex(range(len(df)), fill_value=0)
            df[c.name] = pd.array(full.to_numpy(), dtype=_dtype(c.dtype))
        elif c.derive is not None:
            df[c.name] = pd.array(c.derive(df), dtype=_dtype(c.dtype))
    return df


def _same_origin(src: pd.DataFrame, df: pd.DataFrame, key: str, copied: bool) -> Any:
    """Which rows of ``src`` an aggregated column of ``df`` counts (a boolean array): into a
    turn, the rows whose ``from_parent`` is the turn's; into a summary, a log's own rows
    (``copied``: its rows copied from the parent), so a row is never counted twice over a
    parent and its forks."""
    mine = src["from_parent"].to_numpy(dtype=bool)
    if key == "_turn_row":
        turn_copied = df["from_parent"].to_numpy(dtype=bool)
        return mine == turn_copied[src[key].to_numpy()]
    return mine if copied else ~mine


def _public(frame: str, df: pd.DataFrame) -> pd.DataFrame:
    return df[[c.name for c in COLUMNS[frame]]].reset_index(drop=True)


def _needs(want: Iterable[str]) -> set[str]:
    """The frames to build for ``want``: the wanted ones and those they aggregate."""
    need = set(want)
    if "cache_losses" in need:
        need.add("requests")
    if need & {"turns", "summary"}:
        need |= {"requests", "cache_losses", "limit_hits", "tool_calls", "turns"}
    return need


def _check_paths(source: Source) -> None:
    """Refuse a path of ``source`` that names no log: a misspelled path, or a directory
    without any ``*.jsonl`` (an analysis of nothing would read as "no usage").

    Raises:
        SessionError: the first such path, named with what was found there.
    """
    items: Iterable[Any] = [source] if isinstance(source, str | os.PathLike | Session) else source
    for item in items:
        if isinstance(item, Session):
            continue
        path = Path(item)
        if path.is_dir():
            if not any(p.is_file() for p in path.rglob("*.jsonl")):
                raise SessionError(f"{path}: no session logs (*.jsonl) in this directory")
        elif not path.is_file():
            raise SessionError(f"{path}: no such file or directory")


def read_logs(source: Source) -> Iterator[Log]:
    """The logs of ``source`` that the session reads, one at a time: the one acceptance rule
    of both engines (pandas and DuckDB).

    A log :func:`boxmaker.session.read_log` refuses, or a second copy of a session already
    read, is left out with a :class:`LogReadWarning` in the session's words.

    Raises:
        SessionError: a path of ``source`` names no log (see :func:`_check_paths`).
    """
    return vet_logs(source, open_log, workers=1)


def open_log(item: Path | Session) -> Log:
    """One item of :func:`find_logs` as a :class:`Log` (a file read by
    :func:`boxmaker.session.read_log`, read-only).

    Raises:
        SessionError: as :func:`~boxmaker.session.read_log`.
    """
    return session_log(item) if isinstance(item, Session) else file_log(item)


class Vetted(Protocol):
    """What a vetting function of :func:`vet_logs` returns: at least the log's session id and
    path (a second log of the same session is left out)."""

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
    vet: Callable[[Path | Session], V],
    *,
    workers: int | None = 1,
    progress: bool | None = None,
) -> Iterator[V]:
    """The logs of ``source`` that the session reads, each passed through ``vet``, in order.

    ``vet`` reads one item of :func:`find_logs` (a file: with :func:`open_log`, that is
    :func:`boxmaker.session.read_log`) and returns what the caller keeps of it; it raises
    :class:`~boxmaker.errors.SessionError` for a log the session refuses, which is left out
    with a :class:`LogReadWarning` in the session's words, as is a second log of a session
    already read.

    Args:
        source: as for :func:`requests`.
        vet: a module-level function (or a :func:`functools.partial` of one) when
            ``workers`` is not 1: files are then vetted in worker processes and what they
            warned (:class:`LogReadWarning` only) is warned again here, in the logs' order.
        workers: processes that read files at once (1: this process; ``None``: the CPUs this
            process may use, when the files hold at least :data:`PARALLEL_BYTES` and there are
            two or more; in-memory sessions are always read in this process).
        progress: a tqdm bar of the logs read, on stderr (``None``: when the files hold at
            least :data:`PARALLEL_BYTES`, a read of several seconds).

    Raises:
        SessionError: a path of ``source`` names no log (see :func:`_check_paths`).
    """
    seen: dict[str, str] = {}  # session id -> the log it came from
    _check_paths(source)
    items = find_logs(source)
    big = _big(items)
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
            if value is not None and value.session in seen:  # a copy of a log (a backup)
                error = (
                    f"{value.path}: session {value.session} was read already from "
                    f"{seen[value.session]} (a copy?)"
                )
            if error is not None or value is None:
                warnings.warn(f"{error}; the log is left out", LogReadWarning, stacklevel=3)
                continue
            seen[value.session] = value.path
            yield value
    finally:
        bar.close()


def _big(items: list[Path | Session]) -> bool:
    """Whether the files of ``items`` hold :data:`PARALLEL_BYTES` or more (two or more)."""
    files = [item for item in items if isinstance(item, Path)]
    size = 0
    for path in files if len(files) >= 2 else ():
        with contextlib.suppress(OSError):
            size += path.stat().st_size
        if size >= PARALLEL_BYTES:
            return True
    return False


def _workers(items: list[Path | Session], workers: int | None, big: bool) -> int:
    if workers is not None:
        return max(1, workers)
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if not big or not cpus or cpus < 2:
        return 1
    return min(cpus, sum(isinstance(item, Path) for item in items), 8)


_Outcome: TypeAlias = "tuple[V | None, str | None, list[str]]"
"""A vetted log, or why it is left out, and the :class:`LogReadWarning` messages its reading
gave (from a worker process; empty when read here, where they were warned already)."""


def _vet_each(
    items: list[Path | Session], vet: Callable[[Path | Session], V], workers: int
) -> Iterator[_Outcome[V]]:
    if workers == 1:
        for item in items:
            try:
                yield vet(item), None, []
            except SessionError as exc:
                yield None, str(exc), []
        return
    with ProcessPoolExecutor(workers) as pool:
        futures = [
            pool.submit(_caught, vet, item) if isinstance(item, Path) else item for item in items
        ]
        for pending in futures:
            if isinstance(pending, Session):
                try:
                    yield vet(pending), None, []
                except SessionError as exc:
                    yield None, str(exc), []
            else:
                yield pending.result()


def _caught(vet: Callable[[Path | Session], V], item: Path) -> _Outcome[V]:
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


def _read(source: Source, want: Iterable[str]) -> Rows:
    """Read every log of ``source``; rows only for the frames ``want`` needs (a record type
    no needed frame reads is skipped without its fields being checked)."""
    rows = Rows(_needs(want))
    for log in read_logs(source):
        rows.add(log)
    return rows


class Frames(NamedTuple):
    """All frames of a source, read once (see :func:`load`)."""

    requests: pd.DataFrame
    turns: pd.DataFrame
    cache_losses: pd.DataFrame
    limit_hits: pd.DataFrame
    tool_calls: pd.DataFrame
    summary: pd.DataFrame


def _build(rows: Rows, want: Iterable[str]) -> dict[str, pd.DataFrame]:
    want = set(want)
    need = rows.need
    parts: dict[str, pd.DataFrame] = {}
    order = ("requests", "cache_losses", "limit_hits", "tool_calls", "turns", "summary")
    for frame in order:
        if frame not in need:
            continue
        df = _base(rows, frame)
        if frame == "cache_losses":
            req = parts["requests"]
            per_token = ratio(req.prompt_ms, req.processed_tokens).to_numpy(
                dtype=object, na_value=pd.NA
            )
            idx = df["_request_row"].to_numpy()
            df["prompt_ms_per_token"] = pd.array(
                [per_token[j] if j >= 0 else pd.NA for j in idx], dtype="Float64"
            )
        parts[frame] = _finish(frame, df, parts)
    return {frame: _public(frame, parts[frame]) for frame in want}


Engine: TypeAlias = Literal["pandas", "duckdb"]
"""How the frames are computed: ``"pandas"`` (in memory, the default) or ``"duckdb"`` (SQL
over the logs, the same columns and values; see :func:`boxmaker.frames.connect`)."""


def _engine(engine: str) -> None:
    if engine not in ("pandas", "duckdb"):
        raise ValueError(f"engine {engine!r}: not 'pandas' or 'duckdb'")


def load(source: Source, *, engine: Engine = "pandas") -> Frames:
    """All six frames of ``source``, reading each log once.

    Args:
        source: a log file, a directory (recursive ``*.jsonl``), a :class:`Session`, or a
            list of these.

    Returns:
        :class:`Frames` (``requests``, ``turns``, ``cache_losses``, ``limit_hits``,
        ``tool_calls``, ``summary``), each as its function returns it.

    Raises:
        SessionError: a path of ``source`` does not exist, or is a directory without any
            ``*.jsonl`` (an empty list of sources gives empty frames).
        ValueError: an unknown ``engine``.

    Warns:
        LogReadWarning: a log, or part of one, was left out (the message names file and line).

    With ``engine="duckdb"`` (the ``duckdb`` extra) the frames are computed by DuckDB over the
    same validated records (:func:`boxmaker.frames.connect`): the same columns and values.
    """
    _engine(engine)
    if engine == "duckdb":
        from . import _duck  # _duck imports this module (read_logs)

        con = _duck.connect(source)
        try:
            return Frames(**{name: _duck.frame(con, name) for name in Frames._fields})
        finally:
            con.close()
    built = _build(_read(source, Frames._fields), Frames._fields)
    return Frames(**built)


def _one(frame: str, source: Source, engine: Engine = "pandas") -> pd.DataFrame:
    _engine(engine)
    if engine == "duckdb":
        from . import _duck  # _duck imports this module (read_logs)

        con = _duck.connect(source)
        try:
            return _duck.frame(con, frame)
        finally:
            con.close()
    return _build(_read(source, [frame]), [frame])[frame]


def requests(source: Source, *, engine: Engine = "pandas") -> pd.DataFrame:
    """One row per completion (``Usage`` record), in log order.

    Args:
        source: a log file, a directory (recursive ``*.jsonl``), a :class:`Session`, or a
            list of these.

        engine: ``"pandas"`` (default) or ``"duckdb"`` (the same columns and values, computed
            by DuckDB over the same validated records; the ``duckdb`` extra). Every frame
            function takes it.

    Warns:
        LogReadWarning: a log, or part of one, was left out (the message names file and line).

    A completion belongs to the turn of the latest ``User`` record before it; ``tool_calls``
    counts the calls of the ``Assistant`` record it follows. Values the server did not send
    (older llama.cpp builds send no ``timings``) are ``<NA>``.

    In a fork's log (:meth:`boxmaker.session.Session.fork`) the rows of the records copied
    from its parent (records 1..``Forked.record - 1``) have ``from_parent`` true, in this
    frame and in ``turns``, ``tool_calls``, ``cache_losses`` and ``limit_hits``; they keep the
    numbers (``request``, ``turn``, ``turn_request``) the parent gave them, and the fork's own
    rows go on from there. Leave them out (``frame[~frame.from_parent]``) to sum over a parent
    and its forks.

    Columns:
    {columns}
    """
    return _one("requests", source, engine)


def turns(source: Source, *, engine: Engine = "pandas") -> pd.DataFrame:
    """One row per turn: a turn starts at each ``User`` record and runs to the next one.

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    ``outcome`` is the ``outcome`` of the turn's ``TurnEnd`` record (schema 2 ends every
    turn with one; ``end_detail`` and ``http_status`` come from it too). A turn without one (a
    log of schema 1, or a turn still running while the log was read) gets it from its
    records, in this order: a ``LimitHit`` that ends a turn gives its kind
    (``tool_iterations``, ``repeated_call``; ``context_full`` gives ``session_full``); a last
    message that is an ``Assistant`` without tool calls gives ``answered``, or ``length`` when
    that completion was cut at ``max_tokens`` (``finish_reason: "length"``); else
    ``cancelled`` when a tool call was answered with ``not_run: "cancelled"``, else
    ``no_answer`` (schema 1 recorded nothing for a failed request or a cancel during a
    completion).

    A turn of a fork's log is ``from_parent`` when every record of it is a copy of the
    parent's. A turn that straddles the fork point (a fork at an edited tool result: its
    user message, first completions and earlier results copied, the edited result and what
    follows the fork's own) is the fork's own; its counts and sums (``requests``, tokens,
    ``iterations``, ``tool_results``, cache losses, limit hits) are over its own records
    only, its copied completions being ``requests`` rows with ``from_parent``. A turn's counts
    are always over its rows of its own ``from_parent``, so summing turns over
    ``~from_parent`` gives the summary's totals.

    Columns:
    {columns}
    """
    return _one("turns", source, engine)


def cache_losses(source: Source, *, engine: Engine = "pandas") -> pd.DataFrame:
    """One row per ``CacheLoss`` record: llama.cpp reused fewer prompt tokens than the
    previous request made cacheable (see :mod:`boxmaker.cache`).

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    ``lost_ms`` prices the lost tokens at the losing request's own prompt rate
    (``prompt_ms / processed_tokens``); ``<NA>`` when that request processed no tokens.

    Columns:
    {columns}
    """
    return _one("cache_losses", source, engine)


def limit_hits(source: Source, *, engine: Engine = "pandas") -> pd.DataFrame:
    """One row per ``LimitHit`` record (the spec's five limits).

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    Columns:
    {columns}
    """
    return _one("limit_hits", source, engine)


def tool_calls(source: Source, *, engine: Engine = "pandas") -> pd.DataFrame:
    """One row per ``ToolResult`` record (each tool call the loop answered).

    ``not_run`` is the record's reason for answering without running the tool (``repeat``,
    the turn ended first, ``process_died``; schema-1 logs get it from the upgrade on read);
    ``ran`` is true exactly when it has none.

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    Columns:
    {columns}
    """
    return _one("tool_calls", source, engine)


def summary(source: Source, *, engine: Engine = "pandas") -> pd.DataFrame:
    """One row per session log with the totals a paper table needs.

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    Totals are over the session's own records (the sums of the other frames' columns over
    their rows with ``from_parent`` false): a fork's log holds its parent's records up to
    the fork point, counted in ``inherited_turns`` and ``inherited_requests`` only, so that
    summing the summary over a parent and its forks counts each completion once.
    ``records``, ``started`` (the baseline's time, the parent's for a fork) and ``ended`` are
    the log's as a whole.

    Columns:
    {columns}
    """
    return _one("summary", source, engine)


def describe(frame: str) -> pd.DataFrame:
    """The columns of ``frame`` (``"requests"``, ``"turns"``, ...) as a table: ``column``,
    ``dtype``, ``unit``, ``source``, ``doc``, from :data:`COLUMNS`.

    Raises:
        KeyError: no such frame.
    """
    record = ROW_RECORD[frame]
    return pd.DataFrame(
        [(c.name, c.dtype, c.unit, c.origin(record), c.doc) for c in COLUMNS[frame]],
        columns=["column", "dtype", "unit", "source", "doc"],
    )


for _f in (requests, turns, cache_losses, limit_hits, tool_calls, summary):
    _f.__doc__ = (_f.__doc__ or "").replace("{columns}", _doc_table(_f.__name__))
