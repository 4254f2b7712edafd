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
from pathlib import Path

from ..config import LoopLimits
from ..records import ToolCall
from ..session import open_log, split_turns
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
    over the calls of a session log (a tapped agent's or boxmaker's own), turn by turn as
    :func:`boxmaker.session.split_turns` cuts it (the turns and completions every view counts).

    Raises:
        SessionError: the log cannot be read.
    """
    limits = limits or LoopLimits()
    reading = split_turns(open_log(Path(path)))
    records = reading.records
    turns = [t for t in reading.turns if t.number is not None]
    report = LogWhatIf()
    report.lines.append(f"what-if on the log {path}: {len(turns)} turn(s)")
    for turn in turns:
        assert turn.number is not None
        guard = LoopGuard(limits)
        calls: dict[str, ToolCall] = {}
        results = {records[c.result]["tool_call_id"]: c for c in turn.calls}
        for completion in turn.completions:
            assert completion.in_turn is not None
            if completion.assistant is None or not completion.tool_calls:
                continue
            made = [
                ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"])
                for c in records[completion.assistant]["tool_calls"]
            ]
            if _fires(report, guard, calls, made, turn.number, completion.in_turn):
                break
            for call in made:  # what the agent got back, in the guard's memory
                answered = results.get(call.id)
                if answered is not None and answered.source != "not_run":
                    guard.ran(call, records[answered.result]["content"])
    if not report.hits:
        report.lines.append("no limit fires on this log")
    return report


def _fires(
    report: LogWhatIf,
    guard: LoopGuard,
    calls: dict[str, ToolCall],
    made: list[ToolCall],
    turn: int,
    completion: int,
) -> bool:
    """Check one completion's calls: whether a limit (or a repeat the guard answers) fires,
    reported as a hit."""
    limit = guard.completion()
    if limit is not None:
        return _hit(report, turn, completion, limit.kind, limit.detail)
    for call in made:
        verdict = guard.check(call)
        calls[call.id] = call
        if verdict.action == "stop" and verdict.limit is not None:
            return _hit(report, turn, completion, verdict.limit.kind, verdict.limit.detail)
        if verdict.action == "answer":
            kind = "repeat" if verdict.not_run == "repeat" else "loop"
            return _hit(report, turn, completion, kind, verdict.content)
    return False


def _hit(report: LogWhatIf, turn: int, completion: int, kind: str, detail: str) -> bool:
    report.hits.append((turn, completion, kind, detail))
    report.lines.append(f"turn {turn}, completion {completion}: {kind} fires: {detail}")
    return True
