"""The thinking cap of one streamed completion: when reasoning was ended by the budget, when
to send ``reasoning_end`` as the fallback, and when to say the cap could not be enforced.

The budget goes with the request as llama.cpp's ``thinking_budget_tokens`` (its sampler ends
reasoning after ``budget - 1`` reasoning deltas; measured on the embedded server: budgets 3,
5, 10, 40 gave 2, 4, 9, 39 deltas). :class:`ThinkingCap` watches the
:class:`ChunkDecoder` after each chunk (no I/O of its own: ending reasoning
is the ``control`` callable the client passes).
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import InferError
from ..events import ClientEvent
from ._stream._chunks import ChunkDecoder

__all__ = ["IGNORED_BUDGET_MARGIN", "NO_REASONING", "ThinkingCap"]

NO_REASONING = (
    "the model does not reason: its chat template renders no reasoning (GET /props), so the "
    "thinking cap has nothing to cap"
)
"""What the cap says on a model without reasoning (not a limit hit: the server is fine)."""

IGNORED_BUDGET_MARGIN = 2
"""Reasoning deltas beyond the ``thinking_budget_tokens`` sent before the client decides the
server ignored it and sends ``reasoning_end`` (the fallback). A delta holds at least one
token, so a server that honours the budget never reaches the margin."""

Control = Callable[[str], tuple[bool, str]]
"""Send ``reasoning_end`` for a completion id: ``(success, answer text)``; raises
:class:`~boxmaker.errors.InferError` when the request fails."""


class ThinkingCap:
    """The cap of one completion with a reasoning budget.

    Args:
        budget: reasoning tokens this completion may use (``>= 0``).
        sent: the budget went with the request as ``thinking_budget_tokens``; ``False``:
            ``reasoning_end`` is sent once ``max(budget, 1)`` reasoning deltas came.
        control: sends ``reasoning_end`` (:data:`Control`).
        warn_unseen: called when no reasoning was seen at all; returns whether to say so
            (the client says it once per client).
        reasons: whether the model reasons at all, as the server's ``/props`` says
            (:attr:`boxmaker.records.Capabilities.reasoning`); ``None``: not known.

    Call :meth:`check` after each chunk. Outcomes (at most one, events passed to
    ``on_event``): :class:`~boxmaker.events.ThinkingCapped` when the answer starts after
    ``budget - 1`` to ``budget`` reasoning deltas (the sampler ended it; a model that stops by
    itself at that count looks the same) or when ``reasoning_end`` was accepted (sent once the
    deltas reach ``budget +`` :data:`IGNORED_BUDGET_MARGIN` while reasoning goes on);
    :class:`~boxmaker.events.CapNotEnforced` when ``reasoning_end`` failed or was refused,
    when more reasoning than the budget came with no chance to end it, or, for a budget of 2
    or more, when no reasoning was seen at all; on a model that does not reason (``reasons``
    is ``False``) that last one says so instead, and is not a limit hit (nothing to cap).

    Only the model's reasoning counts: a proxy's text before the model's stream is no
    reasoning (:meth:`ChunkDecoder._take_id`), and while the reasoning may still turn out a
    proxy's (:attr:`ChunkDecoder.provisional`: a stream that has not opened), no
    ``reasoning_end`` is sent, so it never goes out for a proxy's id.
    """

    __slots__ = (
        "_control",
        "_ignored_at",
        "_warn_unseen",
        "budget",
        "reasons",
        "sent",
        "settled",
    )

    def __init__(
        self,
        budget: int,
        sent: bool,
        control: Control,
        warn_unseen: Callable[[], bool],
        *,
        reasons: bool | None = None,
    ) -> None:
        self.budget = budget
        self.reasons = reasons
        self.sent = sent
        self.settled = False  # the cap's outcome is known (capped, warned, or fine)
        self._control = control
        self._warn_unseen = warn_unseen
        self._ignored_at = budget + IGNORED_BUDGET_MARGIN if sent else max(budget, 1)

    def check(self, chunks: ChunkDecoder, on_event: Callable[[ClientEvent], None]) -> None:
        """After a chunk: settle the cap when the answer started, or end reasoning when the
        count shows the server ignored the budget."""
        if self.settled:
            return
        if chunks.thinking_capped or chunks.cap_warning is not None:
            self.settled = True
        elif chunks.answering:  # reasoning is over: did the budget end it?
            self.settled = True
            self._settle(chunks, on_event)
        elif (
            chunks.reasoning_tokens >= self._ignored_at
            and not chunks.reasoning_from_tag
            and not chunks.provisional
        ):
            self._end(chunks, on_event)

    def _settle(self, chunks: ChunkDecoder, on_event: Callable[[ClientEvent], None]) -> None:
        n, budget = chunks.reasoning_tokens, self.budget
        if self.sent and budget - 1 <= n <= budget:
            on_event(chunks.mark_capped())
        elif n > budget:
            how = (
                "it came as content closed by </think>, counted only once it had ended"
                if chunks.reasoning_from_tag and not chunks.reasoning_in_content
                else "it ended before reasoning_end could be sent"
            )
            on_event(
                chunks.mark_unenforced(
                    f"{n} reasoning tokens for a budget of {budget}: the server ignored "
                    f"thinking_budget_tokens and {how} (use a llama-server that honours "
                    "thinking_budget_tokens, or start it with --reasoning-format deepseek)"
                )
            )
        elif n == 0 and budget >= 2 and self.reasons is False and self._warn_unseen():
            on_event(chunks.mark_moot(NO_REASONING))
        elif n == 0 and budget >= 2 and self._warn_unseen():
            on_event(
                chunks.mark_unenforced(
                    "no reasoning seen (no reasoning_content/reasoning field, no <think> tag in "
                    "content): thinking is off (chat_template_kwargs.enable_thinking), or the "
                    "server hides reasoning the cap then cannot count (start llama-server "
                    "with --jinja; --reasoning-format deepseek or none)"
                )
            )

    def _end(self, chunks: ChunkDecoder, on_event: Callable[[ClientEvent], None]) -> None:
        """Send reasoning_end; when it cannot be sent or is refused, say so and read on."""
        what = f"llama-server refused reasoning control for {chunks.id or '(no id)'}"
        if not chunks.id:
            on_event(chunks.mark_unenforced(f"{what}: the stream carried no completion id"))
            return
        try:
            success, text = self._control(chunks.id)
        except InferError as exc:
            why = f"{what}: {exc} (start llama-server with reasoning control enabled)"
            on_event(chunks.mark_unenforced(why))
            return
        if not success:
            on_event(chunks.mark_unenforced(f"{what}: it answered {text}"))
            return
        on_event(chunks.mark_capped())
