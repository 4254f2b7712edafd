"""Where a delta's text goes: the part of :class:`ChunkDecoder` that takes each reasoning and
content text (one place for both read paths, the parsed chunk and the usual chunk read from its
text) and moves reasoning sent as content (templates that put ``<think>`` in the prompt;
servers started with ``--reasoning-format none``) to reasoning. The rules are described in
:class:`ChunkDecoder`'s docstring."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from ...events import ClientEvent, Content, Reasoning

__all__ = ["Emit", "ThinkTags", "new_event"]

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"

Emit = Callable[[ClientEvent], Any]
"""Where events go: a hook, or ``list.append`` of the events of one chunk."""

_E = TypeVar("_E")

# The hot events built as object.__new__ + their slots' descriptors: the same frozen objects as
# their __init__ makes (which goes through object.__setattr__ once per field), at about half
# the cost per chunk.
if TYPE_CHECKING:

    def new_event(cls: type[_E]) -> _E:
        """A bare instance of the event class ``cls``; set every field before use."""

else:
    new_event = object.__new__
_set_content = vars(Content)["text"].__set__
_set_reasoning = vars(Reasoning)["text"].__set__


class ThinkTags:
    """Mixin of :class:`ChunkDecoder` (which holds the state, in its
    ``__slots__``): content deltas while undecided, and inside an opening ``<think>``."""

    __slots__ = (
        "_content",
        "_in_think",
        "_reasoning",
        "_tag_deltas",
        "_tail",
        "_undecided",
        "reasoning_from_tag",
        "reasoning_in_content",
        "reasoning_tokens",
    )

    _content: list[str]
    _reasoning: list[str]
    _tail: str
    _tag_deltas: int
    _undecided: bool
    _in_think: bool
    reasoning_tokens: int
    reasoning_from_tag: bool
    reasoning_in_content: bool

    def _add_reasoning(self, text: str, emit: Emit) -> None:
        """A reasoning delta's text (``delta.reasoning_content`` or ``delta.reasoning``,
        not empty): kept, counted in :attr:`reasoning_tokens`, emitted as ``Reasoning``."""
        if self._undecided:
            self._decide(emit)
        self._reasoning.append(text)
        self.reasoning_tokens += 1
        event = new_event(Reasoning)
        _set_reasoning(event, text)
        emit(event)

    def _add_content(self, text: str, emit: Emit) -> None:
        """A content delta's text (not empty): content, or reasoning while a ``<think>``
        tag may still decide it (:meth:`_split_content`)."""
        if self._undecided:
            self._split_content(text, emit)
            return
        self._content.append(text)
        event = new_event(Content)
        _set_content(event, text)
        emit(event)

    def _decide(self, emit: Emit) -> None:
        """Content is content from now on: emit and keep a held-back partial tag."""
        self._undecided = False
        if self._tail:
            if self._in_think:  # a partial </think> that never completed: still reasoning
                self._in_think = False
                self._reasoning.append(self._tail)
                emit(Reasoning(self._tail))
            else:
                self._content.append(self._tail)
                emit(Content(self._tail))
            self._tail = ""

    def _split_content(self, text: str, emit: Emit) -> None:
        """A content delta while undecided: look for ``</think>`` (see the class docstring)."""
        if self._tail:
            text = self._tail + text
            self._tail = ""
        if self._in_think:
            self._think_text(text, emit)
            return
        if not self._content and not self._tag_deltas:  # nothing came yet: opens <think>?
            stripped = text.lstrip()
            if stripped.startswith(_THINK_OPEN):
                self._in_think = self.reasoning_in_content = True
                self._think_text(stripped[len(_THINK_OPEN) :], emit)
                return
            if _THINK_OPEN.startswith(stripped):  # whitespace, or a partial tag: wait
                self._tail = text
                return
        if "<" in text:
            close = text.find(_THINK_CLOSE)
            opened = text.find(_THINK_OPEN)
            if opened >= 0 and (close < 0 or opened < close):  # the model's own <think>
                self._undecided = False
            elif close >= 0:
                before = text[:close]
                if before:
                    self._content.append(before)
                    self._tag_deltas += 1
                    emit(Reasoning(before))
                self._reasoning, self._content = self._content, []
                self.reasoning_tokens += self._tag_deltas
                self.reasoning_from_tag = True
                self._undecided = False
                text = text[close + len(_THINK_CLOSE) :]
                if text:
                    self._content.append(text)
                    emit(Content(text))
                return
            else:
                cut = text.rfind("<")
                end = text[cut:]
                if _THINK_CLOSE.startswith(end) or _THINK_OPEN.startswith(end):
                    self._tail = end
                    text = text[:cut]
        if text:
            self._content.append(text)
            self._tag_deltas += 1
            emit(Content(text))

    def _think_text(self, text: str, emit: Emit) -> None:
        """Content inside an opening ``<think>``: reasoning up to ``</think>``, then content."""
        close = text.find(_THINK_CLOSE)
        if close >= 0:
            before, after = text[:close], text[close + len(_THINK_CLOSE) :]
            if before:
                self._reasoning.append(before)
                self.reasoning_tokens += 1
                emit(Reasoning(before))
            self._in_think = self._undecided = False
            self.reasoning_from_tag = True
            if after:
                self._content.append(after)
                emit(Content(after))
            return
        cut = text.rfind("<")
        if cut >= 0 and _THINK_CLOSE.startswith(text[cut:]):
            self._tail = text[cut:]
            text = text[:cut]
        if text:
            self._reasoning.append(text)
            self.reasoning_tokens += 1
            emit(Reasoning(text))
