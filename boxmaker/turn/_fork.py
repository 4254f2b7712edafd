"""A fork's turns: going on from the fork point, and its parent's tool results replayed.

A fork (:meth:`boxmaker.session.Session.fork`) holds its parent's records up to the fork
point. :func:`continue_fork` runs what comes next: turn ``k`` again (``before_answer``), the
rest of the open turn (``edited_result``), or a new turn. :class:`Replay` answers the fork's
tool calls with its parent's results, marked ``source="replayed"``, as long as the fork makes
the parent's calls: the same tool name and canonical arguments
(:func:`boxmaker.tools.canonical_arguments`) at the same position (the ``n``-th call run
since the fork point, counting only calls that ran, in both logs). From the first call that
differs, tools run live; with ``stop=True`` the turn ends there instead
(:class:`~boxmaker.errors.ForkDiverged`, outcome ``diverged``). :func:`warmth` gives the
fork's ``Warmed`` record after its first completion: how much of its parent's prefix the
server reused (:func:`boxmaker.cache.fork_warmth`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..cache import WarmStart, fork_warmth
from ..errors import ForkDiverged, SessionError
from ..records import (
    Assistant,
    CacheLoss,
    Forked,
    Record,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    Warmed,
)
from ..session import Session
from ..tools import Dispatched, canonical_arguments

__all__ = ["Replay", "open_calls", "replayed", "warmth"]


@dataclass
class Replay:
    """The parent's tool results a fork replays, in order, and how far the replay got.

    Args:
        calls: the parent's calls that ran after the fork point, each with its result.
        stop: end the fork's turn at the first call that differs
            (:class:`~boxmaker.errors.ForkDiverged`) instead of running it live.

    Attributes:
        position: calls answered so far (replayed, or the one that diverged).
        diverged_at: the position of the first call that differed; ``None`` while the fork
            follows its parent.
        why: why the replay stopped following the parent there, in words (``None`` while
            it follows): the call differs, the parent made no more calls, or the parent's
            result of the same call was an edit (never replayed as a tool's output).
    """

    calls: Sequence[tuple[ToolCall, ToolResult]]
    stop: bool = False
    position: int = 0
    diverged_at: int | None = None
    why: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def of(cls, fork: Session, *, stop: bool = False) -> Replay:
        """The replay of ``fork``: its parent's calls that ran after the fork point (for an
        edited result, after the edited one), read from the parent's log (read-only).

        A fork that has turns of its own already (a batch run resumed, a second
        ``Replay.of`` for the next turn) goes on where they left off: its replayed results
        count as answered, and a call it answered live means it has diverged already. Turns
        that did not happen (cancelled, failed or cut by a dead process: their message is
        sent again) are not counted.

        Raises:
            SessionError: ``fork`` is no fork, or its parent's log cannot be read.
        """
        forked, path = fork.forked, fork.parent_path()
        if forked is None or path is None:
            raise SessionError(f"{fork.path}: not a fork (no 'forked' record)")
        with Session.open(path, read_only=True) as parent:
            records = parent.records
        replay = cls(calls=_parent_calls(records, forked), stop=stop)
        own = fork.records[forked.record + (forked.point == "edited_result") :]
        replay.position, replay.diverged_at = _answered(own)
        return replay

    def answer(self, call: ToolCall) -> Dispatched | None:
        """The parent's result for ``call`` when it is the parent's call at this position
        (marked ``source="replayed"``), else ``None`` (run it live) from now on.

        Raises:
            ForkDiverged: the call differs and ``stop`` is set.
        """
        with self._lock:
            position = self.position
            self.position += 1
            why, edited = "the parent made no more calls", False
            if self.diverged_at is None and position < len(self.calls):
                theirs, result = self.calls[position]
                same = theirs.name == call.name and canonical_arguments(
                    theirs.arguments
                ) == canonical_arguments(call.arguments)
                if same and result.source != "edited":
                    return Dispatched(
                        content=result.content,
                        data_class=result.data_class,
                        untrusted=result.untrusted,
                        server=result.server,
                        source="replayed",
                    )
                edited = same  # the same call: only its result was an edit
                why = (
                    "the parent's result of this call was edited: never replayed as a tool's"
                    " output, so it runs live"
                    if edited
                    else f"it differs from the parent's call ({theirs.name})"
                )
            first = self.diverged_at is None
            if first:
                self.diverged_at, self.why = position, why
        if self.stop and first:
            if edited:
                raise ForkDiverged(
                    f"the fork's call {position + 1} since the fork point ({call.name}) is its "
                    f"parent's, but {why.removeprefix('the ')}",
                    position=position,
                )
            parent = (
                f"the parent's was {self.calls[position][0].name}"
                if position < len(self.calls)
                else "the parent made no more calls"
            )
            raise ForkDiverged(
                f"the fork's call {position + 1} since the fork point ({call.name}) differs "
                f"from its parent's ({parent})",
                position=position,
            )
        return None


def _parent_calls(records: Sequence[Record], forked: Forked) -> list[tuple[ToolCall, ToolResult]]:
    """The parent's calls that ran after the fork point, each with its result, in order."""
    start = forked.record if forked.point == "edited_result" else forked.record - 1
    out: list[tuple[ToolCall, ToolResult]] = []
    calls: tuple[ToolCall, ...] = ()
    answered = 0
    for i, record in enumerate(records):
        if isinstance(record, Assistant):
            calls, answered = record.tool_calls, 0
        elif isinstance(record, ToolResult):
            call = calls[answered] if answered < len(calls) else None
            answered += 1
            # an edited result keeps its place (the fork's calls are compared by position)
            # but is never replayed (Replay.answer)
            ran = record.not_run is None
            if i >= start and call is not None and ran:
                out.append((call, record))
    return out


_ASKED = frozenset({None, "invalid_call", "denied", "needs_approval", "diverged"})
"""``not_run`` of a fork's result whose call the replay was asked about (the loop asks for
every call it does not answer itself: a repeat, the guard's nudge, a limit's repair)."""


def _answered(own: Sequence[Record]) -> tuple[int, int | None]:
    """``(position, diverged_at)`` of a replay after a fork's own records ``own``: its
    replayed results, up to the first call it answered otherwise; results of turns that did
    not happen (their ``TurnEnd`` ``cancelled``, ``infer_error``, ``process_died``) are left
    out."""
    position = 0
    turn: list[ToolResult] = []
    for record in [*own, None]:
        if isinstance(record, ToolResult):
            turn.append(record)
            continue
        if isinstance(record, TurnEnd) and record.outcome in _NOT_HAPPENED:
            turn = []
            continue
        if record is None or isinstance(record, TurnEnd):
            for result in turn:
                if result.source == "replayed":
                    position += 1
                elif result.source is None and result.not_run in _ASKED:
                    return position + 1, position
            turn = []
    return position, None


_NOT_HAPPENED = frozenset({"cancelled", "infer_error", "process_died"})
"""``TurnEnd`` outcomes of a turn that did not happen: its message is sent again (a batch
run resumed; :data:`boxmaker.batch._tasks.RETRIED_OUTCOMES`)."""


def replayed(replay: Replay | None, call: ToolCall) -> Dispatched | None:
    """``replay.answer(call)``, or ``None`` without a replay."""
    return None if replay is None else replay.answer(call)


def open_calls(session: Session) -> tuple[ToolCall, ...]:
    """The calls still to answer in ``session``'s open turn (going on with a fork made at an
    edited result: the calls after it).

    Raises:
        SessionError: the session has no open turn (give the user's message instead).
    """
    if not session.turn_left_open():
        raise SessionError(f"{session.path}: no open turn to go on with; give a user message")
    return session.unanswered_calls()


def warmth(
    session: Session, start: WarmStart | None, usage: Usage, new: Sequence[Record]
) -> list[Warmed]:
    """The ``Warmed`` record to append with a fork's first completion (``usage``, with the
    ``new`` records about to be appended with it: its ``CacheLoss`` says why when forensics
    could tell); ``[]`` for a session that is no fork, or a fork with a completion of its
    own already. ``start``: what :func:`boxmaker.cache.warm_fork` did for this fork
    (another session's is ignored)."""
    forked = session.forked
    if forked is None:
        return []
    records = session.records
    for i in range(len(records) - 1, forked.record - 1, -1):  # back to the last completion
        if isinstance(records[i], Usage | Warmed):
            return []
    if start is not None and start.session and start.session != session.id:
        start = None
    loss = next((r for r in new if isinstance(r, CacheLoss)), None)
    return [fork_warmth(records, forked, usage, start, loss=loss)]
