"""``continue_fork``: a fork's next turn, from where its parent's records stop."""

from __future__ import annotations

import threading

from ..errors import SessionError
from ..events import Hook
from ..session import Session
from ._loop import Runtime, TurnOutcome, run_turn

__all__ = ["continue_fork"]


def continue_fork(
    fork: Session,
    runtime: Runtime,
    content: str | None = None,
    on_event: Hook | None = None,
    *,
    cancel: threading.Event | None = None,
) -> TurnOutcome:
    """Run a fork's next turn: turn ``k`` again with its user message (``before_answer``,
    or ``content`` in its place), the rest of the open turn (``edited_result``: the turn's
    other calls, then the next completion), or a new turn of ``content``.

    Args:
        fork: a log made by :meth:`~boxmaker.session.Session.fork`, open for writing.
        runtime: what the fork runs with (other limits, sampling, tools, model or server);
            set ``runtime.replay`` (:meth:`Replay.of`) to replay the parent's tool results.
        content: the user message (needed after the fork's first turn or ``after_turn``).
        on_event, cancel: as :func:`~boxmaker.turn.run_turn`.

    Raises:
        SessionError: ``fork`` is no fork, or ``content`` is needed and missing.
        TurnError: as :func:`~boxmaker.turn.run_turn`.
    """
    forked = fork.forked
    if forked is None:
        raise SessionError(f"{fork.path}: not a fork (no 'forked' record)")
    fresh = len(fork.records) == forked.record + (forked.point == "edited_result")
    if fresh and forked.point == "edited_result":
        return run_turn(fork, runtime, None, on_event, cancel=cancel)
    text = content if content is not None else forked.rerun if fresh else None
    if text is None:
        raise SessionError(f"{fork.path}: the fork's next turn needs a user message")
    return run_turn(fork, runtime, text, on_event, cancel=cancel)
