"""One pool of kept-alive connections per client, and streamed bodies read in large blocks.

Why: at a GPU server's rates the client's CPU goes into its HTTP layer. httpx's own transport
(httpcore with h11) opens a connection per request here (the client kept none, so that a
cancel could reach its socket), and yields a streamed body one HTTP chunk at a time, each
through h11's state machine and four generator layers: llama.cpp writes one chunk per token,
and reading the stream once per chunk cost a quarter of the client's CPU per completion (issue
38). :class:`PooledTransport` is an httpx transport for plain ``http://`` servers that keeps
its connections alive and reads a body with one ``recv`` of up to :data:`READ_BYTES` per
step, de-chunking everything that read holds in one pass: the stream decoders
(:mod:`boxmaker.client`) then see one read per ``recv``, as many chunks as it held.

The client uses it for a server at an ``http://`` URL with no proxy in the environment
(:func:`pooled`); otherwise httpx's own transport serves it, as before. Inside it, requests
go to httpx's transport, made when first needed (so an ``http://`` client never loads the TLS
certificate store), while a cassette patches httpx's transports (:mod:`boxmaker.cassettes`: it
records and replays what httpx's transport sends).

What the client relies on, kept as httpx does it: the errors are httpx's
(:class:`httpx.ConnectError`, :class:`httpx.ConnectTimeout`, :class:`httpx.ReadTimeout` after
the ``read`` timeout of silence, :class:`httpx.RemoteProtocolError` for a connection closed
before or inside an answer, :class:`httpx.ReadError`, :class:`httpx.WriteError`); the
``trace`` request extension gets httpcore's event names (``connection.connect_tcp.started``
and ``.complete`` for a new connection, with the connection as ``return_value``;
``http11.send_request_headers.started``; ``http11.receive_response_headers.complete``), plus
``connection.reused`` with the connection as ``return_value`` when a kept one is taken (so a
cancel watch knows the socket before any byte of the answer); the response's
``network_stream`` extension answers ``get_extra_info("socket")``.

A kept connection is taken only when its socket has nothing to read (the server has neither
closed it nor sent a stray byte); the server may still close it in the instant between:
:mod:`boxmaker.client._reuse` sends such a request once more. A body not read to its end
(a cancelled or stopped stream) closes its connection.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import httpx

__all__ = ["LINGER_S", "READ_BYTES", "ChunkedDecoder", "PooledTransport", "pooled"]

READ_BYTES = 256 * 1024
"""The most bytes one ``recv`` of a body takes."""

_KEEP = 256  # kept connections per server at most (a batch holds one per slot in flight)
_ORIGINAL = httpx.HTTPTransport.handle_request  # replaced while a cassette is open


class _Connection:
    """One HTTP/1.1 connection: its socket, and bytes read past the last answer."""

    __slots__ = ("address", "sock", "timeout")

    def __init__(self, address: tuple[str, int], sock: socket.socket) -> None:
        self.address = address
        self.sock = sock
        self.timeout: float | None = None

    def get_extra_info(self, name: str) -> Any:
        """httpcore's ``NetworkStream.get_extra_info``: ``"socket"`` gives the socket."""
        return self.sock if name == "socket" else None

    def set_timeout(self, seconds: float | None) -> None:
        if seconds != self.timeout:
            self.sock.settimeout(seconds)
            self.timeout = seconds

    def usable(self) -> bool:
        """Whether a kept connection can take a request: nothing to read on it (a closed
        connection reads end-of-file, a stray byte means the last answer was not what we
        read). One ``poll`` that does not wait."""
        poller = select.poll()
        poller.register(self.sock, select.POLLIN)
        try:
            return not poller.poll(0)
        except OSError:
            return False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class PooledTransport(httpx.BaseTransport):
    """An httpx transport with kept-alive connections and block reads, for ``http://``.

    Args:
        fallback: makes the transport for what this one does not send itself (``https://``,
            an environment proxy, an open cassette); called once, when first needed.

    Thread-safe: a connection serves one request at a time; the kept ones are shared.
    """

    def __init__(self, fallback: Callable[[], httpx.BaseTransport]) -> None:
        self._make_fallback = fallback
        self._fallback: httpx.BaseTransport | None = None
        self._kept: dict[tuple[str, int], list[_Connection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the answer's head is read, its body streams.

        Raises:
            httpx.TransportError: as httpx's transport raises them (see the module).
        """
        url = request.url
        if url.scheme != "http" or httpx.HTTPTransport.handle_request is not _ORIGINAL:
            return self._other().handle_request(request)
        address = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        trace = request.extensions.get("trace")
        conn = self._take(address)
        if conn is None:
            conn = self._connect(address, timeouts.get("connect"), trace)
        elif trace is not None:
            trace("connection.reused", {"return_value": conn})
        try:
            return self._exchange(conn, request, timeouts, trace)
        except BaseException:
            conn.close()
            raise

    def close(self) -> None:
        """Close every kept connection, and the fallback transport."""
        with self._lock:
            self._closed = True
            kept, self._kept = self._kept, {}
        for conns in kept.values():
            for conn in conns:
                conn.close()
        if self._fallback is not None:
            self._fallback.close()

    # -- connections ------------------------------------------------------------------------

    def _other(self) -> httpx.BaseTransport:
        with self._lock:
            if self._fallback is None:
                self._fallback = self._make_fallback()
            return self._fallback

    def _take(self, address: tuple[str, int]) -> _Connection | None:
        while True:
            with self._lock:
                conns = self._kept.get(address)
                if not conns:
                    return None
                conn = conns.pop()
            if conn.usable():
                return conn
            conn.close()

    def _keep(self, conn: _Connection) -> None:
        with self._lock:
            conns = self._kept.setdefault(conn.address, [])
            if not self._closed and len(conns) < _KEEP:
                conns.append(conn)
                return
        conn.close()

    @staticmethod
    def _connect(
        address: tuple[str, int], timeout: float | None, trace: Callable[..., Any] | None
    ) -> _Connection:
        if trace is not None:
            trace("connection.connect_tcp.started", {"host": address[0], "port": address[1]})
        try:
            sock = socket.create_connection(address, timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Connection(address, sock)
        conn.timeout = timeout
        if trace is not None:
            trace("connection.connect_tcp.complete", {"return_value": conn})
        return conn

    # -- one request ------------------------------------------------------------------------

    def _exchange(
        self,
        conn: _Connection,
        request: httpx.Request,
        timeouts: dict[str, float | None],
        trace: Callable[..., Any] | None,
    ) -> httpx.Response:
        """Write the request, read the answer's head; the body streams from the socket."""
        url = request.url
        lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode("ascii"), url.raw_path)]
        lines += [b"%s: %s\r\n" % pair for pair in request.headers.raw]
        body = request.read()
        if body and "content-length" not in request.headers:
            lines.append(b"Content-Length: %d\r\n" % len(body))
        if trace is not None:
            trace("http11.send_request_headers.started", {"request": request})
        lines.append(b"\r\n")
        conn.set_timeout(timeouts.get("write"))
        try:
            _send(conn.sock, [b"".join(lines), body])
        except TimeoutError as exc:
            raise httpx.WriteTimeout(str(exc) or "timed out", request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc), request=request) from exc
        conn.set_timeout(timeouts.get("read"))
        reader = _Reader(conn, request)
        status, reason, headers, version = reader.head()
        if trace is not None:
            trace("http11.receive_response_headers.complete", {"request": request})
        stream = _Body(self, reader, request, headers, status, version)
        extensions = {"network_stream": conn, "http_version": version, "reason_phrase": reason}
        return httpx.Response(status, headers=headers, stream=stream, extensions=extensions)


def _send(sock: socket.socket, buffers: list[bytes]) -> None:
    """Send ``buffers`` in order, as few ``sendmsg`` calls as the socket takes (the body is
    not copied into one buffer with the head)."""
    views = [memoryview(b) for b in buffers if b]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def pooled(url: str) -> bool:
    """Whether :class:`PooledTransport` serves a client of base URL ``url``: ``http://``, and
    no proxy in the environment (``HTTP_PROXY``, ``ALL_PROXY``: httpx's own transport goes
    through it)."""
    if httpx.URL(url).scheme != "http":
        return False
    proxies = urllib.request.getproxies_environment()
    return not (proxies.get("http") or proxies.get("all"))


class _Reader:
    """Reads one answer from a connection: the head, then the body in large blocks."""

    __slots__ = ("buf", "conn", "request")

    def __init__(self, conn: _Connection, request: httpx.Request) -> None:
        self.conn = conn
        self.request = request
        self.buf = b""

    def recv(self) -> bytes:
        """One read of up to :data:`READ_BYTES` (``b""`` at end-of-file)."""
        try:
            return self.conn.sock.recv(READ_BYTES)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(str(exc) or "timed out", request=self.request) from exc
        except OSError as exc:
            raise httpx.ReadError(str(exc), request=self.request) from exc

    def head(self) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        """The answer's status, reason, headers and HTTP version (1xx answers skipped)."""
        while True:
            end = self.buf.find(b"\r\n\r\n")
            while end < 0:
                data = self.recv()
                if not data:
                    what = "sending a response" if not self.buf else "completing the head"
                    raise httpx.RemoteProtocolError(
                        f"Server disconnected without {what}.", request=self.request
                    )
                self.buf += data
                if len(self.buf) > 1 << 20:
                    raise httpx.RemoteProtocolError("response head too long", request=self.request)
                end = self.buf.find(b"\r\n\r\n")
            head, self.buf = self.buf[:end], self.buf[end + 4 :]
            first, *rest = head.split(b"\r\n")
            parts = first.split(b" ", 2)
            try:
                version, status = parts[0], int(parts[1])
            except (IndexError, ValueError):
                raise httpx.RemoteProtocolError(
                    f"malformed status line {first[:100]!r}", request=self.request
                ) from None
            headers = []
            for line in rest:
                name, sep, value = line.partition(b":")
                if not sep:
                    raise httpx.RemoteProtocolError(
                        f"malformed header line {line[:100]!r}", request=self.request
                    )
                headers.append((name.strip(), value.strip()))
            if not 100 <= status < 200 or status == 101:
                return status, parts[2] if len(parts) > 2 else b"", headers, version


class ChunkedDecoder:
    """``Transfer-Encoding: chunked`` (RFC 9112, section 7.1) -> the body's bytes, sans I/O.

    :meth:`feed` takes the bytes of one read and gives the data of every chunk they complete
    or continue, joined: one ``bytes`` per read, however many chunks it held (the decoders
    above see one read, not one step per chunk). A read may end anywhere: inside a size line,
    a chunk's data or its closing CRLF, the trailer. Chunk extensions (``;name=value``) and
    trailer fields are read past. :attr:`done` once the last chunk and the trailer's empty
    line came; bytes after them are kept in :attr:`after`, not given as data.

    Raises:
        ValueError: (from :meth:`feed`) a size line that is no hex number or longer than
            4 KiB, or a chunk's data not followed by CRLF.
    """

    __slots__ = ("_buf", "_size", "after", "done")

    def __init__(self) -> None:
        self._buf = b""  # the unread end of the last read: part of a line or of a CRLF
        self._size = _HEAD  # data+CRLF bytes due of the chunk being read, or _HEAD, _TRAILER
        self.done = False
        self.after = b""

    def feed(self, data: bytes) -> bytes:
        """The body's bytes that ``data`` (the next read) completes."""
        if self.done:
            self.after += data
            return b""
        buf = self._buf + data if self._buf else data
        parts: list[bytes] = []
        pos, end, size = 0, len(buf), self._size
        while pos < end:
            if size < 0:  # a size line, or a line of the trailer
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    if end - pos > _MAX_LINE:
                        raise ValueError(f"chunk size line too long: {buf[pos : pos + 40]!r}")
                    break
                if size == _TRAILER:  # a trailer field (read past), or its end
                    empty = nl == pos
                    pos = nl + 2
                    if empty:
                        self.done, self.after = True, buf[pos:]
                        self._buf, self._size = b"", size
                        return b"".join(parts)
                    continue
                line = buf[pos:nl]
                try:
                    n = int(line.split(b";", 1)[0], 16)
                except ValueError:
                    raise ValueError(f"malformed chunk size line {line[:40]!r}") from None
                if n < 0:
                    raise ValueError(f"malformed chunk size line {line[:40]!r}")
                pos = nl + 2
                size = _TRAILER if n == 0 else n + 2
                continue
            if end - pos >= size:  # the rest of the chunk, its CRLF included
                if buf[pos + size - 2 : pos + size] != b"\r\n":
                    what = buf[pos + size - 2 : pos + size]
                    raise ValueError(f"chunk data not followed by CRLF: {what!r}")
                if size > 2:
                    parts.append(buf[pos : pos + size - 2])
                pos += size
                size = _HEAD
            else:  # part of the chunk: its data now, what may be its CRLF later
                keep = min(end - pos, size - 2)
                if keep <= 0:
                    break
                parts.append(buf[pos : pos + keep])
                pos += keep
                size -= keep
        self._size = size
        self._buf = buf[pos:] if pos < end else b""
        return b"".join(parts)


_HEAD, _TRAILER = -1, -2
_MAX_LINE = 4096


class _Body(httpx.SyncByteStream):
    """A streamed answer's body: each step one ``recv``, de-chunked (``Transfer-Encoding:
    chunked``, :class:`ChunkedDecoder`), or counted (``Content-Length``), or up to
    end-of-file. Read to its end, the connection is kept (unless the server said
    ``Connection: close`` or spoke HTTP/1.0); closed earlier, the connection is closed,
    except a chunked body whose last chunk came already or comes within :data:`LINGER_S`
    (the client stops reading at ``data: [DONE]``, which the last chunk follows at once)."""

    def __init__(
        self,
        pool: PooledTransport,
        reader: _Reader,
        request: httpx.Request,
        headers: list[tuple[bytes, bytes]],
        status: int,
        version: bytes,
    ) -> None:
        self._pool = pool
        self._reader = reader
        self._request = request
        self._done = False
        self._closed = False
        self._keep = version == b"HTTP/1.1"
        length: int | None = None
        chunked = False
        for name, value in headers:
            lowered = name.lower()
            if lowered == b"transfer-encoding":
                chunked = value.lower().endswith(b"chunked")
            elif lowered == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise httpx.RemoteProtocolError(
                        f"malformed Content-Length {value[:40]!r}", request=request
                    ) from None
            elif lowered == b"connection" and b"close" in value.lower():
                self._keep = False
        if request.method == "HEAD" or status in (204, 304):
            chunked, length = False, 0
        self._chunks = ChunkedDecoder() if chunked else None
        self._left = length  # bytes of a counted body still due; None: up to end-of-file
        if not chunked and length is None:
            self._keep = False

    def __iter__(self) -> Iterator[bytes]:
        if self._closed:
            raise httpx.StreamClosed()
        yield from (self._plain() if self._chunks is None else self._dechunked(self._chunks))
        self._done = True
        self.close()

    def _dechunked(self, chunks: ChunkedDecoder) -> Iterator[bytes]:
        reader = self._reader
        data, reader.buf = reader.buf, b""
        while True:
            if data:
                try:
                    out = chunks.feed(data)
                except ValueError as exc:
                    raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc
                if out:
                    yield out
            if chunks.done:
                return
            data = reader.recv()
            if not data:
                raise httpx.RemoteProtocolError(
                    "peer closed connection without sending complete message body: "
                    "incomplete chunked read",
                    request=self._request,
                )

    def _plain(self) -> Iterator[bytes]:
        reader, left = self._reader, self._left
        data, reader.buf = reader.buf, b""
        while True:
            if left is not None:
                if len(data) >= left:
                    if data[:left]:
                        yield data[:left]
                    if len(data) > left:
                        self._keep = False  # bytes past the answer: not ours to keep
                    return
                left -= len(data)
            if data:
                yield data
            data = reader.recv()
            if not data:
                if left is None:
                    return
                raise httpx.RemoteProtocolError(
                    f"peer closed connection without sending complete message body "
                    f"(incomplete read: {left} bytes left)",
                    request=self._request,
                )

    def close(self) -> None:
        """Keep the connection when the body was read to its end (and may be kept), else
        close it."""
        if self._closed:
            return
        self._closed = True
        conn = self._reader.conn
        if self._keep and not self._done and self._chunks is not None:
            self._done = self._linger(self._chunks)
        if self._done and self._keep:
            self._pool._keep(conn)
        else:
            conn.close()

    def _linger(self, chunks: ChunkedDecoder) -> bool:
        """Whether the chunked body ends, with what the socket holds within
        :data:`LINGER_S` (its data is dropped: the reader stopped reading)."""
        sock = self._reader.conn.sock
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        wait = LINGER_S
        try:
            while not chunks.done and poller.poll(wait * 1000):
                data = sock.recv(READ_BYTES, socket.MSG_DONTWAIT)
                if not data:
                    return False
                chunks.feed(data)
                wait = 0.0
        except (OSError, ValueError):
            return False
        return chunks.done and not chunks.after


LINGER_S = 0.005
"""How long closing a chunked body not read to its end waits for its last chunk (seconds)."""
