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
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TypeAlias

__all__ = [
    "APPROVAL_DECISIONS",
    "COUNTS",
    "LIMIT_KINDS",
    "NOT_RUN_REASONS",
    "SCHEMA_VERSION",
    "TURN_END_OUTCOMES",
    "Approval",
    "ApprovalDecision",
    "Assistant",
    "Baseline",
    "CacheLoss",
    "Capabilities",
    "LimitHit",
    "LimitKind",
    "NotRunReason",
    "Record",
    "ToolCall",
    "ToolResult",
    "TurnEnd",
    "TurnEndOutcome",
    "Unknown",
    "Usage",
    "User",
    "format_time",
    "is_measurement",
    "parse_time",
    "record_from_json",
    "record_to_json",
    "utc_now",
]

SCHEMA_VERSION = 2
"""Version of the log format, written in each log's first line (the baseline).

1: the first format. 2: ``TurnEnd`` records, ``ToolResult.not_run``, the forensic fields of
``CacheLoss``. Older logs are upgraded on read by the steps of :mod:`boxmaker.session`.

Added within schema 2, without a new version because nothing is lost when an older schema-2
reader meets them: ``ToolResult.server`` (an optional field, ignored by a reader that does not
know it, absent in older logs and read as ``None``) and :class:`Approval` records (kept as
``Unknown`` by a reader that does not know the type; never messages), and the loop guard's
values (:mod:`boxmaker.turn`): the limit kind, ``not_run`` reason and turn outcome
``loop``, and the outcome ``answered_after_limit`` (strings an older reader keeps as they are);
:class:`Capabilities` records (kept as ``Unknown`` by an older reader; never messages) and the
optional ``CacheLoss`` fields ``reprocessed`` and ``reprocessed_ms`` (read as ``None`` in
older logs), and the cause ``checkpoint``.
"""

LimitKind: TypeAlias = Literal[
    "tool_iterations", "repeated_call", "thinking_cap", "context_full", "tool_result_cap", "loop"
]
LIMIT_KINDS: tuple[LimitKind, ...] = typing.get_args(LimitKind)
"""The six kinds of limit (the spec's limits table), in that order; ``loop`` is the loop
guard's cycle, stale-result and per-tool cap rules (:mod:`boxmaker.turn`)."""

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
]
TURN_END_OUTCOMES: tuple[TurnEndOutcome, ...] = typing.get_args(TurnEndOutcome)
"""How a turn can end (:attr:`TurnEnd.outcome`): an answer, an answer cut at ``max_tokens``
(``finish_reason: "length"``), each limit that ends a turn, a cancel, or a failed request;
``loop``, the loop guard ended it; ``answered_after_limit``, a limit ended it and, with
``loop.on_limit = "answer"``, one last completion without tools answered; ``process_died``,
written when a log is reopened: the process stopped inside that turn (killed, crashed)."""

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
a JSON object or do not fit the tool's schema): the result says why, for the model to read."""

ApprovalDecision: TypeAlias = Literal["approved", "denied"]
APPROVAL_DECISIONS: tuple[ApprovalDecision, ...] = typing.get_args(ApprovalDecision)
"""What an :class:`Approval` decided."""


def utc_now() -> datetime:
    """The current time as an aware UTC datetime."""
    return datetime.now(UTC)


def format_time(t: datetime) -> str:
    """ISO 8601 in UTC with microseconds and a ``Z``, e.g. ``2026-11-30T07:01:02.000001Z``."""
    return t.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """Parse :func:`format_time`'s output (any ISO 8601 with an offset) to an aware datetime.

    Raises:
        ValueError: not ISO 8601, no UTC offset, or out of range once moved to UTC.
    """
    t = datetime.fromisoformat(text)
    if t.tzinfo is None:
        raise ValueError(f"time without UTC offset: {text!r}")
    try:
        return t.astimezone(UTC)
    except OverflowError as exc:
        raise ValueError(f"time out of range in UTC: {text!r:.60}") from exc


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
    reasoning_tokens: int = 0
    thinking_capped: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
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

    expected: int
    reused: int
    position: int | None = None
    cause: str | None = None
    old_window: str | None = None
    new_window: str | None = None
    detail: str | None = None
    reprocessed: int | None = None
    reprocessed_ms: float | None = None
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
    tool, a port without servers, or a call not sent to any.
    """

    call: int
    tool_call_id: str
    name: str
    content: str
    data_class: str = "public"
    untrusted: bool = False
    truncated: bool = False
    not_run: str | None = None
    server: str | None = None
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
    decision: str
    by: str
    reason: str = ""
    waited_ms: float = 0.0
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

    outcome: str
    detail: str = ""
    status: int | None = None
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
        elif f.name in ("tools", "timings"):
            out[f.name] = [dict(t) for t in value] if f.name == "tools" else dict(value)
        else:
            out[f.name] = value
    return out


def record_from_json(data: Mapping[str, Any]) -> Record:
    """Build a record from one log line's JSON object.

    A ``type`` this version does not know gives an :class:`Unknown` record holding the data.

    Raises:
        ValueError: a known type with missing or malformed fields (the message says which).
    """
    name = data.get("type")
    time_text = data.get("time")
    if not isinstance(time_text, str):
        raise ValueError(f"{name} record without a 'time' string")
    time = parse_time(time_text)
    cls = _TYPES.get(name) if isinstance(name, str) else None
    if cls is None:
        return Unknown(type=str(name), data=dict(data), time=time)
    hints = _field_types(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name == "time":
            continue
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{name} record without {f.name!r}")
            continue
        value = data[f.name]
        expected = hints.get(f.name)
        if expected is not None and (
            not isinstance(value, expected) or (isinstance(value, bool) and bool not in expected)
        ):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in expected)
            raise ValueError(f"{name} record: {f.name} = {value!r:.60} is not {names}")
        if f.name == "tool_calls":
            try:
                value = tuple(
                    ToolCall(id=str(c["id"]), name=str(c["name"]), arguments=str(c["arguments"]))
                    for c in value
                )
            except (KeyError, TypeError) as exc:
                raise ValueError(f"malformed tool_calls in {name} record: {exc}") from exc
        elif f.name == "timings":
            for key, number in value.items():
                if not is_measurement(number):
                    raise ValueError(
                        f"{name} record: timings.{key} = {number!r:.40} is not a finite number >= 0"
                    )
                _in_range(name, f"timings.{key}", number)
        elif type(value) is int:
            _in_range(name, f.name, value)
            if value < 0 and f.name in COUNTS:
                raise ValueError(f"{name} record: {f.name} = {value} is not a count (>= 0)")
        kwargs[f.name] = value
    try:
        record: Record = cls(time=time, **kwargs)
    except TypeError as exc:
        raise ValueError(f"malformed {name} record: {exc}") from exc
    return record


COUNTS = frozenset({"expected", "reused", "position", "reprocessed"})
"""Integer fields that count tokens (``CacheLoss``): never negative, for the session and the
frames alike."""


def is_measurement(value: object) -> bool:
    """``value`` can be a llama.cpp timing (a count or a duration): a finite int or float, zero
    or more (not a bool). The one rule of the session and the frames for ``timings``."""
    return (type(value) is int and value >= 0) or (
        type(value) is float and math.isfinite(value) and value >= 0
    )


def _in_range(record: object, name: str, value: float) -> None:
    """Refuse an integer the analysis cannot hold (beyond 64 bits: pandas' Int64)."""
    if type(value) is int and not -(2**63) <= value < 2**63:
        raise ValueError(f"{record} record: {name} = {value!r:.40} is out of range (64-bit)")


_SIMPLE: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "str | None": (str, type(None)),
    "int": (int,),
    "int | None": (int, type(None)),
    "float": (int, float),
    "bool": (bool,),
    "bool | None": (bool, type(None)),
    "float | None": (int, float, type(None)),
    "Mapping[str, float]": (dict,),
    "tuple[ToolCall, ...]": (list,),
    "tuple[Mapping[str, Any], ...]": (list,),
}


def _field_types(cls: type[Any]) -> dict[str, tuple[type, ...]]:
    """Field name -> the JSON types its value may have, for the simply typed fields."""
    return {f.name: _SIMPLE[str(f.type)] for f in dataclasses.fields(cls) if str(f.type) in _SIMPLE}


def baseline_from_json(data: Mapping[str, Any]) -> Baseline:
    """Build the :class:`Baseline` from a log's first line.

    Raises:
        ValueError: the line is not a baseline, or its fields are malformed.
    """
    if data.get("type") != "baseline":
        raise ValueError(f"first record is {data.get('type')!r}, not 'baseline'")
    system = data.get("system", "")
    tools = data.get("tools", [])
    if not isinstance(system, str) or not isinstance(tools, list):
        raise ValueError("baseline needs 'system' (string) and 'tools' (list)")
    for number, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ValueError(f"baseline tools[{number}] = {tool!r:.40} is not a JSON object")
    time_text = data.get("time")
    time = parse_time(time_text) if isinstance(time_text, str) else utc_now()
    return Baseline(system=system, tools=tuple(dict(t) for t in tools), time=time)
