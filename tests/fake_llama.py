"""The one fake llama-server of the tests: a script of answers, played on a real socket
(127.0.0.1, a free port) or behind :class:`httpx.MockTransport`, for transport-level tests.

A script is a list of items; each request (socket: each connection) takes the next one, the
last one repeats:

- :class:`Reply`: a llama.cpp chat answer (see LLAMA_CPP.md): a chunked SSE stream of the
  role event, the reasoning and content one chunk per character, the tool calls, the
  ``finish_reason``, an event with ``timings`` and ``data: [DONE]``; it can stall after
  ``stall_after`` content chunks until the test sets :attr:`FakeLlama.release`, or answer an
  HTTP error instead (:func:`context_full`). Served the same way by :meth:`Script.handler`
  (httpx.MockTransport, no socket) and by :class:`FakeLlama` (a socket).
- :class:`Raw`: steps played as they are on the socket, for faults below HTTP: ``bytes``
  (use :data:`SSE_HEAD`, :func:`chunk`, :func:`sse`), a ``float`` pause in seconds,
  :class:`Every` for repeated ``: ping`` comments, :class:`Stall`. After the steps the
  connection is held open, silent, until the client closes it (then
  :attr:`FakeLlama.disconnected` is set) or the server is closed; ``hold=False`` closes it at
  once. A failed send (the client went away) also sets ``disconnected``.

A ``GET`` (``/health``) is answered ``{"status": "ok"}`` and takes no item of the script; a
``POST`` to :data:`NOT_SERVED` (the endpoints cache forensics asks) is answered 404 and takes
none either.

Example::

    with running([Raw([SSE_HEAD, chunk(b": ping\\n\\n")])]) as server:
        client = Client(ClientConfig(url=server.url))
        ...
        assert server.disconnected.wait(2)
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import httpx

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
class Every:
    """Send ``data`` every ``interval_s`` seconds for ``for_s`` seconds (then go on)."""

    data: bytes
    interval_s: float
    for_s: float


@dataclass(frozen=True)
class Stall:
    """Set :attr:`FakeLlama.chunks_sent`, then wait for :attr:`FakeLlama.release`."""


Step = bytes | float | Every | Stall


@dataclass(frozen=True)
class Raw:
    """Socket-level steps for one connection (see the module docstring)."""

    steps: Sequence[Step]
    hold: bool = True


@dataclass(frozen=True)
class Reply:
    """One scripted llama.cpp chat answer.

    Attributes:
        content: the answer text, one chunk per item (a ``str``: one character per chunk).
        reasoning: ``reasoning_content`` before the content, one chunk per item as above.
        tool_calls: ``(id, name, arguments JSON)`` of each call, one event each; the finish
            reason is then ``tool_calls``.
        stall_after: after this many content chunks, wait for :attr:`FakeLlama.release`
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

    def steps(self) -> list[Step]:
        """The reply as socket steps: a whole HTTP/1.1 answer, then the connection closes."""
        if self.status is not None:
            body = json.dumps(self.error or {}).encode()
            error_head = (
                f"HTTP/1.1 {self.status} Error\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            return [error_head.encode() + body]
        steps: list[Step] = [SSE_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")]
        steps += [e if isinstance(e, Stall) else chunk(e) for e in self.events()]
        return [*steps, b"0\r\n\r\n"]


def context_full() -> Reply:
    """llama.cpp's HTTP 400 ``exceed_context_size_error``."""
    return Reply(status=400, error=CONTEXT_FULL)


Item = Reply | Raw


NOT_SERVED = frozenset({"/apply-template", "/tokenize"})
"""Paths the fake answers 404 without taking an item of the script."""

NOT_FOUND = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}


class Script:
    """A script played behind :class:`httpx.MockTransport` (pass :meth:`handler`), no socket.

    Attributes:
        bodies: the JSON bodies of the chat requests received, in order.
        chunks_sent: set once a stalling reply has sent its chunks and is waiting.
        release: set it to let a stalling reply go on.
    """

    def __init__(self, script: Sequence[Item]) -> None:
        self.script = list(script)
        self.bodies: list[dict[str, Any]] = []
        self.chunks_sent = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def next_item(self, body: bytes) -> Item:
        """Record a chat request's ``body`` and take the next item of the script."""
        with self._lock:
            if body:
                self.bodies.append(json.loads(body))
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The script behind :class:`httpx.MockTransport` (``Reply`` items only: ``Raw``
        steps need the socket; raises ``TypeError`` on one)."""
        if request.method == "GET":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path in NOT_SERVED:
            return httpx.Response(404, json=NOT_FOUND)
        item = self.next_item(request.read())
        if isinstance(item, Raw):
            raise TypeError("Raw steps are played on the socket only")
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


class FakeLlama(Script):
    """The fake server on a socket: 127.0.0.1, a free port, daemon threads, playing
    ``script``; :meth:`handler` (from :class:`Script`) serves the same script to
    :class:`httpx.MockTransport`.

    Use it as a context manager (or :func:`running`); :meth:`close` stops the socket server.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        requests: the raw bytes (head and body) of each request received on the socket.
        bodies: the JSON bodies of the chat requests received (socket or handler), in order.
        connections: socket connections accepted so far.
        chunks_sent: set once a stalling reply has sent its chunks and is waiting.
        release: set it to let a stalling reply go on.
        disconnected: set once a client went away (seen by a read or a send).
    """

    def __init__(self, script: Sequence[Item]) -> None:
        super().__init__(script)
        self.requests: list[bytes] = []
        self.connections = 0
        self.disconnected = threading.Event()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        """Stop serving: a stall is released, every connection closed, the threads end."""
        self.release.set()
        self._closing.set()
        for thread in list(self._threads):
            thread.join(timeout=2)
        self._listener.close()

    def __enter__(self) -> FakeLlama:
        """Return the server itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the server (see :meth:`close`)."""
        self.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.05)
            request = self._read_request(conn)
            if request is None:
                return
            self.requests.append(request)
            head, _, body = request.partition(b"\r\n\r\n")
            if head.startswith(b"GET "):
                self._send(conn, _ok_json())
                return
            if head.split(b" ", 2)[1].decode("latin-1") in NOT_SERVED:
                self._send(conn, _not_found_json())
                return
            item = self.next_item(body)
            raw = item if isinstance(item, Raw) else Raw(item.steps(), hold=False)
            for step in raw.steps:
                if not self._play(conn, step):
                    return
            while raw.hold and not self._closing.is_set():
                try:
                    if conn.recv(1024) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            if raw.hold and not self._closing.is_set():
                self.disconnected.set()

    def _read_request(self, conn: socket.socket) -> bytes | None:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = self._recv(conn)
            if not piece:
                return None
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            piece = self._recv(conn)
            if not piece:
                return None
            body += piece
        return head + b"\r\n\r\n" + body

    def _recv(self, conn: socket.socket) -> bytes:
        while not self._closing.is_set():
            try:
                return conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return b""
        return b""

    def _play(self, conn: socket.socket, step: Step) -> bool:
        """Play one step; False when the connection is gone or the server is closing."""
        if isinstance(step, Stall):
            self.chunks_sent.set()
            self.release.wait()
            return not self._closing.is_set()
        if isinstance(step, float | int):
            return not self._closing.wait(step)
        if isinstance(step, Every):
            end = threading.Event()
            timer = threading.Timer(step.for_s, end.set)
            timer.start()
            try:
                while not end.is_set():
                    if not self._send(conn, step.data) or self._closing.wait(step.interval_s):
                        return False
            finally:
                timer.cancel()
            return True
        return self._send(conn, step)

    def _send(self, conn: socket.socket, data: bytes) -> bool:
        try:
            conn.sendall(data)
        except OSError:
            self.disconnected.set()
            return False
        return True


def _not_found_json() -> bytes:
    body = json.dumps(NOT_FOUND).encode()
    head = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def _ok_json() -> bytes:
    body = b'{"status": "ok"}'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@contextmanager
def running(script: Sequence[Item]) -> Iterator[FakeLlama]:
    """Serve ``script`` on the socket until the block ends."""
    with FakeLlama(script) as fake:
        yield fake
