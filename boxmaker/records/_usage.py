"""The figures of a completion's ``Usage`` record, as every view counts them: what the server
measured, or unknown (``None``), never 0 for a figure it did not send."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from ._codec import record_to_json
from ._types import Usage

__all__ = ["UsageTokens", "usage_tokens"]


class UsageTokens(NamedTuple):
    """One completion's tokens, as every view counts them (``None``: unknown, never 0).

    Attributes:
        prompt: the prompt's size: llama.cpp's ``cache_n + prompt_n``, else the OpenAI
            ``usage.prompt_tokens`` the server sent (vLLM and proxies send no ``timings``).
        cached: ``cache_n``, the prompt tokens reused from the slot's cache.
        processed: ``prompt_n``, the prompt tokens processed anew.
        generated: ``predicted_n``, else ``usage.completion_tokens``.
        reasoning: the record's ``reasoning_tokens``.
    """

    prompt: int | None
    cached: int | None
    processed: int | None
    generated: int | None
    reasoning: int | None


def usage_tokens(usage: Usage | Mapping[str, Any]) -> UsageTokens:
    """The :class:`UsageTokens` of a ``Usage`` record (the record, or its JSON): the one rule
    of every view (the frames' ``requests`` columns compute it too, vectorised:
    ``prompt_tokens``, ``cached_tokens``, ...; the DuckDB engine in SQL)."""
    if isinstance(usage, Usage):
        usage = record_to_json(usage)
    timings = usage.get("timings") or {}
    cached, processed = timings.get("cache_n"), timings.get("prompt_n")
    prompt = cached + processed if cached is not None and processed is not None else None
    if prompt is None:
        prompt = usage.get("prompt_tokens")
    generated = timings.get("predicted_n")
    if generated is None:
        generated = usage.get("completion_tokens")
    return UsageTokens(prompt, cached, processed, generated, usage.get("reasoning_tokens"))
