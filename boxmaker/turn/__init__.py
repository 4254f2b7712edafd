"""``run_turn``: one turn of the agent loop and its limits (the spec's steps, in order),
the loop guard, and the log made whole when a limit ends a turn.
"""

from .._public import publish
from ._guard import ALREADY_MADE, NUDGE, LoopGuard
from ._loop import Runtime, TurnOutcome, run_turn

__all__ = ["ALREADY_MADE", "NUDGE", "LoopGuard", "Runtime", "TurnOutcome", "run_turn"]

publish(globals(), __all__)
