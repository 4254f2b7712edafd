"""A stand-in llama-server on a real socket (127.0.0.1, a free port), for tests that run
``boxmaker`` against a server: it plays scripted replies to ``POST /v1/chat/completions``.

Each request takes the next :class:`Reply` of the script (the last one repeats). A reply
streams its content one chunk per character in llama.cpp's shapes (see LLAMA_CPP.md), then
``finish_reason``, an event with ``timings``, and ``data: [DONE]``; or it stalls after
``stall_after`` chunks until the test sets :attr:`FakeLlama.release`; or it answers with an
HTTP error body.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


@dataclass(frozen=True)
class Reply:
    """One scripted answer.

    Attributes:
        content: the answer text, streamed one character per chunk.
        stall_after: after this many content chunks, wait for :attr:`FakeLlama.release`
            before sending the rest (``None``: no stall).
        status: an HTTP error status to answer with instead of a stream (body: ``error``).
        error: the JSON body of an error answer.
    """

    content: str = "ok"
    stall_after: int | None = None
    status: int | None = None
    error: dict[str, Any] | None = None


def context_full() -> Reply:
    """llama.cpp's HTTP 400 ``exceed_context_size_error``."""
    return Reply(status=400, error=CONTEXT_FULL)


class FakeLlama:
    """The fake server. Use :func:`running` to start and stop it.

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        bodies: the JSON bodies of the chat requests received, in order.
        chunks_sent: set once a stalling reply has sent its chunks and is waiting.
        release: set it to let a stalling reply go on.
        disconnected: set when a client went away in the middle of a stream.
    """

    def __init__(self, script: Sequence[Reply]) -> None:
        self.script = list(script)
        self.bodies: list[dict[str, Any]] = []
        self.chunks_sent = threading.Event()
        self.release = threading.Event()
        self.disconnected = threading.Event()
        self._lock = threading.Lock()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"

    def next_reply(self, body: dict[str, Any]) -> Reply:
        """Record ``body`` and take the next reply of the script."""
        with self._lock:
            self.bodies.append(body)
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]


@contextmanager
def running(script: Sequence[Reply]) -> Iterator[FakeLlama]:
    """Serve ``script`` in a thread until the block ends."""
    fake = FakeLlama(script)
    thread = threading.Thread(target=fake._http.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.release.set()
        fake._http.shutdown()
        fake._http.server_close()
        thread.join()


def _chunk(delta: dict[str, Any], **extra: Any) -> bytes:
    event = {"id": "chatcmpl-fake", "choices": [{"index": 0, "delta": delta}], **extra}
    return f"data: {json.dumps(event)}\n\n".encode()


def _handler(fake: FakeLlama) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._send(200, {"status": "ok"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            reply = fake.next_reply(body)
            if reply.status is not None:
                self._send(reply.status, reply.error or {})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            try:
                self._stream(reply)
            except OSError:
                fake.disconnected.set()
            self.close_connection = True

        def _stream(self, reply: Reply) -> None:
            self._write(_chunk({"role": "assistant", "content": None}))
            for i, ch in enumerate(reply.content):
                if i == reply.stall_after:
                    fake.chunks_sent.set()
                    fake.release.wait()
                self._write(_chunk({"content": ch}))
            self._write(_chunk({}, choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]))
            timings: dict[str, float] = {"cache_n": 0, "prompt_n": 10}
            timings |= {"predicted_n": len(reply.content), "prompt_ms": 1.0, "predicted_ms": 2.0}
            self._write(_chunk({}, choices=[], timings=timings))
            self._write(b"data: [DONE]\n\n")

        def _write(self, data: bytes) -> None:
            self.wfile.write(data)
            self.wfile.flush()

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler
