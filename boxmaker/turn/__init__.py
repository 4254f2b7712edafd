"""``run_turn``: one turn of the agent loop and its limits (the spec's steps, in order),
the loop guard, the turn's client-side bounds (``TurnBounds``), the log made whole when a
limit ends a turn, and ``TurnRunner``: one turn on a worker thread, stopped through a
``CancelToken`` the caller makes and the loop never clears.
"""

from .._public import publish
from ._bounds import THINKING_GRACE, TOKEN_GRACE, TurnBounds
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
    "Runtime",
    "TurnBounds",
    "TurnOutcome",
    "TurnRunner",
    "run_turn",
]

publish(globals(), __all__)
