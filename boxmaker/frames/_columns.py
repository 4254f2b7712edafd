"""The columns of the frames (:mod:`boxmaker.frames`), as data.

Each frame's columns are a tuple of :class:`Column` (name, dtype, unit, where the value comes
from, what it means): the one definition the frames are built from, their docstrings' column
tables are generated from (:func:`doc_table`) and :func:`boxmaker.frames.describe` shows. A new
column is one entry here (a ``field`` of the frame's record, an ``agg`` over another frame, or a
``derive`` from this frame's columns); a reader-filled one also needs a line in the frame's row
writer in :mod:`boxmaker.frames`.

Record shapes are :mod:`boxmaker.records`' (the current schema; older logs are upgraded on
read); token counts and milliseconds come from llama.cpp's ``timings`` object kept in each
``Usage`` record (``cache_n``, ``prompt_n``, ``predicted_n`` in tokens; ``prompt_ms``,
``predicted_ms`` in milliseconds).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records import FORK_POINTS, LIMIT_KINDS, NOT_RUN_REASONS, TURN_END_OUTCOMES
from ..session import CALL_SOURCES, ENDING_LIMITS

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CACHE_LOSS_COLUMNS",
    "COLUMNS",
    "ENDING_LIMITS",
    "FROM_PARENT_DOC",
    "LIMIT_HIT_COLUMNS",
    "REQUEST_COLUMNS",
    "ROW_RECORD",
    "SUMMARY_COLUMNS",
    "TIME",
    "TOOL_CALL_COLUMNS",
    "TURN_COLUMNS",
    "TURN_OUTCOMES",
    "Column",
    "doc_table",
    "ratio",
]

TURN_OUTCOMES: tuple[str, ...] = (*TURN_END_OUTCOMES, "no_answer")
"""How a turn ended (the categories of ``turns().outcome``): the outcomes of
:data:`boxmaker.records.TURN_END_OUTCOMES` (``answered``, ``length``, ``tool_iterations``,
``repeated_call``, ``session_full``, ``cancelled``, ``infer_error``, ``loop``,
``answered_after_limit``, ``process_died`` and the client-side bounds' ``completion_tokens``,
``completions``, ``turn_deadline``, ``tool_calls``, ``tool_arguments``), then ``no_answer`` for a
turn without a ``TurnEnd`` record (a log of schema 1, or a turn still running) whose records do
not say how it ended; see :func:`boxmaker.frames.turns`."""


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
        fallback: with ``field``: another key of the record, read where ``field`` is missing
            (a figure the server sent another way: OpenAI ``usage`` without llama.cpp's
            ``timings``).
        agg: ``(frame, column)``: the sum of ``column`` (with ``None``: the count) over
            another frame's rows that belong to this row (its turn or its session).
        where: with ``agg``: only rows whose ``column`` equals ``value``.
        copied: with ``agg``: over the rows copied from a fork's parent (``from_parent``)
            instead of the own ones. Without it a ``summary`` column counts a log's own rows
            only (``from_parent`` false) and a ``turns`` column the turn's rows of the turn's
            own ``from_parent``, so that summing any frame over a batch of forks counts each
            completion once (see :data:`FROM_PARENT_DOC`).
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
    fallback: str | None = None
    agg: tuple[str, str | None] | None = None
    where: tuple[str, str] | None = None
    copied: bool = False
    derive: Callable[[pd.DataFrame], Any] | None = None
    categories: tuple[str, ...] = ()
    source: str = "log position"

    def origin(self, record: str) -> str:
        """Where the value comes from, as the docs show it."""
        if self.field is not None:
            also = f", else {record}.{self.fallback}" if self.fallback else ""
            return f"{record}.{self.field}{also}"
        if self.agg is not None:
            frame, column = self.agg
            what = f"sum of {frame}.{column}" if column else f"count of {frame} rows"
            what += f" where {self.where[0]} == {self.where[1]!r}" if self.where else ""
            return what + (" where from_parent" if self.copied else "")
        if self.derive is not None:
            return "derived"
        return self.source


def ratio(num: Any, den: Any) -> Any:
    """``num / den`` as Float64, ``<NA>`` where either is missing or ``den`` is 0."""
    den = den.astype("Float64")
    return (num.astype("Float64") / den.where(den != 0)).astype("Float64")


TIME = "datetime64[ns, UTC]"

FROM_PARENT_DOC = (
    "the row is made of records copied from the parent of a fork (a fork's log holds its "
    "parent's records 1..Forked.record-1 before its own; boxmaker.session.Session.fork): "
    "they count for the parent, so leave them out (~from_parent) when summing over a parent "
    "and its forks; False in logs that are no fork"
)
"""The doc of the ``from_parent`` column of the per-row frames."""


def _from_parent(more: str = "") -> Column:
    """The ``from_parent`` column (``more``: what it means in this frame)."""
    doc = FROM_PARENT_DOC + (f"; {more}" if more else "")
    return Column(
        name="from_parent", dtype="boolean", doc=doc, source="record index < forked.record"
    )


REQUEST_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id (the baseline's session_id)"),
    Column(name="request", dtype="Int64", doc="number of the completion in the session, from 1"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session, from 1"),
    Column(name="turn_request", dtype="Int64", doc="number of the completion in the turn, from 1"),
    Column(name="time", dtype=TIME, doc="when the completion ended", field="time"),
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
        name="usage_prompt_tokens",
        dtype="Int64",
        unit="tokens",
        doc="the OpenAI usage.prompt_tokens as the server sent it (<NA>: not sent)",
        field="prompt_tokens",
    ),
    Column(
        name="usage_completion_tokens",
        dtype="Int64",
        unit="tokens",
        doc="the OpenAI usage.completion_tokens as the server sent it (<NA>: not sent)",
        field="completion_tokens",
    ),
    Column(
        name="prompt_tokens",
        dtype="Int64",
        unit="tokens",
        doc="prompt size: cached + processed, else (no timings: vLLM, proxies) "
        "usage_prompt_tokens; <NA> when neither was sent",
        derive=lambda f: (f.cached_tokens + f.processed_tokens).fillna(f.usage_prompt_tokens),
    ),
    Column(
        name="generated_tokens",
        dtype="Int64",
        unit="tokens",
        doc="tokens generated (reasoning, content and tool calls): timings.predicted_n, else "
        "usage.completion_tokens",
        field="timings.predicted_n",
        fallback="completion_tokens",
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
        derive=lambda f: ratio(f.processed_tokens * 1000, f.prompt_ms),
    ),
    Column(
        name="generation_tokens_per_s",
        dtype="Float64",
        unit="tokens/s",
        doc="generation rate: generated_tokens / generation_ms",
        derive=lambda f: ratio(f.generated_tokens * 1000, f.generation_ms),
    ),
    Column(
        name="cache_reuse_ratio",
        dtype="Float64",
        unit="ratio",
        doc="share of the prompt reused from the cache: cached_tokens / prompt_tokens",
        derive=lambda f: ratio(f.cached_tokens, f.prompt_tokens),
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
    _from_parent(),
)


_SUMMED = (
    ("cached_tokens", "Int64", "tokens"),
    ("processed_tokens", "Int64", "tokens"),
    ("prompt_tokens", "Int64", "tokens"),
    ("generated_tokens", "Int64", "tokens"),
    ("reasoning_tokens", "Int64", "tokens"),
    ("prompt_ms", "Float64", "ms"),
    ("generation_ms", "Float64", "ms"),
)
"""The requests' columns that turns and sessions sum (name, dtype, unit)."""


def _request_sums(scope: str) -> tuple[Column, ...]:
    """The sums of :data:`_SUMMED` over a ``scope``'s (turn's, session's) requests."""
    return tuple(
        Column(
            name=n,
            dtype=d,
            unit=u,
            doc=f"sum over the {scope}'s requests of {n}",
            agg=("requests", n),
        )
        for n, d, u in _SUMMED
    )


def _loss_sums(scope: str) -> tuple[Column, ...]:
    """The sums over a ``scope``'s (turn's, session's) cache losses: the two quantities of a
    loss under their one name each (``lost_tokens``, ``reprocessed_tokens``) and the time."""
    return (
        Column(
            name="lost_tokens",
            dtype="Int64",
            unit="tokens",
            doc=f"sum over the {scope}'s cache losses of expected - reused (the previous "
            "prompts' tokens not reused)",
            agg=("cache_losses", "lost_tokens"),
        ),
        Column(
            name="reprocessed_tokens",
            dtype="Int64",
            unit="tokens",
            doc=f"sum over the {scope}'s cache losses of the tokens the server processed "
            "again (prompt and reply; <NA> when a loss does not say)",
            agg=("cache_losses", "reprocessed_tokens"),
        ),
        Column(
            name="reprocessed_ms",
            dtype="Float64",
            unit="ms",
            doc=f"sum over the {scope}'s cache losses of the time that cost (<NA> when a loss "
            "does not say)",
            agg=("cache_losses", "reprocessed_ms"),
        ),
    )


TURN_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session, from 1"),
    Column(
        name="started",
        dtype=TIME,
        doc="the User record's time; a turn a fork continues from its parent's copied "
        "records (a rerun, an edited result): the fork's Forked record time, if later",
        source="user.time",
    ),
    Column(name="ended", dtype=TIME, doc="time of the turn's last record", source="*.time"),
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
        source="turn_end.outcome, else derived from the turn's records",
    ),
    Column(
        name="end_detail",
        dtype="string",
        doc="what the TurnEnd record says more: the limit's words, the error message "
        "(<NA> without a TurnEnd record)",
        source="turn_end.detail",
    ),
    Column(
        name="http_status",
        dtype="Int64",
        doc="HTTP status of the failed request of an infer_error turn (<NA> otherwise, or when "
        "no response came)",
        source="turn_end.status",
    ),
    Column(
        name="requests",
        dtype="Int64",
        doc="the log's own completions (a fork's copied ones are inherited_requests)",
        agg=("requests", None),
    ),
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
    *_request_sums("turn"),
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
    *_loss_sums("turn"),
    Column(name="limit_hits", dtype="Int64", doc="LimitHit records", agg=("limit_hits", None)),
    _from_parent(
        "every record of the turn copied from the parent: a turn that straddles the fork point "
        "(edited_result: its first records copied, the edited result and what follows the "
        "fork's) is the fork's own, its counts and sums over its own records only (its copied "
        "completions are requests rows with from_parent)"
    ),
)

CACHE_LOSS_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="request", dtype="Int64", doc="the completion whose cache reuse fell short"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session"),
    Column(name="time", dtype=TIME, doc="when the loss was recorded", field="time"),
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
        doc="tokens of the previous prompt the server did not reuse: expected - reused "
        "(boxmaker.cache.CacheOutcome.lost)",
        derive=lambda f: f.expected_tokens - f.reused_tokens,
    ),
    Column(
        name="reprocessed_tokens",
        dtype="Int64",
        unit="tokens",
        doc="what the server processed again of what its slot held (the previous prompt and "
        "reply; boxmaker.cache.reprocessed); <NA>: the log does not say (older logs)",
        field="reprocessed",
    ),
    Column(
        name="reprocessed_ms",
        dtype="Float64",
        unit="ms",
        doc="what processing reprocessed_tokens again cost, at the request's prompt rate "
        "(<NA>: the log does not say)",
        field="reprocessed_ms",
    ),
    Column(
        name="position",
        dtype="Int64",
        unit="tokens",
        doc="first token (0-based) where the slot's tokens and the new prompt differ "
        "(<NA>: not looked into)",
        field="position",
    ),
    Column(
        name="cause",
        dtype="category",
        doc="why the reuse fell short (boxmaker.cache.CAUSES: history_rewritten, history_edited, "
        "evicted, checkpoint, truncated, unknown, idle_slot_cleared, restore_cold, slept, "
        "model_swapped; <NA>: not looked into)",
        field="cause",
    ),
    Column(
        name="old_window",
        dtype="string",
        doc="a short text window of the old prompt around position",
        field="old_window",
    ),
    Column(
        name="new_window",
        dtype="string",
        doc="a short text window of the new prompt around position",
        field="new_window",
    ),
    Column(
        name="detail",
        dtype="string",
        doc="what forensics saw, in words, or why it could not look",
        field="detail",
    ),
    _from_parent(),
)

LIMIT_HIT_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session"),
    Column(name="request", dtype="Int64", doc="the session's latest completion at the time"),
    Column(name="time", dtype=TIME, doc="when the limit fired", field="time"),
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
        doc="the limit ended the turn (all kinds but thinking_cap and tool_result_cap)",
        derive=lambda f: f.kind.isin(list(ENDING_LIMITS)).astype("boolean"),
    ),
    _from_parent(),
)

TOOL_CALL_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="turn", dtype="Int64", doc="number of the turn in the session"),
    Column(name="time", dtype=TIME, doc="when the result was recorded", field="time"),
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
        name="source",
        dtype="category",
        categories=CALL_SOURCES,
        doc="what answered the call (boxmaker.session.CALL_SOURCES): ran (the tool ran), "
        "not_run (the loop answered for it), replayed (a fork took its parent's result), "
        "edited (a researcher's text at a fork point)",
        source="tool_result.not_run and .source",
    ),
    Column(
        name="ran",
        dtype="boolean",
        doc="the tool ran: source == 'ran' (False: the loop answered for it, or a fork "
        "replayed or edited its result)",
        derive=lambda f: (f.source == "ran").astype("boolean"),
    ),
    Column(
        name="not_run",
        dtype="category",
        categories=NOT_RUN_REASONS,
        doc="why the loop answered without running the tool (boxmaker.records.NOT_RUN_REASONS; "
        "<NA>: it ran)",
        field="not_run",
    ),
    Column(
        name="server",
        dtype="category",
        doc="the tool port's server that answered (an MCP server's name; <NA>: local tool)",
        field="server",
    ),
    Column(
        name="approval",
        dtype="category",
        categories=("approved", "denied"),
        doc="the decision on a call that needed approval (<NA>: none was asked)",
        source="approval.decision (by call)",
    ),
    Column(
        name="approved_by",
        dtype="category",
        doc="who or what decided (an ask callback's name, timeout, cancel)",
        source="approval.by (by call)",
    ),
    Column(
        name="approval_reason",
        dtype="string",
        doc="the decider's words",
        source="approval.reason (by call)",
    ),
    Column(
        name="approval_wait_ms",
        dtype="Float64",
        unit="ms",
        doc="time from asking to the decision",
        source="approval.waited_ms (by call)",
    ),
    _from_parent(),
)

SUMMARY_COLUMNS: tuple[Column, ...] = (
    Column(name="session", dtype="category", doc="session id"),
    Column(name="path", dtype="string", doc="the log file", source="file"),
    Column(
        name="started",
        dtype=TIME,
        doc="when the log's own part started: the baseline's time, or a fork's Forked record "
        "time (a fork's baseline is its parent's)",
        source="baseline.time, forked.time",
    ),
    Column(name="ended", dtype=TIME, doc="the last record's time", source="*.time"),
    Column(
        name="records",
        dtype="Int64",
        doc="records after the baseline (a fork's: its Forked, copied and own records)",
        source="lines",
    ),
    Column(name="unknown_records", dtype="Int64", doc="records of unknown type (skipped)"),
    Column(
        name="parent_session",
        dtype="string",
        doc="the session this log was forked from (<NA>: no fork)",
        source="forked.parent_session",
    ),
    Column(
        name="fork_turn",
        dtype="Int64",
        doc="the parent's turn the fork branches at (<NA>: no fork)",
        source="forked.turn",
    ),
    Column(
        name="fork_point",
        dtype="category",
        categories=FORK_POINTS,
        doc="where in that turn (boxmaker.records.FORK_POINTS)",
        source="forked.point",
    ),
    Column(
        name="fork_settings",
        dtype="string",
        doc="what the fork changed, as JSON with sorted keys (Forked.settings; {} when nothing "
        "was said; <NA>: no fork)",
        source="forked.settings",
    ),
    Column(
        name="inherited_turns",
        dtype="Int64",
        doc="turns copied from the parent (turns rows with from_parent; 0: no fork); the "
        "other totals count the log's own records only",
        agg=("turns", None),
        copied=True,
    ),
    Column(
        name="inherited_requests",
        dtype="Int64",
        doc="completions copied from the parent (requests rows with from_parent), a straddling "
        "turn's included",
        agg=("requests", None),
        copied=True,
    ),
    Column(
        name="turns",
        dtype="Int64",
        doc="the log's own turns (User records; a fork's copied ones are inherited_turns)",
        agg=("turns", None),
    ),
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
    *_request_sums("session"),
    Column(
        name="cache_reuse_ratio",
        dtype="Float64",
        unit="ratio",
        doc="cached_tokens / prompt_tokens over the session (<NA> where either is unknown)",
        derive=lambda f: ratio(f.cached_tokens, f.prompt_tokens),
    ),
    Column(
        name="cache_losses",
        dtype="Int64",
        doc="CacheLoss records",
        agg=("cache_losses", None),
    ),
    *_loss_sums("session"),
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

ROW_RECORD = {
    "requests": "usage",
    "turns": "user",
    "cache_losses": "cache_loss",
    "limit_hits": "limit_hit",
    "tool_calls": "tool_result",
    "summary": "baseline",
}
"""The record type each frame has one row per."""


def doc_table(frame: str) -> str:
    """The column table of ``frame`` for its function's docstring: one list item per column,
    name (dtype, unit): doc [source], each name and source a literal (the docs site renders it)."""
    record = ROW_RECORD[frame]
    lines = []
    for c in COLUMNS[frame]:
        unit = f", {c.unit}" if c.unit else ""
        lines.append(f"        - ``{c.name}`` ({c.dtype}{unit}): {c.doc} [``{c.origin(record)}``]")
    return "\n" + "\n".join(lines)  # a blank line: the list starts a block of its own


def fork_settings_text(forked: Mapping[str, Any] | None) -> str | None:
    """A ``Forked`` record's ``settings`` (JSON object) as the frames show it: JSON with
    sorted keys, ``"{}"`` when nothing was said, ``None`` when the log is no fork."""
    if forked is None:
        return None
    return json.dumps(forked.get("settings") or {}, sort_keys=True)
