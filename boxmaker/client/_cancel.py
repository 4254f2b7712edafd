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

    One daemon thread of the process looks at every live watch each :data:`WATCH_S` seconds
    (and sleeps while there is none): a watch costs no thread of its own, so a batch of 64
    requests in flight wakes one thread, not 64.

    Use: make one per attempt, pass ``extensions={"trace": watch.trace}`` with the request,
    :meth:`add` the response's ``network_stream``, and call :meth:`stop` when the attempt
    ends, however it ends.

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
        _WATCHER.add(self)

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
        """The attempt is over: the watch touches no socket any more."""
        with self._lock:
            self._over = True
        _WATCHER.remove(self)

    def look(self) -> bool:
        """The shared thread's look: shut the sockets once ``cancel`` is set; whether the
        watch is done (fired or stopped)."""
        if self._over:
            return True
        if not self._cancel.is_set():
            return False
        with self._lock:
            if self._over:
                return True
            self._fired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)
        return True


class _Watcher:
    """The one thread that looks at every live :class:`CancelWatch`."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watches: set[CancelWatch] = set()
        self._thread: threading.Thread | None = None

    def add(self, watch: CancelWatch) -> None:
        with self._cond:
            self._watches.add(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="boxmaker-cancel", daemon=True
                )
                self._thread.start()
            elif len(self._watches) == 1:
                self._cond.notify()

    def remove(self, watch: CancelWatch) -> None:
        with self._cond:
            self._watches.discard(watch)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._watches:
                    self._cond.wait()
                watches = list(self._watches)
            done = [watch for watch in watches if watch.look()]
            with self._cond:
                self._watches.difference_update(done)
                self._cond.wait(WATCH_S)


_WATCHER = _Watcher()


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
