"""Stream decoding: a llama-server chat-completion stream (bytes) -> client events and a Completion.

llama.cpp answers a streamed ``POST /v1/chat/completions`` with Server-Sent Events (the WHATWG
"server-sent events" format): one ``data: {json}`` event per chunk and a final ``data: [DONE]``.
The chunks follow the OpenAI chat-completions streaming format (``choices[0].delta`` with
``content``, ``tool_calls``) plus llama.cpp's additions (``delta.reasoning_content``,
``prompt_progress``, ``timings``; see llama.cpp's ``tools/server/README.md``).

Three layers, each usable on its own, with no I/O (the HTTP client and the cassette reader
both drive them):

- :class:`SSEDecoder`: bytes as they arrive -> ``(field, data)`` SSE events;
- :class:`ChunkDecoder`: parsed JSON chunks -> :mod:`boxmaker.events` client events, and the
  accumulated :class:`Completion`;
- :class:`StreamDecoder`: both joined, with the JSON parse and ``[DONE]``: bytes -> events.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .errors import InferError, StreamCut
from .events import (
    ClientEvent,
    Content,
    Progress,
    Reasoning,
    ThinkingCapped,
    ToolCallDelta,
    Waiting,
)
from .records import ToolCall, Usage

__all__ = [
    "CONTEXT_FULL",
    "ChunkDecoder",
    "Completion",
    "SSEDecoder",
    "StreamDecoder",
    "is_context_full",
]

CONTEXT_FULL = "exceed_context_size_error"
"""llama.cpp's ``error.type`` when the prompt does not fit in the slot's context."""


_WAITING = Waiting()
_JSON = json.JSONDecoder()


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One finished streamed chat completion, joined from its chunks.

    Attributes:
        id: the stream's ``id`` (``"chatcmpl-..."``), ``""`` if the server sent none.
        content: the joined ``delta.content`` fragments, ``None`` if none came.
        reasoning: the joined ``delta.reasoning_content`` fragments (llama.cpp's reasoning
            parser, the model's ``<think>`` text), ``None`` if none came.
        tool_calls: the calls of ``delta.tool_calls`` in ``index`` order; ``arguments`` is the
            exact joined text (neither parsed nor re-serialised, so it may be invalid JSON). A
            call the server sent without ``id`` gets a made-up one derived from the completion
            id and the index (stable when a recording is replayed).
        finish_reason: ``"stop"``, ``"length"``, ``"tool_calls"``..., ``None`` if the stream
            ended with ``[DONE]`` but no finish reason.
        timings: llama.cpp's ``timings`` of the last chunk that carried them (``cache_n``,
            ``prompt_n``, ``predicted_n`` in tokens; ``prompt_ms``, ``predicted_ms`` in ms;
            ``*_per_second``...), ``{}`` if none.
        usage: the OpenAI ``usage`` object of the last chunk that carried it
            (``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
            ``prompt_tokens_details.cached_tokens``), ``{}`` if none.
        reasoning_tokens: number of reasoning deltas received (llama.cpp sends about one token
            per delta, so this counts reasoning tokens).
        thinking_capped: ``reasoning_end`` was sent for this completion (budget reached).
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

    def usage_record(self) -> Usage:
        """The session log's :class:`~boxmaker.records.Usage` record of this completion:
        ``timings`` as sent, reasoning tokens, the thinking-cap flag, the OpenAI
        ``usage.prompt_tokens`` / ``completion_tokens`` (``None`` when absent) and the
        ``finish_reason``."""
        return Usage(
            timings=dict(self.timings),
            reasoning_tokens=self.reasoning_tokens,
            thinking_capped=self.thinking_capped,
            prompt_tokens=_int_or_none(self.usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(self.usage.get("completion_tokens")),
            finish_reason=self.finish_reason,
        )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def is_context_full(error: BaseException) -> bool:
    """Whether ``error`` is llama.cpp's "the prompt does not fit" answer.

    True for an :class:`~boxmaker.errors.InferError` whose ``error.type`` is
    ``"exceed_context_size_error"``, whether it came as HTTP 400 or inside a 200 stream;
    False for anything else (other statuses, other types, other exceptions).
    """
    return isinstance(error, InferError) and error.error_type == CONTEXT_FULL


# --------------------------------------------------------------------------------------------
# SSE: bytes -> (field, data)


class SSEDecoder:
    """Incremental Server-Sent Events decoder: bytes as they arrive -> ``(field, data)``.

    Format: WHATWG HTML "server-sent events" (the one llama.cpp and OpenAI stream). Lines end
    with ``\\n``, ``\\r\\n`` or a lone ``\\r``; an empty line ends an event; ``field: value``
    lines (one optional space after the colon is dropped); lines starting with ``:`` are
    comments (llama.cpp's ``: ping``) and ignored.

    :meth:`feed` returns, for each event completed by the chunk, one ``(field, data)`` per
    field name the event carried, in order of first appearance: ``("data", "{...}")``, or
    ``("error", "{...}")`` for older llama.cpp builds. Several lines of the same field are
    joined with ``\\n``. Events and fields with empty data are dropped.

    A chunk boundary may fall anywhere: mid-line, mid-UTF-8 character, between ``\\r`` and
    ``\\n``; the incomplete tail waits for the next chunk. Invalid UTF-8 becomes U+FFFD.
    """

    __slots__ = ("_buf", "_pending")

    def __init__(self) -> None:
        self._buf = b""
        self._pending: list[tuple[str, str]] = []

    def feed(self, chunk: bytes) -> list[tuple[str, str]]:
        """Decode one chunk of bytes; return the events it completed (maybe none)."""
        buf = self._buf + chunk if self._buf else chunk
        hold = b""
        if b"\r" in buf:
            if buf[-1:] == b"\r":  # may be the first half of a \r\n split between chunks
                hold = b"\r"
                buf = buf[:-1]
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        if buf[-1:] == b"\n":
            self._buf = hold
            lines = buf.decode("utf-8", "replace").split("\n")
            lines.pop()
        else:
            end = buf.rfind(b"\n")
            if end < 0:
                self._buf = buf + hold
                return []
            self._buf = buf[end + 1 :] + hold
            lines = buf[:end].decode("utf-8", "replace").split("\n")
        return self._lines(lines)

    def flush(self) -> list[tuple[str, str]]:
        """End of stream: decode what is left, ending an unterminated last event."""
        buf, self._buf = self._buf, b""
        text = buf.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")
        lines = text.split("\n") if text else []
        lines.append("")
        return self._lines(lines)

    def _lines(self, lines: list[str]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        pending = self._pending
        for line in lines:
            if not line:
                if pending:
                    if len(pending) == 1:
                        if pending[0][1]:
                            out.append(pending[0])
                    else:
                        out.extend(_merge_fields(pending))
                    pending = []
            elif line.startswith("data: "):
                pending.append(("data", line[6:]))
            elif line[0] != ":":
                name, _, value = line.partition(":")
                pending.append((name, value[1:] if value[:1] == " " else value))
        self._pending = pending
        return out


def _merge_fields(pending: list[tuple[str, str]]) -> list[tuple[str, str]]:
    merged: dict[str, list[str]] = {}
    for name, value in pending:
        merged.setdefault(name, []).append(value)
    return [(name, text) for name, values in merged.items() if (text := "\n".join(values))]


# --------------------------------------------------------------------------------------------
# chunks -> events + Completion


class _CallParts:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments: list[str] = []


class ChunkDecoder:
    """Parsed stream chunks -> client events, accumulating one :class:`Completion`.

    Feed each ``data:`` JSON object (OpenAI ``chat.completion.chunk`` with llama.cpp's
    additions) to :meth:`feed`; call :meth:`mark_done` on ``data: [DONE]``; then
    :meth:`finish` gives the :class:`Completion`.

    Events per chunk, in this order:

    - ``prompt_progress`` -> :class:`~boxmaker.events.Progress`; when ``processed`` reaches
      ``total`` -> :class:`~boxmaker.events.Waiting`;
    - the first chunk without ``prompt_progress`` before any token -> ``Waiting`` (builds
      without progress), so ``Waiting`` comes exactly once, before the first token;
    - ``delta.reasoning_content`` -> :class:`~boxmaker.events.Reasoning` (counted in
      :attr:`reasoning_tokens`), ``delta.content`` -> :class:`~boxmaker.events.Content`,
      each ``delta.tool_calls[i]`` -> :class:`~boxmaker.events.ToolCallDelta`. A tool call's
      ``id`` and ``name`` are kept from the first delta that carries them and appear in the
      event only then (``None`` in later events even if the server repeats them); its
      ``arguments`` fragments are joined per ``index`` by :meth:`finish`.

    ``timings`` and ``usage`` are taken from the last chunk that carries them (llama.cpp puts
    them on the finish chunk, or on a trailing ``"choices": []`` chunk when
    ``stream_options.include_usage`` is set).

    Attributes:
        id: the stream's completion id (``"chatcmpl-..."``), ``""`` until one arrives.
        finish_reason: the ``finish_reason`` once a chunk carried one, else ``None``.
        done: ``data: [DONE]`` was received (:meth:`mark_done`).
        chunks: number of chunks fed.
        reasoning_tokens: reasoning deltas received so far.
        thinking_capped: :meth:`mark_capped` was called.
        timings: llama.cpp ``timings`` so far (``{}`` if none).
        usage: OpenAI ``usage`` so far (``{}`` if none).
    """

    __slots__ = (
        "_calls",
        "_content",
        "_reasoning",
        "_waiting",
        "chunks",
        "done",
        "finish_reason",
        "id",
        "reasoning_tokens",
        "thinking_capped",
        "timings",
        "usage",
    )

    def __init__(self) -> None:
        self.id = ""
        self.finish_reason: str | None = None
        self.done = False
        self.chunks = 0
        self.reasoning_tokens = 0
        self.thinking_capped = False
        self.timings: dict[str, float] = {}
        self.usage: dict[str, Any] = {}
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _CallParts] = {}
        self._waiting = False  # Waiting was emitted (or cannot be any more)

    @property
    def finished(self) -> bool:
        """Whether the stream has ended properly: a ``finish_reason`` or ``[DONE]`` came."""
        return self.finish_reason is not None or self.done

    def feed(self, obj: dict[str, Any]) -> list[ClientEvent]:
        """Take one parsed chunk; return the events it carries.

        Raises:
            InferError: the chunk is an error object (``{"error": {...}}``; ``status`` is
                ``error.code`` when present), or its shape is not a chat-completion chunk.
        """
        self.chunks += 1
        try:
            return self._feed(obj)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            text = json.dumps(obj, ensure_ascii=False)[:500]
            raise InferError(
                f"malformed chunk from llama-server ({exc!r}): {text}", body=text
            ) from exc

    def _feed(self, obj: dict[str, Any]) -> list[ClientEvent]:
        events: list[ClientEvent] = []
        if not self.id:
            cid = obj.get("id")
            if isinstance(cid, str):
                self.id = cid
        if "error" in obj:
            raise _stream_error(obj, json.dumps(obj, ensure_ascii=False))
        progress = obj.get("prompt_progress")
        if progress is not None:
            total = int(progress.get("total", 0))
            processed = int(progress.get("processed", 0))
            events.append(
                Progress(
                    total=total,
                    cache=int(progress.get("cache", 0)),
                    processed=processed,
                    time_ms=float(progress.get("time_ms", 0.0)),
                )
            )
            if not self._waiting and processed >= total:
                self._waiting = True
                events.append(_WAITING)
        elif not self._waiting:
            self._waiting = True
            events.append(_WAITING)
        choices = obj.get("choices")
        if choices:
            choice = choices[0]
            delta = choice.get("delta")
            if delta:
                text = delta.get("reasoning_content")
                if text:
                    self._reasoning.append(text)
                    self.reasoning_tokens += 1
                    events.append(Reasoning(text))
                text = delta.get("content")
                if text:
                    self._content.append(text)
                    events.append(Content(text))
                calls = delta.get("tool_calls")
                if calls:
                    self._tool_calls(calls, events)
            reason = choice.get("finish_reason")
            if reason is not None:
                self.finish_reason = reason
        timings = obj.get("timings")
        if timings is not None:
            self.timings = dict(timings)
        usage = obj.get("usage")
        if usage is not None:
            self.usage = dict(usage)
        return events

    def _tool_calls(self, calls: list[dict[str, Any]], events: list[ClientEvent]) -> None:
        for position, call in enumerate(calls):
            index = int(call.get("index", position))
            parts = self._calls.get(index)
            if parts is None:
                parts = self._calls[index] = _CallParts()
            new_id = None
            call_id = call.get("id")
            if call_id and not parts.id:
                parts.id = new_id = call_id
            new_name = None
            arguments = ""
            function = call.get("function")
            if function:
                name = function.get("name")
                if name and not parts.name:
                    parts.name = new_name = name
                arguments = function.get("arguments") or ""
                if arguments:
                    parts.arguments.append(arguments)
            events.append(ToolCallDelta(index, new_id, new_name, arguments))

    def mark_done(self) -> None:
        """Record that ``data: [DONE]`` arrived (the stream ended properly)."""
        self.done = True

    def mark_capped(self) -> ThinkingCapped:
        """Record that ``reasoning_end`` was sent; return the event to emit."""
        self.thinking_capped = True
        return ThinkingCapped(reasoning_tokens=self.reasoning_tokens)

    def finish(self) -> Completion:
        """The accumulated completion.

        Raises:
            StreamCut: the stream ended with neither a ``finish_reason`` nor ``[DONE]``.
        """
        if not self.finished:
            raise StreamCut(
                f"stream cut: llama-server's stream ended after {self.chunks} chunks without "
                "finish_reason or [DONE]"
            )
        return self.partial()

    def partial(self) -> Completion:
        """What arrived so far as a :class:`Completion`, whether or not the stream finished
        (for a cut or failed stream: the text and calls received before it broke)."""
        calls = tuple(
            ToolCall(
                id=parts.id or _made_up_call_id(self.id, index),
                name=parts.name,
                arguments="".join(parts.arguments),
            )
            for index, parts in sorted(self._calls.items())
        )
        return Completion(
            id=self.id,
            content="".join(self._content) if self._content else None,
            reasoning="".join(self._reasoning) if self._reasoning else None,
            tool_calls=calls,
            finish_reason=self.finish_reason,
            timings=self.timings,
            usage=self.usage,
            reasoning_tokens=self.reasoning_tokens,
            thinking_capped=self.thinking_capped,
        )


def _made_up_call_id(completion_id: str, index: int) -> str:
    digest = hashlib.sha256(f"{completion_id}/{index}".encode()).hexdigest()
    return f"call_{digest[:24]}"


def _stream_error(payload: Any, text: str) -> InferError:
    """The :class:`InferError` for an error sent inside a 200 stream.

    ``payload`` is the parsed event: ``{"error": {...}}`` (newer llama.cpp, as ``data:``) or
    the bare error object (older builds' ``error:`` line). ``status`` is ``error.code`` when
    it is an integer, ``body`` is ``text``.
    """
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if not isinstance(error, dict):
        error = {"message": str(error)}
    code = error.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    kind = error.get("type")
    what = f" ({kind})" if isinstance(kind, str) else ""
    message = error.get("message") or text
    return InferError(
        f"llama-server sent an error inside the stream{what}: {message}",
        status=status,
        body=text,
        error=error,
    )


# --------------------------------------------------------------------------------------------
# bytes -> events: the two decoders joined


class StreamDecoder:
    """A whole chat-completion stream: bytes as they arrive -> client events.

    Joins :class:`SSEDecoder` and :class:`ChunkDecoder`: each ``data:`` event is parsed as JSON
    and fed to the chunk decoder; ``data: [DONE]`` marks the stream done (later bytes are
    ignored); an older build's ``error:`` event is an error. Used by the HTTP client (live) and
    the cassette reader (recorded bodies), so both read a stream the same way.

    Attributes:
        chunks: the :class:`ChunkDecoder` (id, finish reason, timings, token counts so far).
    """

    __slots__ = ("chunks", "sse")

    def __init__(self) -> None:
        self.sse = SSEDecoder()
        self.chunks = ChunkDecoder()

    @property
    def done(self) -> bool:
        """``data: [DONE]`` was received."""
        return self.chunks.done

    def feed(self, raw: bytes) -> list[ClientEvent]:
        """Decode one read of bytes; return the client events of the chunks it completed.

        Raises:
            InferError: an error event, a chunk that is not a JSON object, or a malformed
                chunk (see :meth:`ChunkDecoder.feed`).
        """
        return [event for events in self.per_chunk(self.sse.feed(raw)) for event in events]

    def flush(self) -> list[ClientEvent]:
        """End of stream: decode an unterminated last event; return its events."""
        return [event for events in self.per_chunk(self.sse.flush()) for event in events]

    def per_chunk(self, sse_events: list[tuple[str, str]]) -> Iterator[list[ClientEvent]]:
        """The client events of each chunk among ``sse_events`` (from :attr:`sse`), one list
        per chunk, so a caller can act between chunks (the client's thinking cap and cancel
        checks). Stops at ``[DONE]``. Raises as :meth:`feed`."""
        chunks = self.chunks
        if chunks.done:
            return
        raw_decode = _JSON.raw_decode
        for name, data in sse_events:
            if name != "data":
                if name == "error":
                    raise _stream_error(_loads_or_text(data), data)
                continue
            if data == "[DONE]":
                chunks.mark_done()
                return
            try:  # raw_decode skips json.loads' whitespace regexes (the hot path)
                obj, end = raw_decode(data)
            except ValueError:
                end = -1
            if end != len(data):  # surrounding whitespace, or not JSON: the strict parse
                try:
                    obj = json.loads(data)
                except ValueError as exc:
                    raise InferError(
                        f"malformed chunk from llama-server (not JSON: {exc}): {data[:500]}",
                        body=data,
                    ) from exc
            if type(obj) is not dict:
                raise InferError(
                    f"malformed chunk from llama-server (not a JSON object): {data[:500]}",
                    body=data,
                )
            yield chunks.feed(obj)


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text
