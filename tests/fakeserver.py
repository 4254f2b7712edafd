"""A scripted HTTP server on a real socket, for tests that provoke network faults for real.

:class:`FakeServer` listens on 127.0.0.1 on a free port and serves from daemon threads. For
each connection it reads one request (head, then ``Content-Length`` bytes of body), keeps it
in :attr:`FakeServer.requests`, then plays its script (``later``, when given, for every
connection after the first):

- ``bytes``: sent as they are (use :data:`SSE_HEAD` and :func:`chunk` to build a chunked SSE
  answer, or any raw HTTP);
- ``float``: a pause in seconds;
- :class:`Every`: the same bytes sent every ``interval_s`` seconds for ``for_s`` seconds
  (``: ping`` comments).

After the script the connection is held open, silent, until the client closes it (then
:attr:`FakeServer.disconnected` is set) or the server is closed; with ``hold=False`` it is
closed at once. A failed send (the client went away) also sets ``disconnected``.

Example::

    with FakeServer([SSE_HEAD, chunk(b": ping\\n\\n")]) as server:
        client = Client(ClientConfig(url=server.url))
        ...
        assert server.disconnected.wait(2)
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
"""The head of a chunked ``200`` SSE answer, as llama-server sends it."""


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


Step = bytes | float | Every


class FakeServer:
    """A scripted HTTP server on 127.0.0.1 (free port), served by daemon threads.

    Args:
        script: what to do after reading each request (see the module docstring).
        hold: keep the connection open after the script until the client closes it (a
            request sent again on a held connection is read and left unanswered).
        later: the script for the second and later connections (``None``: ``script``).

    Attributes:
        url: ``http://127.0.0.1:PORT``.
        requests: the raw bytes (head and body) of each request received.
        disconnected: set once a client closed its connection (seen by a read or a send).
        connections: connections accepted so far.
    """

    def __init__(
        self, script: Sequence[Step], *, hold: bool = True, later: Sequence[Step] | None = None
    ) -> None:
        self.script = list(script)
        self.later = self.script if later is None else list(later)
        self.hold = hold
        self.connections = 0
        self.requests: list[bytes] = []
        self.disconnected = threading.Event()
        self._closing = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def close(self) -> None:
        """Stop serving: every connection is closed, the threads end."""
        self._closing.set()
        for thread in list(self._threads):
            thread.join(timeout=2)
        self._listener.close()

    def __enter__(self) -> FakeServer:
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
            script = self.script if self.connections == 0 else self.later
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn, script), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket, script: list[Step]) -> None:
        with conn:
            conn.settimeout(0.05)
            request = self._read_request(conn)
            if request is None:
                return
            self.requests.append(request)
            for step in script:
                if not self._play(conn, step):
                    return
            while self.hold and not self._closing.is_set():
                try:
                    if conn.recv(1024) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            if self.hold and not self._closing.is_set():
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
