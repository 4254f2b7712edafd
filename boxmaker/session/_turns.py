"""A log's turns: the one split of a session log's records into turns.

Every view of a session (both frame engines' definition, the OTel and Inspect exports, the
transcript view, the tap's what-if, ``frames.forks``, ``compare``) reads a log's structure
from :func:`split_turns`, so a turn, its completions, its tool calls and its times are the same
everywhere. It reads the JSON records :func:`~boxmaker.session.read_log` gives (a
:class:`~boxmaker.session.Log`), builds no record objects, and touches no file.

The rules:

- A turn is a ``User`` record and every record up to the next one; records before the first
  ``User`` (a fork's ``Forked`` record, ``Capabilities``) belong to no turn (``number`` is
  ``None``).
- Origin: in a fork's log (its first record a ``Forked``) the records before index
  ``Forked.record`` are copies of its parent's (``from_parent``). A turn is ``from_parent``
  when all its records of a known type are copies; a turn that straddles the fork point (an
  edited tool result: its first records copied, the edited result and what follows the
  fork's) is the fork's own, and its own part starts at ``own``.
- Times: a turn starts at its ``User`` record's time, except a fork's own turn that begins
  with copied records (an edited result, a rerun), which starts when the fork was made (its
  ``Forked`` record's time) if that is later; it ends at its last record of a known type. A
  fork's log starts (``Reading.started``) at its ``Forked`` record, any other at its baseline.
- A completion is a ``Usage`` record, with the ``Assistant`` record before it (after the
  previous completion); it belongs to the turn it is in.
- A tool call is a ``ToolResult`` record; its ``source`` says what answered it: ``ran`` (the
  tool ran), ``not_run`` (the loop answered without running it: ``ToolResult.not_run``),
  ``replayed`` (a fork took its parent's result) or ``edited`` (a researcher's text at a fork
  point). Only ``ran`` is a tool run.
- The outcome is the turn's ``TurnEnd`` record's; a turn without one (schema 1, or a turn
  still running) gets it from its records (:func:`inferred_outcome`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, TypeAlias

from ..records import parse_time
from ._sources import Log

__all__ = [
    "CALL_SOURCES",
    "ENDING_LIMITS",
    "KNOWN_TYPES",
    "Call",
    "CallSource",
    "Reading",
    "Request",
    "Turn",
    "backwards",
    "copied_records",
    "inferred_outcome",
    "split_turns",
    "unknown_types",
]

KNOWN_TYPES = (
    "assistant",
    "tool_result",
    "usage",
    "user",
    "limit_hit",
    "cache_loss",
    "turn_end",
    "approval",
    "capabilities",
    "forked",
    "warmed",
)
"""The record types a reading knows (a tuple: ``in`` compares, so any JSON value is safe);
others (a newer version's) are counted in :attr:`Reading.unknown` and skipped."""

ENDING_LIMITS: Mapping[str, str] = {
    "tool_iterations": "tool_iterations",
    "repeated_call": "repeated_call",
    "context_full": "session_full",
    "loop": "loop",
    "completion_tokens": "completion_tokens",
    "completions": "completions",
    "turn_deadline": "turn_deadline",
    "tool_calls": "tool_calls",
    "tool_arguments": "tool_arguments",
}
"""The limit kinds that end a turn, and the turn outcome each gives (for turns without a
``TurnEnd`` record)."""

CallSource: TypeAlias = Literal["ran", "not_run", "replayed", "edited"]
CALL_SOURCES: tuple[CallSource, ...] = ("ran", "not_run", "replayed", "edited")
"""What answered a tool call (:attr:`Call.source`)."""


class Request(NamedTuple):
    """One completion (a ``Usage`` record) of a log.

    Attributes:
        number: its number in the session (1, 2, ...), copied ones included.
        in_turn: its number in its turn (1, 2, ...), ``None`` before the first turn.
        usage: the index of its ``Usage`` record (in the log's records after the baseline).
        assistant: the index of its ``Assistant`` record, ``None`` when the log has none
            between the previous completion and this one.
        tool_calls: the calls of that ``Assistant`` record (``None`` without one).
        from_parent: a copy of the fork's parent's.
    """

    number: int
    in_turn: int | None
    usage: int
    assistant: int | None
    tool_calls: int | None
    from_parent: bool


class Call(NamedTuple):
    """One answered tool call (a ``ToolResult`` record) of a log.

    Attributes:
        result: the index of its ``ToolResult`` record.
        request: the session's latest completion before it (its number; 0: none).
        source: what answered it (:data:`CALL_SOURCES`).
        arguments_chars: the length of the model's arguments text (characters), found by
            ``tool_call_id`` among the log's ``Assistant`` records so far (``None``: not found).
        approval: the index of the latest ``Approval`` record of the same call number before
            it (and after any earlier result of that number), ``None`` when none was asked.
        from_parent: a copy of the fork's parent's.
    """

    result: int
    request: int
    source: CallSource
    arguments_chars: int | None
    approval: int | None
    from_parent: bool


class Turn(NamedTuple):
    """One turn of a log (or the records before its first turn, ``number`` ``None``).

    Attributes:
        number: the turn's number in the session (1, 2, ...), or ``None``.
        start: the index of its first record (its ``User``); its records are
            ``records[start:stop]``.
        stop: the index after its last record.
        own: the index of its first record that is the log's own (``start`` in a log that is
            no fork; ``stop`` for a turn copied whole).
        from_parent: every record of a known type is a copy of the fork's parent's.
        started: when it started (an ISO 8601 time as in the log; see the module's rules).
        ended: the time of its last record of a known type (``started`` if none).
        outcome: how it ended: the ``TurnEnd`` record's ``outcome``, else inferred.
        detail: the ``TurnEnd`` record's ``detail`` (``None`` without one).
        status: the ``TurnEnd`` record's HTTP ``status`` (``None`` without one, or none).
        completions: its completions, in order.
        calls: its answered tool calls, in order.
        limits: the indexes of its ``LimitHit`` records.
        losses: the indexes of its ``CacheLoss`` records, each with the number of the
            completion it follows, as ``(index, request)``.
        iterations: its completions whose ``Assistant`` made tool calls (of a turn that
            straddles a fork point, its own ones only).
    """

    number: int | None
    start: int
    stop: int
    own: int
    from_parent: bool
    started: Any
    ended: Any
    outcome: str
    detail: str | None
    status: int | None
    completions: tuple[Request, ...]
    calls: tuple[Call, ...]
    limits: tuple[tuple[int, int], ...]
    losses: tuple[tuple[int, int], ...]
    iterations: int


class Reading(NamedTuple):
    """A log and its turns (:func:`split_turns`).

    Attributes:
        log: the log read.
        copied: the records before this index are copies of the fork's parent's (0: no fork).
        forked: the ``Forked`` record (JSON), ``None`` when the log is no fork.
        started: when the log's own part started: the ``Forked`` record's time for a fork,
            else the baseline's.
        ended: the time of its last record of a known type (the baseline's if none).
        turns: its turns, in order, with the records before the first one (if any) first.
        unknown: the count of records of each type this version does not know.
        problems: what is odd in the log, in words, one message each (records of unknown
            type skipped, a turn that ends before it starts: the clock went back); the
            readers warn them.
    """

    log: Log
    copied: int
    forked: dict[str, Any] | None
    started: Any
    ended: Any
    turns: tuple[Turn, ...]
    unknown: dict[str, int]
    problems: tuple[str, ...] = ()

    @property
    def session(self) -> str:
        """The session id."""
        return self.log.session

    @property
    def records(self) -> list[Any]:
        """The log's records after the baseline (JSON)."""
        return self.log.records

    def own_turns(self) -> tuple[Turn, ...]:
        """The numbered turns that are the log's own (not copied whole from a parent)."""
        return tuple(t for t in self.turns if t.number is not None and not t.from_parent)


def copied_records(records: list[Any]) -> int:
    """The records before this index (after the baseline) are copies of a fork's parent's:
    ``Forked.record`` when the first record is a ``forked``, else 0."""
    first = records[0] if records else None
    return int(first["record"]) if first is not None and first["type"] == "forked" else 0


def _later(a: Any, b: Any) -> Any:
    """The later of two log times (``b`` when ``a`` is missing)."""
    if not isinstance(a, str) or not isinstance(b, str):
        return b if b is not None else a
    return a if parse_time(a) > parse_time(b) else b


def inferred_outcome(types: list[Any], records: list[dict[str, Any]]) -> str:
    """How a turn without a ``TurnEnd`` record ended, from its records (``types[k]`` the type
    of ``records[k]``): an ending ``LimitHit``; else a last message that is an ``Assistant``
    without tool calls (``length`` when its completion was cut at ``max_tokens``); else
    ``cancelled`` when a call was answered ``not_run: "cancelled"``; else ``no_answer``."""
    ending: str | None = None
    answered = cut = cancelled = False
    for kind, rec in zip(types, records, strict=True):
        if kind == "assistant":
            answered = not rec.get("tool_calls")
        elif kind == "tool_result":
            answered = False
            cancelled = cancelled or rec.get("not_run") == "cancelled"
        elif kind == "usage":
            cut = rec.get("finish_reason") == "length"
        elif kind == "limit_hit" and rec["kind"] in ENDING_LIMITS:
            ending = rec["kind"]
    if ending is not None:
        return ENDING_LIMITS[ending]
    if answered:
        return "length" if cut else "answered"
    return "cancelled" if cancelled else "no_answer"


def _source(rec: dict[str, Any]) -> CallSource:
    source = rec.get("source")
    if source == "replayed" or source == "edited":
        return source  # type: ignore[no-any-return]
    return "ran" if rec.get("not_run") is None else "not_run"


def split_turns(log: Log) -> Reading:
    """Cut a log's records into turns (see the module's rules).

    Args:
        log: a log as :func:`~boxmaker.session.read_logs` gives it (its records checked by
            :data:`boxmaker.records.RULES`).

    Returns:
        The :class:`Reading`.
    """
    records = log.records
    types = [r["type"] for r in records]  # objects with a "type" string: read_log checked
    unknown: dict[str, int] = {}
    if set(types).difference(KNOWN_TYPES):
        for t in types:
            if t not in KNOWN_TYPES:
                unknown[str(t)] = unknown.get(str(t), 0) + 1
    copied = copied_records(records)
    forked = records[0] if copied else None
    fork_time = forked["time"] if forked is not None else None
    bounds = [i for i, t in enumerate(types) if t == "user"]
    starts = ([0] if not bounds or bounds[0] > 0 else []) + bounds
    if not records:
        starts = []
    arguments: dict[str, int] = {}  # tool_call_id -> len(arguments), over the log so far
    approvals: dict[Any, int] = {}  # call number -> its latest Approval record not yet used
    request = 0
    last_time = log.head.get("time")
    turns: list[Turn] = []
    number: int | None = None
    for n, start in enumerate(starts):
        stop = starts[n + 1] if n + 1 < len(starts) else len(records)
        if types[start] == "user":
            number = 1 if number is None else number + 1
        turn, request, last_time = _turn(
            records,
            types,
            start,
            stop,
            number,
            copied,
            fork_time,
            request,
            arguments,
            approvals,
            last_time,
        )
        turns.append(turn)
    started = fork_time if fork_time is not None else log.head.get("time")
    problems: tuple[str, ...] = (unknown_types(log.path, unknown),) if unknown else ()
    problems += tuple(
        backwards(log.path, t.number)
        for t in turns
        if t.number is not None
        and isinstance(t.started, str)
        and isinstance(t.ended, str)
        and parse_time(t.ended) < parse_time(t.started)
    )
    return Reading(log, copied, forked, started, last_time, tuple(turns), unknown, problems)


def unknown_types(path: str, unknown: Mapping[str, int]) -> str:
    """The warning of records of a type this version does not know (a newer version's),
    skipped by every reader."""
    return f"{path}: records of unknown type skipped: {', '.join(sorted(unknown))}"


def backwards(path: str, turn: int) -> str:
    """The warning of a turn that ends before it starts (its ``wall_ms`` is negative): the
    clock that wrote the log went back (an NTP step, records from two machines)."""
    return (
        f"{path}: turn {turn} ends before it starts (the log's clock went back): "
        "its wall_ms is negative"
    )


def _turn(
    records: list[Any],
    types: list[Any],
    start: int,
    stop: int,
    number: int | None,
    copied: int,
    fork_time: Any,
    request: int,
    arguments: dict[str, int],
    approvals: dict[Any, int],
    last_time: Any,
) -> tuple[Turn, int, Any]:
    """One turn ``records[start:stop]``; returns it, the session's latest completion after it
    and the latest time of a known record."""
    completions: list[Request] = []
    calls: list[Call] = []
    limits: list[tuple[int, int]] = []
    losses: list[tuple[int, int]] = []
    end: dict[str, Any] | None = None
    assistant: int | None = None
    last_known = start
    iterations = own_iterations = 0
    for i in range(start, stop):
        kind = types[i]
        if kind not in KNOWN_TYPES:
            continue
        last_known = i
        rec = records[i]
        last_time = rec["time"]
        if kind == "assistant":
            assistant = i
            for c in rec.get("tool_calls") or ():
                arguments[c["id"]] = len(c["arguments"])
            if rec.get("tool_calls"):
                iterations += 1
                own_iterations += i >= copied
        elif kind == "usage":
            request += 1
            count = None if assistant is None else len(records[assistant].get("tool_calls") or ())
            in_turn = len(completions) + 1 if number is not None else None
            completions.append(Request(request, in_turn, i, assistant, count, i < copied))
            assistant = None
        elif kind == "tool_result":
            approval = approvals.pop(rec["call"], None)
            chars = arguments.get(rec["tool_call_id"])
            calls.append(Call(i, request, _source(rec), chars, approval, i < copied))
        elif kind == "approval":
            approvals[rec["call"]] = i
        elif kind == "limit_hit":
            limits.append((i, request))
        elif kind == "cache_loss":
            losses.append((i, request))
        elif kind == "turn_end":
            end = rec
    from_parent = last_known < copied
    iterations = iterations if from_parent else own_iterations
    own = stop if from_parent else max(start, min(copied, stop))
    started = records[start]["time"] if start < stop else last_time
    if not from_parent and start < copied and number is not None:
        started = _later(fork_time, started)  # a turn the fork continues from copied records
    if end is not None:
        outcome, detail, status = end["outcome"], end.get("detail"), end.get("status")
    else:
        known = [k for k in range(start, stop) if types[k] in KNOWN_TYPES]
        outcome = inferred_outcome([types[k] for k in known], [records[k] for k in known])
        detail = status = None
    turn = Turn(
        number=number,
        start=start,
        stop=stop,
        own=own,
        from_parent=from_parent,
        started=started,
        ended=last_time,
        outcome=outcome,
        detail=detail,
        status=status,
        completions=tuple(completions),
        calls=tuple(calls),
        limits=tuple(limits),
        losses=tuple(losses),
        iterations=iterations,
    )
    return turn, request, last_time
