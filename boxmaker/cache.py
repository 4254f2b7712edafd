"""Prompt-cache outcome between two completions of a session (llama.cpp ``timings``).

After each completion llama.cpp reports ``timings.cache_n`` (prompt tokens reused from the
slot's cache) and ``timings.prompt_n`` (prompt tokens processed anew). Because every request of
a session extends the previous one, the next request should reuse at least the previous
``cache_n + prompt_n`` tokens. Less is a loss: the server threw away (part of) what it had.
Recordings made in separate conversations do not line up, and a loss between them is correct.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CacheOutcome", "cache_outcome"]


@dataclass(frozen=True, kw_only=True)
class CacheOutcome:
    """``expected``: previous ``cache_n + prompt_n`` (tokens); ``reused``: new ``cache_n``
    (tokens); ``hit``: ``reused >= expected``; ``lost``: ``max(0, expected - reused)``."""

    expected: int
    reused: int

    @property
    def hit(self) -> bool:
        """True when the new request reused everything the previous one made cacheable."""
        return self.reused >= self.expected

    @property
    def lost(self) -> int:
        """Tokens that had to be processed again (0 on a hit)."""
        return max(0, self.expected - self.reused)


def cache_outcome(
    previous_timings: Mapping[str, float], new_timings: Mapping[str, float]
) -> CacheOutcome | None:
    """Compare two completions' ``timings``; ``None`` when either lacks ``cache_n``/``prompt_n``.

    Args:
        previous_timings: llama.cpp ``timings`` of the earlier completion.
        new_timings: ``timings`` of the completion that followed it in the same session.
    """
    try:
        expected = int(previous_timings["cache_n"]) + int(previous_timings["prompt_n"])
        reused = int(new_timings["cache_n"])
    except (KeyError, TypeError, ValueError):
        return None
    return CacheOutcome(expected=expected, reused=reused)
