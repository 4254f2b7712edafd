"""The transcript as ipywidgets, drawn by appending: what :mod:`boxmaker.widgets` shows.

A refresh of a live panel must cost the same after 2 turns or 2,000, and within a turn the
same after 10 streamed fragments or 100,000 (``python benchmarks/widgets.py`` measures both).
So nothing is drawn twice:

- :class:`TranscriptBox` holds one widget per turn, in pages (:class:`Pages`), so adding a
  turn sends a short children list, never all of them; a turn from a stored log is one HTML
  widget rendered once.
- :class:`TurnWidgets` draws a turn as it happens: the user message, one HTML widget per
  finished block, rendered once (an answer's Markdown when its completion ends), and a foot
  (counters, badges, how the turn ended).
- :class:`LiveBlock` shows the block still streaming as escaped text (``white-space:
  pre-wrap``) in widgets of at most :data:`CHUNK_CHARS` characters: a draw sends the text that
  came since the last one, into the last chunk or new chunks.

The HTML comes from :mod:`boxmaker.view` (the rules for untrusted model text are there);
this module only decides what to render when and where it goes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as ipw

from ..view import (
    TRANSCRIPT_CSS,
    AnswerBlock,
    Block,
    ReasoningBlock,
    ToolBlock,
    Transcript,
    TurnView,
    render_block,
    render_stream_head,
    render_text,
    render_turn,
    render_turn_foot,
    render_user,
)

__all__ = [
    "CHUNK_CHARS",
    "PAGE",
    "WIDGET_CSS",
    "LiveBlock",
    "Pages",
    "TranscriptBox",
    "TurnWidgets",
]

CHUNK_CHARS = 1024
"""Characters of streaming text per widget: a refresh re-sends at most this much text."""

PAGE = 32
"""Widgets per page of a :class:`Pages` box."""

WIDGET_CSS = (
    "<style>"
    ".bxm-transcript .widget-html-content{line-height:1.45;}"
    ".bxm-transcript .widget-html{margin:0;flex-shrink:0;}"
    ".bxm-transcript .widget-box{flex-shrink:0!important;overflow:visible!important;}"
    ".bxm-scroll{resize:vertical;}"
    ".bxm-live-text,.bxm-live-text .widget-box{display:block!important;overflow:visible!important;"
    "white-space:pre-wrap;margin:0!important;}"
    ".bxm-live-text .widget-html,.bxm-live-text .widget-html-content{display:inline!important;"
    "margin:0!important;padding:0!important;}"
    ".bxm-live-reasoning .bxm-live-text{color:#666;font-size:90%;font-family:monospace;}"
    "</style>"
)
"""Layout of the transcript's widgets (ipywidgets' own class names): streaming text flows
across its chunk widgets as one text; lines are not spaced out like one-line controls."""


class Pages:
    """Widgets in order inside ``box``, held in pages of up to :data:`PAGE` widgets.

    Appending sets the children of the last page (at most :data:`PAGE`) and, once every
    :data:`PAGE` widgets, those of ``box`` (one per page), so adding the 2,000th turn or
    chunk costs about what the 20th does (a flat children list would be re-sent whole).
    """

    def __init__(self, box: Any, new_page: Callable[[], Any]) -> None:
        self.box = box
        self._new_page = new_page
        self._pages: list[Any] = []
        self._last: list[Any] = []

    def append(self, widget: Any) -> None:
        """Add ``widget`` after the others."""
        if not self._pages or len(self._last) == PAGE:
            self._last = []
            self._pages.append(self._new_page())
            self.box.children = tuple(self._pages)
        self._last.append(widget)
        self._pages[-1].children = tuple(self._last)


class LiveBlock:
    """A reasoning or answer block while it streams: a head line (reasoning: its token count)
    and its text, escaped, in widgets of up to :data:`CHUNK_CHARS` characters shown as one
    text (``white-space: pre-wrap``). A draw sends only the text that came since the last:
    the chunk it lands in, and new chunks. Its Markdown is rendered once, when it ends."""

    def __init__(self, block: ReasoningBlock | AnswerBlock) -> None:
        self.block = block
        self.head = ipw.HTML(render_stream_head(block))
        self.body = ipw.Box()
        self.body.add_class("bxm-live-text")
        self._chunks = Pages(self.body, ipw.Box)
        self._chunk: Any = None
        self._text = ""
        self.drawn = 0
        kind = "reasoning" if isinstance(block, ReasoningBlock) else "answer"
        self.widget = ipw.VBox([self.head, self.body] if kind == "reasoning" else [self.body])
        self.widget.add_class("bxm-live")
        self.widget.add_class(f"bxm-live-{kind}")

    def draw(self) -> None:
        """Append what the block gained since the last draw (O(new text))."""
        set_if_changed(self.head, "value", render_stream_head(self.block))
        new = self.block.tail(self.drawn)
        self.drawn += len(new)
        while new:
            if self._chunk is not None and len(self._text) < CHUNK_CHARS:
                room = CHUNK_CHARS - len(self._text)
                self._text += new[:room]
                new = new[room:]
                self._chunk.value = render_text(self._text)
            else:
                self._text, new = new[:CHUNK_CHARS], new[CHUNK_CHARS:]
                self._chunk = ipw.HTML(render_text(self._text))
                self._chunks.append(self._chunk)


def _key(block: Block) -> tuple[object, ...]:
    """What of a block not streaming can still change its HTML (a tool call gets its number
    and result; reasoning its token count from the log, or the capped mark; text fed through
    the hook while no turn runs grows)."""
    if isinstance(block, ToolBlock):
        return ("tool", block.call, block.result is None)
    if isinstance(block, ReasoningBlock):
        return ("reasoning", block.tokens, block.capped, block.size)
    return ("answer", block.size)


class TurnWidgets:
    """The widgets of a turn shown as it happens: the user message, one widget per block and
    a foot (counters, badges, how it ended). A draw renders only what changed: a finished
    block once (the Markdown of an answer when its completion ends), the streaming block as
    appended text (:class:`LiveBlock`), the foot when its text changes."""

    def __init__(self, turn: TurnView) -> None:
        self.turn = turn
        self.head = ipw.HTML(render_user(turn))
        self.foot = ipw.HTML("")
        self.views: list[tuple[Any, tuple[object, ...] | None]] = []  # (view, key or live)
        self.widget = ipw.VBox([self.head, self.foot])
        self.widget.add_class("bxm-turn")

    def draw(self, streaming: Block | None) -> None:
        """Bring the widgets up to the turn; ``streaming`` is the block still growing."""
        changed = False
        for i, block in enumerate(self.turn.blocks):
            view, key = self.views[i] if i < len(self.views) else (None, None)
            if block is streaming:
                assert isinstance(block, ReasoningBlock | AnswerBlock)
                if not isinstance(view, LiveBlock):
                    view, changed = LiveBlock(block), True
                    self._put(i, view, None)
                view.draw()
                continue
            new_key = _key(block)
            if key == new_key and view is not None:
                continue
            if isinstance(view, ipw.HTML):
                view.value = render_block(block)
            else:
                view, changed = ipw.HTML(render_block(block)), True
            self._put(i, view, new_key)
        set_if_changed(self.foot, "value", render_turn_foot(self.turn))
        if changed:
            widgets = [v.widget if isinstance(v, LiveBlock) else v for v, _ in self.views]
            self.widget.children = (self.head, *widgets, self.foot)

    def _put(self, i: int, view: Any, key: tuple[object, ...] | None) -> None:
        if i < len(self.views):
            self.views[i] = (view, key)
        else:
            self.views.append((view, key))

    def html(self) -> str:
        """The turn as one HTML string; equal to ``render_turn(turn)`` once it is drawn with
        nothing streaming (the blocks' HTML is reused, not rendered again)."""
        blocks = [
            render_block(v.block, streaming=True) if isinstance(v, LiveBlock) else v.value
            for v, _ in self.views
        ]
        blocks += [render_block(b) for b in self.turn.blocks[len(self.views) :]]
        head = [TRANSCRIPT_CSS, "<div class='bxm-turn'>", self.head.value]
        return "".join([*head, *blocks, render_turn_foot(self.turn), "</div>"])


class TranscriptBox:
    """A VBox with the transcript's turns, in pages of :data:`PAGE` (see :class:`Pages`).

    Turns given to :meth:`add_finished` (a stored log) are one HTML widget each, rendered once.
    Turns that arrive later are :class:`TurnWidgets` s; :meth:`show` draws the last one (and the
    one before it once more when a new turn starts), never the others, so a refresh costs the
    same after 2 turns or 2,000, and within a turn the same after 10 or 100,000 fragments.
    """

    def __init__(self) -> None:
        self.box = ipw.VBox([])
        self.box.add_class("bxm-transcript")
        self._pages = Pages(self.box, ipw.VBox)
        self.views: list[Any] = []  # ipw.HTML (a finished turn) or TurnWidgets

    def add_finished(self, turns: Sequence[TurnView]) -> None:
        """Show ``turns`` (turns of a stored log that will not change) after the others."""
        for turn in turns:
            item = ipw.HTML(render_turn(turn))
            self.views.append(item)
            self._pages.append(item)

    def show(self, transcript: Transcript, live: bool) -> None:
        """Bring the widgets up to ``transcript``; ``live``: a turn is running (its streaming
        block is drawn as appended text)."""
        turns = transcript.turns
        streaming = transcript.streaming_block if live else None
        for i in range(max(len(self.views) - 1, 0), len(turns)):
            if i == len(self.views):
                view = TurnWidgets(turns[i])
                self.views.append(view)
                self._pages.append(view.widget)
            view = self.views[i]
            if isinstance(view, TurnWidgets):
                view.draw(streaming if i == len(turns) - 1 else None)

    def html(self) -> str:
        """Every turn as one HTML string (the widgets' HTML, nothing rendered again but a
        block still streaming)."""
        return "".join(v.html() if isinstance(v, TurnWidgets) else v.value for v in self.views)


def set_if_changed(widget: Any, name: str, value: Any) -> None:
    """Set a trait only when it changes (each change is one message to the front end)."""
    if getattr(widget, name) != value:
        setattr(widget, name, value)
