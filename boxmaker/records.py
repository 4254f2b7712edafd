"""The record types of a session log, and their JSON form.

A session log (see :mod:`boxmaker.session`) is one JSON object per line. The first line is the
session's :class:`Baseline` (with ``"schema"``, the log format version, and ``"session_id"``);
every later line is one of the records below, tagged by ``"type"``::

    {"type": "user", "time": "2026-11-30T07:01:02.123456Z", "content": "What is the weather?"}

Every record carries ``time``: when it was made, UTC, written as ISO 8601 with a ``Z``. Time is
kept in the log only; it never goes into a message sent to the model.

Records are frozen: a record, once written, never changes. Field names follow the OpenAI
chat-completions API (``tool_calls``, ``tool_call_id``) and llama.cpp's server (``timings``
with ``cache_n``, ``prompt_n``, ``predicted_n``, ``prompt_ms``, ``predicted_ms``).

What each line may hold is one rule table, :data:`RULES`, derived from the dataclasses' type
hints (``Literal`` values, :data:`Tokens` and :data:`Millis` never negative, times within
:data:`TIME_RANGE`); :func:`check_records` applies it, and every reader of a log
(:func:`boxmaker.session.read_log`, so the session and the frames alike) and its writer use it.
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain, compress, repeat
from typing import Annotated, Any, Literal, TypeAlias

__all__ = [
    "APPROVAL_DECISIONS",
    "COUNTS",
    "FORK_POINTS",
    "LIMIT_KINDS",
    "NOT_RUN_REASONS",
    "RESULT_SOURCES",
    "RULES",
    "SCHEMA_VERSION",
    "SESSION_ID",
    "TIME_RANGE",
    "TURN_END_OUTCOMES",
    "Approval",
    "ApprovalDecision",
    "Assistant",
    "AtLeast",
    "Baseline",
    "CacheLoss",
    "Capabilities",
    "FieldRule",
    "ForkPoint",
    "Forked",
    "LimitHit",
    "LimitKind",
    "Millis",
    "NotRunReason",
    "Record",
    "RecordError",
    "ResultSource",
    "Tokens",
    "ToolCall",
    "ToolResult",
    "TurnEnd",
    "TurnEndOutcome",
    "Unknown",
    "Usage",
    "User",
    "baseline_from_json",
    "check_baseline",
    "check_records",
    "format_time",
    "is_measurement",
    "parse_time",
    "record_from_json",
    "record_to_json",
    "records_from_json",
    "time_problem",
    "utc_now",
]

SCHEMA_VERSION = 4
"""Version of the log format, written in each log's first line (the baseline).

1: the first format. 2: ``TurnEnd`` records, ``ToolResult.not_run``, the forensic fields of
``CacheLoss``. 3: records written together are framed as a group (``"group": n`` on the
first line, read all or nothing; :mod:`boxmaker.session`). 4: forks: a :class:`Forked`
record first in a fork's log, ``ToolResult.source`` (``replayed``, ``edited``), the turn
outcome and ``not_run`` reason ``diverged``. Older logs are upgraded on read
by the steps of :mod:`boxmaker.session`.

Added within schema 2, without a new version because nothing is lost when an older schema-2
reader meets them: ``ToolResult.server`` (an optional field, ignored by a reader that does not
know it, absent in older logs and read as ``None``) and :class:`Approval` records (kept as
``Unknown`` by a reader that does not know the type; never messages), and the loop guard's
values (:mod:`boxmaker.turn`): the limit kind, ``not_run`` reason and turn outcome
``loop``, and the outcome ``answered_after_limit``, the client-side bounds' limit kinds and
outcomes (``completion_tokens``, ``completions``, ``turn_deadline``, ``tool_calls``,
``tool_arguments``), the outcomes ``server_stopped`` and ``tool_call_in_content`` and the
``not_run`` reasons ``length`` and ``server_stopped``, :class:`Capabilities` records (never
messages) and the optional ``CacheLoss`` fields ``reprocessed`` and ``reprocessed_ms`` (read as
``None`` in older logs), and the cause ``checkpoint``. Readers now check these values by their
``Literal`` types (:data:`RULES`), so a value added later is refused by an older reader, naming
it (the log reads with the version that added it).
"""

LimitKind: TypeAlias = Literal[
    "tool_iterations",
    "repeated_call",
    "thinking_cap",
    "context_full",
    "tool_result_cap",
    "loop",
    "completion_tokens",
    "completions",
    "turn_deadline",
    "tool_calls",
    "tool_arguments",
]
LIMIT_KINDS: tuple[LimitKind, ...] = typing.get_args(LimitKind)
"""The kinds of limit: the six of the spec's limits table, in that order (``loop`` is the loop
guard's cycle, stale-result and per-tool cap rules, :mod:`boxmaker.turn`), then the turn's
client-side bounds (:class:`boxmaker.config.LoopLimits`), each ending the turn:
``completion_tokens`` (a stream went on past its token bound), ``completions`` (too many
completions in the turn), ``turn_deadline`` (the turn ran out of time), ``tool_calls`` (too
many calls in one completion), ``tool_arguments`` (one call's arguments too long)."""

TurnEndOutcome: TypeAlias = Literal[
    "answered",
    "length",
    "tool_iterations",
    "repeated_call",
    "session_full",
    "cancelled",
    "infer_error",
    "loop",
    "answered_after_limit",
    "process_died",
    "completion_tokens",
    "completions",
    "turn_deadline",
    "tool_calls",
    "tool_arguments",
    "server_stopped",
    "tool_call_in_content",
    "diverged",
]
TURN_END_OUTCOMES: tuple[TurnEndOutcome, ...] = typing.get_args(TurnEndOutcome)
"""How a turn can end (:attr:`TurnEnd.outcome`): an answer, an answer cut at ``max_tokens``
(``finish_reason: "length"``), each limit that ends a turn, a cancel, or a failed request;
``loop``, the loop guard ended it; ``answered_after_limit``, a limit ended it and, with
``loop.on_limit = "answer"``, one last completion without tools answered; ``process_died``,
written when a log is reopened: the process stopped inside that turn (killed, crashed);
``server_stopped``, the server ended the completion with a ``finish_reason`` other than
``stop``, ``length`` or ``tool_calls`` (vLLM's ``abort``, ``error``; the detail names it), not
an answer; ``tool_call_in_content``, the answer's content holds a tool call the server did not
parse (the detail names the format and the fix), not taken as the answer; ``diverged``
(schema 4), a fork's call differed from its parent's and the fork was asked to stop there
(:mod:`boxmaker.turn`'s replay). A ``length`` turn
whose completion had tool calls ran none of them (cut by ``max_tokens``; the detail says so).
Then the turn's client-side bounds, each named as its limit kind (:data:`LIMIT_KINDS`)."""

NotRunReason: TypeAlias = Literal[
    "repeat",
    "tool_iterations",
    "repeated_call",
    "cancelled",
    "infer_error",
    "process_died",
    "denied",
    "needs_approval",
    "loop",
    "invalid_call",
    "turn_deadline",
    "length",
    "server_stopped",
    "diverged",
]
NOT_RUN_REASONS: tuple[NotRunReason, ...] = typing.get_args(NotRunReason)
"""Why a tool call was answered without running (:attr:`ToolResult.not_run`): ``repeat``, the
first repeat of a call already made in the turn; the turn ended first (``tool_iterations``,
``repeated_call``, ``cancelled``, ``infer_error``); ``process_died``, the log was reopened
after the process stopped inside the turn; ``denied``, the tool port refused the call (a
person or a policy said no, or no one answered in time: see the :class:`Approval` record);
``needs_approval``, the port asked for an approval no one was there to give; ``loop``, the
loop guard's nudge (a cycle, stale results or a tool's call cap), or the turn ended by it;
``invalid_call``, the call could not be run as made (an unknown tool, arguments that are not
a JSON object or do not fit the tool's schema): the result says why, for the model to read;
``turn_deadline``, the turn ran out of time before the call ran; ``length``, the completion
was cut by ``max_tokens`` (``finish_reason: "length"``), so its calls may be cut too and none is
run; ``server_stopped``, the server ended the completion otherwise (``abort``...);
``diverged`` (schema 4), a fork stopped at its first call that differs from its parent's."""

ForkPoint: TypeAlias = Literal["after_turn", "before_answer", "edited_result"]
FORK_POINTS: tuple[ForkPoint, ...] = typing.get_args(ForkPoint)
"""Where a fork branches from its parent (:attr:`Forked.point`): ``after_turn``, after the
parent's turn ended (the fork's next turn is a new one); ``before_answer``, after the turn's
user message, before its first completion (the turn is re-run); ``edited_result``, at one
tool result of the turn, replaced by the researcher's text (the turn goes on from there)."""

ResultSource: TypeAlias = Literal["replayed", "edited"]
RESULT_SOURCES: tuple[ResultSource, ...] = typing.get_args(ResultSource)
"""Where a tool result came from when no tool ran for it (:attr:`ToolResult.source`):
``replayed``, the parent's result for the same call (a fork replaying its parent's tools);
``edited``, text a researcher wrote in place of the tool's output at a fork point."""

ApprovalDecision: TypeAlias = Literal["approved", "denied"]
APPROVAL_DECISIONS: tuple[ApprovalDecision, ...] = typing.get_args(ApprovalDecision)
"""What an :class:`Approval` decided."""


@dataclass(frozen=True)
class AtLeast:
    """``Annotated`` marker of a number field that is never below ``minimum`` (see
    :data:`RULES`)."""

    minimum: int


Tokens: TypeAlias = Annotated[int, AtLeast(0)]
"""A count of tokens: an ``int`` >= 0 (the log's rule refuses a negative one)."""

Millis: TypeAlias = Annotated[float, AtLeast(0)]
"""A duration in milliseconds: a finite number >= 0."""


def utc_now() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


def format_time(t: datetime) -> str:
    """ISO 8601 in UTC with microseconds and a ``Z``, e.g. ``2026-11-30T07:01:02.000001Z``."""
    return t.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """Parse :func:`format_time`'s output (any ISO 8601 with an offset) to an aware UTC
    datetime.

    Raises:
        ValueError: not ISO 8601, no UTC offset, or out of :data:`TIME_RANGE` once moved to
            UTC (the message says which: :func:`time_problem`).
    """
    why = time_problem(text)
    if why is not None:
        raise ValueError(f"time {text!r:.60} {why}")
    return datetime.fromisoformat(text).astimezone(UTC)


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One tool call as the model made it (OpenAI ``tool_calls[i]``).

    ``arguments`` is the model's exact text (a JSON object when the model behaved); it is kept
    raw even when it is not valid JSON.
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, kw_only=True)
class Baseline:
    """What every request of a session starts with: the system prompt and the offered tools.

    ``tools`` holds OpenAI tool definitions (``{"type": "function", "function": {"name",
    "description", "parameters"}}``), sent as the request's ``tools``.
    """

    system: str = ""
    tools: tuple[Mapping[str, Any], ...] = ()
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class User:
    """A user message."""

    content: str
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class Assistant:
    """One completion's message: the three fields of the streamed delta, joined.

    ``content`` from ``delta.content``, ``reasoning`` from ``delta.reasoning_content``,
    ``tool_calls`` from ``delta.tool_calls``; ``None`` where the model sent nothing.
    """

    content: str | None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class Usage:
    """What one completion cost, from llama.cpp's final stream event.

    ``timings`` is llama.cpp's object as sent (``cache_n``, ``prompt_n``, ``predicted_n`` in
    tokens; ``prompt_ms``, ``predicted_ms`` in milliseconds; per-token and per-second rates),
    empty when the server sent none (older builds). ``reasoning_tokens`` counts the streamed
    reasoning deltas (llama.cpp sends about one token per delta). ``prompt_tokens`` and
    ``completion_tokens`` are the OpenAI ``usage`` fields, ``None`` when absent.
    """

    timings: Mapping[str, float] = field(default_factory=dict)
    reasoning_tokens: Tokens = 0
    thinking_capped: bool = False
    prompt_tokens: Tokens | None = None
    completion_tokens: Tokens | None = None
    finish_reason: str | None = None
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class CacheLoss:
    """llama.cpp reused fewer prompt tokens than the previous request made cacheable.

    ``expected`` = previous ``cache_n + prompt_n`` (tokens), ``reused`` = new ``cache_n``.
    Schema 2 adds what cache forensics found, each ``None`` when not looked into:
    ``position``, the first token (0-based) at which the slot's tokens and the new prompt
    differ; ``cause``, why (``history_rewritten``, ``history_edited``, ``evicted``,
    ``truncated``, ``unknown``); ``old_window`` / ``new_window``, a short text window of the
    old and the new prompt around ``position``. ``detail`` (added later in schema 2, optional:
    older logs read with ``None``) is what forensics saw, in words, or why it could not look.
    ``reprocessed`` / ``reprocessed_ms`` (added later in schema 2, optional) are what the
    server actually processed again of what its slot held (previous prompt and reply), in
    tokens and ms (:func:`boxmaker.cache.reprocessed`): more than ``expected - reused`` when the
    reply was lost too; ``None`` when the timings did not say.
    """

    expected: Tokens
    reused: Tokens
    position: Tokens | None = None
    cause: str | None = None
    old_window: str | None = None
    new_window: str | None = None
    detail: str | None = None
    reprocessed: Tokens | None = None
    reprocessed_ms: Millis | None = None
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What the server's chat template and slots can do, read from llama.cpp's ``GET /props``
    once, before a session's first request (:meth:`boxmaker.client.Client.capabilities`).

    Each field is ``None`` when the server does not say. From ``chat_template_caps``, as
    named there: ``supports_tools`` (the template renders a tool list; llama.cpp silently
    drops ``tools`` from the prompt when it cannot), ``supports_tool_calls``,
    ``supports_parallel_tool_calls``, ``supports_system_role``,
    ``supports_preserve_reasoning``; ``reasoning``:
    ``supports_thinking`` where a build gives it, else whether the template text renders
    reasoning at all (``reasoning_content``, ``<think>``, ``thinking``). From the rest:
    ``slots`` (``total_slots``), ``n_ctx`` (tokens one slot may hold,
    ``default_generation_settings.n_ctx``), ``kv_unified`` (one KV pool all slots share: then
    ``n_ctx`` is the whole pool, not one slot's own), ``n_swa`` (the sliding-window size in
    tokens), ``cache_ram_mib`` (the cross-request prompt cache, MiB), ``model`` (alias or
    path). ``warning``: tools were offered to a template that cannot take them and the
    researcher chose to go on (``client.unsupported_tools = "warn"``); ``detail``: what could
    not be read, in words.
    """

    supports_tools: bool | None = None
    supports_tool_calls: bool | None = None
    supports_parallel_tool_calls: bool | None = None
    supports_system_role: bool | None = None
    supports_preserve_reasoning: bool | None = None
    reasoning: bool | None = None
    slots: int | None = None
    n_ctx: int | None = None
    kv_unified: bool | None = None
    n_swa: int | None = None
    cache_ram_mib: int | None = None
    model: str | None = None
    warning: str | None = None
    detail: str = ""
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class ToolResult:
    """The result of one tool call, sent back as a ``tool`` message.

    ``call`` is the session's tool-call number (1, 2, ...); ``tool_call_id`` the model's id of
    the call; ``content`` the text sent to the model (capped, at most the configured number of
    characters); ``data_class`` a label for the data (``"public"`` for local tools);
    ``untrusted`` marks content from outside (e.g. the web); ``truncated`` says the content
    was cut by ``cap_result``; ``not_run`` is ``None`` for a call that ran, else why it was
    answered without running (one of :data:`NOT_RUN_REASONS`; schema 2); ``server`` names the
    tool server that answered (the name an MCP server has in the config), ``None`` for a local
    tool, a port without servers, or a call not sent to any; ``source`` (schema 4) is ``None``
    for a result the tool (or the loop) gave in this log, ``"replayed"`` for one copied from a
    fork's parent (the call matched the parent's), ``"edited"`` for a researcher's text at a
    fork point (:data:`RESULT_SOURCES`): never passed off as a tool's output.
    """

    call: int
    tool_call_id: str
    name: str
    content: str
    data_class: str = "public"
    untrusted: bool = False
    truncated: bool = False
    not_run: NotRunReason | None = None
    server: str | None = None
    source: ResultSource | None = None
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class Approval:
    """A decision on a tool call that needed approval, appended just before its ``ToolResult``.

    ``call`` is the session's tool-call number (the ``ToolResult`` with the same ``call`` holds
    the outcome), ``name`` the tool; ``decision`` is ``"approved"`` or ``"denied"``; ``by`` says
    who or what decided: the name an ``ask`` callback gave (e.g. ``"console"``, ``"panel"``,
    ``"code"``), or ``"timeout"`` (no answer in time) or ``"cancel"`` (the turn was stopped
    while waiting), both denials; ``reason`` is the decider's words (``""`` when none);
    ``waited_ms`` the time between asking and the decision, in milliseconds; ``time`` is when
    the decision was made.
    """

    call: int
    name: str
    decision: ApprovalDecision
    by: str
    reason: str = ""
    waited_ms: Millis = 0.0
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class LimitHit:
    """A limit fired (``kind`` is one of :data:`LIMIT_KINDS`); ``detail`` says what and where."""

    kind: LimitKind
    detail: str
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class TurnEnd:
    """How a turn ended, the last record of every turn (schema 2).

    ``outcome`` is one of :data:`TURN_END_OUTCOMES`; ``detail`` says more (the limit's words,
    the error message, ``""`` for an answer); ``status`` is the HTTP status of a failed request
    (``infer_error``), ``None`` otherwise or when no response came.
    """

    outcome: TurnEndOutcome
    detail: str = ""
    status: int | None = None
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class Forked:
    """Where a fork's log came from: the first record after its baseline (schema 4).

    The records that follow it, up to the parent's record ``record`` (exclusive), are the
    parent's records 1..``record - 1`` (1-based, after the baseline), copied as the parent's
    file holds them (times included); the fork's own records come after them.
    ``parent_session`` and ``parent_path`` name the parent's log (the path relative to the
    fork's folder when the parent lies under it, else as given); ``parent_schema`` is its
    format version; ``turn`` the parent's turn (1-based: its ``turn``-th user message) the
    fork branches at and ``point`` where in it (:data:`FORK_POINTS`); ``record`` the first
    record of the parent the fork does not copy (with ``edited_result``, the tool result
    replaced by the edited one that follows the copies); ``edited_call`` the tool-call number
    whose result was edited (``None`` otherwise); ``rerun`` the user message of the turn to
    run again (``before_answer``; ``None`` otherwise); ``settings`` what the fork changed, as
    given (``{"loop.tool_iterations": 2}``: ``--set`` pairs, or anything a researcher
    names; empty when nothing was said).
    """

    parent_session: str
    parent_path: str
    parent_schema: int
    turn: Tokens
    point: ForkPoint
    record: Tokens
    edited_call: int | None = None
    rerun: str | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    time: datetime = field(default_factory=utc_now)


@dataclass(frozen=True, kw_only=True)
class Unknown:
    """A record of a type this version does not know, kept as read so nothing is lost."""

    type: str
    data: Mapping[str, Any]
    time: datetime = field(default_factory=utc_now)


Record: TypeAlias = (
    User
    | Assistant
    | Usage
    | CacheLoss
    | ToolResult
    | Approval
    | LimitHit
    | TurnEnd
    | Capabilities
    | Forked
    | Unknown
)
"""Any record that can follow the baseline in a session log."""

_TYPES: dict[str, type[Any]] = {
    "user": User,
    "assistant": Assistant,
    "usage": Usage,
    "cache_loss": CacheLoss,
    "tool_result": ToolResult,
    "approval": Approval,
    "limit_hit": LimitHit,
    "turn_end": TurnEnd,
    "capabilities": Capabilities,
    "forked": Forked,
}
_NAMES: dict[type[Any], str] = {cls: name for name, cls in _TYPES.items()}


def record_to_json(record: Record | Baseline) -> dict[str, Any]:
    """The JSON object of one log line: ``{"type": ..., "time": ..., <fields>}``.

    A :class:`Baseline` gives ``{"type": "baseline", ...}`` without ``schema`` and
    ``session_id`` (the session adds those). An :class:`Unknown` gives back what was read.
    """
    if isinstance(record, Unknown):
        return dict(record.data)
    out: dict[str, Any] = {
        "type": "baseline" if isinstance(record, Baseline) else _NAMES[type(record)]
    }
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name == "time":
            out["time"] = format_time(value)
        elif f.name == "tool_calls":
            out["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in value
            ]
        elif f.name in ("tools", "timings", "settings"):
            out[f.name] = [dict(t) for t in value] if f.name == "tools" else dict(value)
        else:
            out[f.name] = value
    return out


def record_from_json(data: Mapping[str, Any]) -> Record:
    """Build a record from one log line's JSON object, checked by :data:`RULES` first.

    A ``type`` this version does not know gives an :class:`Unknown` record holding the data.

    Raises:
        RecordError: the line breaks the log's rule (a missing or malformed field, a value
            outside its ``Literal``, a bad time; the message says which); a ``ValueError``.
    """
    return records_from_json([data])[0]


def records_from_json(items: Sequence[Any]) -> list[Record]:
    """Build the records of a log's lines after the baseline (JSON values, in file order),
    checked by :func:`check_records` first.

    Raises:
        RecordError: as :func:`check_records` (``index`` is the position in ``items``).
    """
    check_records(items)
    return [_build(item) for item in items]


def _build(data: Mapping[str, Any]) -> Record:
    """The record of a line that :func:`check_records` accepted."""
    time = parse_time(data["time"])
    cls = _TYPES.get(data["type"])
    if cls is None:
        return Unknown(type=data["type"], data=dict(data), time=time)
    kwargs: dict[str, Any] = {}
    for rule in RULES[data["type"]]:
        if rule.name == "time" or rule.name not in data:
            continue
        value = data[rule.name]
        if rule.items is not None and rule.name == "tool_calls":
            value = tuple(ToolCall(**{r.name: c[r.name] for r in rule.items}) for c in value)
        kwargs[rule.name] = value
    record: Record = cls(time=time, **kwargs)
    return record


# -- the one rule of the log: what each field of each line may hold ---------------------------

_INT64 = (-(2**63), 2**63 - 1)
"""The range of every integer (pandas' ``Int64``, the frames' integer dtype)."""


class RecordError(ValueError):
    """A log line breaks the rule of :data:`RULES`; ``index`` is the line's position in the
    list checked (the message names the record type, field and value)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


class _Absent:
    """The value of a key a line does not have (``None`` is JSON's ``null``)."""

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


@dataclass(frozen=True)
class FieldRule:
    """What one key of a log line's JSON object may hold, derived from the record dataclass's
    type hint (:data:`RULES`).

    Attributes:
        name: the JSON key (the dataclass field).
        required: the line must have it: a field without a default, and ``time`` of every
            record after the baseline.
        types: the JSON value types allowed, as Python types (``NoneType`` for ``null``);
            ``int`` and ``float`` for a float (JSON has one number type), never ``bool`` for
            a number.
        values: for a ``Literal``: the strings allowed; ``None`` otherwise.
        minimum: numbers are never below it (:data:`Tokens`, :data:`Millis`: 0).
        time: a time: ISO 8601 with a UTC offset, within :data:`TIME_RANGE`.
        items: a list whose elements are JSON objects checked by these rules (``tool_calls``:
            :class:`ToolCall`'s), ``()`` for objects of any shape (``tools``); ``None``: no list.
        measurements: a JSON object whose values are llama.cpp measurements
            (:func:`is_measurement`; ``timings``).
        pattern: a string that must match it whole (the session id).
        want: what the value should be, in words, for the error message.
    """

    name: str
    required: bool
    types: frozenset[type]
    values: frozenset[str] | None = None
    minimum: int | None = None
    time: bool = False
    items: tuple[FieldRule, ...] | None = None
    measurements: bool = False
    pattern: re.Pattern[str] | None = None
    want: str = ""


def _rule(name: str, hint: Any, required: bool) -> FieldRule:
    """The :class:`FieldRule` of a field from its type hint (see :data:`RULES`)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    allowed: set[type] = set()
    options: dict[str, Any] = {}
    words: list[str] = []
    for member in members:
        if member is type(None):
            allowed.add(type(None))
            continue
        if typing.get_origin(member) is Annotated:
            member, *meta = typing.get_args(member)
            options["minimum"] = next(m.minimum for m in meta if isinstance(m, AtLeast))
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is Literal:
            allowed.add(str)
            options["values"] = frozenset(args)
            words.append("one of " + ", ".join(args))
        elif member is datetime:
            allowed.add(str)
            options["time"] = True
            words.append("an ISO 8601 time with a UTC offset")
        elif member in (str, int, bool):
            allowed.add(member)
            words.append(member.__name__)
        elif member is float:
            allowed |= {int, float}
            words.append("a finite number")
        elif origin is Mapping:
            allowed.add(dict)
            options["measurements"] = args[1] is float
            words.append("a JSON object")
        elif origin is tuple and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
            allowed.add(list)
            options["items"] = _rules(args[0], timed=False)
            words.append("a list of objects")
        elif origin is tuple:
            allowed.add(list)
            options["items"] = ()
            words.append("a list of objects")
        else:  # pragma: no cover - a record field of a new kind needs a rule here
            raise TypeError(f"no log rule for {name}: {hint!r}")
    if type(None) in allowed:
        words.append("null")
    if options.get("minimum") is not None:
        words[0] += f" >= {options['minimum']}"
    return FieldRule(name, required, frozenset(allowed), want=" or ".join(words), **options)


def _rules(cls: type[Any], *, timed: bool) -> tuple[FieldRule, ...]:
    """The rules of a dataclass's fields, from its type hints; ``time`` is required when
    ``timed`` (every record after the baseline carries one)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple(
        _rule(
            f.name,
            hints[f.name],
            (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            or (timed and f.name == "time"),
        )
        for f in dataclasses.fields(cls)
    )


SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A session id: safe as a file name (letters, digits, ``.``, ``_``, ``-``; at most 128
characters; not starting with ``.``, ``_`` or ``-``)."""

TIME_RANGE = (
    datetime(1677, 9, 21, 0, 12, 43, 145225, tzinfo=UTC),
    datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=UTC),
)
"""The times a log may hold, in UTC: pandas' ``datetime64[ns]`` range (the frames' time
dtype), to the microsecond; every such time is also a valid :class:`datetime`."""

_TIME = FieldRule(
    "time", True, frozenset({str}), time=True, want="an ISO 8601 time with a UTC offset"
)
"""The rule of a record of a type this version does not know: it carries a time."""

RULES: Mapping[str, tuple[FieldRule, ...]] = {
    **{name: _rules(cls, timed=True) for name, cls in _TYPES.items()},
    "baseline": (
        *_rules(Baseline, timed=False),
        FieldRule(
            "session_id", False, frozenset({str}), pattern=SESSION_ID, want="safe as a file name"
        ),
    ),
}
"""THE rule of the log: for each line's ``type``, the rule of each key, derived from the type
hints of the record dataclasses (:class:`User`, ..., :class:`TurnEnd`; ``"baseline"``: the
first line, :class:`Baseline` and its ``session_id``). :meth:`Session.open
<boxmaker.session.Session.open>`, :func:`boxmaker.session.read_log` and the frames all read
through it, so they accept and refuse the same logs:

- a key of a field without a default must be there, and every record after the baseline has a
  ``time`` (the baseline's is optional);
- ``str``, ``int``, ``bool`` are those JSON types (``true`` is no ``int``); a ``float`` is any
  finite JSON number; ``X | None`` also allows ``null``; integers fit in 64 bits;
- a ``Literal`` allows its strings only: :data:`LimitKind`, :data:`TurnEndOutcome`,
  :data:`NotRunReason`, :data:`ApprovalDecision` (a value a newer version added is refused,
  naming it: read such a log with that version);
- :data:`Tokens` and :data:`Millis` are never negative; ``timings`` values are measurements
  (:func:`is_measurement`);
- a time is ISO 8601 with a UTC offset within :data:`TIME_RANGE`;
- ``tool_calls`` are objects with ``id``, ``name``, ``arguments`` strings; baseline ``tools``
  are objects; the session id matches :data:`SESSION_ID`.

Keys a type does not name are ignored (an optional field a later version added); a line of a
``type`` this version does not know needs a ``time`` only (it is kept as :class:`Unknown`)."""

COUNTS = frozenset(
    f"{name}.{rule.name}"
    for name, rules in RULES.items()
    for rule in rules
    if rule.minimum is not None and int in rule.types and float not in rule.types
)
"""The fields that count tokens (``"cache_loss.reused"``, ``"usage.prompt_tokens"``, ...):
never negative, for the session and the frames alike (from :data:`Tokens` in the hints)."""


def is_measurement(value: object) -> bool:
    """``value`` can be a llama.cpp timing (a count or a duration): a finite int or float, zero
    or more (not a bool), an int within 64 bits. The one rule of the session and the frames for
    ``timings``."""
    return (type(value) is int and 0 <= value <= _INT64[1]) or (
        type(value) is float and math.isfinite(value) and value >= 0
    )


def time_problem(text: str) -> str | None:
    """What is wrong with a log time (``None``: nothing): it must be ISO 8601 with a UTC
    offset (as :func:`format_time` writes it) and, in UTC, within :data:`TIME_RANGE`."""
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return "is not an ISO 8601 time"
    if t.tzinfo is None:
        return "has no UTC offset"
    try:
        t = t.astimezone(UTC)
    except OverflowError:
        return "is out of range in UTC"
    if not TIME_RANGE[0] <= t <= TIME_RANGE[1]:
        return "is out of range (1677-09-21 to 2262-04-11 UTC: pandas' datetime64[ns])"
    return None


def check_baseline(head: Mapping[str, Any]) -> None:
    """Check a log's first line (the baseline's JSON object) against ``RULES["baseline"]``.

    Its ``schema`` is checked by the upgrade steps (:mod:`boxmaker.session`).

    Raises:
        RecordError: not a baseline, or a field breaks its rule (the message says which).
    """
    if head.get("type") != "baseline":
        raise RecordError(f"first record is {head.get('type')!r:.40}, not 'baseline'", 0)
    found = _problems(RULES["baseline"], [dict(head)], "baseline")
    if found:
        raise RecordError(found[0][1], 0)


def check_records(items: Sequence[Any]) -> None:
    """Check a log's lines after the baseline (JSON values, current schema) against
    :data:`RULES`, field by field over all lines of a type at once (the frames check every
    record of every log).

    Raises:
        RecordError: the first line (in ``items``' order) that breaks the rule; ``index`` is
            its position, the message names record type, field and value.
    """
    try:
        names = [item.get("type", _ABSENT) for item in items]  # of JSON values, dicts have .get
    except AttributeError:
        j = next(j for j, item in enumerate(items) if type(item) is not dict)
        raise RecordError(f"line is not a JSON object: {items[j]!r:.80}", j) from None
    found: list[tuple[int, str]] = []
    if not set(map(type, names)) <= {str}:
        j = next(j for j, name in enumerate(names) if type(name) is not str)
        found.append((j, f"record without a 'type' string: {items[j]!r:.80}"))
    # C-level passes (map, compress): this runs over every record of every log the frames read
    for name in {name for name in names if type(name) is str}:
        where = list(compress(range(len(names)), map(operator.eq, names, repeat(name))))
        rules = RULES.get(name) if name != "baseline" else None
        lines = list(map(items.__getitem__, where))
        for k, message in _problems(rules or (_TIME,), lines, name):
            found.append((where[k], message))
            break
    if found:
        j, message = min(found)
        raise RecordError(message, j)


def _problems(
    rules: tuple[FieldRule, ...], lines: Sequence[dict[str, Any]], name: str
) -> list[tuple[int, str]]:
    """The first break of each rule over ``lines`` (position, message), earliest first."""
    found = []
    for rule in rules:
        values = list(map(dict.get, lines, repeat(rule.name), repeat(_ABSENT)))
        bad = _problem(rule, values, rule.name)
        if bad is not None:
            k, what = bad
            found.append((k, f"{name} record {what}" if what.startswith("without") else
                          f"{name} record: {what}"))  # fmt: skip
    return sorted(found, key=lambda problem: problem[0])  # a line's first field first


def _problem(rule: FieldRule, values: list[Any], label: str) -> tuple[int, str] | None:
    """The first value of ``values`` (one per line) that breaks ``rule``: (position, what)."""
    kinds = set(map(type, values))
    ok = rule.types if rule.required else rule.types | {_Absent}
    if not kinds <= ok:
        k = next(k for k, v in enumerate(values) if type(v) not in ok)
        if values[k] is _ABSENT:
            return k, f"without {label!r}"
        return k, f"{label} = {values[k]!r:.60} is not {rule.want}"
    if _suspect(rule, values, kinds):
        for check, why in _checks(rule):
            k = next((k for k, v in enumerate(values) if not check(v)), -1)
            if k >= 0:
                return k, f"{label} = {values[k]!r:.60} {why}"
    if rule.time:
        return _time_problem(values, label)
    if rule.measurements:
        return _inner(values, label, _MEASUREMENT)
    if rule.items is not None:
        return _inner(values, label, rule.items)
    return None


_NUMBERS = (int, float)
_NULLS = frozenset({None, _ABSENT})


def _suspect(rule: FieldRule, values: list[Any], kinds: set[type]) -> bool:
    """Whether a value may break the value checks of ``rule``: one quick pass in C over all
    (``sum``, ``min``, ``max``, a set); only then are the values checked one by one."""
    if kinds & {int, float}:
        nums = values if kinds <= {int, float} else [v for v in values if type(v) in _NUMBERS]
        try:
            total, lo, hi = sum(nums), min(nums), max(nums)
        except OverflowError:  # an int too large for a float, among floats
            return True
        if float in kinds and not math.isfinite(total):  # NaN or infinity (or a sum past 1e308)
            return True
        if int in kinds and (lo < _INT64[0] or hi > _INT64[1]):
            return True
        if rule.minimum is not None and lo < rule.minimum:
            return True
    if rule.values is not None and not set(values) <= rule.values | _NULLS:
        return True
    return rule.pattern is not None and str in kinds


def _checks(rule: FieldRule) -> list[tuple[Callable[[Any], bool], str]]:
    """The value checks of ``rule``, one value at a time, and what a failure says."""
    number = f"is not {rule.want}" if float in rule.types else "is not a count (>= 0)"
    least, allowed, pattern = rule.minimum, rule.values, rule.pattern
    out: list[tuple[Callable[[Any], bool], str]] = [
        (lambda v: type(v) is not int or _INT64[0] <= v <= _INT64[1], "is out of range (64-bit)"),
        (lambda v: type(v) is not float or math.isfinite(v), number),
    ]
    if least is not None:
        out.append((lambda v: type(v) not in _NUMBERS or v >= least, number))
    if allowed is not None:
        out.append((lambda v: type(v) is not str or v in allowed, f"is not {rule.want}"))
    if pattern is not None:
        out.append((lambda v: type(v) is not str or bool(pattern.fullmatch(v)),
                    f"is not {rule.want}"))  # fmt: skip
    return out


_MEASUREMENT = FieldRule(
    "value", True, frozenset({int, float}), minimum=0, want="a finite number >= 0"
)


def _inner(
    values: list[Any], label: str, rules: FieldRule | tuple[FieldRule, ...]
) -> tuple[int, str] | None:
    """The first break inside lists or objects (one per line): each element (a list's) or
    value (an object's) checked by ``rules`` (one rule for the values themselves, or the rules
    of the elements' keys)."""
    inside: list[Any] = []
    kinds = set(map(type, values))
    if kinds == {list}:
        inside = list(chain.from_iterable(values))
    elif kinds == {dict}:
        inside = list(chain.from_iterable(map(dict.values, values)))
    else:
        for value in values:
            if type(value) is list:
                inside += value
            elif type(value) is dict:
                inside += value.values()
    if isinstance(rules, FieldRule):
        bad = _problem(rules, inside, "")
        return None if bad is None else _owned(values, bad[0], label, bad[1])
    if not set(map(type, inside)) <= {dict}:
        n = next(n for n, v in enumerate(inside) if type(v) is not dict)
        return _owned(values, n, label, f" = {inside[n]!r:.40} is not a JSON object")
    found = []
    for rule in rules:
        bad = _problem(
            rule, list(map(dict.get, inside, repeat(rule.name), repeat(_ABSENT))), rule.name
        )
        if bad is not None:
            found.append(bad)
    if not found:
        return None
    n, what = min(found)
    return _owned(values, n, label, f" {what}" if what.startswith("without") else f".{what}")


def _owned(values: list[Any], n: int, label: str, what: str) -> tuple[int, str]:
    """(line, message) of the ``n``-th element or value inside ``values``' lists or objects:
    ``label[i]`` for a list's element, ``label.key`` for an object's value."""
    for k, value in enumerate(values):
        size = len(value) if type(value) in (list, dict) else 0
        if n < size:
            where = f"[{n}]" if type(value) is list else f".{list(value)[n]}"
            return k, f"{label}{where}{what}"
        n -= size
    raise AssertionError("no such element")  # pragma: no cover


def _time_problem(values: list[Any], label: str) -> tuple[int, str] | None:
    """The first time of ``values`` (strings, or absent where optional) that breaks the rule
    of :func:`time_problem`; all of them parsed at once first (the common case: all good)."""
    texts = values if set(map(type, values)) == {str} else [v for v in values if type(v) is str]
    try:
        parsed = list(map(datetime.fromisoformat, texts))
        if None not in map(operator.attrgetter("tzinfo"), parsed) and (
            not parsed or (TIME_RANGE[0] <= min(parsed) and max(parsed) <= TIME_RANGE[1])
        ):
            return None
    except (ValueError, OverflowError):
        pass
    for k, v in enumerate(values):
        why = time_problem(v) if type(v) is str else None
        if why is not None:
            return k, f"{label} = {v!r:.60} {why}"
    return None  # pragma: no cover - the fast path refused what the slow one accepts


def baseline_from_json(data: Mapping[str, Any]) -> Baseline:
    """Build the :class:`Baseline` from a log's first line, checked by :func:`check_baseline`.

    A baseline without ``time`` gets the time of reading.

    Raises:
        RecordError: the line is not a baseline, or its fields are malformed (a
            ``ValueError``).
    """
    check_baseline(data)
    time_text = data.get("time")
    time = parse_time(time_text) if isinstance(time_text, str) else utc_now()
    tools = data.get("tools", [])
    return Baseline(system=data.get("system", ""), tools=tuple(dict(t) for t in tools), time=time)
