"""The transcript of a session as plain data: turn events and log records folded into turns.

:class:`Transcript` folds the events :func:`boxmaker.turn.run_turn` passes to its ``on_event``
(:mod:`boxmaker.events`) and the records of a session log (:mod:`boxmaker.records`) into one
:class:`TurnView` per user message, with its blocks (reasoning, answer, tool calls), counters
and badges, and a :class:`LiveState` of the running request. It is pure: no widgets, no
kernel, no Markdown, no network, so tests drive it with event sequences, and the widgets
(:mod:`boxmaker.widgets`) and the HTML rendering (:mod:`boxmaker.view`) only read it.

Cost: folding one streamed fragment costs the same however long the text already is (fragments
are kept as a list and joined once when the text is read), and only the last turn ever changes,
so a view need re-render only that one (``python benchmarks/transcript.py`` measures both).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TypeVar

from ..events import (
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallStarted,
    TurnEvent,
    Waiting,
)
from ..records import Assistant, CacheLoss, LimitHit, Record, ToolResult, TurnEnd, Usage, User

__all__ = [
    "AnswerBlock",
    "Block",
    "LiveState",
    "ReasoningBlock",
    "ToolBlock",
    "Transcript",
    "TurnView",
]


def _joined(parts: list[str]) -> str:
    """The text of ``parts``; joins them once and keeps the result as the only part."""
    if len(parts) > 1:
        parts[:] = ["".join(parts)]
    return parts[0] if parts else ""


def _tail(parts: list[str], size: int, start: int) -> str:
    """The text of ``parts`` (``size`` characters in all) from character ``start`` on, read
    from the last fragments back: O(characters returned), however long the text before."""
    taken: list[str] = []
    at = size
    for part in reversed(parts):
        if at <= start:
            break
        taken.append(part)
        at -= len(part)
    return "".join(reversed(taken))[max(start - at, 0) :]


@dataclass
class _StreamedText:
    """Text that arrives in fragments: ``parts`` as streamed, read whole as :attr:`text`;
    appending and reading the tail cost O(new text), whatever the length so far."""

    parts: list[str] = field(default_factory=list)
    size: int = field(init=False, default=0)
    """Characters in :attr:`text` (kept as fragments arrive)."""

    def __post_init__(self) -> None:
        self.size = sum(map(len, self.parts))

    @property
    def text(self) -> str:
        """The fragments joined, in order."""
        return _joined(self.parts)

    def append(self, text: str) -> None:
        """Add one streamed fragment (O(1))."""
        self.parts.append(text)
        self.size += len(text)

    def tail(self, start: int) -> str:
        """The text from character ``start`` on; costs O(characters returned)."""
        return _tail(self.parts, self.size, start)


@dataclass
class ReasoningBlock(_StreamedText):
    """Reasoning of one completion.

    ``parts`` the fragments as streamed (read the whole as :attr:`text`), ``tokens`` reasoning
    deltas seen (about one token each) or the log's ``reasoning_tokens``, ``capped`` when the
    thinking cap ended it.
    """

    tokens: int = 0
    capped: bool = False


@dataclass
class AnswerBlock(_StreamedText):
    """The content of one completion, exactly as streamed (Markdown source).

    ``parts`` the fragments as streamed; read the whole as :attr:`text`.
    """


@dataclass
class ToolBlock:
    """One tool call: the model's ``name`` and ``arguments`` text and its ``id``; ``call`` the
    session's call number once known; the result's fields once the result is in."""

    id: str
    name: str
    arguments: str
    call: int | None = None
    result: str | None = None
    data_class: str = ""
    untrusted: bool = False
    truncated: bool = False


Block = ReasoningBlock | AnswerBlock | ToolBlock
"""One block of a turn, in the order the blocks arrived."""

_Streamed = TypeVar("_Streamed", ReasoningBlock, AnswerBlock)


@dataclass
class TurnView:
    """One turn: the user message, the blocks in the order they arrived, counters and badges.

    Counters sum the turn's completions (``Usage`` records): ``prompt`` (``prompt_n``, tokens
    processed), ``cached`` (``cache_n``, tokens reused), ``generated`` (``predicted_n``),
    ``reasoning`` tokens, and ``ms`` (``prompt_ms + predicted_ms``). ``badges`` holds one
    ``(kind, text)`` per ``LimitHit`` (kind = the limit) and ``CacheLoss`` (kind
    ``"cache_loss"``; with the cause forensics found, e.g. ``cache loss (history_rewritten at
    token 571): ...``); ``windows`` maps the index of a cache-loss badge to its ``(old, new)``
    text windows around the divergence, when forensics found them. ``ended`` says why the turn
    stopped early (``None``: it did not, or it is still running).
    """

    user: str
    blocks: list[Block] = field(default_factory=list)
    completions: int = 0
    prompt: int = 0
    cached: int = 0
    generated: int = 0
    reasoning: int = 0
    ms: float = 0.0
    badges: list[tuple[str, str]] = field(default_factory=list)
    windows: dict[int, tuple[str, str]] = field(default_factory=dict)
    ended: str | None = None

    def answer(self) -> str:
        """The answer text of the turn: every content fragment joined, in order."""
        return "".join(b.text for b in self.blocks if isinstance(b, AnswerBlock))


@dataclass
class LiveState:
    """What the running completion is doing: ``status`` (``""``, ``"Queued"``,
    ``"Processing prompt"``, ``"Waiting"``, ``"Generating at N tokens/s"``, ``"Retrying in N s"``,
    ``"Done"``...), prompt ``progress`` as ``(processed, total, cache)`` tokens or ``None``,
    ``first_token_at`` (clock seconds) and ``tokens`` (fragments) of the running completion."""

    status: str = ""
    progress: tuple[int, int, int] | None = None
    first_token_at: float | None = None
    tokens: int = 0


class Transcript:
    """Folds turn events and session records into :class:`TurnView` s (no widgets, no kernel).

    Feed it with :meth:`apply` (the live event stream of :func:`~boxmaker.turn.run_turn`) or
    :meth:`extend` (records of a stored log: the same records the live stream carries, without
    the client events). Both give the same turns; the live stream adds :attr:`live` state.
    Every event changes the last turn only (or starts a new one).

    Args:
        clock: seconds on a monotonic clock, for the generation rate (tests pass a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.turns: list[TurnView] = []
        self.live = LiveState()
        self._clock = clock
        self._streamed = False

    @property
    def streaming_block(self) -> ReasoningBlock | AnswerBlock | None:
        """The block the running completion is streaming into (the last block of the last
        turn, still growing), or ``None`` between completions and for turns from a log."""
        if not (self._streamed and self.turns and self.turns[-1].blocks):
            return None
        last = self.turns[-1].blocks[-1]
        return last if isinstance(last, ReasoningBlock | AnswerBlock) else None

    def extend(self, events: Iterable[TurnEvent | Record]) -> Transcript:
        """Apply each event in order; returns ``self``."""
        for event in events:
            self.apply(event)
        return self

    def _turn(self) -> TurnView:
        if not self.turns:  # a log that starts without a user message
            self.turns.append(TurnView(user=""))
        return self.turns[-1]

    def _last(self, kind: type[_Streamed]) -> _Streamed:
        """The last block of the last turn if it is a ``kind``, else a new one appended."""
        blocks = self._turn().blocks
        last = blocks[-1] if blocks else None
        if isinstance(last, kind):
            return last
        block = kind()
        blocks.append(block)
        return block

    def apply(self, event: TurnEvent | Record, at: float | None = None) -> None:
        """Fold one event or record into the transcript.

        Args:
            event: the event or record.
            at: when it arrived, on the ``clock``'s scale (``None``: now); a hook that buffers
                events passes their arrival times so the generation rate stays true.
        """
        live = self.live
        if isinstance(event, User):
            self.turns.append(TurnView(user=event.content))
            self.live = LiveState()
            self._streamed = False
        elif isinstance(event, Queued):
            live.status, live.progress, live.first_token_at, live.tokens = "Queued", None, None, 0
        elif isinstance(event, Progress):
            live.status = "Processing prompt"
            live.progress = (event.processed, event.total, event.cache)
        elif isinstance(event, Waiting):
            live.status = "Waiting"
        elif isinstance(event, Reasoning | Content):
            self._stream(event, self._clock() if at is None else at)
        elif isinstance(event, ThinkingCapped):
            self._last(ReasoningBlock).capped = True
        elif isinstance(event, Retrying):
            live.status = f"Retrying in {event.delay_s:g} s (attempt {event.attempt})"
        elif isinstance(event, Assistant):
            self._assistant(event)
        elif isinstance(event, ToolCallStarted):
            block = self._pending(lambda b: b.call is None and b.name == event.name)
            if block is not None:
                block.call = event.call
            live.status = f"Running {event.name}"
        elif isinstance(event, ToolResult):
            self._tool_result(event)
        elif isinstance(event, Usage):
            self._usage(event)
        elif isinstance(event, CacheLoss):
            self._cache_loss(event)
        elif isinstance(event, LimitHit):
            self._turn().badges.append((event.kind, f"{event.kind}: {event.detail}"))
        elif isinstance(event, TurnEnd) and self.turns:
            self._streamed = False
            # schema 2: a stored log says how each turn ended (a live panel says it too)
            early = event.outcome not in ("answered", "length")
            self.turns[-1].ended = f"{event.outcome}: {event.detail}" if early else None

    def _stream(self, event: Reasoning | Content, now: float) -> None:
        live = self.live
        if live.first_token_at is None:
            live.first_token_at = now
        live.tokens += 1
        elapsed = now - live.first_token_at
        rate = f"{(live.tokens - 1) / elapsed:.0f}" if elapsed > 0 else "…"
        live.status = f"Generating at {rate} tokens/s"
        live.progress = None
        self._streamed = True
        if isinstance(event, Reasoning):
            block = self._last(ReasoningBlock)
            block.append(event.text)
            block.tokens += 1
        else:
            self._last(AnswerBlock).append(event.text)

    def _assistant(self, record: Assistant) -> None:
        turn = self._turn()
        if not self._streamed:  # from a log: no deltas came before
            if record.reasoning:
                turn.blocks.append(ReasoningBlock(parts=[record.reasoning]))
            if record.content:
                turn.blocks.append(AnswerBlock(parts=[record.content]))
        self._streamed = False
        for c in record.tool_calls:
            turn.blocks.append(ToolBlock(id=c.id, name=c.name, arguments=c.arguments))

    def _pending(self, match: Callable[[ToolBlock], bool]) -> ToolBlock | None:
        for block in self._turn().blocks:
            if isinstance(block, ToolBlock) and block.result is None and match(block):
                return block
        return None

    def _tool_result(self, record: ToolResult) -> None:
        block = self._pending(lambda b: b.id == record.tool_call_id)
        if block is None:
            block = ToolBlock(id=record.tool_call_id, name=record.name, arguments="")
            self._turn().blocks.append(block)
        block.call = record.call
        block.result = record.content
        block.data_class = record.data_class
        block.untrusted = record.untrusted
        block.truncated = record.truncated

    def _cache_loss(self, loss: CacheLoss) -> None:
        turn = self._turn()
        lost = loss.reprocessed if loss.reprocessed is not None else loss.expected - loss.reused
        why = ""
        if loss.cause is not None:
            at = f" at token {loss.position}" if loss.position is not None else ""
            why = f" ({loss.cause}{at})"
        text = f"cache loss{why}: {lost} tokens re-processed ({loss.reused} of {loss.expected})"
        if loss.reprocessed_ms is not None:
            text += f", {loss.reprocessed_ms:.0f} ms"
        if loss.old_window is not None and loss.new_window is not None:
            turn.windows[len(turn.badges)] = (loss.old_window, loss.new_window)
        turn.badges.append(("cache_loss", text))

    def _usage(self, record: Usage) -> None:
        turn, t = self._turn(), record.timings
        turn.completions += 1
        turn.prompt += int(t.get("prompt_n", 0))
        turn.cached += int(t.get("cache_n", 0))
        turn.generated += int(t.get("predicted_n", 0))
        turn.reasoning += record.reasoning_tokens or 0  # None: not counted (a whole answer)
        turn.ms += float(t.get("prompt_ms", 0.0)) + float(t.get("predicted_ms", 0.0))
        if record.reasoning_tokens:  # the log's count beats the number of deltas seen
            blocks = [b for b in turn.blocks if isinstance(b, ReasoningBlock)]
            if blocks and blocks[-1].tokens == 0:
                blocks[-1].tokens = record.reasoning_tokens
        cut = record.finish_reason == "length"
        self.live.status = "Cut at max_tokens" if cut else "Done"
        self.live.progress = None

    def end_turn(self, reason: str | None) -> None:
        """Mark the last turn finished; ``reason`` says why it ended early (``None``: answered)."""
        self._streamed = False
        if self.turns:
            self.turns[-1].ended = reason
        self.live.status = f"Ended: {reason}" if reason else "Done"
        self.live.progress = None
