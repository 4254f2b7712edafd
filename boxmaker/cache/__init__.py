"""The prompt cache: ``cache_outcome(previous_timings, new_timings)`` (hit or loss, pure)
and cache-loss forensics (why a loss happened, in the model's tokens, through the
server's ``/apply-template`` and ``/tokenize``).
"""

from .._public import publish
from ._forensics import CacheForensics, explain_log, extra_requests_paused, paused_while
from ._outcome import (
    CAUSES,
    WINDOW_TOKENS,
    CacheOutcome,
    LossCause,
    Tokens,
    cache_outcome,
    classify_loss,
    first_divergence,
    history_change,
    reprocessed,
    window,
)

__all__ = [
    "CAUSES",
    "WINDOW_TOKENS",
    "CacheForensics",
    "CacheOutcome",
    "LossCause",
    "Tokens",
    "cache_outcome",
    "classify_loss",
    "explain_log",
    "extra_requests_paused",
    "first_divergence",
    "history_change",
    "paused_while",
    "reprocessed",
    "window",
]

publish(globals(), __all__)
