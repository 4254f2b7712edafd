"""One finished streamed chat completion: :class:`Completion`, what
:class:`ChunkDecoder` joins from a stream's chunks (OpenAI chat-completions
streaming format with llama.cpp's additions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...records import LimitHit, ToolCall, Usage, is_measurement

__all__ = ["Completion", "reported_reasoning"]


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One finished streamed chat completion, joined from its chunks.

    Attributes:
        id: the stream's ``id`` (``"chatcmpl-..."``), ``""`` if the server sent none.
        content: the joined ``delta.content`` fragments, ``None`` if none came.
        reasoning: the joined ``delta.reasoning_content`` (llama.cpp's reasoning parser, the
            model's ``<think>`` text) or ``delta.reasoning`` (Ollama, vLLM) fragments, or the
            content inside ``<think>...</think>`` or before a ``</think>`` that had no opening
            tag (see
            :class:`ChunkDecoder`); ``None`` if none came.
        tool_calls: the calls of ``delta.tool_calls`` in ``index`` order (see
            :class:`ChunkDecoder` for how deltas are matched to calls);
            ``arguments`` is the exact joined text (neither parsed nor re-serialised, so it
            may be invalid JSON), except arguments sent as a JSON object, which become
            canonical JSON text. A call the server sent without ``id`` gets a made-up one
            derived from the completion id and the call's number (stable when a recording is
            replayed).
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``..., ``None`` if the stream
            ended with ``[DONE]`` but no finish reason.
        timings: llama.cpp's ``timings`` of the last chunk that carried them (``cache_n``,
            ``prompt_n``, ``predicted_n`` in tokens; ``prompt_ms``, ``predicted_ms`` in ms;
            ``*_per_second``...), ``{}`` if none.
        usage: the OpenAI ``usage`` object of the last chunk that carried it
            (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
            ``prompt_tokens_details.cached_tokens``), ``{}`` if none.
        reasoning_tokens: number of reasoning deltas received (llama.cpp sends about one token
            per delta, so this counts reasoning tokens), content deltas moved to ``reasoning``
            by a ``</think>`` included.
        thinking_capped: the thinking cap ended this completion's reasoning (the server's
            ``thinking_budget_tokens``, or ``reasoning_end`` sent; see
            :meth:`boxmaker.client.Client.chat`).
        cap_warning: why the thinking cap could not be enforced on this completion
            (:class:`~boxmaker.events.CapNotEnforced`), ``None`` when it could or none was set.
        proxy_text: what a proxy in front of the server streamed as its own chunks before the
            model's (llama-swap's loading progress, sent as ``reasoning_content``), joined;
            not the model's reasoning, not counted in ``reasoning_tokens``. ``None`` if none.
        cap_moot: the cap had nothing to cap (a model that does not reason; ``cap_warning``
            says so): not a limit hit.
        whole: the answer came as one ``chat.completion`` (a server or proxy that ignored
            ``stream: true``), not as a stream: its reasoning came in one piece, so
            ``reasoning_tokens`` is the server's ``usage.completion_tokens_details.
            reasoning_tokens`` (``0`` when it sent none; the log then says unknown, see
            :meth:`usage_record`).
    """

    id: str
    content: str | None
    reasoning: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    timings: dict[str, float] = field(default_factory=dict)
    usage: dict[str, Any] = field(default_factory=dict)
    reasoning_tokens: int = 0
    thinking_capped: bool = False
    cap_warning: str | None = None
    proxy_text: str | None = None
    cap_moot: bool = False
    whole: bool = False

    def limit_hits(self) -> list[LimitHit]:
        """The session log's thinking-cap records of this completion: a
        ``LimitHit(kind="thinking_cap")`` when the cap ended reasoning (detail ``"reasoning
        ended after N tokens of this completion"``), or when it could not be enforced (detail
        ``"not enforced: ..."`` with the reason); ``[]`` otherwise (also when the model does
        not reason: ``cap_moot``)."""
        n = self.reasoning_tokens
        if self.thinking_capped:
            detail = f"reasoning ended after {n} tokens of this completion"
            return [LimitHit(kind="thinking_cap", detail=detail)]
        if self.cap_warning is not None and not self.cap_moot:
            return [LimitHit(kind="thinking_cap", detail=f"not enforced: {self.cap_warning}")]
        return []

    def usage_record(self) -> Usage:
        """The session log's :class:`~boxmaker.records.Usage` record of this completion: what
        the server measured, or unknown (``None``), never a guess.

        - ``timings`` as sent, but a value that is not a finite number >= 0 (e.g. the ``null``
          llama.cpp sends for a rate over 0 ms) is left out: the log holds measurements only;
        - ``prompt_tokens`` / ``completion_tokens`` from the OpenAI ``usage`` (of the last
          chunk that carried one: running totals keep the last); ``None`` when absent, not a
          count, or impossible: ``prompt_tokens`` 0 (a chat prompt is never empty: Ollama
          sends 0 for a cached one, ollama/ollama#5370) or ``completion_tokens`` 0 for a
          completion that brought text or calls; ``note`` names each figure left out so;
        - ``reasoning_tokens``: the server's ``completion_tokens_details.reasoning_tokens``
          when it sent one (on a stream: one above 0, a 0 beside streamed reasoning being a
          placeholder); else the reasoning deltas counted (``0``: no reasoning came), or for
          a :attr:`whole` answer ``None`` when reasoning came (one piece is no count), ``0``
          when none did;
        - the thinking-cap flag and the ``finish_reason``.
        """
        notes: list[str] = []
        prompt = _count(self.usage, "prompt_tokens", notes)
        if prompt == 0:
            prompt = None
            notes.append("usage.prompt_tokens 0 for a prompt that is never empty: left unknown")
        completion = _count(self.usage, "completion_tokens", notes)
        if completion == 0 and (self.content or self.reasoning or self.tool_calls):
            completion = None
            notes.append("usage.completion_tokens 0 for a completion with output: left unknown")
        return Usage(
            timings={k: v for k, v in self.timings.items() if is_measurement(v, k)},
            reasoning_tokens=self._reasoning_count(),
            thinking_capped=self.thinking_capped,
            prompt_tokens=prompt,
            completion_tokens=completion,
            finish_reason=self.finish_reason,
            note="; ".join(notes) or None,
        )

    def _reasoning_count(self) -> int | None:
        """The log's ``reasoning_tokens`` (see :meth:`usage_record`): the server's count
        whenever it sent one (a stream's deltas are a count of tokens only where each is
        one, as llama.cpp streams them: a server that sends several a delta reported 12 and
        the log said 2)."""
        sent = reported_reasoning(self.usage)
        if not self.whole:  # a 0 beside streamed reasoning is a placeholder (sglang sends it)
            return sent if sent else self.reasoning_tokens
        if sent is not None:
            return sent
        return None if self.reasoning else 0


def reported_reasoning(usage: dict[str, Any]) -> int | None:
    """The reasoning tokens a server reported in an OpenAI ``usage`` object
    (``completion_tokens_details.reasoning_tokens``), ``None`` when it did not."""
    details = usage.get("completion_tokens_details")
    return _count(details, "reasoning_tokens", []) if isinstance(details, dict) else None


def _count(usage: dict[str, Any], key: str, notes: list[str]) -> int | None:
    """``usage[key]`` when it is a token count (an int, 0 or more, not a bool), else ``None``;
    a value that is there but no count is named in ``notes``."""
    value = usage.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63:
        return value
    if value is not None:
        notes.append(f"usage.{key} {str(value)[:40]} is not a token count: left unknown")
    return None
