"""A request's messages written as JSON and fingerprinted once per session, not at each request.

Why: a session's requests carry its whole history, so writing each request's body and
fingerprinting its messages for the slot leases (:mod:`boxmaker.client._slots`) grew with the
session: 16 ms of a turn at 10,000 records against 3 ms at 100 (issue 38: the per-turn cost
must stay flat). A session's requests are lists of the same message objects, one more turn's
at the end each time (:meth:`boxmaker.session.Session.messages` gives a
:class:`~boxmaker.session.Messages`, whose dicts are the session's own and never change), so
for each session (told by its first message object) the last list seen is kept with its
messages' JSON joined and their fingerprint, and a list of the same objects plus more writes
and hashes only the new ones. That the list starts with the same objects is one C-level
comparison of the two lists (``==`` takes an identical object as equal without looking into
it).

Only a :class:`~boxmaker.session.Messages` list is looked up: a list built by other code may
hold dicts changed in place since the last request, so its messages are written anew each
time, as before.

The fingerprint (:class:`Fingerprint`) is one running hash per message: its ``i``-th value
hashes the JSON of the first ``i + 1`` messages, so whether one request's messages start with
another's is one comparison (:meth:`Fingerprint.shares`), whatever their length.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .. import _json
from ..session import Messages

__all__ = ["Fingerprint", "fingerprint", "request_body"]

_KEEP = 512
"""Sessions whose last list is kept (least recently used first out)."""


@dataclass(frozen=True)
class Fingerprint:
    """What tells one request's messages from another's prefix: ``count`` messages, and
    ``running[i]`` a hash of the JSON of the first ``i + 1`` (the list may run on past
    ``count``: later requests of the session share it)."""

    count: int
    running: list[int]

    def shares(self, other: Fingerprint, n: int) -> bool:
        """Whether both start with the same ``n`` messages (``n`` at most either count)."""
        return n > 0 and self.running[n - 1] == other.running[n - 1]


NO_MESSAGES = Fingerprint(0, [])


class _Written:
    """A list of messages as written so far: the messages, the running hashes, their JSON
    joined by ``,`` (while every one is orjson's), under a lock (the joined bytes grow in
    place)."""

    __slots__ = ("joined", "lock", "messages", "running", "whole")

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.running: list[int] = []
        self.joined = bytearray()
        self.whole = True  # every message written by orjson (else: no joined body)
        self.lock = threading.Lock()

    def extend(self, messages: list[Any]) -> None:
        """Write and hash ``messages`` after the ones so far (the caller holds the lock)."""
        last = self.running[-1] if self.running else 0
        joined, running = self.joined, self.running
        for message in messages:
            part = _json.dumps(message)
            if part is None:
                self.whole = False
                text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
                part = text.encode("utf-8", "surrogatepass")  # a lone surrogate: hashed too
            elif self.whole:
                if joined:
                    joined += b","
                joined += part
            last = hash((last, part))
            running.append(last)
        self.messages += messages


_LOCK = threading.Lock()
_KNOWN: OrderedDict[int, _Written] = OrderedDict()  # id(a session's first message) -> written


def _written(messages: list[Any]) -> _Written:
    """``messages`` written: for a :class:`~boxmaker.session.Messages` list that starts
    with the messages its session's kept one holds, that one, with the rest added; else
    written anew (and kept, for a ``Messages`` list)."""
    fresh = _Written()
    if type(messages) is not Messages or not messages:
        fresh.extend(messages)
        return fresh
    key = id(messages[0])
    with _LOCK:
        kept = _KNOWN.get(key)
        if kept is not None:
            _KNOWN.move_to_end(key)
    if kept is not None:
        with kept.lock:
            size = len(kept.messages)
            if (
                kept.messages[0] is messages[0]
                and size <= len(messages)
                and messages[:size] == kept.messages
            ):
                if size < len(messages):
                    kept.extend(messages[size:])
                return kept
    fresh.extend(messages)
    with _LOCK:
        _KNOWN[key] = fresh
        while len(_KNOWN) > _KEEP:
            _KNOWN.popitem(last=False)
    return fresh


def fingerprint(messages: Any) -> Fingerprint:
    """The :class:`Fingerprint` of ``messages`` (no messages for anything but a list)."""
    if not isinstance(messages, list) or not messages:
        return NO_MESSAGES
    written = _written(messages)
    return Fingerprint(len(messages), written.running)


_MARK = "\x00boxmaker:messages\x00"
_MARK_JSON = b'"\\u0000boxmaker:messages\\u0000"'


def request_body(payload: dict[str, Any]) -> bytes | None:
    """The JSON of a chat request (compact UTF-8, as :func:`boxmaker._json.dumps` writes it)
    with its ``messages`` put together from their JSON written once per session; ``None``
    when it cannot be (no messages list, or a message only :mod:`json` can write): the
    caller writes the whole payload then."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    text = _json.dumps({**payload, "messages": _MARK})
    if text is None or text.count(_MARK_JSON) != 1:
        return None
    head, _, tail = text.partition(_MARK_JSON)
    written = _written(messages)
    with written.lock:
        if not written.whole or len(written.messages) < len(messages):
            return None
        if len(written.messages) == len(messages):
            return b"".join((head, b"[", written.joined, b"]", tail))
    return None  # the session went on meanwhile (another thread): written whole instead
