"""Stream decoding: a llama-server chat-completion stream (bytes) -> client events and a Completion.

llama.cpp answers a streamed ``POST /v1/chat/completions`` with Server-Sent Events (the WHATWG
"server-sent events" format): one ``data: {json}`` event per chunk and a final ``data: [DONE]``.
The chunks follow the OpenAI chat-completions streaming format (``choices[0].delta`` with
``content``, ``tool_calls``) plus llama.cpp's additions (``delta.reasoning_content``,
``prompt_progress``, ``timings``; see llama.cpp's ``tools/server/README.md``).

Three layers, each usable on its own, with no I/O (the HTTP client and the cassette reader
both drive them):

- :class:`SSEDecoder` (:mod:`boxmaker.client`): bytes as they arrive -> ``(field, data)`` SSE
  events;
- :class:`ChunkDecoder` (:mod:`boxmaker.client`): parsed JSON chunks -> :mod:`boxmaker.events`
  client events, and the accumulated :class:`Completion`; the usual chunk is read from its
  text without a parse (:mod:`boxmaker.client`);
- :class:`StreamDecoder` (here): both joined, with the JSON parse and ``[DONE]``: bytes ->
  events.

The names of the three modules are all importable from here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, cast

import orjson

from ...errors import InferError
from ...events import ClientEvent
from .._errors import CONTEXT_FULL, context_full_error, is_context_full, stream_error
from ._chunks import ChunkDecoder, Completion
from ._sse import MAX_EVENT_BYTES, SSEDecoder
from ._think_tags import Emit
from ._whole import completion_chunk

__all__ = [
    "CONTEXT_FULL",
    "MAX_EVENT_BYTES",
    "ChunkDecoder",
    "Completion",
    "SSEDecoder",
    "StreamDecoder",
    "context_full_error",
    "is_context_full",
]

_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


class StreamDecoder:
    """A whole chat-completion stream: bytes as they arrive -> client events.

    Joins :class:`SSEDecoder` and :class:`ChunkDecoder`: each ``data:`` event is parsed as JSON
    and fed to the chunk decoder; ``data: [DONE]`` marks the stream done (later bytes are
    ignored); an older build's ``error:`` event is an error. Used by the HTTP client (live) and
    the cassette reader (recorded bodies), so both read a stream the same way.

    Args:
        tool_call_deltas: make :class:`~boxmaker.events.ToolCallDelta` events (see
            :class:`ChunkDecoder`); ``False`` when nobody listens to them.
        max_event_bytes: the cap on one SSE event in bytes (see :class:`SSEDecoder`;
            ``None``: no cap).

    Attributes:
        chunks: the :class:`ChunkDecoder` (id, finish reason, timings, token counts so far).
    """

    __slots__ = ("chunks", "sse")

    def __init__(
        self, *, tool_call_deltas: bool = True, max_event_bytes: int | None = MAX_EVENT_BYTES
    ) -> None:
        self.sse = SSEDecoder(max_event_bytes=max_event_bytes)
        self.chunks = ChunkDecoder(tool_call_deltas=tool_call_deltas)

    @property
    def done(self) -> bool:
        """``data: [DONE]`` was received."""
        return self.chunks.done

    def feed(self, raw: bytes) -> list[ClientEvent]:
        """Decode one read of bytes; return the client events of the chunks it completed.

        Raises:
            InferError: an error event, a chunk that is not a JSON object, a malformed
                chunk (see :meth:`ChunkDecoder.feed`), or an event past ``max_event_bytes``.
        """
        return [event for events in self.per_chunk(self.sse.feed(raw)) for event in events]

    def flush(self) -> list[ClientEvent]:
        """End of stream: decode an unterminated last event; return its events."""
        return [event for events in self.per_chunk(self.sse.flush()) for event in events]

    def feed_completion(self, text: str) -> list[ClientEvent]:
        """Decode a whole ``chat.completion`` JSON answer (a server or proxy that answered a
        streamed request with ``Content-Type: application/json``) as a stream of one chunk
        and ``[DONE]``: the same events and :class:`Completion` (content, reasoning, tool
        calls, usage, timings, finish reason) as the stream would give.

        Raises:
            InferError: ``text`` is no ``chat.completion`` (the message quotes it), or an
                error object (see :meth:`ChunkDecoder.feed`).
        """
        self.chunks.whole = True
        events = self.chunks.feed(completion_chunk(text))
        return events + self.chunks.mark_done()

    def per_chunk(self, sse_events: list[tuple[str, str]]) -> Iterator[list[ClientEvent]]:
        """The client events of each chunk among ``sse_events`` (from :attr:`sse`), one list
        per chunk, so a caller can act between chunks (the client's thinking cap and cancel
        checks). Stops at ``[DONE]``. Raises as :meth:`feed`."""
        feed_event = self.feed_event
        chunks = self.chunks
        for name, data in sse_events:
            if chunks.done:
                return
            events = feed_event(name, data)
            if events or (name == "data" and data != "[DONE]"):
                yield events

    def emit(
        self,
        sse_events: list[tuple[str, str]],
        on_event: Callable[[ClientEvent], None],
        between: Callable[[], None] | None = None,
    ) -> None:
        """Pass the client events of ``sse_events`` (from :attr:`sse`) to ``on_event`` in
        order, calling ``between`` after each ``data`` event (a chunk or ``[DONE]``), so a
        caller can act between chunks (the client's thinking cap and cancel checks); stops
        at ``[DONE]``. The same events as :meth:`feed_event` of each, in one loop (the
        client's hot path; each chunk read as :meth:`feed_chunk` reads it). An exception of
        ``on_event`` or ``between`` propagates as it is. Raises as :meth:`feed`."""
        chunks = self.chunks
        if chunks.done:
            return
        feed = chunks.feed
        feed_usual = chunks.feed_usual
        for name, data in sse_events:
            if name == "data" and data != "[DONE]":
                # feed_chunk's three lines, inlined: a call per chunk costs 2% of this loop
                if not feed_usual(data, on_event):
                    for event in feed(_chunk_object(data), data):
                        on_event(event)
            else:
                for event in self.feed_event(name, data):
                    on_event(event)
                if name != "data":
                    continue
                if between is not None:
                    between()
                return  # [DONE]
            if between is not None:
                between()

    def feed_chunk(self, data: str, on_event: Emit) -> None:
        """One chunk's JSON text ``data`` (a ``data:`` event but ``[DONE]``): read by
        :meth:`ChunkDecoder.feed_usual` when it has the usual shape, else parsed
        (:func:`_chunk_object`) and fed; its events go to ``on_event``. The one place a
        chunk's text is read, for :meth:`emit` and :meth:`feed_event` alike. Raises as
        :meth:`feed`."""
        chunks = self.chunks
        if not chunks.feed_usual(data, on_event):
            for event in chunks.feed(_chunk_object(data), data):
                on_event(event)

    def feed_event(self, name: str, data: str) -> list[ClientEvent]:
        """The client events of one SSE event ``(field, data)`` from :attr:`sse`.

        A ``data`` event is one JSON chunk (read by :meth:`ChunkDecoder.feed_usual` when it
        has the usual shape, else parsed with orjson; what orjson refuses, such as ``NaN``
        or a lone surrogate escape, is parsed by :func:`json.loads` as before) or
        ``[DONE]``; other fields but ``error`` are ignored, and so is everything after
        ``[DONE]`` (``[]``). Raises as :meth:`feed`.
        """
        chunks = self.chunks
        if chunks.done:
            return []
        if name == "data":
            if data == "[DONE]":
                return chunks.mark_done()
            events: list[ClientEvent] = []
            self.feed_chunk(data, events.append)
            return events
        if name == "error":
            raise stream_error(_loads_or_text(data), data)
        return []


def _chunk_object(data: str) -> dict[str, Any]:
    """The JSON object of one ``data:`` chunk: orjson, or :func:`json.loads` for what orjson
    refuses (``NaN``, a lone surrogate escape). Raises ``InferError`` for another value."""
    try:
        obj = _loads(data)
    except _JSONDecodeError:
        obj = _strict_loads(data)
    if obj.__class__ is not dict:
        raise _not_an_object(data)
    return cast(dict[str, Any], obj)


def _not_an_object(data: str) -> InferError:
    return InferError(
        f"malformed chunk from llama-server (not a JSON object): {data[:500]}", body=data
    )


def _strict_loads(data: str) -> Any:
    """``data`` parsed by :func:`json.loads` (what orjson refuses: ``NaN``, lone surrogate
    escapes, integers beyond 64 bits...), or :class:`InferError` when it is not JSON."""
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InferError(
            f"malformed chunk from llama-server (not JSON: {exc}): {data[:500]}", body=data
        ) from exc


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text
