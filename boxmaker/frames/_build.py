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

import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple, TypeAlias

import numpy as np
import pandas as pd

from ..records import parse_time
from ..session import ENDING_LIMITS, LogReadWarning, Source, find_logs, read_logs
from ._columns import COLUMNS, ROW_RECORD, TIME, TURN_OUTCOMES, Column
from ._columns import doc_table as _doc_table
from ._rows import HIDDEN, Rows

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

_KEY = {"turns": "_turn_row", "summary": "_session_row"}
"""The hidden column that ties another frame's rows to a row of this frame."""


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
    if column.dtype in ("category", "string"):
        values = _encodable(values)
    if column.dtype == "category":
        known = list(column.categories)
        extra = sorted(set(values) - set(known) - {None})
        return pd.Categorical(values, categories=pd.Index(known + extra, dtype="str"))
    return pd.array(values, dtype=_dtype(column.dtype))


def _encodable(values: list[Any]) -> list[Any]:
    """``values`` with each lone UTF-16 surrogate (a JSON ``\\ud800`` escape the session
    reads) as U+FFFD, as the DuckDB engine reads them: pandas' string storage holds UTF-8
    only. One pass of C when no text has one (the usual case)."""
    texts = [v for v in values if type(v) is str]
    try:
        "".join(texts).encode("utf-8")
    except UnicodeEncodeError:
        return [_LONE.sub("\ufffd", v) if type(v) is str else v for v in values]
    return values


_LONE = re.compile("[\ud800-\udfff]")


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
            df[c.name] = pd.array(_aggregate(src, key, column, len(df)), dtype=_dtype(c.dtype))
        elif c.derive is not None:
            df[c.name] = pd.array(c.derive(df), dtype=_dtype(c.dtype))
    return df


def _aggregate(src: pd.DataFrame, key: str, column: str | None, rows: int) -> Any:
    """The count of ``src`` rows per ``key`` (``column`` ``None``), or the sum of ``column``:
    0 for a row without any, ``<NA>`` where a summed value is unknown (a total over an unknown
    is unknown: never 0, never the sum of the known part)."""
    keys = src[key].to_numpy()
    if column is None:
        return np.bincount(keys, minlength=rows)[:rows] if len(keys) else np.zeros(rows, int)
    floats = pd.api.types.is_float_dtype(src[column].dtype)
    values = src[column].astype("Float64" if floats else "Int64")  # booleans counted
    unknown = values.isna().to_numpy()
    total = values.fillna(0).groupby(keys).sum().reindex(range(rows), fill_value=0)
    out: Any = total.astype(values.dtype).array.copy()
    if unknown.any():
        out[np.unique(keys[unknown])] = pd.NA
    return out


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
    if need & {"turns", "summary"}:
        need |= {"requests", "cache_losses", "limit_hits", "tool_calls", "turns"}
    return need


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

    A loss has two quantities, each under one name in every view (the frames, ``report``,
    ``cache explain``, the exports): ``lost_tokens``, the previous prompt's tokens the server
    did not reuse (``expected - reused``), and ``reprocessed_tokens``, what it processed
    again of what its slot held, the reply included (:func:`boxmaker.cache.reprocessed`), with
    ``reprocessed_ms``, what that cost; ``<NA>`` where the log does not say (older logs).

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
    """The columns of ``frame`` (``"requests"``, ``"turns"``, ..., and ``"forks"``) as a
    table: ``column``, ``dtype``, ``unit``, ``source``, ``doc``, from :data:`COLUMNS` (the
    ``forks`` frame's from :data:`boxmaker.frames.FORK_COLUMNS`, without unit and source).

    Raises:
        KeyError: no such frame (the message names those there are).
    """
    if frame == "forks":
        from ._forks import FORK_COLUMNS, forks

        dtypes = forks([]).dtypes
        return pd.DataFrame(
            [(name, str(dtypes[name]), None, None, doc) for name, doc in FORK_COLUMNS.items()],
            columns=["column", "dtype", "unit", "source", "doc"],
        )
    if frame not in ROW_RECORD:
        raise KeyError(f"no frame {frame!r}: one of {', '.join([*ROW_RECORD, 'forks'])}")
    record = ROW_RECORD[frame]
    return pd.DataFrame(
        [(c.name, c.dtype, c.unit, c.origin(record), c.doc) for c in COLUMNS[frame]],
        columns=["column", "dtype", "unit", "source", "doc"],
    )


for _f in (requests, turns, cache_losses, limit_hits, tool_calls, summary):
    _f.__doc__ = (_f.__doc__ or "").replace("{columns}", _doc_table(_f.__name__))
