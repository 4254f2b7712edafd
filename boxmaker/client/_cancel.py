"""Interrupting a blocking socket read from another thread when a cancel event is set.

Used by :class:`boxmaker.client.Client` so that ``cancel`` ends a request at once whatever
the server does (silent, stalled, or sending only ``: ping`` comments).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from ..errors import RequestCancelled

__all__ = ["WATCH_S", "CancelWatch", "cancellable"]

WATCH_S = 0.05
"""How often, in seconds, a watch checks that its request is still running."""


class CancelWatch:
    """Ends a blocked read of one request attempt as soon as ``cancel`` is set.

    httpx cannot interrupt a read in progress, and closing a socket from another thread does
    not wake a thread blocked reading it (Linux), but ``shutdown()`` does: the read then
    returns end-of-file at once. The watch learns the attempt's socket from httpcore's
    ``trace`` request extension (``connection.connect_tcp.complete`` carries a new network
    stream; the client's pooled transport names a kept one it takes with
    ``connection.reused``, :mod:`boxmaker.client._pool`) and from
    the response's ``network_stream`` extension; when ``cancel`` is set it shuts the sockets
    down. Transports without sockets (``httpx.MockTransport``, cassettes) give none; there
    cancel is seen between reads.

    Use: make one per attempt (it starts its thread), pass ``extensions={"trace":
    watch.trace}`` with the request, :meth:`add` the response's ``network_stream``, and call
    :meth:`stop` when the attempt ends, however it ends.

    Args:
        cancel: the caller's cancel event.
    """

    __slots__ = ("_cancel", "_fired", "_lock", "_over", "_sockets")

    def __init__(self, cancel: threading.Event) -> None:
        self._cancel = cancel
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._fired = False  # cancel was seen: shut every socket, also ones added later
        self._over = False  # the attempt ended: touch nothing any more
        threading.Thread(target=self._watch, name="boxmaker-cancel", daemon=True).start()

    def trace(self, name: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keep the socket of each new (or reused) connection."""
        if name in ("connection.connect_tcp.complete", "connection.reused"):
            self.add(info.get("return_value"))

    def add(self, stream: object) -> None:
        """Watch the socket of an httpcore network stream (anything else is ignored)."""
        get = getattr(stream, "get_extra_info", None)
        sock = get("socket") if callable(get) else None
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            if self._over:
                return
            self._sockets.append(sock)
            fired = self._fired
        if fired:
            _shut(sock)

    def stop(self) -> None:
        """The attempt is over: the watch thread ends and touches no socket."""
        with self._lock:
            self._over = True

    def _watch(self) -> None:
        while not self._cancel.wait(WATCH_S):
            if self._over:
                return
        with self._lock:
            if self._over:
                return
            self._fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def cancellable(cancel: threading.Event | None, what: str) -> Iterator[dict[str, Any]]:
    """One small request (a side request, slot discovery, ``reasoning_end``) that ``cancel``
    ends within about 0.1 s whatever the server does (silent, or sending only ``: ping``
    comments in a body that never ends).

    Yields the httpx request extensions to send it with (a :class:`CancelWatch`'s trace);
    make the whole request, body read included, inside the block.

    Args:
        cancel: the caller's cancel event; ``None``: nothing is watched (yields ``{}``).
        what: the request, for the error's message (``"GET /props at URL"``).

    Raises:
        RequestCancelled: ``cancel`` was set before the request, or the request failed
            (an :class:`httpx.HTTPError`) once it was set: the watch shut its socket.
    """
    if cancel is None:
        yield {}
        return
    if cancel.is_set():
        raise RequestCancelled(f"{what} cancelled before it was sent")
    watch = CancelWatch(cancel)
    try:
        yield {"trace": watch.trace}
    except httpx.HTTPError as exc:
        if cancel.is_set():
            raise RequestCancelled(f"{what} cancelled; connection closed") from exc
        raise
    finally:
        watch.stop()
