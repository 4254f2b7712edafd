"""A fake llama-server behind :class:`httpx.MockTransport`: :class:`LlamaScript` plays a list of
:class:`Reply` as llama.cpp's server answers (its SSE stream, HTTP errors, stalls)."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = [
    "CONTEXT_FULL",
    "NOT_FOUND",
    "NOT_SERVED",
    "SSE_HEAD",
    "LlamaScript",
    "Reply",
    "Stall",
    "chunk",
    "context_full_reply",
    "sse",
]


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
"""The head of a chunked ``200`` SSE answer, as llama-server sends it."""

CONTEXT_FULL = {
    "error": {
        "code": 400,
        "message": "request (3021 tokens) exceeds the available context size (2048 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 3021,
        "n_ctx": 2048,
    }
}
"""llama.cpp's answer to a prompt longer than the context (HTTP 400)."""


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk of a ``Transfer-Encoding: chunked`` body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj: str) -> bytes:
    """One SSE ``data:`` event (``obj`` is the JSON text) as one HTTP chunk."""
    return chunk(f"data: {obj}\n\n".encode())


@dataclass(frozen=True)
class Stall:
    """A pause in a reply's stream: set the script's ``chunks_sent``, then wait for its
    ``release`` (:class:`LlamaScript`)."""


@dataclass(frozen=True)
class Reply:
    """One scripted llama.cpp chat answer.

    Attributes:
        content: the answer text, one chunk per item (a ``str``: one character per chunk).
        reasoning: ``reasoning_content`` before the content, one chunk per item as above.
        tool_calls: ``(id, name, arguments JSON)`` of each call, one event each; the finish
            reason is then ``tool_calls``.
        stall_after: after this many content chunks, wait for :attr:`LlamaScript.release`
            before sending the rest (``None``: no stall).
        status: an HTTP error status to answer with instead of a stream (body: ``error``).
        error: the JSON body of an error answer.
        id: the completion id of every event.
        data: when given, the stream is these ``data:`` texts as they are (a cut stream, a
            malformed chunk, an error event), nothing else, not even ``[DONE]``.
    """

    content: Sequence[str] = "ok"
    reasoning: Sequence[str] = ""
    tool_calls: Sequence[tuple[str, str, str]] = field(default=())
    stall_after: int | None = None
    status: int | None = None
    error: dict[str, Any] | None = None
    id: str = "chatcmpl-fake"
    data: Sequence[str] | None = None

    def events(self) -> list[bytes | Stall]:
        """The SSE events of the stream (``data: ...\\n\\n`` each), a :class:`Stall` where
        the reply stalls."""

        def event(delta: dict[str, Any], **extra: Any) -> bytes:
            obj = {"id": self.id, "choices": [{"index": 0, "delta": delta}], **extra}
            return f"data: {json.dumps(obj)}\n\n".encode()

        if self.data is not None:
            return [f"data: {text}\n\n".encode() for text in self.data]
        out: list[bytes | Stall] = [event({"role": "assistant", "content": None})]
        out += [event({"reasoning_content": ch}) for ch in self.reasoning]
        for i, ch in enumerate(self.content):
            if i == self.stall_after:
                out.append(Stall())
            out.append(event({"content": ch}))
        for i, (cid, name, arguments) in enumerate(self.tool_calls):
            fn = {"name": name, "arguments": arguments}
            out.append(event({"tool_calls": [{"index": i, "id": cid, "function": fn}]}))
        finish = "tool_calls" if self.tool_calls else "stop"
        out.append(event({}, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
        timings: dict[str, float] = {"cache_n": 0, "prompt_n": 10}
        timings |= {"predicted_n": len(self.content), "prompt_ms": 1.0, "predicted_ms": 2.0}
        out.append(event({}, choices=[], timings=timings))
        out.append(b"data: [DONE]\n\n")
        return out

    def steps(self) -> list[bytes | Stall]:
        """The reply as raw HTTP/1.1 bytes for a socket server (a chunked SSE answer with
        ``Connection: close``, or the error answer), a :class:`Stall` where it stalls."""
        if self.status is not None:
            body = json.dumps(self.error or {}).encode()
            error_head = (
                f"HTTP/1.1 {self.status} Error\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            return [error_head.encode() + body]
        steps: list[bytes | Stall] = [
            SSE_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        ]
        steps += [e if isinstance(e, Stall) else chunk(e) for e in self.events()]
        return [*steps, b"0\r\n\r\n"]


def context_full_reply() -> Reply:
    """llama.cpp's HTTP 400 ``exceed_context_size_error``."""
    return Reply(status=400, error=CONTEXT_FULL)


NOT_SERVED = frozenset({"/apply-template", "/tokenize"})
"""Paths the fake answers 404 without taking an item of the script."""

NOT_FOUND = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
"""llama.cpp's 404 body."""


class LlamaScript:
    """A fake llama-server: a script of :class:`Reply` played behind
    :class:`httpx.MockTransport` (pass :meth:`handler`), no socket.

    Each chat request takes the next reply; the last one repeats. A ``GET`` (``/health``) is
    answered ``{"status": "ok"}`` and a ``POST`` to :data:`NOT_SERVED` 404, neither taking a
    reply. Example: ``Client(ClientConfig(), transport=httpx.MockTransport(script.handler))``.

    Args:
        script: the replies, in order (a subclass serving a socket may hold other items).

    Attributes:
        bodies: the JSON bodies of the chat requests received, in order.
        chunks_sent: set once a stalling reply has sent its chunks and is waiting.
        release: set it to let a stalling reply go on.
    """

    def __init__(self, script: Sequence[object]) -> None:
        self.script = list(script)
        self.bodies: list[dict[str, Any]] = []
        self.chunks_sent = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def next_item(self, body: bytes) -> object:
        """Record a chat request's ``body`` and take the next item of the script."""
        with self._lock:
            # not JSON: played as any other request, not kept in bodies
            with contextlib.suppress(ValueError):
                if body:
                    self.bodies.append(json.loads(body))
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The script behind :class:`httpx.MockTransport` (raises ``TypeError`` on an item that
        is not a :class:`Reply`: socket-level steps need a socket)."""
        if request.method == "GET":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path in NOT_SERVED:
            return httpx.Response(404, json=NOT_FOUND)
        item = self.next_item(request.read())
        if not isinstance(item, Reply):
            raise TypeError(f"{type(item).__name__} items are played on a socket only")
        if item.status is not None:
            return httpx.Response(item.status, json=item.error or {})
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=self._stream(item))

    def _stream(self, reply: Reply) -> Iterator[bytes]:
        for event in reply.events():
            if isinstance(event, Stall):
                self.chunks_sent.set()
                self.release.wait()
            else:
                yield event
