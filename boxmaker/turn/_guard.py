"""The loop guard: every rule that stops a turn going round in circles, in one place.

:func:`boxmaker.turn.run_turn` asks one :class:`LoopGuard` per turn two questions: after each
completion with tool calls, :meth:`LoopGuard.completion` (the ``tool_iterations`` cap), and
before each tool call, :meth:`LoopGuard.check` (run it, answer it without running, or end the
turn); after a call ran it reports the result with :meth:`LoopGuard.ran`. The knobs are in
:class:`boxmaker.config.LoopLimits` (``config.loop``):

- identical repeats (the cycle of length 1, counted anywhere in the turn): the
  ``repeat_answered_at``-th identical (name, canonical arguments) call is answered
  :data:`ALREADY_MADE` (``not_run="repeat"``), the ``repeat_ends_turn_at``-th ends the turn
  (``TurnLimit`` of kind ``repeated_call``);
- cycles of length 2 to ``cycle_length``: the turn's last calls are one block of that many
  calls repeated ``cycle_repeats`` times in a row (A, B, A, B);
- stale results: a tool that returned the same result ``stale_results_at`` times in the turn,
  whatever the arguments: its next call fires;
- per-tool call caps (``tool_call_caps``): the call past a tool's cap fires.

The last three share one policy: the first time one fires in a turn the call is answered with
a nudge saying what was detected (``not_run="loop"``, the call is not run); the turn ends
(``TurnLimit`` of kind ``loop``, whose detail names the rule, and for a cycle its length and
calls) the next time one fires, or as soon as the model calls again what the nudge named (a
call of the cycle, the stale or capped tool), though the rule itself would not fire on it (a
model told to stop alternating A and B that calls B once more has not heeded the nudge).
Tools named in ``repeat_exempt`` (a status poll is meant to repeat) are left out of the
repeat, cycle and stale rules; a cap named for a tool still applies.

Pure logic: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Literal, cast

from ..config import LoopLimits
from ..errors import TurnLimit
from ..records import NotRunReason, Record, ToolCall, ToolResult, TurnEnd, TurnEndOutcome
from ..session import Session
from ..tools import canonical_arguments

__all__ = [
    "ALREADY_MADE",
    "NUDGE",
    "AnswerAfterLimit",
    "LoopGuard",
    "Verdict",
    "after_limit",
    "dead_turn",
    "ended",
    "not_run_results",
]

ALREADY_MADE = (
    "This call was already made with these arguments in this turn, so it was not run again. "
    "Use the earlier result."
)

NUDGE = (
    "Loop guard: {what}. This call was not run. Do not repeat it: use the results you have, "
    "try something else, or answer."
)
"""The loop guard's answer to the call it nudges (``what`` names the rule's finding)."""


@dataclass(frozen=True)
class Verdict:
    """What to do with one tool call.

    Attributes:
        action: ``"run"`` (dispatch it), ``"answer"`` (do not run it: answer ``content`` with
            ``not_run`` as the reason) or ``"stop"`` (end the turn with ``limit``).
        content: the answer for ``"answer"`` ("" otherwise).
        not_run: ``"repeat"`` or ``"loop"`` for ``"answer"`` (one of
            :data:`boxmaker.records.NOT_RUN_REASONS`), else ``None``.
        limit: the ``TurnLimit`` for ``"stop"``, else ``None``.
    """

    action: Literal["run", "answer", "stop"]
    content: str = ""
    not_run: Literal["repeat", "loop"] | None = None
    limit: TurnLimit | None = None


_RUN = Verdict("run")
_ANSWERED = ("tool_iterations", "repeated_call", "loop")


@dataclass
class LoopGuard:
    """The loop guard of one turn (see the module docstring); one per turn.

    Attributes:
        limits: the knobs (``config.loop``).
        iterations: completions with tool calls in the turn so far.
        calls: canonical (name, arguments) of each call of the turn so far, exempt tools left
            out, in order.
    """

    ANSWER_NOW: ClassVar[str] = "; answer the user now from the results you have"
    """Added to the 'not run' results of the calls a limit stopped when ``on_limit =
    "answer"``: the last completion (without tools) is asked for an answer."""

    limits: LoopLimits
    iterations: int = 0
    calls: list[tuple[str, str]] = field(default_factory=list)
    _seen: Counter[tuple[str, str]] = field(default_factory=Counter)
    _per_tool: Counter[str] = field(default_factory=Counter)
    _results: Counter[tuple[str, str]] = field(default_factory=Counter)
    _nudged: bool = False
    # what the nudge named (a cycle's calls, a stale or capped tool), and its words: a call
    # of it after the nudge ends the turn, though the rule itself may not fire again
    _flagged: tuple[frozenset[tuple[str, str]], frozenset[str], str, str] | None = None

    def completion(self) -> TurnLimit | None:
        """Count one completion with tool calls; the ``TurnLimit`` of kind
        ``tool_iterations`` when that makes more than ``limits.tool_iterations``."""
        self.iterations += 1
        cap, n = self.limits.tool_iterations, self.iterations
        if cap is not None and n > cap:
            why = f"{n} completions with tool calls in this turn, the cap is {cap}"
            return TurnLimit("tool_iterations", n, cap, why)
        return None

    def check(self, call: ToolCall) -> Verdict:
        """The verdict on ``call``, about to run (it is counted as made, whatever the verdict)."""
        lim = self.limits
        self._per_tool[call.name] += 1
        cap = lim.tool_call_caps.get(call.name)
        capped = cap is not None and (n := self._per_tool[call.name]) > cap
        if capped and cap is not None and call.name in lim.repeat_exempt:
            return self._fire("tool_call_cap", n, cap, f"{call.name} called {n} times, cap {cap}")
        if call.name in lim.repeat_exempt:
            return _RUN
        key = (call.name, canonical_arguments(call.arguments))
        self.calls.append(key)
        seen = self._seen[key] = self._seen[key] + 1 if lim.repeat_detection else 1
        if (ends := lim.repeat_ends_turn_at) is not None and seen >= ends:
            why = f"{call.name} was called {seen} times with the same arguments in this turn"
            return Verdict("stop", limit=TurnLimit("repeated_call", seen, ends - 1, why))
        if (answered := lim.repeat_answered_at) is not None and seen >= answered:
            return Verdict("answer", content=ALREADY_MADE, not_run="repeat")
        if (cycle := self._cycle()) is not None:
            length, block = cycle
            names = ", ".join(f"{name} {args}" for name, args in block)
            what = f"a cycle of {length} calls ({names}) repeated {lim.cycle_repeats} times"
            self._flag(frozenset(block), frozenset(), "cycle", what)
            return self._fire("cycle", lim.cycle_repeats, lim.cycle_repeats - 1, what)
        stale = lim.stale_results_at
        same = max((n for (name, _), n in self._results.items() if name == call.name), default=0)
        if stale is not None and same >= stale:
            what = f"{call.name} returned the same result {same} times in this turn"
            self._flag(frozenset(), frozenset({call.name}), "stale_result", what)
            return self._fire("stale_result", same + 1, stale, what)
        if capped and cap is not None:
            what = f"{call.name} called {n} times, cap {cap}"
            self._flag(frozenset(), frozenset({call.name}), "tool_call_cap", what)
            return self._fire("tool_call_cap", n, cap, what)
        if self._flagged is not None and (key in self._flagged[0] or call.name in self._flagged[1]):
            _, _, rule, what = self._flagged
            return self._fire(rule, 2, 1, f"{what}; {call.name} was called again after the nudge")
        return _RUN

    def ran(self, call: ToolCall, content: str) -> None:
        """Note the result of a call that ran (for the stale-results rule)."""
        if call.name not in self.limits.repeat_exempt:
            self._results[(call.name, content)] += 1

    def answers(self, error: BaseException) -> TurnLimit | None:
        """``error`` when the turn it ended gets one last completion without tools
        (``limits.on_limit == "answer"`` and a tool-iteration, repeat or loop-guard
        ``TurnLimit``), else ``None``."""
        if isinstance(error, TurnLimit) and error.kind in _ANSWERED:
            return error if self.limits.on_limit == "answer" else None
        return None

    def _cycle(self) -> tuple[int, Sequence[tuple[str, str]]] | None:
        """The shortest cycle (length 2 to ``cycle_length``) that the last calls repeat
        ``cycle_repeats`` times in a row, as (length, block), else ``None``. A block of one
        call repeated is the length-1 case, left to the repeat rule."""
        k, r, s = self.limits.cycle_length, self.limits.cycle_repeats, self.calls
        for length in range(2, (k or 0) + 1):
            if len(s) < length * r:
                break
            block = s[-length:]
            if len(set(block)) > 1 and all(
                s[-length * (i + 1) : len(s) - length * i] == block for i in range(1, r)
            ):
                return length, block
        return None

    def _flag(
        self, keys: frozenset[tuple[str, str]], names: frozenset[str], rule: str, what: str
    ) -> None:
        """Remember what the first nudge of the turn named."""
        if not self._nudged:
            self._flagged = (keys, names, rule, what)

    def _fire(self, rule: str, value: int, bound: int, what: str) -> Verdict:
        """First firing in the turn: a nudge; later: stop with a ``loop`` ``TurnLimit``."""
        if not self._nudged:
            self._nudged = True
            return Verdict("answer", content=NUDGE.format(what=what), not_run="loop")
        return Verdict("stop", limit=TurnLimit("loop", value, bound, f"rule {rule}: {what}"))


class AnswerAfterLimit(Exception):
    """Raised inside :func:`boxmaker.turn.run_turn` only: ``limit`` ended the turn and
    ``on_limit = "answer"`` asks for one last completion; the log is already whole."""

    def __init__(self, limit: TurnLimit) -> None:
        super().__init__(str(limit))
        self.limit = limit


def after_limit(calls: Sequence[ToolCall], first: int, limit: TurnLimit) -> list[Record]:
    """What follows the last completion after ``limit`` (``on_limit = "answer"``): a 'not run'
    result for each call it made anyway (numbered from ``first``), then the ``TurnEnd`` of
    outcome ``answered_after_limit`` with the limit's words as detail."""
    why = f"the turn ended ({limit})"
    return [
        *not_run_results(calls, first, why, limit.kind),
        TurnEnd(outcome="answered_after_limit", detail=str(limit)),
    ]


def ended(outcome: str, detail: str, status: int | None) -> TurnEnd:
    """The ``TurnEnd`` of a turn a limit or an error ended: ``outcome`` is the limit's kind or
    the error's outcome (one of :data:`~boxmaker.records.TURN_END_OUTCOMES`; the session
    checks it by the log's rule before writing)."""
    return TurnEnd(outcome=cast(TurnEndOutcome, outcome), detail=detail, status=status)


def not_run_results(
    calls: Sequence[ToolCall], first: int, why: str, reason: str
) -> list[ToolResult]:
    """A 'not run' ``ToolResult`` (``not_run=reason``, call numbers from ``first``) for each of
    ``calls`` (the calls of the last assistant still without a result): llama.cpp needs a
    result for every call of the history."""
    return [
        ToolResult(
            call=first + i,
            tool_call_id=call.id,
            name=call.name,
            content=f"This call was not run: {why}.",
            not_run=cast(NotRunReason, reason),  # the log's rule checks it on write
        )
        for i, call in enumerate(calls)
    ]


def dead_turn(session: Session) -> list[Record]:
    """What closes a turn the process running it died in (a log reopened mid-turn), so it
    counts as what it was: a 'not run' result (``not_run="process_died"``) for each call of the
    last assistant without one, and a ``TurnEnd`` of outcome ``process_died`` when the turn was
    left open; ``[]`` for a log whose last turn ended."""
    why = "the process running the turn stopped before it"
    dead = not_run_results(session.unanswered_calls(), session.next_call(), why, "process_died")
    end = [TurnEnd(outcome="process_died", detail=why)] if session.turn_left_open() else []
    return [*dead, *end]
