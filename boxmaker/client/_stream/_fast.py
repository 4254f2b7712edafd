"""The usual stream chunk read from its text, without parsing the whole JSON object.

Nearly every chunk of a chat-completion stream is one JSON text that differs from the one
before it only in the delta's single member (llama.cpp, OpenAI format)::

    {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":"T"}}],"created":...}
    {"choices":[{"finish_reason":null,"index":0,"delta":{"tool_calls":[{"index":8,"function":{"arguments":"g"}}]}}],...}

:class:`FastChunks` (a mixin of :class:`ChunkDecoder`, which parses the
chunks it cannot read this way) learns the text around that member from a parsed chunk and
then reads such chunks by comparing the text around the member and reading the member alone
(fixed texts and one string value, checked to be a valid JSON string), about four times
faster than parsing the object. The result is by construction the one the full parse gives
(see :meth:`FastChunks.learn`); ``tests/client/test_fast_chunks.py`` checks it on generated streams.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ...events import ToolCallDelta
from ._shape import carries_error
from ._think_tags import Emit, ThinkTags, new_event

__all__ = ["FastChunks", "tool_call_delta"]

_set_index, _set_id, _set_name, _set_arguments = (
    vars(ToolCallDelta)[field].__set__ for field in ("index", "id", "name", "arguments")
)


def tool_call_delta(
    index: int, call_id: str | None, name: str | None, arguments: str
) -> ToolCallDelta:
    """A :class:`~boxmaker.events.ToolCallDelta`, built as the hot events are
    (:func:`new_event`)."""
    event = new_event(ToolCallDelta)
    _set_index(event, index)
    _set_id(event, call_id)
    _set_name(event, name)
    _set_arguments(event, arguments)
    return event


# A JSON string's inside (RFC 8259: no '"', no '\\' but in an escape, no control character).
_STRING = r'[^"\\\x00-\x1f]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\x00-\x1f]*)*'
# The one member of the usual delta, compact as llama.cpp and OpenAI write it: a text field
# (groups 1, 2: name and value's inside), or one tool call's next arguments (groups 3, 4:
# index and the arguments' inside). Used to learn; feed_usual reads the same members.
_MEMBER = re.compile(
    rf'"(reasoning_content|content|reasoning)":"({_STRING})"'
    rf'|"tool_calls":\[\{{"index":(0|[1-9][0-9]*),"function":\{{"arguments":"({_STRING})"\}}\}}\]'
)
# The text of a tool-call fragment before the arguments' inside (group 1: the index).
_CALL_HEAD = re.compile(r'"tool_calls":\[\{"index":(0|[1-9][0-9]*),"function":\{"arguments":"')
_CALL_END = '"}}]'  # after the arguments' inside
_TOOL_CALLS = '"tool_calls":'
_REASONING_CONTENT = '"reasoning_content":"'
_CONTENT = '"content":"'
_REASONING = '"reasoning":"'
_DELTA = '"delta":{'
_PROBE = "probe \u00e9"
_PROBE_MEMBER = f'"content":"{_PROBE}"'
_LEARN_TRIES = 4  # texts around a member that failed the probe before learning gives up


class FastChunks(ThinkTags):
    """Mixin of :class:`ChunkDecoder` (which holds the state, in its
    ``__slots__``): the usual chunk read from its text (:meth:`feed_usual`), once
    :meth:`learn` has seen the text around its delta.
    """

    __slots__ = (
        "_after",
        "_call_head",
        "_call_start",
        "_call_tail",
        "_call_tail_len",
        "_fragment_call",
        "_head",
        "_head_len",
        "_last",
        "_learn_tries",
        "_learnt_at",
        "_text_tail",
        "_text_tail_len",
        "chunks",
    )

    _calls: dict[int, Any]
    _at_index: dict[int, int]
    _last: int
    chunks: int
    id: str
    tool_call_deltas: bool

    def __init__(self) -> None:
        self._head: str | None = None  # the text before the delta's member, once learnt
        self._after = ""  # the text after it
        self._text_tail = self._call_tail = ""  # '"' and '"}}]' before _after
        self._head_len = self._text_tail_len = self._call_tail_len = 0
        self._learn_tries = _LEARN_TRIES
        self._learnt_at = -2  # the chunk count when the text was last learnt
        self._call_head = "\x00"  # the member's text before the arguments of the last call read
        self._call_start = 0  # where the arguments start: _head_len + len(_call_head)
        self._fragment_call = (
            -1
        )  # and that call's number (forget_call() when its index gets another)

    def feed_usual(self, text: str, on_event: Emit) -> bool:
        """Read the chunk whose JSON text is ``text`` if it is a usual one, passing its
        events to ``on_event``; whether it was.

        Usual: the learned text (:meth:`learn`) around a delta of one member that is
        ``content``, ``reasoning_content`` or ``reasoning`` (a string), or the next
        ``arguments`` string of the call at a known ``index`` (nothing else in that call),
        written compactly. Then the decoder's state changes exactly as
        :meth:`ChunkDecoder.feed` of the parsed chunk would change it, and
        ``on_event`` gets the same events (an exception it raises propagates, the chunk
        counted); otherwise ``False`` and nothing changed (the caller parses ``text`` and
        feeds it).
        """
        head = self._head
        if head is None or not text.startswith(head):
            return False
        start = self._head_len
        if not text.startswith(self._call_head, start):
            if not text.startswith(_TOOL_CALLS, start):
                return self._text_member(text, start, on_event)
            call = _CALL_HEAD.match(text, start)  # a fragment of another call than the last
            if call is None:
                return False
            number = self._at_index.get(int(call[1]))
            if number is None:  # a call not seen yet: the full path numbers it
                return False
            self._call_head, self._fragment_call = call[0], number
            self._call_start = call.end()
        # the next arguments of the call _fragment_call (at the index _call_head names)
        start = self._call_start
        end = len(text) - self._call_tail_len
        if end < start or not text.endswith(self._call_tail):
            return False
        number = self._fragment_call
        arguments = text[start:end]
        if '"' in arguments or "\\" in arguments or not arguments.isprintable():
            exact = _inside(arguments)
            if exact is None:
                return False
            arguments = exact
        self.chunks += 1
        self._add_fragment(number, arguments, on_event)
        return True

    def forget_call(self) -> None:
        """Forget the call the usual fragments were read for (a new head, or a server index
        that now names another call: the next fragment looks its number up again)."""
        self._call_head, self._fragment_call = "\x00", -1

    def _add_fragment(self, number: int, arguments: str, emit: Emit) -> None:
        """More ``arguments`` text for the known call ``number`` (the usual tool-call
        delta): kept, and emitted as a ``ToolCallDelta`` without id or name."""
        self._last = number
        if arguments:
            self._calls[number].arguments.append(arguments)
        if self.tool_call_deltas:
            event = new_event(ToolCallDelta)
            _set_index(event, number)
            _set_id(event, None)
            _set_name(event, None)
            _set_arguments(event, arguments)
            emit(event)

    def _text_member(self, text: str, start: int, on_event: Emit) -> bool:
        """:meth:`feed_usual` of a text field (``text`` starts with the learnt head, which
        ends at ``start``)."""
        if text.startswith(_REASONING_CONTENT, start):
            start += len(_REASONING_CONTENT)
            reasoning = True
        elif text.startswith(_CONTENT, start):
            start += len(_CONTENT)
            reasoning = False
        elif text.startswith(_REASONING, start):
            start += len(_REASONING)
            reasoning = True
        else:
            return False
        end = len(text) - self._text_tail_len
        if end < start or not text.endswith(self._text_tail):
            return False
        value = text[start:end]
        if '"' in value or "\\" in value or not value.isprintable():
            exact = _inside(value)
            if exact is None:
                return False
            value = exact
        self.chunks += 1
        if value:
            if reasoning:
                self._add_reasoning(value, on_event)
            else:
                self._add_content(value, on_event)
        return True

    def learn(self, text: str) -> None:
        """Learn the text around the delta's member from ``text``, the JSON text of a chunk
        just fed (parsed), for :meth:`feed_usual`.

        ``text`` is cut before and after the first compact ``"delta":{`` whose one member
        :meth:`feed_usual` can read. The cut is kept only when :func:`json.loads` of the
        text with that member replaced by ``"content":"probe é"`` (the probe) gives a chunk
        whose delta is exactly that member, and which :meth:`ChunkDecoder.feed`
        reads as nothing but its delta: no ``error`` (``null`` counts as none, the one rule
        :func:`carries_error`), ``prompt_progress``, ``timings``,
        ``usage`` or ``finish_reason`` (``""`` counts as none), once the stream's ``id`` is
        taken (a chunk of one member, with no role or progress, never changes it). JSON's
        grammar makes the member one element between the two fixed texts, so any other member there
        yields the same chunk with that delta: the probe rules out a cut in the wrong place
        (a duplicate key after it, a look-alike inside a string). A probe costs a parse, so
        learning stops for this stream after a few texts that fail it or that are followed
        at once by another one (a server that varies the text around every delta, such as
        a per-chunk random field, gains nothing from it).
        """
        if self._learn_tries <= 0:
            return
        at = text.find(_DELTA)
        if at < 0:
            if '"delta"' in text:  # written with spaces (never read the usual way)
                self._learn_failed()
            return
        start = at + len(_DELTA)
        member = _MEMBER.match(text, start)
        if member is None or text[member.end() : member.end() + 1] != "}":
            return
        head, tail = text[:start], text[member.end() :]
        if head == self._head and tail == self._after:
            return
        if self._learnt_at == self.chunks - 1:  # the last one read no chunk after its own
            self._learn_failed()
            if self._learn_tries <= 0:
                return
        if not self._probe(head, tail):
            self._learn_failed()
            return
        self._learnt_at = self.chunks
        self._head, self._after, self._head_len = head, tail, len(head)
        self._text_tail, self._call_tail = '"' + tail, _CALL_END + tail
        self._text_tail_len, self._call_tail_len = len(self._text_tail), len(self._call_tail)
        self.forget_call()  # a new head: no call read yet

    def _learn_failed(self) -> None:
        """Count a text that was not worth learning; after a few, stop learning and reading
        the usual way (every chunk parsed, as the reading would not pay)."""
        self._learn_tries -= 1
        if self._learn_tries <= 0:
            self._head = None

    def _probe(self, head: str, tail: str) -> bool:
        """Whether ``head + probe member + tail`` is a chunk of nothing but that delta."""
        try:
            obj = json.loads(head + _PROBE_MEMBER + tail)
        except (ValueError, RecursionError):
            return False
        if obj.__class__ is not dict or carries_error(obj):
            return False
        if not self.id:  # feed would take the chunk's id, or tell a proxy's note by its absence
            return False
        if obj.get("prompt_progress") is not None or obj.get("timings") or obj.get("usage"):
            return False  # (an empty timings or usage object is none, as feed reads it)
        choices = obj.get("choices")
        if choices.__class__ is not list or not choices or choices[0].__class__ is not dict:
            return False
        choice = choices[0]
        # "" is no finish (SGLang, Ollama): feed ignores it as it ignores null
        return not choice.get("finish_reason") and choice.get("delta") == {"content": _PROBE}


@functools.lru_cache(maxsize=4096)
def _inside(inside: str) -> str | None:
    """The JSON string ``'"' + inside + '"'`` as :func:`json.loads` reads it, or ``None`` if
    ``inside`` is no string's inside (an unescaped quote, a control character, a bad escape:
    then the text is no single string). Cached: the same escaped fragments recur (``\\"``
    in tool arguments, ``\\n`` in text)."""
    try:
        value: str = json.loads(f'"{inside}"')
    except ValueError:
        return None
    return value
