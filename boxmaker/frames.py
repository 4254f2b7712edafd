"""Session logs as pandas frames: usage, turns, cache losses, limit hits, tool calls, summary.

Every function takes a *source*: one log path, a directory (searched recursively for
``*.jsonl``), a :class:`~boxmaker.session.Session`, or a list of any of these, and returns a
:class:`pandas.DataFrame` whose columns are defined as data in :data:`COLUMNS` (name, dtype,
unit, where the value comes from, what it means); each function's docstring ends with its
column table, generated from the same list, and :func:`describe` gives it as a frame. Units are
in the names (``_tokens``, ``_ms``, ``_chars``, ``_per_s``); times are UTC
(``datetime64[ns, UTC]``); kinds are categoricals; counts are nullable ``Int64``.

The log format is :mod:`boxmaker.records` (record JSON shapes) and :mod:`boxmaker.session` (the
file layout); token counts and milliseconds come from llama.cpp's ``timings`` object kept in each
``Usage`` record (``cache_n``, ``prompt_n``, ``predicted_n`` in tokens; ``prompt_ms``,
``predicted_ms`` in milliseconds).

Reading follows :meth:`Session.open`'s rules, read-only (a log is never modified here):

- a torn last line (no newline) is dropped with a :class:`LogReadWarning`;
- records of a type this version does not know are skipped with a warning (counted in
  ``summary().unknown_records``);
- a log that :meth:`Session.open` would refuse (unreadable, no baseline, a newer schema, a
  line that is not a JSON object, a field of the wrong type) is left out with a warning that
  names the file and line, and the other logs are still read.

Warnings are :class:`LogReadWarning` (a :class:`UserWarning`); turn them into errors with
``warnings.simplefilter("error", LogReadWarning)``.

For speed the reader does not build record objects: each line is parsed with one
``json.loads``, values go into column lists, and each frame is constructed once.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

import numpy as np
import pandas as pd

from .records import LIMIT_KINDS, SCHEMA_VERSION, record_to_json
from .session import Session
from .turn import ALREADY_MADE

__all__ = [
    "COLUMNS",
    "ENDING_LIMITS",
    "TURN_OUTCOMES",
    "Column",
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

TURN_OUTCOMES: tuple[str, ...] = (
    "answered",
    "length",
    "tool_iterations",
    "repeated_call",
    "session_full",
    "cancelled",
    "no_answer",
)
"""How a turn ended (the categories of ``turns().outcome``); see :func:`turns`."""

ENDING_LIMITS: Mapping[str, str] = {
    "tool_iterations": "tool_iterations",
    "repeated_call": "repeated_call",
    "context_full": "session_full",
}
"""The limit kinds that end a turn, and the turn outcome each gives."""

_NOT_RUN = "This call was not run: the turn ended ("
"""How :mod:`boxmaker.turn` answers the tool calls a turn ended before running."""


class LogReadWarning(UserWarning):
    """A session log, or part of one, could not be read; the message names file and line."""


@dataclass(frozen=True, kw_only=True)
class Column:
    """One column of a frame: its definition and its documentation in one place.

    Exactly one of ``field``, ``agg``, ``derive`` says where the value comes from; with none,
    the reader fills it from its position in the log (session, turn, request number, ...) and
    ``source`` says how.

    Attributes:
        name: the column name (with its unit as a suffix where there is one).
        dtype: the pandas dtype (``"Int64"``, ``"Float64"``, ``"boolean"``, ``"string"``,
            ``"category"``, ``"datetime64[ns, UTC]"``).
        unit: ``"tokens"``, ``"ms"``, ``"chars"``, ``"tokens/s"``, ``"ratio"`` or ``""``.
        doc: what the value means.
        field: a key (or ``"outer.inner"`` path) of the frame's record JSON, read as is.
        agg: ``(frame, column)``: the sum of ``column`` (with ``None``: the count) over
            another frame's rows that belong to this row (its turn or its session).
        where: with ``agg``: only rows whose ``column`` equals ``value``.
        derive: computed from this frame's other columns.
        categories: for ``"category"``: the known categories, in order (values outside them
            are added after).
        source: for reader-filled columns: where the value comes from, for the docs.
    """

    name: str
    dtype: str
    unit: str = ""
    doc: str
    field: str | None = None
    agg: tuple[str, str | None] | None = None
    where: tuple[str, str] | None = None
    derive: Callable[[pd.DataFrame], Any] | None = None
    categories: tuple[str, ...] = ()
    source: str = "log position"

    def origin(self, record: str) -> str:
        """Where the value comes from, as the docs show it."""
        if self.field is not None:
            return f"{record}.{self.field}"
        if self.agg is not None:
            frame, column = self.agg
            what = f"sum of {frame}.{column}" if column else f"count of {frame} rows"
            return what + (f" where {self.where[0]} == {self.where[1]!r}" if self.where else "")
        if self.derive is not None:
            return "derived"
        return self.source


def _ratio(num: Any, den: Any) -> Any:
    """``num / den`` as Float64, ``<NA>`` where ``den`` is 0 or missing."""
    den = den.astype("Float64")
    return (num.astype("Float64") / den.where(den != 0)).astype("Float64")


_TIME = "datetime64[ns, UTC]"

REQUEST_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id (the baseline's session_id)"),
    Column(name="request", dtype="Int64", doc="number of the completion in the session, from 1"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session, from 1"),
    Column(name="turn_request", dtype="Int64", doc="number of the completion in the turn, from 1"),
    Column(name="time", dtype=_TIME, doc="when the completion ended", field="time"),
    Column(
        name="cached_tokens",
        dtype="Int64",
        unit="tokens",
        doc="prompt tokens reused from the slot's cache",
        field="timings.cache_n",
    ),
    Column(
        name="processed_tokens",
        dtype="Int64",
        unit="tokens",
        doc="prompt tokens processed (not from the cache)",
        field="timings.prompt_n",
    ),
    Column(
        name="prompt_tokens",
        dtype="Int64",
        unit="tokens",
        doc="prompt size: cached + processed",
        derive=lambda f: f.cached_tokens + f.processed_tokens,
    ),
    Column(
        name="generated_tokens",
        dtype="Int64",
        unit="tokens",
        doc="tokens generated (reasoning, content and tool calls)",
        field="timings.predicted_n",
    ),
    Column(
        name="reasoning_tokens",
        dtype="Int64",
        unit="tokens",
        doc="streamed reasoning deltas (about one token each)",
        field="reasoning_tokens",
    ),
    Column(
        name="prompt_ms",
        dtype="Float64",
        unit="ms",
        doc="time to process the prompt",
        field="timings.prompt_ms",
    ),
    Column(
        name="generation_ms",
        dtype="Float64",
        unit="ms",
        doc="time to generate",
        field="timings.predicted_ms",
    ),
    Column(
        name="prompt_tokens_per_s",
        dtype="Float64",
        unit="tokens/s",
        doc="prompt processing rate: processed_tokens / prompt_ms",
        derive=lambda f: _ratio(f.processed_tokens * 1000, f.prompt_ms),
    ),
    Column(
        name="generation_tokens_per_s",
        dtype="Float64",
        unit="tokens/s",
        doc="generation rate: generated_tokens / generation_ms",
        derive=lambda f: _ratio(f.generated_tokens * 1000, f.generation_ms),
    ),
    Column(
        name="cache_reuse_ratio",
        dtype="Float64",
        unit="ratio",
        doc="share of the prompt reused from the cache: cached_tokens / prompt_tokens",
        derive=lambda f: _ratio(f.cached_tokens, f.prompt_tokens),
    ),
    Column(
        name="thinking_capped",
        dtype="boolean",
        doc="the turn's reasoning budget ended this completion's reasoning",
        field="thinking_capped",
    ),
    Column(
        name="finish_reason",
        dtype="string",
        doc="llama.cpp's finish_reason: stop, length (cut at max_tokens), tool_calls",
        field="finish_reason",
    ),
    Column(
        name="tool_calls",
        dtype="Int64",
        doc="tool calls in the completion (its Assistant record)",
        source="assistant.tool_calls (count)",
    ),
)

TURN_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session, from 1"),
    Column(name="started", dtype=_TIME, doc="the User record's time", source="user.time"),
    Column(name="ended", dtype=_TIME, doc="time of the turn's last record", source="*.time"),
    Column(
        name="wall_ms",
        dtype="Float64",
        unit="ms",
        doc="ended - started",
        derive=lambda f: (f.ended - f.started).dt.total_seconds().astype("Float64") * 1000,
    ),
    Column(
        name="outcome",
        dtype="category",
        categories=TURN_OUTCOMES,
        doc="how the turn ended (see turns())",
        source="derived from the turn's records",
    ),
    Column(name="requests", dtype="Int64", doc="completions", agg=("requests", None)),
    Column(
        name="iterations",
        dtype="Int64",
        doc="completions with tool calls (the loop's tool iterations)",
        source="assistant records with tool_calls",
    ),
    Column(
        name="tool_calls",
        dtype="Int64",
        doc="tool calls the model made",
        agg=("requests", "tool_calls"),
    ),
    Column(
        name="tool_results",
        dtype="Int64",
        doc="ToolResult records (including calls answered without running)",
        agg=("tool_calls", None),
    ),
    *(
        Column(name=n, dtype=d, unit=u, doc=f"sum over the turn's requests of {n}", agg=a)
        for n, d, u, a in (
            ("cached_tokens", "Int64", "tokens", ("requests", "cached_tokens")),
            ("processed_tokens", "Int64", "tokens", ("requests", "processed_tokens")),
            ("generated_tokens", "Int64", "tokens", ("requests", "generated_tokens")),
            ("reasoning_tokens", "Int64", "tokens", ("requests", "reasoning_tokens")),
            ("prompt_ms", "Float64", "ms", ("requests", "prompt_ms")),
            ("generation_ms", "Float64", "ms", ("requests", "generation_ms")),
        )
    ),
    Column(
        name="thinking_capped",
        dtype="Int64",
        doc="completions whose reasoning the budget ended",
        agg=("requests", "thinking_capped"),
    ),
    Column(
        name="cache_losses",
        dtype="Int64",
        doc="CacheLoss records",
        agg=("cache_losses", None),
    ),
    Column(
        name="lost_tokens",
        dtype="Int64",
        unit="tokens",
        doc="prompt tokens processed again after cache losses",
        agg=("cache_losses", "lost_tokens"),
    ),
    Column(name="limit_hits", dtype="Int64", doc="LimitHit records", agg=("limit_hits", None)),
)

CACHE_LOSS_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="request", dtype="Int64", doc="the completion whose cache reuse fell short"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session"),
    Column(name="time", dtype=_TIME, doc="when the loss was recorded", field="time"),
    Column(
        name="expected_tokens",
        dtype="Int64",
        unit="tokens",
        doc="previous cache_n + prompt_n: what should have been reused",
        field="expected",
    ),
    Column(
        name="reused_tokens",
        dtype="Int64",
        unit="tokens",
        doc="the new cache_n: what was reused",
        field="reused",
    ),
    Column(
        name="lost_tokens",
        dtype="Int64",
        unit="tokens",
        doc="expected - reused: tokens processed again",
        derive=lambda f: f.expected_tokens - f.reused_tokens,
    ),
    Column(
        name="prompt_ms_per_token",
        dtype="Float64",
        unit="ms",
        doc="the request's prompt time per processed token",
        source="requests.prompt_ms / requests.processed_tokens",
    ),
    Column(
        name="lost_ms",
        dtype="Float64",
        unit="ms",
        doc="what processing the lost tokens again cost: lost_tokens * prompt_ms_per_token",
        derive=lambda f: f.lost_tokens.astype("Float64") * f.prompt_ms_per_token,
    ),
)

LIMIT_HIT_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session"),
    Column(name="request", dtype="Int64", doc="the session's latest completion at the time"),
    Column(name="time", dtype=_TIME, doc="when the limit fired", field="time"),
    Column(
        name="kind",
        dtype="category",
        categories=LIMIT_KINDS,
        doc="which limit (boxmaker.records.LIMIT_KINDS)",
        field="kind",
    ),
    Column(name="detail", dtype="string", doc="what fired, in words", field="detail"),
    Column(
        name="ended_turn",
        dtype="boolean",
        doc="the limit ended the turn (tool_iterations, repeated_call, context_full)",
        derive=lambda f: f.kind.isin(list(ENDING_LIMITS)).astype("boolean"),
    ),
)

TOOL_CALL_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session"),
    Column(name="time", dtype=_TIME, doc="when the result was recorded", field="time"),
    Column(name="call", dtype="Int64", doc="the session's tool-call number", field="call"),
    Column(name="name", dtype="category", doc="tool name", field="name"),
    Column(
        name="tool_call_id", dtype="string", doc="the model's id of the call", field="tool_call_id"
    ),
    Column(
        name="arguments_chars",
        dtype="Int64",
        unit="chars",
        doc="length of the model's arguments text (<NA> when the call is not found)",
        source="assistant.tool_calls[].arguments (by tool_call_id)",
    ),
    Column(
        name="result_chars",
        dtype="Int64",
        unit="chars",
        doc="length of the result text sent to the model (after capping)",
        source="tool_result.content (length)",
    ),
    Column(name="truncated", dtype="boolean", doc="cut by the result cap", field="truncated"),
    Column(name="data_class", dtype="category", doc="label of the data", field="data_class"),
    Column(name="untrusted", dtype="boolean", doc="content from outside", field="untrusted"),
    Column(
        name="ran",
        dtype="boolean",
        doc="the tool ran (False: the loop answered for it: a repeat, or the turn ended)",
        source="tool_result.content (the loop's texts)",
    ),
)

SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="path", dtype="string", doc="the log file", source="file"),
    Column(name="started", dtype=_TIME, doc="the baseline's time", source="baseline.time"),
    Column(name="ended", dtype=_TIME, doc="the last record's time", source="*.time"),
    Column(name="records", dtype="Int64", doc="records after the baseline", source="lines"),
    Column(name="unknown_records", dtype="Int64", doc="records of unknown type (skipped)"),
    Column(name="turns", dtype="Int64", doc="turns (User records)", agg=("turns", None)),
    *(
        Column(
            name=f"{o}_turns",
            dtype="Int64",
            doc=f"turns whose outcome is {o}",
            agg=("turns", None),
            where=("outcome", o),
        )
        for o in TURN_OUTCOMES
    ),
    Column(name="requests", dtype="Int64", doc="completions", agg=("requests", None)),
    Column(
        name="tool_calls",
        dtype="Int64",
        doc="tool calls the model made",
        agg=("requests", "tool_calls"),
    ),
    *(
        Column(name=n, dtype=d, unit=u, doc=f"sum over the session's requests of {n}", agg=a)
        for n, d, u, a in (
            ("cached_tokens", "Int64", "tokens", ("requests", "cached_tokens")),
            ("processed_tokens", "Int64", "tokens", ("requests", "processed_tokens")),
            ("generated_tokens", "Int64", "tokens", ("requests", "generated_tokens")),
            ("reasoning_tokens", "Int64", "tokens", ("requests", "reasoning_tokens")),
            ("prompt_ms", "Float64", "ms", ("requests", "prompt_ms")),
            ("generation_ms", "Float64", "ms", ("requests", "generation_ms")),
        )
    ),
    Column(
        name="cache_reuse_ratio",
        dtype="Float64",
        unit="ratio",
        doc="cached_tokens / (cached_tokens + processed_tokens) over the session",
        derive=lambda f: _ratio(f.cached_tokens, f.cached_tokens + f.processed_tokens),
    ),
    Column(
        name="cache_losses",
        dtype="Int64",
        doc="CacheLoss records",
        agg=("cache_losses", None),
    ),
    Column(
        name="lost_tokens",
        dtype="Int64",
        unit="tokens",
        doc="prompt tokens processed again after cache losses",
        agg=("cache_losses", "lost_tokens"),
    ),
    Column(
        name="lost_ms",
        dtype="Float64",
        unit="ms",
        doc="time spent processing them again",
        agg=("cache_losses", "lost_ms"),
    ),
    Column(name="limit_hits", dtype="Int64", doc="LimitHit records", agg=("limit_hits", None)),
    *(
        Column(
            name=f"{k}_hits",
            dtype="Int64",
            doc=f"LimitHit records of kind {k}",
            agg=("limit_hits", None),
            where=("kind", k),
        )
        for k in LIMIT_KINDS
    ),
)

COLUMNS: Mapping[str, tuple[Column, ...]] = {
    "requests": REQUEST_COLUMNS,
    "turns": TURN_COLUMNS,
    "cache_losses": CACHE_LOSS_COLUMNS,
    "limit_hits": LIMIT_HIT_COLUMNS,
    "tool_calls": TOOL_CALL_COLUMNS,
    "summary": SUMMARY_COLUMNS,
}
"""The columns of each frame, in order: the one definition the frames and their docs use."""

_RECORD = {
    "requests": "usage",
    "turns": "user",
    "cache_losses": "cache_loss",
    "limit_hits": "limit_hit",
    "tool_calls": "tool_result",
    "summary": "baseline",
}
"""The record type each frame has one row per."""

_KEY = {"turns": "_turn_row", "summary": "_session_row"}
"""The hidden column that ties another frame's rows to a row of this frame."""

_OK_TYPES: Mapping[str, tuple[type, ...]] = {
    "Int64": (int,),
    "Float64": (int, float),
    "boolean": (bool,),
    "string": (str,),
    "category": (str,),
    _TIME: (str,),
}


# -- finding and reading logs ------------------------------------------------------------------


def find_logs(source: Source) -> list[Path | Session]:
    """The logs a source names, in order: files as given, directories searched recursively
    for ``*.jsonl`` (sorted), :class:`Session` objects as they are.

    A path that does not exist is left out with a :class:`LogReadWarning`.
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


class _Log(NamedTuple):
    session: str
    path: str
    head: dict[str, Any]
    records: list[Any]


class _BadLog(Exception):
    """A log the reader leaves out; the message names file and line."""


def _read_log(path: Path) -> _Log:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _BadLog(f"{path}: cannot read session log: {exc}") from exc
    end = raw.rfind(b"\n") + 1
    if end < len(raw):
        torn = raw[end:]
        warnings.warn(
            f"{path}: dropped a torn last line ({len(torn)} bytes, a write cut short: "
            f"{torn[:60]!r})",
            LogReadWarning,
            stacklevel=4,
        )
        raw = raw[:end]
    count = raw.count(b"\n")
    if not count:
        raise _BadLog(f"{path}: empty session log (no baseline line)")
    # One parse for the whole file: the lines joined into a JSON array. Any line that is not
    # one JSON value gives an error or a different count; then each line is parsed alone to
    # name the first bad one.
    try:
        records = json.loads(b"[" + raw[:-1].replace(b"\n", b",") + b"]")
    except ValueError:
        records = []
    if len(records) != count:
        records = []
        for number, line in enumerate(raw.split(b"\n")[:-1], start=1):
            try:
                records.append(json.loads(line))
            except ValueError as exc:
                raise _BadLog(f"{path}:{number}: corrupt line ({exc}): {line[:80]!r}") from exc
    head = records[0]
    if not isinstance(head, dict) or head.get("type") != "baseline":
        raise _BadLog(f"{path}:1: first line is not a baseline record")
    schema = head.get("schema")
    if not isinstance(schema, int) or schema > SCHEMA_VERSION:
        raise _BadLog(
            f"{path}:1: log schema {schema!r} is not readable by this version "
            f"(reads up to {SCHEMA_VERSION})"
        )
    sid = head.get("session_id")
    return _Log(str(sid) if sid else path.stem, str(path), head, records[1:])


def _session_log(session: Session) -> _Log:
    head = {"type": "baseline", "schema": session.schema, **record_to_json(session.baseline)}
    records = [record_to_json(r) for r in session.records]
    return _Log(session.id, str(session.path), head, records)


# -- the reader: one pass over each log fills the column lists of every frame ------------------


class _Getter(NamedTuple):
    extend: Callable[[Iterable[Any]], None]
    key: str
    sub: str | None
    ok: frozenset[type]
    name: str


class _Rows:
    """Column lists of every frame, filled log by log; hidden ``_*`` columns tie rows together."""

    def __init__(self, need: set[str]) -> None:
        self.need = need
        self.cols: dict[str, dict[str, list[Any]]] = {}
        self.getters: dict[str, list[_Getter]] = {}
        for frame, specs in COLUMNS.items():
            cols: dict[str, list[Any]] = {}
            getters: list[_Getter] = []
            for c in specs:
                if c.agg is not None or c.derive is not None:
                    continue
                cols[c.name] = []
                if c.field is not None:
                    key, _, sub = c.field.partition(".")
                    ok = frozenset((*_OK_TYPES[c.dtype], type(None)))
                    getters.append(_Getter(cols[c.name].extend, key, sub or None, ok, c.name))
            for hidden in ("_session_row", "_turn_row", "_request_row"):
                cols[hidden] = []
            self.cols[frame] = cols
            self.getters[frame] = getters

    def sizes(self) -> dict[str, int]:
        return {frame: len(cols["_session_row"]) for frame, cols in self.cols.items()}

    def cut(self, sizes: Mapping[str, int]) -> None:
        """Drop every row added after :meth:`sizes` gave ``sizes`` (a log that failed)."""
        for frame, cols in self.cols.items():
            for values in cols.values():
                del values[sizes[frame] :]

    def add(self, log: _Log) -> None:
        """Add one log's rows, or none of them (raising :class:`_BadLog`)."""
        sizes = self.sizes()
        try:
            self._walk(log)
        except _BadRecord as exc:
            self.cut(sizes)
            line = exc.args[1] + 2
            raise _BadLog(f"{log.path}:{line}: {exc.args[0]}") from None

    def _walk(self, log: _Log) -> None:
        sid = log.session
        req, tur, cl, lh, tc, sm = (
            self.cols[f]
            for f in ("requests", "turns", "cache_losses", "limit_hits", "tool_calls", "summary")
        )
        keep_cl, keep_lh, keep_tc = (
            f in self.need for f in ("cache_losses", "limit_hits", "tool_calls")
        )
        keep_turns = "turns" in self.need
        took: dict[str, tuple[list[dict[str, Any]], list[int]]] = {
            f: ([], []) for f in ("requests", "cache_losses", "limit_hits", "tool_calls")
        }
        s_row = len(sm["_session_row"])
        turn: int | None = None
        turn_row = -1
        request = turn_request = 0
        request_row = -1
        calls: int | None = None
        arguments: dict[Any, int] = {}
        unknown: dict[str, int] = {}
        last_time = log.head.get("time")
        # the open turn: started, iterations, answered, cancelled, ending limit
        started: Any = None
        iterations = 0
        answered = cancelled = cut = False
        ending: str | None = None

        def close_turn() -> None:
            if turn is None or not keep_turns:
                return
            outcome = (
                ENDING_LIMITS[ending]
                if ending
                else ("length" if cut else "answered")
                if answered
                else "cancelled"
                if cancelled
                else "no_answer"
            )
            for name, value in (
                ("session", sid),
                ("turn", turn),
                ("started", started),
                ("ended", last_time),
                ("outcome", outcome),
                ("iterations", iterations),
                ("_session_row", s_row),
                ("_turn_row", -1),
                ("_request_row", -1),
            ):
                tur[name].append(value)

        for i, rec in enumerate(log.records):
            if type(rec) is not dict:
                raise _BadRecord("line is not a JSON object", i)
            kind = rec.get("type")
            if kind == "usage":
                request += 1
                turn_request += 1
                request_row = len(req["_session_row"])
                took["requests"][0].append(rec)
                took["requests"][1].append(i)
                req["session"].append(sid)
                req["request"].append(request)
                req["turn"].append(turn)
                req["turn_request"].append(turn_request if turn is not None else None)
                req["tool_calls"].append(calls)
                req["_session_row"].append(s_row)
                req["_turn_row"].append(turn_row)
                req["_request_row"].append(request_row)
                calls = None
                cut = rec.get("finish_reason") == "length"
            elif kind == "assistant":
                tool_calls = rec.get("tool_calls") or ()
                try:
                    for c in tool_calls:
                        arguments[c["id"]] = len(c["arguments"])
                except (TypeError, KeyError) as exc:
                    raise _BadRecord(
                        f"malformed tool_calls in assistant record: {exc}", i
                    ) from None
                calls = len(tool_calls)
                answered = not tool_calls
                if tool_calls:
                    iterations += 1
            elif kind == "tool_result":
                if not keep_tc:
                    continue
                took["tool_calls"][0].append(rec)
                took["tool_calls"][1].append(i)
                content = rec.get("content")
                if type(content) is not str:
                    raise _BadRecord("tool_result record without a 'content' string", i)
                not_run = content.startswith(_NOT_RUN)
                cancelled = cancelled or (not_run and "cancelled" in content)
                answered = False
                tc["session"].append(sid)
                tc["turn"].append(turn)
                tc["arguments_chars"].append(arguments.get(rec.get("tool_call_id")))
                tc["result_chars"].append(len(content))
                tc["ran"].append(not (not_run or content == ALREADY_MADE))
                tc["_session_row"].append(s_row)
                tc["_turn_row"].append(turn_row)
                tc["_request_row"].append(request_row)
            elif kind == "user":
                close_turn()
                turn = 1 if turn is None else turn + 1
                turn_row = len(tur["_session_row"])
                turn_request = iterations = 0
                answered = cancelled = False
                ending = None
                started = rec.get("time")
                calls = None
            elif kind == "cache_loss":
                if not keep_cl:
                    continue
                took["cache_losses"][0].append(rec)
                took["cache_losses"][1].append(i)
                cl["session"].append(sid)
                cl["request"].append(request or None)
                cl["turn"].append(turn)
                cl["prompt_ms_per_token"].append(None)
                cl["_session_row"].append(s_row)
                cl["_turn_row"].append(turn_row)
                cl["_request_row"].append(request_row)
            elif kind == "limit_hit":
                if not keep_lh:
                    continue
                took["limit_hits"][0].append(rec)
                took["limit_hits"][1].append(i)
                hit = rec.get("kind")
                if hit in ENDING_LIMITS:
                    ending = hit
                lh["session"].append(sid)
                lh["turn"].append(turn)
                lh["request"].append(request or None)
                lh["_session_row"].append(s_row)
                lh["_turn_row"].append(turn_row)
                lh["_request_row"].append(request_row)
            else:
                unknown[str(kind)] = unknown.get(str(kind), 0) + 1
                continue
            time = rec.get("time")
            if time is not None:
                last_time = time
        close_turn()
        for frame, (recs, lines) in took.items():
            _take(recs, lines, self.getters[frame])
        if unknown:
            warnings.warn(
                f"{log.path}: records of unknown type skipped: {', '.join(sorted(unknown))}",
                LogReadWarning,
                stacklevel=5,
            )
        for name, value in (
            ("session", sid),
            ("path", log.path),
            ("started", log.head.get("time")),
            ("ended", last_time),
            ("records", len(log.records)),
            ("unknown_records", sum(unknown.values())),
            ("_session_row", s_row),
            ("_turn_row", -1),
            ("_request_row", -1),
        ):
            sm[name].append(value)


class _BadRecord(Exception):
    """args: (message, index of the record after the baseline)."""


def _take(recs: list[dict[str, Any]], lines: list[int], getters: list[_Getter]) -> None:
    """Add the field columns of one log's records of a frame (one list per column, types
    checked per column), or raise :class:`_BadRecord` for the first value of a wrong type."""
    for extend, key, sub, ok, name in getters:
        if sub is None:
            values = [r.get(key) for r in recs]
        else:
            values = [v.get(sub) if type(v) is dict else None for v in [r.get(key) for r in recs]]
        wrong = set(map(type, values)) - ok
        if wrong:
            j = next(j for j, v in enumerate(values) if type(v) in wrong)
            want = " or ".join(sorted(t.__name__ for t in ok if t is not type(None)))
            raise _BadRecord(f"{name}: {values[j]!r} is not {want}", lines[j])
        extend(values)


# -- building frames -------------------------------------------------------------------------


def _dtype(name: str) -> Any:
    """The pandas dtype object of a :class:`Column` dtype name."""
    return pd.api.types.pandas_dtype(name)


def _array(values: list[Any], column: Column) -> Any:
    if column.dtype == _TIME:
        times = pd.to_datetime(
            pd.Series(values, dtype=object), utc=True, format="ISO8601", errors="coerce"
        )
        return times.astype(_dtype(_TIME)).array
    if column.dtype == "category":
        known = list(column.categories)
        extra = sorted(set(values) - set(known) - {None})
        return pd.Categorical(values, categories=pd.Index(known + extra, dtype="str"))
    return pd.array(values, dtype=_dtype(column.dtype))


def _base(rows: _Rows, frame: str) -> pd.DataFrame:
    """A frame with its reader-filled and field columns, and the hidden ones."""
    cols = rows.cols[frame]
    data: dict[str, Any] = {}
    for c in COLUMNS[frame]:
        if c.name in cols:
            data[c.name] = _array(cols[c.name], c)
    for hidden in ("_session_row", "_turn_row", "_request_row"):
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
            grouped = src.groupby(key)
            values = grouped.size() if column is None else grouped[column].sum()
            full = values.reindex(range(len(df)), fill_value=0)
            df[c.name] = pd.array(full.to_numpy(), dtype=_dtype(c.dtype))
        elif c.derive is not None:
            df[c.name] = pd.array(c.derive(df), dtype=_dtype(c.dtype))
    return df


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


def _read(source: Source, want: Iterable[str]) -> _Rows:
    """Read every log of ``source``; rows only for the frames ``want`` needs (a record type
    no needed frame reads is skipped without its fields being checked)."""
    rows = _Rows(_needs(want))
    for item in find_logs(source):
        try:
            log = _session_log(item) if isinstance(item, Session) else _read_log(item)
            rows.add(log)
        except _BadLog as exc:
            warnings.warn(f"{exc}; the log is left out", LogReadWarning, stacklevel=3)
    return rows


class Frames(NamedTuple):
    """All frames of a source, read once (see :func:`load`)."""

    requests: pd.DataFrame
    turns: pd.DataFrame
    cache_losses: pd.DataFrame
    limit_hits: pd.DataFrame
    tool_calls: pd.DataFrame
    summary: pd.DataFrame


def _build(rows: _Rows, want: Iterable[str]) -> dict[str, pd.DataFrame]:
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
            per_token = _ratio(req.prompt_ms, req.processed_tokens).to_numpy(
                dtype=object, na_value=pd.NA
            )
            idx = df["_request_row"].to_numpy()
            df["prompt_ms_per_token"] = pd.array(
                [per_token[j] if j >= 0 else pd.NA for j in idx], dtype="Float64"
            )
        parts[frame] = _finish(frame, df, parts)
    return {frame: _public(frame, parts[frame]) for frame in want}


def load(source: Source) -> Frames:
    """All six frames of ``source``, reading each log once.

    Args:
        source: a log file, a directory (recursive ``*.jsonl``), a :class:`Session`, or a
            list of these.

    Returns:
        :class:`Frames` (``requests``, ``turns``, ``cache_losses``, ``limit_hits``,
        ``tool_calls``, ``summary``), each as its function returns it.

    Warns:
        LogReadWarning: a log, or part of one, was left out (the message names file and line).
    """
    built = _build(_read(source, Frames._fields), Frames._fields)
    return Frames(**built)


def _one(frame: str, source: Source) -> pd.DataFrame:
    return _build(_read(source, [frame]), [frame])[frame]


def requests(source: Source) -> pd.DataFrame:
    """One row per completion (``Usage`` record), in log order.

    Args:
        source: a log file, a directory (recursive ``*.jsonl``), a :class:`Session`, or a
            list of these.

    Warns:
        LogReadWarning: a log, or part of one, was left out (the message names file and line).

    A completion belongs to the turn of the latest ``User`` record before it; ``tool_calls``
    counts the calls of the ``Assistant`` record it follows. Values the server did not send
    (older llama.cpp builds send no ``timings``) are ``<NA>``.

    Columns:
    {columns}
    """
    return _one("requests", source)


def turns(source: Source) -> pd.DataFrame:
    """One row per turn: a turn starts at each ``User`` record and runs to the next one.

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    ``outcome`` is derived from the turn's records, in this order: a ``LimitHit`` that ends a
    turn gives its kind (``tool_iterations``, ``repeated_call``; ``context_full`` gives
    ``session_full``); a last message that is an ``Assistant`` without tool calls gives
    ``answered``, or ``length`` when that completion was cut at ``max_tokens``
    (``finish_reason: "length"``); otherwise the turn ended without an answer and the log
    does not record why
    (an inference error, or a cancel during a completion, append nothing): ``cancelled`` when a
    tool call was answered "not run: the turn was cancelled", else ``no_answer`` (which also
    covers a turn still running while the log was read).

    Columns:
    {columns}
    """
    return _one("turns", source)


def cache_losses(source: Source) -> pd.DataFrame:
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
    return _one("cache_losses", source)


def limit_hits(source: Source) -> pd.DataFrame:
    """One row per ``LimitHit`` record (the spec's five limits).

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    Columns:
    {columns}
    """
    return _one("limit_hits", source)


def tool_calls(source: Source) -> pd.DataFrame:
    """One row per ``ToolResult`` record (each tool call the loop answered).

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    Columns:
    {columns}
    """
    return _one("tool_calls", source)


def summary(source: Source) -> pd.DataFrame:
    """One row per session log with the totals a paper table needs.

    Args:
        source: as for :func:`requests`.

    Warns:
        LogReadWarning: as for :func:`requests`.

    Totals are over all of the session's records (the sums of the other frames' columns).

    Columns:
    {columns}
    """
    return _one("summary", source)


def describe(frame: str) -> pd.DataFrame:
    """The columns of ``frame`` (``"requests"``, ``"turns"``, ...) as a table: ``column``,
    ``dtype``, ``unit``, ``source``, ``doc``, from :data:`COLUMNS`.

    Raises:
        KeyError: no such frame.
    """
    record = _RECORD[frame]
    return pd.DataFrame(
        [(c.name, c.dtype, c.unit, c.origin(record), c.doc) for c in COLUMNS[frame]],
        columns=["column", "dtype", "unit", "source", "doc"],
    )


def _doc_table(frame: str) -> str:
    record = _RECORD[frame]
    lines = []
    for c in COLUMNS[frame]:
        unit = f", {c.unit}" if c.unit else ""
        lines.append(f"        ``{c.name}`` ({c.dtype}{unit}): {c.doc} [{c.origin(record)}]")
    return "\n".join(lines).lstrip()


for _f in (requests, turns, cache_losses, limit_hits, tool_calls, summary):
    _f.__doc__ = (_f.__doc__ or "").replace("{columns}", _doc_table(_f.__name__))
