"""What a chunk's fields mean, whoever sent it: the rules both read paths of
:class:`ChunkDecoder` (the parsed chunk and the usual chunk read from its text) share.

Each rule is written once here, from the shapes public reports show (OpenAI-compatible
servers and proxies other than llama.cpp): an ``"error": null`` on every chunk is no error
(Foundry Local), ``delta.content`` may be a list of typed parts (Mistral, GLM, NVIDIA
endpoints), a proxy may stream its own text before the model's (llama-swap's loading block),
and text joined from deltas may hold the two halves of a UTF-16 surrogate pair that a gateway
cut apart. No I/O.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = [
    "LOADING_MARK",
    "LoadingBlock",
    "carries_error",
    "content_parts",
    "joined",
    "opens_stream",
    "proxy_note",
    "reasoning_only",
]


def carries_error(obj: dict[str, Any]) -> bool:
    """Whether a chunk is an error: it has an ``error`` member that is not ``null``.

    Foundry Local writes ``"error": null`` (and ``"Successful": true``) into every chunk of a
    good stream (microsoft/foundry-local#144); llama.cpp and OpenAI send ``{"error": {...}}``
    for a real one."""
    return obj.get("error") is not None


def content_parts(content: list[Any]) -> tuple[str, str]:
    """The text of a ``delta.content`` sent as a list of typed parts: ``(content, reasoning)``.

    Mistral's API (and relays of it, GLM and NVIDIA endpoints) streams ``content`` as
    ``[{"type": "text", "text": "..."}, ...]``; its reasoning models add ``{"type":
    "thinking", "thinking": [{"type": "text", "text": "..."}]}`` parts, and search answers
    ``{"type": "reference", ...}`` parts. Text parts are joined in order (a bare string part
    counts as text), thinking parts' texts are joined as reasoning, other parts carry no
    text and are skipped.

    Raises:
        TypeError: a part that is neither a JSON object nor a string, or a ``text`` or
            ``thinking`` that is not text (a malformed chunk).
    """
    text: list[str] = []
    thinking: list[str] = []
    for part in content:
        if part.__class__ is str:
            text.append(part)
            continue
        if part.__class__ is not dict:
            raise TypeError("a delta.content part is neither an object nor a string")
        kind = part.get("type")
        if kind == "text":
            value = part.get("text")
            if value.__class__ is not str:
                raise TypeError("a text part of delta.content has no text")
            text.append(value)
        elif kind == "thinking":
            inner = part.get("thinking")
            if inner.__class__ is str:
                thinking.append(inner)
            elif inner.__class__ is list:
                words, more = content_parts(inner)
                thinking += (words, more)
            elif inner is not None:
                raise TypeError("a thinking part of delta.content holds no text")
    return "".join(text), "".join(thinking)


def opens_stream(obj: dict[str, Any]) -> bool:
    """Whether a chunk opens a model's stream: it carries ``prompt_progress`` (llama.cpp) or
    a ``delta.role`` that is not ``null`` (every OpenAI-compatible server's first chunk).
    LiteLLM writes ``"role": null`` into each later chunk: that opens nothing."""
    if obj.get("prompt_progress") is not None:
        return True
    choices = obj.get("choices")
    if choices.__class__ is not list or not choices or choices[0].__class__ is not dict:
        return False
    delta = choices[0].get("delta")
    return delta.__class__ is dict and delta.get("role") is not None


def proxy_note(obj: dict[str, Any]) -> str | None:
    """The text of a proxy's note: a chunk of one choice that is a delta of one reasoning text
    and nothing else (no ``id``, ``index``, ``finish_reason``, progress or usage), as
    llama-swap writes its loading progress: ``{"choices":[{"delta":{"reasoning_content":
    "..."}}]}`` (``internal/router/loading.go`` ``sendData``). ``None`` for any other chunk
    (a model's chunk always carries more)."""
    if any(key not in _NOTE_KEYS for key in obj):
        return None
    choices = obj.get("choices")
    if choices.__class__ is not list or len(choices) != 1 or choices[0].__class__ is not dict:
        return None
    choice = choices[0]
    delta = choice.get("delta")
    if len(choice) != 1 or delta.__class__ is not dict or len(delta) != 1:
        return None
    text = delta.get("reasoning_content", delta.get("reasoning"))
    return text if text.__class__ is str else None


_NOTE_KEYS = frozenset(("choices", "object", "created", "model"))

_QUIET = ("prompt_progress", "timings", "usage")  # members a chunk of text alone lacks (or null)


def reasoning_only(obj: dict[str, Any]) -> str | None:
    """The reasoning text of a chunk that carries nothing else: one choice whose delta has a
    ``reasoning_content`` (or ``reasoning``) string and no content, tool call or role, no
    ``finish_reason``, no progress, timings or usage (``null`` counts as absent, whatever
    the chunk's ``id``). ``None`` for any other chunk."""
    if any(obj.get(key) is not None for key in _QUIET):
        return None
    choices = obj.get("choices")
    if choices.__class__ is not list or len(choices) != 1 or choices[0].__class__ is not dict:
        return None
    choice = choices[0]
    delta = choice.get("delta")
    if delta.__class__ is not dict or choice.get("finish_reason"):
        return None
    if delta.get("content") or delta.get("tool_calls") or delta.get("role") is not None:
        return None
    text = delta.get("reasoning_content") or delta.get("reasoning")
    return text if text.__class__ is str else None


LOADING_MARK = "\u2501"
"""``━``: llama-swap draws its loading block's first and last lines with it
(mostlygeek/llama-swap#371: ``sendLine("━━━━━")`` before ``llama-swap loading model: ...``
and after ``Done! (N s)``)."""

_NONE, _MAYBE, _IN, _AFTER = range(4)


class LoadingBlock:
    """llama-swap's loading block, told apart from the model's reasoning by its marks.

    llama-swap streams its loading progress as ``reasoning_content`` before the model's own
    stream (mostlygeek/llama-swap#371): a line of :data:`LOADING_MARK`, ``llama-swap loading
    model: NAME``, dots and remarks, ``Done! (N s)``, a line of marks, a line of one space.
    Without an ``id`` each chunk is a :func:`proxy_note`; behind another proxy it may carry
    an ``id`` (and a full chunk's shape), and only its marks tell it.

    Feed :meth:`take` the text of each reasoning-only chunk (:func:`reasoning_only`) from the
    stream's start; call :meth:`end` at any other chunk. The block starts when the stream's
    first reasoning text starts with the mark, and holds every reasoning-only chunk until
    its closing line of marks and the whitespace-only texts right after it, or until
    :meth:`end`. Once over (or never started) it takes nothing.

    Attributes:
        over: the block is over, or there was none: nothing more is the proxy's.
    """

    __slots__ = ("_line", "_lines", "_state")

    def __init__(self) -> None:
        self._state = _MAYBE
        self._line = ""  # the block's unfinished last line
        self._lines = 0  # finished lines of the block

    @property
    def over(self) -> bool:
        """Nothing more can be the block's."""
        return self._state == _NONE

    def take(self, text: str) -> bool:
        """Whether ``text`` (a reasoning-only chunk's text) is the block's."""
        state = self._state
        if state == _MAYBE:
            if not text.startswith(LOADING_MARK):
                self._state = _NONE
                return False
            self._state = state = _IN
        if state == _AFTER:
            if text.strip():
                self._state = _NONE
                return False
            return True
        if state == _IN:
            *done, self._line = (self._line + text).split("\n")
            for line in done:
                self._lines += 1
                if self._lines > 1 and line and not line.strip(LOADING_MARK):
                    self._state = _AFTER  # the closing line; whitespace may follow
            return True
        return False

    def end(self) -> None:
        """The model's stream shows (any chunk but a reasoning-only one): the block is over."""
        self._state = _NONE


_SURROGATE = re.compile("[\ud800-\udfff]")


def joined(pieces: list[str]) -> str:
    """The text of ``pieces`` (a stream's deltas of one field), joined.

    A delta's JSON string is decoded on its own (it is one JSON value), so when a gateway cut
    a character outside the Basic Multilingual Plane between two deltas (slicing every 256
    UTF-16 units), each delta holds one half of its surrogate pair, and each half decodes to
    a lone surrogate code point. Decoding the joined JSON text once would pair them; here the
    halves are paired after joining, which gives the same text. A half without its partner
    (no UTF-8 can encode it) becomes U+FFFD, the replacement character, so the text can be
    logged and sent back to the server.
    """
    text = "".join(pieces)
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
