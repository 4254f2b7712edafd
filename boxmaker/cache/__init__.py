"""The prompt cache: ``cache_outcome(previous_timings, new_timings)`` (hit or loss, pure;
``cache_loss`` gives the loop's ``CacheLoss`` record) and cache-loss forensics (why a loss
happened, in the model's tokens, through the server's ``/apply-template`` and ``/tokenize``,
asked through the client's side requests).
"""

from .._public import publish
from ._forensics import CacheForensics, SentRequest, TemplateServer, explain_log, explain_loss
from ._outcome import (
    CAUSES,
    WINDOW_TOKENS,
    CacheOutcome,
    LossCause,
    Tokens,
    cache_loss,
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
    "SentRequest",
    "TemplateServer",
    "Tokens",
    "cache_loss",
    "cache_outcome",
    "classify_loss",
    "explain_log",
    "explain_loss",
    "first_divergence",
    "history_change",
    "reprocessed",
    "window",
]

publish(globals(), __all__)
