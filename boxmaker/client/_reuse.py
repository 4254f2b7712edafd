"""Send a request once more when it failed before any byte of an answer on a reused
connection.

Why: llama.cpp's server (cpp-httplib) closes the connection right after a streamed answer
while its head said ``Keep-Alive: timeout=5, max=100``; httpx puts the connection back in its
pool, and a request sent on it before the server's FIN arrives fails with
``RemoteProtocolError('Server disconnected without sending a response.')`` (seen: ``boxmaker
doctor`` against ``boxmaker serve`` failed 8 of 16 runs; a raw socket shows the close 0 ms
after the stream's last chunk, and 5 s after a plain answer). Such a request never reached
the server's handler, so sending it again on a new connection is safe; once, so a server
that really drops requests still fails.

:class:`ConnectionTrace` tells the two cases apart through httpcore's ``trace`` request
extension (its event names: ``connection.connect_tcp.*`` for a new connection,
``http11.receive_response_headers.complete`` once the answer's head came).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import httpx

__all__ = ["ConnectionTrace", "send_once_more"]

T = TypeVar("T")

_BEFORE_ANSWER = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
"""What a request sent on a connection the server has closed fails with."""


class ConnectionTrace:
    """httpcore's ``trace`` hook for one request: did it open a new connection, did an answer
    come; ``then`` (another hook, such as the cancel watch's) is called with every event."""

    def __init__(self, then: Callable[[str, dict[str, Any]], None] | None = None) -> None:
        self.connected = False
        self.sent = False
        self.answered = False
        self._then = then

    def __call__(self, name: str, info: dict[str, Any]) -> None:
        """Note ``name`` (``connection.connect_tcp.started``,
        ``http11.send_request_headers.started``, ``http11.receive_response_headers.complete``),
        pass it on."""
        if name.startswith("connection.connect_tcp."):
            self.connected = True
        elif name == "http11.send_request_headers.started":
            self.sent = True
        elif name == "http11.receive_response_headers.complete":
            self.answered = True
        if self._then is not None:
            self._then(name, info)

    def stale(self, exc: BaseException) -> bool:
        """``exc`` is the failure of a request sent on a reused connection that the server
        had closed: sent on an HTTP/1.1 connection this request did not open, no answer, and
        one of :data:`_BEFORE_ANSWER`. (A transport without httpcore, such as
        ``httpx.MockTransport``, sends no trace events: never stale.)"""
        reused = self.sent and not self.connected
        return isinstance(exc, _BEFORE_ANSWER) and reused and not self.answered


def send_once_more(
    send: Callable[[ConnectionTrace], T],
    then: Callable[[str, dict[str, Any]], None] | None = None,
) -> T:
    """``send(trace)``; when it fails before any byte of an answer on a reused connection
    (:meth:`ConnectionTrace.stale`), ``send`` once more with a new trace (httpx then opens a
    new connection: the closed one has left the pool). ``then``: another trace hook each
    trace passes every event on to (a cancel watch's).

    ``send`` must pass the trace as the request's ``extensions={"trace": trace}``.

    Raises:
        httpx.HTTPError: what ``send`` raised otherwise, or on the second attempt.
    """
    trace = ConnectionTrace(then)
    try:
        return send(trace)
    except httpx.HTTPError as exc:
        if not trace.stale(exc):
            raise
    return send(ConnectionTrace(then))
