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


def _try_lock(path: Path) -> int | None:
    """The open, ``flock``-ed descriptor of ``path``, or ``None`` when another process (or
    another descriptor) holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd  # nothing written: a truncate costs milliseconds on a real disk


LEASES = SlotLeases()
"""The slot leases of this process, shared by every :class:`~boxmaker.client.Client`."""
