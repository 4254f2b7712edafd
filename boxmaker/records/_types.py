"""The record types of a session log: one frozen dataclass per kind of line, the
``Literal`` vocabularies (limit kinds, turn outcomes, not-run reasons, fork points, result
sources, approval decisions), the units (:data:`Tokens`, :data:`Millis`), the log's times, and
:data:`TYPE_OF` (a line's ``"type"`` to its class)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeAlias

__all__ = [
    "APPROVAL_DECISIONS",
    "FORK_POINTS",
    "LIMIT_KINDS",
    "MAX_MS",
    "MAX_TOKENS",
    "NAME_OF",
    "NOT_RUN_REASONS",
    "RESULT_SOURCES",
    "SCHEMA_VERSION",
    "TIME_RANGE",
    "TURN_END_OUTCOMES",
    "TYPE_OF",
    "WARM_LABELS",
    "Approval",
    "ApprovalDecision",
    "Assistant",
    "AtLeast",
    "Baseline",
    "CacheLoss",
    "Capabilities",
    "ForkPoint",
    "Forked",
    "LimitHit",
    "LimitKind",
    "Millis",
    "NotRunReason",
    "Record",
    "ResultSource",
    "Tokens",
    "ToolCall",
    "ToolResult",
    "TurnEnd",
    "TurnEndOutcome",
    "Unknown",
    "Usage",
    "User",
    "WarmFound",
    "WarmLabel",
    "Warmed",
    "format_time",
    "parse_time",
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
``None`` in older logs), the cause ``checkpoint``, ``Usage.note`` (optional, read as ``None``)
and a ``null`` ``Usage.reasoning_tokens`` (a count the client could not make; older logs
always have a number), the ``not_run`` reasons ``tool_calls``, ``tool_arguments`` and
``completion_tokens`` (the calls of a completion a client-side bound refused, now logged),
the turn outcome ``abandoned`` (a tapped agent left a turn without its answer).
Added within schema 4, the same way: :class:`Warmed` records (a fork's measured cache reuse;
kept as ``Unknown`` by a reader that does not know the type; never messages); a ``Usage``
line without ``reasoning_tokens`` or ``thinking_capped`` reads as unknown (``None``; an
unknown ``thinking_capped`` is written by leaving it out, so older readers take the line).
Readers now check these values by their ``Literal`` types (:data:`RULES`), so a value added
later is refused by an older reader, naming it (the log reads with the version that added it).
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
    "abandoned",
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
(:mod:`boxmaker.turn`'s replay); ``abandoned``, an agent the tap logs sent a new user message
after the results of its calls without asking for the answer (:mod:`boxmaker.tap`): a turn
without an answer. A ``length`` turn
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
    "tool_calls",
    "tool_arguments",
    "completion_tokens",
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
``diverged`` (schema 4), a fork stopped at its first call that differs from its parent's;
``tool_calls``, ``tool_arguments``, ``completion_tokens``, the completion was refused by a
client-side bound (too many calls, arguments too long, a stream past its token bound): it is
logged with its calls, none of them run."""

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

WarmLabel: TypeAlias = Literal["slot", "restored", "server", "partial", "cold", "unknown"]
WARM_LABELS: tuple[WarmLabel, ...] = typing.get_args(WarmLabel)
"""How warm a fork's first request found its parent's prefix, as measured
(:attr:`Warmed.how`; the threshold is :data:`boxmaker.cache.WARM_SHARE`, 0.9 of the prefix
reused): ``slot``, a slot held it (``boxmaker.cache.warm_fork`` found it there); ``restored``,
the parent's saved slot was restored and used; ``server``, the server found it by itself (a
slot this process did not know of, or its RAM prompt cache, ``--cache-ram``); ``partial``, less
than 0.9 but at least :data:`boxmaker.cache.COLD_SHARE` (0.1) reused; ``cold``, less than 0.1;
``unknown``, no measurement (the server sent no ``cache_n``, or the parent made no completion
before the fork point)."""

WarmFound: TypeAlias = Literal["slot", "restored", "cold"]
"""What ``boxmaker.cache.warm_fork`` did before a fork's first request
(:attr:`Warmed.found`): found a slot holding the prefix, restored the saved slot, or neither."""

ApprovalDecision: TypeAlias = Literal["approved", "denied"]
APPROVAL_DECISIONS: tuple[ApprovalDecision, ...] = typing.get_args(ApprovalDecision)
"""What an :class:`Approval` decided."""


@dataclass(frozen=True)
class AtLeast:
    """``Annotated`` marker of a number field that is never below ``minimum`` nor, when
    given, above ``maximum`` (see :data:`RULES`)."""

    minimum: int
    maximum: float | None = None


MAX_TOKENS = 2**31 - 1
"""The most tokens one count of a log may hold (a prompt, a reply, a loss): far above any
model's context (10M tokens), and low enough that a sum over 4 billion records cannot leave
64 bits. A larger count is no measurement: the log's rule refuses it."""

MAX_MS = 1e10
"""The most milliseconds (or tokens per second) one timing of a log may hold: 115 days. A
larger one is no measurement (``1e308`` made the OTel export overflow): the rule refuses it."""

Tokens: TypeAlias = Annotated[int, AtLeast(0, MAX_TOKENS)]
"""A count of tokens: an ``int`` from 0 to :data:`MAX_TOKENS` (the log's rule refuses
others)."""

Millis: TypeAlias = Annotated[float, AtLeast(0, MAX_MS)]
"""A duration in milliseconds: a finite number from 0 to :data:`MAX_MS`."""


TIME_RANGE = (
    datetime(1677, 9, 21, 0, 12, 43, 145225, tzinfo=UTC),
    datetime(2262, 4, 11, 23, 47, 16, 854775, tzinfo=UTC),
)
"""The times a log may hold, in UTC: pandas' ``datetime64[ns]`` range (the frames' time
dtype), to the microsecond; every such time is also a valid :class:`datetime`."""


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
    """What one completion cost: what the server measured, or unknown.

    ``timings`` is llama.cpp's object as sent (``cache_n``, ``prompt_n``, ``predicted_n`` in
    tokens; ``prompt_ms``, ``predicted_ms`` in milliseconds; per-token and per-second rates),
    empty when the server sent none (older builds). ``reasoning_tokens`` is the server's
    ``usage.completion_tokens_details.reasoning_tokens`` when it sent one, else the streamed
    reasoning deltas counted (llama.cpp sends about one token per delta): ``0`` when no
    reasoning came; ``None`` when the client could not count it (the reasoning came whole, in
    one ``chat.completion``, without the server's count). ``prompt_tokens`` and
    ``completion_tokens`` are the OpenAI ``usage`` fields, ``None`` when absent or impossible
    (Ollama's ``prompt_tokens: 0`` for a cached prompt, ollama/ollama#5370: no prompt has 0
    tokens);
    ``note`` then says which figure the server sent was left out and why (``None``: none
    was). ``thinking_capped``: the thinking cap ended this completion's reasoning. A figure
    that is ``None`` is unknown: absent in the frames' totals, never 0; a log line without
    ``reasoning_tokens`` or ``thinking_capped`` (another writer's) reads as ``None``, as the
    frames read it, not as these defaults.
    """

    timings: Mapping[str, float] = field(default_factory=dict)
    reasoning_tokens: Tokens | None = 0
    thinking_capped: bool | None = False
    prompt_tokens: Tokens | None = None
    completion_tokens: Tokens | None = None
    finish_reason: str | None = None
    note: str | None = None
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
class Warmed:
    """How much of its parent's prompt cache a fork's first request reused, measured: one
    record, right after the fork's first completion (its ``Usage``, and its ``CacheLoss`` if
    any; within schema 4, never a message).

    ``prefix`` is the parent's prefix in tokens: what the parent's slot held after the last
    completion the fork copies (:func:`boxmaker.cache.held_tokens`: its prompt and its reply
    but the reply's last token); ``reused`` the fork's first completion's ``cache_n``; ``how``
    the label that follows from them (:data:`WARM_LABELS`: ``slot``, ``restored`` or
    ``server`` only when ``reused >= 0.9 * prefix``). ``found`` is what
    ``boxmaker.cache.warm_fork`` did beforehand (``None``: it was not asked), ``slot`` the slot
    it sent the fork to, ``file`` the saved slot it restored and ``restored`` the tokens the
    server said it restored; ``prefilled`` the prompt tokens a prefill request processed
    before the fork's first one (a sliding-window model: the prefix sent once into the slot,
    ``None``: no prefill), a cost the fork's own ``reused`` does not show. ``detail`` says
    why a fork is not warm (or was warm though nothing was done for it), in words; ``""``
    otherwise. A figure the server did not send is ``None``.
    """

    how: WarmLabel
    prefix: Tokens | None = None
    reused: Tokens | None = None
    found: WarmFound | None = None
    slot: int | None = None
    file: str | None = None
    restored: Tokens | None = None
    prefilled: Tokens | None = None
    detail: str = ""
    time: datetime = field(default_factory=utc_now)

    @property
    def share(self) -> float | None:
        """The share of ``prefix`` reused (``min(reused, prefix) / prefix``), ``None`` when
        either is unknown or the prefix is empty."""
        if self.prefix is None or self.reused is None or self.prefix <= 0:
            return None
        return min(self.reused, self.prefix) / self.prefix


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
    | Warmed
    | Unknown
)
"""Any record that can follow the baseline in a session log."""

TYPE_OF: dict[str, type[Any]] = {
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
    "warmed": Warmed,
}
NAME_OF: dict[type[Any], str] = {cls: name for name, cls in TYPE_OF.items()}
