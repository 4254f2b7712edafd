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
import functools
import hashlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import RequestCancelled
from ._encoded import NO_MESSAGES, Fingerprint, fingerprint

__all__ = ["LEASES", "SlotLeases", "lock_folder"]

_POLL_S = 0.05  # how often a waiting request looks again (a slot held by another process)
_LAUNCH_POLL_S = 0.005  # the same, waiting to start (launch(): held for milliseconds)


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


@functools.lru_cache(maxsize=1024)
def _url_stem(url: str) -> str:
    """20 hex digits of the SHA-256 of a server's URL: its lock files' names start so."""
    return hashlib.sha256(url.encode()).hexdigest()[:20]


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
    began: dict[int, int] = field(default_factory=dict)  # slot -> launches() its start made
    ended: dict[int, int] = field(default_factory=dict)  # slot -> launches() at its answer's end
    choice: str | None = None  # who picks the slot ("client", "server"); None: not known yet
    looks: dict[str, int] = field(default_factory=dict)  # looks that told nothing, by why


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

    def _files(self, url: str) -> str:
        """The common start of the lock files of the server at ``url``: the lock folder's
        path (``folder``, else :func:`lock_folder` as the environment names it now), ``/``,
        then 20 hex digits of the URL's SHA-256; a file's name adds ``-<slot>.lock``,
        ``.launches`` and so on (strings: a lease makes several, on the path of every
        request)."""
        folder = self._folder if self._folder is not None else _lock_folder_now()
        return f"{folder}/{_url_stem(url)}"

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
            remember: afterwards, the slot holds ``messages`` (a request, a restored slot),
                when the block ended without an exception; ``False`` keeps what was known of
                it (a slot saved to a file).

        Raises:
            RequestCancelled: ``cancel`` was set while waiting.
        """
        prompt = _fingerprint(messages)
        held, fd = self._acquire(url, slot, prompt, count, on_wait, cancel)
        answered = False
        try:
            yield held
            answered = True
        finally:
            with self._cond:
                server = self._servers[url]
                server.held.discard(held)
                if remember:
                    if answered:  # a request that failed may have left the slot empty
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

    def launches(self, url: str, *, bump: bool = False) -> int:
        """The tasks started on the server at ``url`` so far, as boxmaker's clients of this
        user on this machine counted them (a file in the lock folder, all processes
        together); ``bump``: count one more first (a request's answer began: llama.cpp
        answers once it started the task)."""
        fd = os.open(self._files(url) + ".launches", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if bump else fcntl.LOCK_SH)
            n = int.from_bytes(os.pread(fd, 8, 0).ljust(8, b"\0"), "little")
            if bump:
                n += 1
                os.pwrite(fd, n.to_bytes(8, "little"), 0)
            return n
        finally:
            os.close(fd)  # drops the lock

    def started(self, url: str, slot: int | None) -> None:
        """A request's answer began (its task started), in ``slot`` (``None``: one the
        server placed): counted (:meth:`launches`)."""
        n = self.launches(url, bump=True)
        if slot is not None:
            with self._cond:
                self._servers.setdefault(url, _Server()).began[slot] = n

    def ended(self, url: str, slot: int) -> None:
        """A request in ``slot`` ended with its answer: the launches counted then."""
        n = self.launches(url)
        with self._cond:
            self._servers.setdefault(url, _Server()).ended[slot] = n

    def forget(self, url: str, slot: int) -> None:
        """Know nothing of what ``slot`` holds (a request there began and failed: the slot
        holds some of it)."""
        with self._cond:
            self._servers.setdefault(url, _Server()).last.pop(slot, None)

    def looked(self, url: str, why: str) -> int:
        """Count a look at the slots that decided nothing, by ``why``; returns how many such
        looks ``why`` has counted for the server."""
        with self._cond:
            looks = self._servers.setdefault(url, _Server()).looks
            looks[why] = looks.get(why, 0) + 1
            return looks[why]

    def extends(self, url: str, messages: Any, slot: int) -> bool:
        """Whether ``slot``'s last request (that ended with an answer, in this process) is a
        prefix of ``messages``: the slot holds this request's prompt cache, unless it was
        emptied since."""
        prompt = _fingerprint(messages)
        with self._cond:
            server = self._servers.setdefault(url, _Server())
            last = server.last.get(slot)
            if last is None or last.count == 0 or last.count > prompt.count:
                return False
            return slot in server.ended and prompt.shares(last, last.count)

    def contended(self, url: str, slot: int) -> str | None:
        """Whether a task started on the server (:meth:`launches`, any process) that may
        have emptied ``slot`` since its last request: ``"after"`` that request ended (a
        server that clears idle slots emptied it then: llama.cpp clears every idle slot when
        it starts a task), ``"during"`` it ran (its slot may have been idle on the server
        before the client read the answer's end), else ``None``."""
        now = self.launches(url)
        with self._cond:
            server = self._servers.setdefault(url, _Server())
            if now > server.ended.get(slot, now):
                return "after"
            if now > server.began.get(slot, now):
                return "during"
            return None

    def launch(
        self, url: str, *, alone: bool, cancel: threading.Event | None = None
    ) -> Callable[[], None]:
        """Before a request is sent while who picks is not known (:meth:`choice` ``None``):
        ``alone`` (a request that may look at the slots) waits until no other request (of
        any process of this user: a lock file beside the slots') is on its way to start,
        and holds new ones back; else it waits while one is alone. Returns the call (safe to
        make twice) that ends it: once the answer began, or the attempt failed.

        Raises:
            RequestCancelled: ``cancel`` was set while waiting.
        """
        files = self._files(url)
        gate: list[int] = []  # held by a request waiting to go alone: newcomers wait
        try:
            while True:
                if alone or _passes(files + ".launch-waiting"):
                    how = fcntl.LOCK_EX if alone else fcntl.LOCK_SH
                    fd = _try_lock(files + ".launch", how)
                    if fd is not None:
                        break
                    if alone and not gate:
                        gate_fd = _try_lock(files + ".launch-waiting")
                        gate += [] if gate_fd is None else [gate_fd]
                if cancel is not None and cancel.is_set():
                    raise RequestCancelled(f"cancelled while waiting to start a request on {url}")
                time.sleep(_LAUNCH_POLL_S)
        finally:
            _release(gate)
        held = [fd]
        return lambda: _release(held)

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
        files = self._files(url)
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
        gate: list[int] = []  # the placed requests' waiting gate, held while this one waits
        waited = entered = False
        try:
            while True:
                entered = entered or _passes(files + ".pins-waiting")
                for slot in range(n) if entered else ():
                    fd = _try_lock(f"{files}-{slot}.lock", fcntl.LOCK_SH)
                    if fd is None:
                        break
                    fds.append(fd)
                else:
                    if entered:
                        break
                _release(fds)
                if entered and not gate:
                    gate_fd = _try_lock(files + ".placed-waiting")
                    gate += [] if gate_fd is None else [gate_fd]
                if cancel is not None and cancel.is_set():
                    raise RequestCancelled(f"cancelled while waiting for a slot of {url}")
                if not waited:
                    waited = True
                    on_wait(None)
                with self._cond:
                    self._cond.wait(_POLL_S)
        finally:
            _release(gate)
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
        files = self._files(url)
        waited = entered = False
        gate: list[int] = []  # the pins' waiting gate, held while this pin waits
        try:
            while True:
                with self._cond:
                    server = self._servers.setdefault(url, _Server())
                    entered = entered or _passes(files + ".placed-waiting")
                    wanted = [slot] if slot is not None else _ranked(server, prompt)
                    outside = False  # held by another process, or by a request placed by
                    for candidate in wanted if entered else ():  # the server (any_slot)
                        if candidate in server.held:
                            continue
                        fd = _try_lock(f"{files}-{candidate}.lock")
                        if fd is not None:
                            server.held.add(candidate)
                            return candidate, fd
                        outside = True
                    if outside and not gate:
                        gate_fd = _try_lock(files + ".pins-waiting")
                        gate += [] if gate_fd is None else [gate_fd]
                    ask = entered and slot is None and server.count is None
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
        finally:
            _release(gate)


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


def _try_lock(path: str, how: int = fcntl.LOCK_EX) -> int | None:
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


def _passes(path: str) -> bool:
    """Whether no one waits behind the gate ``path`` (nobody holds it ``LOCK_EX``): a request
    that passes may try its slot locks; one that does not waits, so the waiting one gets in
    (a pin waiting for the slots the server's requests hold shared, or such a request waiting
    for the pins: neither starves the other)."""
    fd = _try_lock(path, fcntl.LOCK_SH)
    if fd is None:
        return False
    _release([fd])
    return True


def _release(fds: list[int]) -> None:
    """Unlock and close ``fds``, emptying the list."""
    for fd in fds:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    fds.clear()


LEASES = SlotLeases()
"""The slot leases of this process, shared by every :class:`~boxmaker.client.Client`."""
