"""The one fake llama-server of the tests: a script of answers, played on a real socket
(127.0.0.1, a free port) or behind :class:`httpx.MockTransport`, for transport-level tests.
The replies and the MockTransport handler are :mod:`boxmaker.testing`'s (``Reply``,
``LlamaScript``, re-exported here as ``Script``); the socket server and its raw steps are here.

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
none either; nor does a ``POST /slots/{id}?action=...``: answered as llama-server without
``--slot-save-path`` does (HTTP 501 ``not_supported_error``), or, with
:attr:`FakeLlama.slot_files` set (a dict), as one with it (save keeps the name, restore of a
name not saved is HTTP 400, an invalid name HTTP 400 ``Invalid filename``); with
:attr:`FakeLlama.slot_folder` set too, a save also writes the file there (the server's
``--slot-save-path`` on this machine).

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
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from boxmaker.testing import (
    CONTEXT_FULL,
    NOT_FOUND,
    NOT_SERVED,
    SSE_HEAD,
    LlamaScript,
    Reply,
    Stall,
    chunk,
    context_full_reply,
    sse,
)

__all__ = [
    "CONTEXT_FULL",
    "NOT_FOUND",
    "NOT_SERVED",
    "SSE_HEAD",
    "Every",
    "FakeLlama",
    "Raw",
    "Reply",
    "Script",
    "Stall",
    "chunk",
    "context_full",
    "running",
    "sse",
]


@dataclass(frozen=True)
class Every:
    """Send ``data`` every ``interval_s`` seconds for ``for_s`` seconds (then go on)."""

    data: bytes
    interval_s: float
    for_s: float


Step = bytes | float | Every | Stall


@dataclass(frozen=True)
class Raw:
    """Socket-level steps for one connection (see the module docstring)."""

    steps: Sequence[Step]
    hold: bool = True


Item = Reply | Raw


def context_full() -> Reply:
    """llama.cpp's HTTP 400 ``exceed_context_size_error``."""
    return context_full_reply()


Script = LlamaScript
"""The script behind ``httpx.MockTransport`` (:class:`boxmaker.testing.LlamaScript`)."""


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
        paths: request targets (``"/props"``) answered by the given :class:`Raw` steps,
            whatever the method, instead of the usual answer (no script item is taken).
    """

    def __init__(self, script: Sequence[Item]) -> None:
        super().__init__(script)
        self.requests: list[bytes] = []
        self.slot_files: dict[str, int] | None = None  # name -> slot; None: no slot saving
        self.slot_folder: Path | None = None  # where a save writes its file (None: nowhere)
        self.paths: dict[str, Raw] = {}  # a path (GET or POST) answered by these steps
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
            target = head.split(b" ", 2)[1].decode("latin-1")
            raw: Raw | None = self.paths.get(target)
            if raw is None:
                if head.startswith(b"GET "):
                    self._send(conn, _ok_json())
                    return
                if target in NOT_SERVED:
                    self._send(conn, _not_found_json())
                    return
                if target.startswith("/slots/"):
                    self._send(conn, self._slot_answer(target, body))
                    return
                item = self.next_item(body)
                if not isinstance(item, Raw | Reply):
                    raise TypeError(f"not a script item: {item!r}")
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

    def _slot_answer(self, target: str, body: bytes) -> bytes:
        """llama-server's answer to ``POST /slots/{id}?action=...`` (see the module)."""
        if self.slot_files is None:
            message = "This server does not support slots action. Start it with `--slot-save-path`"
            return _json_answer(
                501, {"code": 501, "message": message, "type": "not_supported_error"}
            )
        path, _, query = target.partition("?")
        slot, action = int(path.rsplit("/", 1)[1]), query.partition("=")[2]
        name = str(json.loads(body or b"{}").get("filename", ""))
        if "/" in name or name.startswith("."):
            return _json_answer(400, {"code": 400, "message": "Invalid filename",
                                      "type": "invalid_request_error"})  # fmt: skip
        if action == "save":
            self.slot_files[name] = slot
            if self.slot_folder is not None:
                (self.slot_folder / name).write_bytes(b"slot %d" % slot)
            return _json_answer(200, {"id_slot": slot, "filename": name, "n_saved": 40,
                                      "n_written": 4000, "timings": {"save_ms": 0.5}})  # fmt: skip
        if name not in self.slot_files:
            message = (
                "Unable to restore slot: No available space in KV cache or invalid slot save file"
            )
            return _json_answer(400, {"code": 400, "message": message,
                                      "type": "invalid_request_error"})  # fmt: skip
        return _json_answer(200, {"id_slot": slot, "filename": name, "n_restored": 40,
                                  "n_read": 4000, "timings": {"restore_ms": 0.5}})  # fmt: skip


def _json_answer(status: int, obj: dict[str, object]) -> bytes:
    """A JSON answer (``{"error": obj}`` for a status other than 200), connection closed."""
    body = json.dumps(obj if status == 200 else {"error": obj}).encode()
    reason = {200: b"OK", 400: b"Bad Request", 501: b"Not Implemented"}[status]
    head = b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n" % (
        status, reason)  # fmt: skip
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


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
