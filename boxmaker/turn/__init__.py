"""``run_turn``: one turn of the agent loop and its limits (the spec's steps, in order),
the loop guard, the turn's client-side bounds (``TurnBounds``), and the log made whole when a
limit ends a turn.
"""

from .._public import publish
from ._bounds import THINKING_GRACE, TOKEN_GRACE, TurnBounds
from ._guard import ALREADY_MADE, NUDGE, LoopGuard
from ._loop import Runtime, TurnOutcome, run_turn

__all__ = [
    "ALREADY_MADE",
    "NUDGE",
    "THINKING_GRACE",
    "TOKEN_GRACE",
    "LoopGuard",
    "Runtime",
    "TurnBounds",
    "TurnOutcome",
    "run_turn",
]

publish(globals(), __all__)
