"""The prompt cache: ``cache_outcome(previous_timings, new_timings)`` (hit or loss, pure;
``cache_loss`` gives the loop's ``CacheLoss`` record) and cache-loss forensics (why a loss
happened, in the model's tokens, through the server's ``/apply-template`` and ``/tokenize``,
asked through the client's side requests); saved slots (``SlotStore``: a session's slot
saved at a turn's end, by session and turn) and ``warm_fork``: a fork's first request served
from its parent's prompt cache (a slot that holds it, else the saved slot restored, else cold
with a ``ColdFork`` warning); a fork's warmth measured at its first completion
(``fork_warmth``: the share of its parent's prefix reused, and the label that follows).
"""

from .._public import publish
from ._forensics import (
    CacheForensics,
    ExplainedLoss,
    SentRequest,
    TemplateServer,
    explain_log,
    explain_loss,
)
from ._outcome import (
    CAUSES,
    REMEDIES,
    WINDOW_TOKENS,
    CacheOutcome,
    LossCause,
    TokenizedText,
    cache_loss,
    cache_outcome,
    classify_loss,
    first_divergence,
    held_tokens,
    history_change,
    reprocessed,
    window,
)
from ._slot_store import ColdFork, SlotFile, SlotStore, WarmStart, warm_fork
from ._warmth import COLD_SHARE, WARM_SHARE, describe_warmth, fork_prefix, fork_warmth

__all__ = [
    "CAUSES",
    "COLD_SHARE",
    "REMEDIES",
    "WARM_SHARE",
    "WINDOW_TOKENS",
    "CacheForensics",
    "CacheOutcome",
    "ColdFork",
    "ExplainedLoss",
    "LossCause",
    "SentRequest",
    "SlotFile",
    "SlotStore",
    "TemplateServer",
    "TokenizedText",
    "WarmStart",
    "cache_loss",
    "cache_outcome",
    "classify_loss",
    "describe_warmth",
    "explain_log",
    "explain_loss",
    "first_divergence",
    "fork_prefix",
    "fork_warmth",
    "held_tokens",
    "history_change",
    "reprocessed",
    "warm_fork",
    "window",
]

publish(globals(), __all__)
