"""Which of boxmaker's loop limits would have stopped a logged agent: the loop guard run
over a session log's own calls (no server, no model: what the agent did is what it did).

A tapped agent's requests are its own, so a cassette replay through boxmaker's loop would
miss at its first request; the calls and results in the log are enough to say where each
limit fires: per turn, each completion with tool calls counts toward ``tool_iterations``,
each call goes through :class:`boxmaker.turn.LoopGuard` (repeats, cycles, stale results,
per-tool caps) with the result the agent got. The first limit that would have ended or
nudged the turn is reported; after it the agent's own course is unknown, so the turn is
left there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..config import LoopLimits
from ..records import Assistant, ToolCall, ToolResult, TurnEnd, User
from ..session import Session
from ..turn import LoopGuard

__all__ = ["LogWhatIf", "what_if_log"]


@dataclass
class LogWhatIf:
    """The report of :func:`what_if_log`: ``hits`` as ``(turn, completion, kind, detail)``
    (turn and completion numbered from 1, ``kind`` a limit kind or ``"repeat"`` for a repeat
    the guard answers without running), ``lines`` in words (``boxmaker replay`` prints
    them)."""

    hits: list[tuple[int, int, str, str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)


def what_if_log(path: str | os.PathLike[str], limits: LoopLimits | None = None) -> LogWhatIf:
    """Run the loop guard and ``tool_iterations`` of ``limits`` (default ``LoopLimits()``)
    over the calls of a session log (a tapped agent's or boxmaker's own).

    Raises:
        SessionError: the log cannot be read.
    """
    limits = limits or LoopLimits()
    with Session.open(path, read_only=True) as session:
        records = session.records
    report = LogWhatIf()
    turns = sum(isinstance(r, User) for r in records)
    report.lines.append(f"what-if on the log {path}: {turns} turn(s)")
    guard, turn, completion, stopped = LoopGuard(limits), 0, 0, False
    calls: dict[str, ToolCall] = {}
    for record in records:
        if isinstance(record, User):
            guard, turn, completion, stopped = LoopGuard(limits), turn + 1, 0, False
        elif isinstance(record, Assistant) and not stopped:
            completion += 1
            if not record.tool_calls:
                continue
            limit = guard.completion()
            if limit is not None:
                stopped = _hit(report, turn, completion, limit.kind, limit.detail)
                continue
            for call in record.tool_calls:
                verdict = guard.check(call)
                calls[call.id] = call
                if verdict.action == "stop" and verdict.limit is not None:
                    stopped = _hit(
                        report, turn, completion, verdict.limit.kind, verdict.limit.detail
                    )
                    break
                if verdict.action == "answer":
                    kind = "repeat" if verdict.not_run == "repeat" else "loop"
                    stopped = _hit(report, turn, completion, kind, verdict.content)
                    break
        elif isinstance(record, ToolResult) and not stopped:
            made = calls.get(record.tool_call_id)
            if made is not None and record.not_run is None:
                guard.ran(made, record.content)
        elif isinstance(record, TurnEnd):
            calls.clear()
    if not report.hits:
        report.lines.append("no limit fires on this log")
    return report


def _hit(report: LogWhatIf, turn: int, completion: int, kind: str, detail: str) -> bool:
    report.hits.append((turn, completion, kind, detail))
    report.lines.append(f"turn {turn}, completion {completion}: {kind} fires: {detail}")
    return True
