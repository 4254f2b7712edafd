"""Slot leases: never two requests in flight on one llama.cpp slot.

Why: llama.cpp's server runs a request pinned to a busy slot (``id_slot``) at once, next to
the one already running there, instead of queueing it, and the two answers cross (seen on an
upstream llama-server: 16 of 20 answers crossed or garbled; LLAMA_CPP.md "Seen on real
software"). So every request the client pins holds a lease on its (server URL, slot) while
it is in flight:

- in this process, a table of held slots under one condition variable (threads, sessions,
  batch workers and clients alike: the table is per process, keyed by the server's URL);
- across the processes of this user on this machine, an advisory ``flock`` on one file per
  (server URL, slot) in the runtime folder (``$XDG_RUNTIME_DIR/boxmaker/slots``, else
  ``<temp dir>/boxmaker-<uid>/slots``, mode 0700). The kernel drops a lock when its process
  dies, so a SIGKILL leaves no stale lock.

Which slot (a request without a pin, the default): the free slot whose last request this one
extends (a session's next request: its prompt cache is there), else one never used, else the
one used least recently; while nothing contends, that is slot 0 and nothing is asked. The
server's slot count (``GET /props`` ``total_slots``) is asked once per server, the first
time the wanted slot is held by another request; when it cannot be read, one slot is assumed
(requests then wait for each other: safe). A pinned request waits for its slot. Waiting is
announced once (``on_wait(slot)``) and ends when the ``cancel`` event is set
(:class:`~boxmaker.errors.RequestCancelled`).

Who picks (``ClientConfig.slot_choice``): on a server that clears idle slots (llama-server's
``--cache-idle-slots`` with a unified KV cache) a pinned request to its emptied slot is not
reloaded from the RAM prompt cache, so there the server picks (``id_slot`` -1) and the client
holds :meth:`SlotLeases.any_slot` instead: a shared ``flock`` on every slot's file, so no pin
(of this process or another) runs next to it, while requests the server places run side by
side (llama.cpp never starts a request in a busy slot it picked itself). Which servers clear
idle slots, as seen by this process, is :meth:`SlotLeases.choice`.

Servers are told apart by their URL as given (``localhost`` and ``127.0.0.1`` are two).
Other clients of the same server (not boxmaker, or another user) are not seen.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RequestCancelled
from ._encoded import NO_MESSAGES, Fingerprint, fingerprint

__all__ = ["LEASES", "SlotLeases", "lock_folder"]

_POLL_S = 0.05  # how often a waiting request looks again (a slot held by another process)


def lock_folder() -> Path:
    """The folder of the cross-process slot locks: ``$XDG_RUNTIME_DIR/boxmaker/slots`` when
    that variable names a folder, else ``<tempfile.gettempdir()>/boxmaker-<uid>/slots``
    (made with mode 0700 so no other user can hold this user's locks)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        base = Path(runtime) / "boxmaker"
    else:
        base = Path(tempfile.gettempdir()) / f"boxmaker-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    folder = base / "slots"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _lock_folder_now() -> Path:
    """:func:`lock_folder`, made once per value of the environment it reads (a lease asks
    it each time, so a test's ``XDG_RUNTIME_DIR`` is honoured, without two ``mkdir`` per
    request)."""
    key = (os.environ.get("XDG_RUNTIME_DIR"), tempfile.tempdir)
    folder = _FOLDERS.get(key)
    if folder is None or not folder.is_dir():
        folder = _FOLDERS[key] = lock_folder()
    return folder


_FOLDERS: dict[tuple[str | None, str | None], Path] = {}


def _fingerprint(messages: Any) -> Fingerprint:
    """A running hash per message (of its compact JSON), to tell whether a request extends
    the last one of a slot (:func:`boxmaker.client._encoded.fingerprint`: a session's
    messages are hashed once, not at each request)."""
    return fingerprint(messages)


@dataclass
class _Server:
    count: int | None = None  # slots the server has (None: not asked yet)
    held: set[int] = field(default_factory=set)
    last: dict[int, Fingerprint] = field(default_factory=dict)  # slot -> last prompt
    used: dict[int, int] = field(default_factory=dict)  # slot -> tick of its last release
    began: dict[int, int] = field(default_factory=dict)  # slot -> tick of its last launched()
    started: int = -1  # tick of the latest task started on the server (launched())
    choice: str | None = None  # who picks the slot ("client", "server"); None: not known yet
    launch: threading.Lock = field(default_factory=threading.Lock)  # launching()


class SlotLeases:
    """The leases of one process (use :data:`LEASES`; tests may make their own).

    Args:
        folder: where the lock files go; ``None``: :func:`lock_folder` at each lease (so a
            test's ``XDG_RUNTIME_DIR`` is honoured).
    """

    def __init__(self, folder: Path | None = None) -> None:
        self._folder = folder
        self._cond = threading.Condition()
        self._servers: dict[str, _Server] = {}
        self._tick = 0

    @contextmanager
    def lease(
        self,
        url: str,
        slot: int | None,
        messages: Any,
        *,
        count: Callable[[], int | None],
        on_wait: Callable[[int | None], None],
        cancel: threading.Event | None = None,
        remember: bool = True,
    ) -> Iterator[int]:
        """Hold a slot of the server at ``url`` for the block; yields its id (``id_slot``).

        Args:
            url: the server's base URL (the key of its slots).
            slot: the slot to hold (a pin: wait for it), or ``None``: the best free slot.
            messages: the request's ``messages`` (picks the slot whose last request this
                one extends).
            count: asked (once per server, without the lock held) for the server's slot
                count when the wanted slot is held by another request; ``None``: unknown (one
                slot assumed).
            on_wait: called once, before waiting, with the slot waited for (``None``: any).
            cancel: set it to end the wait.
            remember: afterwards, the slot holds ``messages`` (a request, a restored slot);
                ``False`` keeps what was known of it (a slot saved to a file).

        Raises:
            RequestCancelled: ``cancel`` was set while waiting.
        """
        prompt = _fingerprint(messages)
        held, fd = self._acquire(url, slot, prompt, count, on_wait, cancel)
        try:
            yield held
        finally:
            with self._cond:
                server = self._servers[url]
                server.held.discard(held)
                if remember:
                    server.last[held] = prompt
                    self._tick += 1
                    server.used[held] = self._tick
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                self._cond.notify_all()

    def holder(self, url: str, messages: Any, slots: Collection[int] | None = None) -> int | None:
        """The slot of the server at ``url`` whose prompt cache (as far as this process knows:
        its last request) holds ``messages`` as a prefix: its last prompt is a prefix of
        ``messages``, or ``messages`` a prefix of it (llama.cpp reuses the common prefix);
        the longest common prefix wins; ``None`` when no slot's does. ``slots``: look only
        at these (a batch run pinned to its slot)."""
        prompt = _fingerprint(messages)
        with self._cond:
            server = self._servers.get(url)
            if server is None:
                return None
            best, size = None, 0
            for slot, last in sorted(server.last.items()):
                if slots is not None and slot not in slots:
                    continue
                n = min(last.count, prompt.count)
                if n > size and last.shares(prompt, n):
                    best, size = slot, n
            return best

    def note(self, url: str, slot: int, messages: Any) -> None:
        """Remember that ``slot`` of the server at ``url`` now holds ``messages`` (a slot
        restored from a file), as a finished request there would be remembered."""
        with self._cond:
            server = self._servers.setdefault(url, _Server())
            server.last[slot] = _fingerprint(messages)
            self._tick += 1
            server.used[slot] = self._tick

    def choice(self, url: str) -> str | None:
        """Who picks the slots of the server at ``url`` in this process: ``"server"`` once it
        was seen clearing an idle slot, ``"client"`` when it has no
        ``/slots`` to look at (or :meth:`decide` said so), ``None`` while not known."""
        with self._cond:
            server = self._servers.get(url)
            return None if server is None else server.choice

    def decide(self, url: str, choice: str | None, *, count: int | None = None) -> None:
        """Set who picks the slots of the server at ``url`` (``"client"`` or ``"server"``,
        for this process's life; ``None``: still not known);
        ``count``: its slot count when known (the files :meth:`any_slot` locks)."""
        with self._cond:
            server = self._servers.setdefault(url, _Server())
            server.choice = choice
            if count is not None and count > 0:
                server.count = count

    def launching(self, url: str, cancel: threading.Event | None = None) -> Callable[[], None]:
        """Hold the launches of the server at ``url`` in this process (one request at a time
        from its look at the slots to the start of its answer); returns the call that ends
        the hold (idempotent).

        Raises:
            RequestCancelled: ``cancel`` was set while waiting.
        """
        with self._cond:
            lock = self._servers.setdefault(url, _Server()).launch
        while not lock.acquire(timeout=_POLL_S):
            if cancel is not None and cancel.is_set():
                raise RequestCancelled(f"cancelled while waiting to start a request on {url}")
        held = [True]

        def release() -> None:
            if held.pop() if held else False:
                lock.release()

        return release

    def launched(self, url: str, slot: int) -> None:
        """Note that a request pinned to ``slot`` is starting a task on the server at ``url``
        now (what :meth:`contended` compares a slot's last request with)."""
        with self._cond:
            self._tick += 1
            server = self._servers.setdefault(url, _Server())
            server.started = server.began[slot] = self._tick

    def contended(self, url: str, messages: Any, slot: int) -> str | None:
        """Whether ``slot`` may have been emptied under ``messages``, whose prefix its last
        request (in this process) was: ``"after"`` when a request started a task on the
        server (:meth:`launched`, :meth:`any_slot`) after that one ended (a server that clears
        idle slots emptied it then: llama.cpp clears every idle slot when it starts a task),
        ``"during"`` when one started while it ran (it may have ended on the server before:
        the server is idle before the client has read the answer), else ``None``."""
        prompt = _fingerprint(messages)
        with self._cond:
            server = self._servers.setdefault(url, _Server())
            last = server.last.get(slot)
            if last is None or last.count == 0 or last.count > prompt.count:
                return None
            if not prompt.shares(last, last.count):
                return None
            if server.started > server.used.get(slot, -1):
                return "after"
            if server.started > server.began.get(slot, -1):
                return "during"
            return None

    @contextmanager
    def any_slot(
        self,
        url: str,
        *,
        count: Callable[[], int | None],
        on_wait: Callable[[int | None], None],
        cancel: threading.Event | None = None,
    ) -> Iterator[None]:
        """Hold the server at ``url`` for a request that llama.cpp places itself (``id_slot``
        -1): a shared ``flock`` on every slot's file, so no pinned request (which locks its
        slot's file alone) runs meanwhile, in this process or another; such requests hold it
        together.

        Args:
            count: asked (once per server, without the lock held) for the slot count when
                :meth:`decide` did not give it; ``None``: one slot assumed.
            on_wait: called once, before waiting, with ``None``.
            cancel: set it to end the wait.

        Raises:
            RequestCancelled: ``cancel`` was set while waiting.
        """
        folder = self._folder if self._folder is not None else _lock_folder_now()
        stem = hashlib.sha256(url.encode()).hexdigest()[:20]
        with self._cond:
            n = self._servers.setdefault(url, _Server()).count
        if n is None:
            asked = count()
            n = asked if isinstance(asked, int) and asked > 0 else 1
            with self._cond:
                server = self._servers[url]
                if server.count is None:
                    server.count = n
                n = server.count
        fds: list[int] = []
        waited = False
        while True:
            for slot in range(n):
                fd = _try_lock(folder / f"{stem}-{slot}.lock", fcntl.LOCK_SH)
                if fd is None:
                    break
                fds.append(fd)
            else:
                with self._cond:  # a task the server places clears its idle slots too
                    self._tick += 1
                    self._servers[url].started = self._tick
                break
            _release(fds)
            if cancel is not None and cancel.is_set():
                raise RequestCancelled(f"cancelled while waiting for a slot of {url}")
            if not waited:
                waited = True
                on_wait(None)
            with self._cond:
                self._cond.wait(_POLL_S)
        try:
            yield
        finally:
            _release(fds)
            with self._cond:
                self._cond.notify_all()

    def pick(self, url: str, messages: Any) -> int:
        """The slot an unpinned request of ``messages`` would be given now (held or not):
        :func:`_ranked`'s first."""
        with self._cond:
            return _ranked(self._servers.setdefault(url, _Server()), _fingerprint(messages))[0]

    def _acquire(
        self,
        url: str,
        slot: int | None,
        prompt: Fingerprint,
        count: Callable[[], int | None],
        on_wait: Callable[[int | None], None],
        cancel: threading.Event | None,
    ) -> tuple[int, int]:
        folder = self._folder if self._folder is not None else lock_folder()
        stem = hashlib.sha256(url.encode()).hexdigest()[:20]
        waited = False
        while True:
            with self._cond:
                server = self._servers.setdefault(url, _Server())
                wanted = [slot] if slot is not None else _ranked(server, prompt)
                for candidate in wanted:
                    if candidate in server.held:
                        continue
                    fd = _try_lock(folder / f"{stem}-{candidate}.lock")
                    if fd is not None:
                        server.held.add(candidate)
                        return candidate, fd
                ask = slot is None and server.count is None
                if not ask:
                    if cancel is not None and cancel.is_set():
                        raise RequestCancelled(f"cancelled while waiting for a slot of {url}")
                    if not waited:
                        waited = True
                        on_wait(slot)
                    self._cond.wait(_POLL_S)
                    continue
            n = count()  # outside the lock: an HTTP request
            with self._cond:
                if server.count is None:
                    server.count = n if isinstance(n, int) and n > 0 else 1


def _ranked(server: _Server, prompt: Fingerprint) -> list[int]:
    """The slots to try, best first: the one whose last prompt this one extends (longest
    first), then never used ones, then least recently used."""
    ids = range(server.count) if server.count is not None else range(1)

    def key(s: int) -> tuple[int, int, int]:
        last = server.last.get(s, NO_MESSAGES)
        n = last.count
        extends = n if n <= prompt.count and prompt.shares(last, n) else 0
        return (-extends, server.used.get(s, -1), s)

    return sorted(ids, key=key)


def _try_lock(path: Path, how: int = fcntl.LOCK_EX) -> int | None:
    """The open, ``flock``-ed descriptor of ``path`` (``how``: ``LOCK_EX``, or ``LOCK_SH``
    for a lock others may share), or ``None`` when another process (or another descriptor)
    holds it against that."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd  # nothing written: a truncate costs milliseconds on a real disk


def _release(fds: list[int]) -> None:
    """Unlock and close ``fds``, emptying the list."""
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    fds.clear()


LEASES = SlotLeases()
"""The slot leases of this process, shared by every :class:`~boxmaker.client.Client`."""
