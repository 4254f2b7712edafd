"""httpx client for llama-server: one streamed chat completion, retries, events.

One request is one ``POST {url}/v1/chat/completions`` with ``stream: true``: llama.cpp answers
with Server-Sent Events (the WHATWG "server-sent events" format), one ``data: {json}`` event
per chunk and a final ``data: [DONE]``. The chunks follow the OpenAI chat-completions streaming
format (``choices[0].delta`` with ``content``, ``tool_calls``) plus llama.cpp's additions
(``delta.reasoning_content``, ``prompt_progress``, ``timings``; see llama.cpp's
``tools/server/README.md``).

The work is split in three layers, each usable on its own (cassette replay, analysis):

- :class:`SSEDecoder`: bytes as they arrive -> ``(field, data)`` SSE events;
- :class:`ChunkDecoder`: parsed JSON chunks -> :mod:`boxmaker.events` client events, and the
  accumulated :class:`Completion`;
- :class:`Client`: the HTTP request, errors, the thinking cap, cancellation and retries.

Example::

    from boxmaker.client import Client

    with Client() as client:                       # http://127.0.0.1:8080
        completion = client.chat_with_retry(
            {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0},
            on_event=print,
        )
        print(completion.content, completion.timings.get("cache_n"))

Every failure is an :class:`~boxmaker.errors.InferError` (HTTP status, body and llama.cpp's
parsed ``error`` object kept); :func:`is_context_full` tells llama.cpp's "prompt does not fit"
apart from the rest.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol

import httpx

from .config import ClientConfig
from .errors import InferError, RequestCancelled, StreamCut
from .events import (
    ClientEvent,
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallDelta,
    Waiting,
)
from .records import ToolCall, Usage

__all__ = [
    "ChatClient",
    "ChunkDecoder",
    "Client",
    "Completion",
    "SSEDecoder",
    "is_context_full",
]

CONTEXT_FULL = "exceed_context_size_error"
"""llama.cpp's ``error.type`` when the prompt does not fit in the slot's context."""

_QUEUED = Queued()
_WAITING = Waiting()
_SSE_HEADERS = {"Accept": "text/event-stream"}
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


def _http_error(response: httpx.Response, what: str) -> InferError:
    """The :class:`InferError` for a non-200 answer (the body must have been read)."""
    text = response.text
    error: dict[str, Any] | None = None
    message = text[:500] or response.reason_phrase
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        found = parsed.get("error")
        if isinstance(found, dict):
            error = found
            message = str(found.get("message", message))
        elif isinstance(found, str):
            message = found
    kind = f" ({error['type']})" if error and isinstance(error.get("type"), str) else ""
    return InferError(
        f"{what}: llama-server answered HTTP {response.status_code}{kind}: {message}",
        status=response.status_code,
        body=text,
        error=error,
    )


# --------------------------------------------------------------------------------------------
# the client


class _Retryable(Exception):
    """Internal: a failure before any event (connection refused, HTTP 503) that may be retried.
    Never leaves this module: :meth:`Client._chat` raises :attr:`error` instead."""

    def __init__(self, error: InferError, reason: str) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason


class ChatClient(Protocol):
    """What the turn loop needs of a client: :class:`Client` is one; tests use fakes."""

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """Stream one chat completion, retrying what can be retried."""
        ...


class Client:
    """Synchronous httpx client for llama-server's OpenAI-compatible chat endpoint.

    Args:
        config: where the server is and how hard to try (:class:`~boxmaker.config.ClientConfig`);
            ``None`` uses the defaults (``http://127.0.0.1:8080``).
        transport: an httpx transport to use instead of the network (``httpx.MockTransport``
            in tests, a recording transport for cassettes).
        sleep: called with the retry delay in seconds; ``None`` uses :func:`time.sleep`, or
            waits on the ``cancel`` event when one is given (so cancelling cuts the wait).

    Attributes:
        url: the server's base URL, without trailing ``/`` (``config.url``).
        config: the client config in use.

    Timeouts: connecting may take ``config.connect_timeout_s`` seconds; once connected, the
    request fails if the server sends no byte for ``config.idle_timeout_s`` seconds (an idle
    timeout per read, not a total one: a stream that keeps sending never times out). The
    ``Authorization: Bearer`` header is sent only when ``config.api_key`` is set.

    One :class:`httpx.Client` (connection pool) serves the stream and the reasoning-control
    request sent while the stream is open. Use as a context manager, or call :meth:`close`.
    A client may be shared by threads (httpx's pool is thread-safe); each :meth:`chat` call
    keeps its state local.
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.config = config if config is not None else ClientConfig()
        self.url = self.config.url.rstrip("/")
        self._chat_url = f"{self.url}/v1/chat/completions"
        self._control_url = f"{self.url}/v1/chat/completions/control"
        self._sleep = sleep
        headers = {}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        connect = self.config.connect_timeout_s
        idle = self.config.idle_timeout_s
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(connect=connect, read=idle, write=idle, pool=connect),
            transport=transport,
        )

    # -- public API ---------------------------------------------------------------------------

    def chat(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """Run one streamed chat completion (one attempt, no retry).

        Args:
            body: the request body (OpenAI chat-completions / llama.cpp): ``messages``,
                ``tools``, ``id_slot``, sampling (``temperature``, ``max_tokens``, ``seed``),
                ``chat_template_kwargs``... It is not modified. The client adds
                ``stream: true``, ``return_progress: true``, ``cache_prompt: true``,
                ``stream_options.include_usage: true`` (so the last chunk carries ``usage``)
                and, when ``reasoning_budget`` is given, ``reasoning_control: true``; these
                override the same keys of ``body``.
            on_event: called in order with each :data:`~boxmaker.events.ClientEvent`, on the
                calling thread, while the stream is read (keep it quick; an exception it
                raises closes the stream and propagates).
            reasoning_budget: reasoning tokens (reasoning deltas) this completion may use;
                when reached (``0``: at the first reasoning delta), :meth:`reasoning_end` is
                sent once, :class:`~boxmaker.events.ThinkingCapped` is emitted and the stream
                is read on (the server ends reasoning and continues with content).
                ``None``: no cap and no reasoning control.
            cancel: when set, the stream is closed (llama.cpp then stops generating) and
                :class:`~boxmaker.errors.RequestCancelled` is raised. Checked before the
                request and after each chunk.

        Returns:
            The :class:`Completion`.

        Raises:
            InferError: connection failed (``status`` None), idle timeout (``status`` None),
                HTTP status other than 200 (``status``, ``body`` and llama.cpp's ``error``
                kept; see :func:`is_context_full` for the context-full 400), a malformed
                chunk, an error object inside the stream (``status`` = its ``code``), or the
                server refused reasoning control.
            StreamCut: the stream ended or broke before ``finish_reason`` / ``[DONE]``.
            RequestCancelled: ``cancel`` was set.
        """
        return self._chat(body, on_event, reasoning_budget, cancel, retries=0)

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """:meth:`chat`, retrying when the server cannot be reached or is loading.

        Retried: connection failures (refused, connect timeout) and HTTP 503 (llama.cpp's
        ``"Loading model"``), at most ``config.retry_attempts`` times after the first
        attempt. Retry ``k`` (1, 2, ...) waits ``config.retry_base_delay_s * 2**(k-1)``
        seconds, at most ``config.retry_max_delay_s``, and is announced by
        :class:`~boxmaker.events.Retrying` ``(attempt=k, delay_s, reason)`` before the wait.
        Both failures happen before any other event, so a retried attempt has emitted
        nothing. Every other error is raised at once.

        Arguments, return value: as :meth:`chat`.

        Raises:
            InferError: as :meth:`chat`; when every attempt failed, the last attempt's error
                (same ``status``, ``body``, ``error``) with a message that says how many
                attempts were made.
            RequestCancelled: ``cancel`` was set, also during a retry wait.
        """
        return self._chat(
            body, on_event, reasoning_budget, cancel, retries=self.config.retry_attempts
        )

    def reasoning_end(self, completion_id: str) -> bool:
        """Ask llama-server to end the reasoning of a running completion now.

        Sends ``POST {url}/v1/chat/completions/control`` with ``{"id": completion_id,
        "action": "reasoning_end"}`` (llama.cpp reasoning control; the completion must have
        been requested with ``reasoning_control: true``).

        Returns:
            The answer's ``success`` field: ``False`` when the server did not accept it
            (e.g. ``"no active completion for this id"``).

        Raises:
            InferError: connection failure, HTTP status other than 200, or an answer that is
                not a JSON object.
        """
        return self._control(completion_id)[0]

    def close(self) -> None:
        """Close the connection pool. The client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> Client:
        """Return the client itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client (see :meth:`close`)."""
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- internals ----------------------------------------------------------------------------

    def _chat(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
        *,
        retries: int,
    ) -> Completion:
        payload = {
            **body,
            "stream": True,
            "return_progress": True,
            "cache_prompt": True,
            "stream_options": {**body.get("stream_options", {}), "include_usage": True},
        }
        if reasoning_budget is not None:
            payload["reasoning_control"] = True
        attempt = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise RequestCancelled("request cancelled before it was sent")
            try:
                return self._attempt(payload, on_event, reasoning_budget, cancel)
            except _Retryable as failure:
                error = failure.error
                if attempt >= retries:
                    if retries == 0:
                        raise error from error.__cause__
                    raise InferError(
                        f"{error} (gave up after {attempt + 1} attempts)",
                        status=error.status,
                        body=error.body,
                        error=error.error,
                    ) from error.__cause__
                attempt += 1
                cfg = self.config
                delay = min(cfg.retry_base_delay_s * 2 ** (attempt - 1), cfg.retry_max_delay_s)
                on_event(Retrying(attempt=attempt, delay_s=delay, reason=failure.reason))
                self._wait(delay, cancel)

    def _wait(self, delay: float, cancel: threading.Event | None) -> None:
        if self._sleep is None and cancel is not None:
            if cancel.wait(delay):
                raise RequestCancelled("request cancelled while waiting to retry")
            return
        (self._sleep or time.sleep)(delay)
        if cancel is not None and cancel.is_set():
            raise RequestCancelled("request cancelled while waiting to retry")

    def _attempt(
        self,
        payload: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
    ) -> Completion:
        started = False
        try:
            with self._http.stream(
                "POST", self._chat_url, json=payload, headers=_SSE_HEADERS
            ) as response:
                started = True
                if response.status_code != 200:
                    response.read()
                    error = _http_error(response, "chat completion")
                    if response.status_code == 503:
                        raise _Retryable(error, f"HTTP 503: {_short(error)}")
                    raise error
                on_event(_QUEUED)
                return self._read(response, on_event, reasoning_budget, cancel)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            error = InferError(f"cannot connect to llama-server at {self.url}: {exc}")
            error.__cause__ = exc
            raise _Retryable(error, f"connection failed: {exc}") from exc
        except httpx.ReadTimeout as exc:
            raise InferError(
                f"llama-server at {self.url} sent nothing for {self.config.idle_timeout_s} s "
                "(idle timeout, ClientConfig.idle_timeout_s)"
            ) from exc
        except httpx.TransportError as exc:
            if started:
                raise StreamCut(
                    f"stream cut: the connection to llama-server broke mid-stream: {exc!r}"
                ) from exc
            raise InferError(f"request to llama-server at {self.url} failed: {exc!r}") from exc

    def _read(
        self,
        response: httpx.Response,
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
    ) -> Completion:
        sse = SSEDecoder()
        chunks = ChunkDecoder()
        cap_at = None if reasoning_budget is None else max(reasoning_budget, 1)
        raw_decode = _JSON.raw_decode
        stream = response.iter_bytes()
        while True:
            raw = next(stream, None)
            events = sse.feed(raw) if raw is not None else sse.flush()
            for name, data in events:
                if name != "data":
                    if name == "error":
                        raise _stream_error(_loads_or_text(data), data)
                    continue
                if data == "[DONE]":
                    chunks.mark_done()
                    return chunks.finish()
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
                for event in chunks.feed(obj):
                    on_event(event)
                if (
                    cap_at is not None
                    and chunks.reasoning_tokens >= cap_at
                    and not chunks.thinking_capped
                ):
                    self._cap(chunks, on_event)
                if cancel is not None and cancel.is_set():
                    response.close()
                    raise RequestCancelled(
                        f"request cancelled after {chunks.chunks} chunks; stream closed"
                    )
            if raw is None:
                return chunks.finish()

    def _cap(self, chunks: ChunkDecoder, on_event: Callable[[ClientEvent], None]) -> None:
        """Send reasoning_end for the running completion; raise if the server refuses."""
        what = f"llama-server refused reasoning control for {chunks.id or '(no id)'}"
        if not chunks.id:
            raise InferError(f"{what}: the stream carried no completion id")
        try:
            success, text = self._control(chunks.id)
        except InferError as exc:
            raise InferError(
                f"{what}: {exc}", status=exc.status, body=exc.body, error=exc.error
            ) from exc
        if not success:
            raise InferError(f"{what}: it answered {text}", status=200, body=text)
        on_event(chunks.mark_capped())

    def _control(self, completion_id: str) -> tuple[bool, str]:
        try:
            response = self._http.post(
                self._control_url, json={"id": completion_id, "action": "reasoning_end"}
            )
        except httpx.HTTPError as exc:
            raise InferError(
                f"reasoning control request to llama-server at {self.url} failed: {exc!r}"
            ) from exc
        if response.status_code != 200:
            raise _http_error(response, "reasoning control")
        text = response.text
        answer = _loads_or_text(text)
        if not isinstance(answer, dict):
            raise InferError(
                f"reasoning control: llama-server's answer is not a JSON object: {text[:500]}",
                status=200,
                body=text,
            )
        return answer.get("success") is True, text


def _loads_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _short(error: InferError) -> str:
    if error.error and isinstance(error.error.get("message"), str):
        return str(error.error["message"])
    return error.body[:200]
