"""``run_turn``: one turn of the agent loop and its limits (the spec's steps, in order),
the loop guard, the turn's client-side bounds (``TurnBounds``), the log made whole when a
limit ends a turn, and ``TurnRunner``: one turn on a worker thread, stopped through a
``CancelToken`` the caller makes and the loop never clears; a fork's next turn
(``continue_fork``) with its parent's tool results replayed while the calls match
(``Replay``).
"""

from .._public import publish
from ._bounds import THINKING_GRACE, TOKEN_GRACE, TurnBounds
from ._continue import continue_fork
from ._fork import Replay
from ._guard import ALREADY_MADE, NUDGE, LoopGuard
from ._loop import Runtime, TurnOutcome, run_turn
from ._runner import CancelToken, TurnRunner

__all__ = [
    "ALREADY_MADE",
    "NUDGE",
    "THINKING_GRACE",
    "TOKEN_GRACE",
    "CancelToken",
    "LoopGuard",
    "Replay",
    "Runtime",
    "TurnBounds",
    "TurnOutcome",
    "TurnRunner",
    "continue_fork",
    "run_turn",
]

publish(globals(), __all__)
