"""The tap's conversations: which one each request continues (one session log each).

Grouping (one session per conversation): each request's messages are compared with every
conversation's last request, message by message as the model sees them
(:func:`~boxmaker.tap._wire.message_key`, reasoning left out). A request continues the
conversation whose last request it extends, best when the next message is that request's reply
as the tap saw it; failing that, the conversation with the longest shared prefix reaching past
its first assistant message (the agent rewrote earlier history); else it starts a new session.
A request equal to a conversation's last one (a retry, or a second agent with the same task)
starts a new session, so two agents at once never share one.

A request's candidates are looked up by a hash of each prefix of its messages
(:class:`Conversations`), not scanned for: the scan grew with every conversation the tap ever
saw (13 % of its time after 768 runs). Pure: no I/O; the writer thread
(:class:`~boxmaker.tap._log.TapLog`) alone calls it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import Assistant, ToolCall, Usage
from ..session import Session
from ._wire import WireApi

__all__ = ["Conversation", "Conversations", "Key"]

Key = tuple[Any, ...]
"""A message as the model sees it (:func:`~boxmaker.tap._wire.message_key`)."""


@dataclass
class Conversation:
    """One conversation through the tap: its session log, its last request's message keys,
    and what its next records need (the turn open, the calls awaiting results, the last
    reply and usage for the cache-loss rule)."""

    session: Session | None
    keys: list[Key]
    # its last request as the agent sent it (forensics read it again on a loss, rarely): the
    # bytes, about a third of the parsed body's memory (5 of the 12 KiB a conversation held)
    request: bytes = b""
    api: WireApi = "chat"
    reply: Assistant | None = None
    reply_key: Key | None = None
    usage: Usage | None = None
    pending: dict[str, ToolCall] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)
    open: bool = False
    last: str = ""  # the role of the turn's last message: user, assistant, tool; reply
    failed: bool = False
    next_call: int = 1
    created: bool = False
    order: int = 0  # its place among the tap's conversations (the older wins a tie)
    exact: tuple[int, int] = (0, 0)  # (len(keys), _chain's hash of keys): the exact index
    start: tuple[int, int] | None = None  # keys through the first reply: the start index
    path: Path | None = None  # its log, once made (its session may be closed: OPEN_LOGS)
    secrets: set[str] = field(default_factory=set)  # every credential its requests showed


class Conversations:
    """Every conversation the tap has seen, oldest first, and the indexes that find the one a
    request continues (:meth:`find`)."""

    def __init__(self) -> None:
        self._all: list[Conversation] = []
        # the conversations by their keys, and by their keys through the first reply
        self._by_keys: dict[tuple[int, int], list[Conversation]] = {}
        self._by_start: dict[tuple[int, int], list[Conversation]] = {}

    def __iter__(self) -> Iterator[Conversation]:
        return iter(self._all)

    def find(self, keys: list[Key], msgs: Sequence[Mapping[str, Any]]) -> tuple[Conversation, int]:
        """The conversation ``keys`` (a request's :data:`Key` per message; ``msgs``, its
        messages) continue, or a new one, and the index of the first message not logged yet;
        :meth:`file` the conversation's new keys once its request is logged."""
        best: tuple[tuple[int, int], Conversation] | None = None
        for conv in self._candidates(keys):
            n = len(conv.keys)
            if keys[:n] == conv.keys and (len(keys) > n or (conv.failed and len(keys) == n)):
                replied = conv.reply_key is not None and len(keys) > n
                score = (2 if replied and _same(keys[n], conv.reply_key) else 1, n)
            else:
                shared = _shared(keys, conv.keys)
                first_reply = next(
                    (i for i, k in enumerate(conv.keys) if k[0] == "assistant"), None
                )
                if first_reply is None or shared <= first_reply:
                    continue
                score = (0, shared)
            if best is None or score > best[0]:
                best = (score, conv)
        if best is None:
            conv = Conversation(session=None, keys=[])
            conv.order = len(self._all)
            self._all.append(conv)
            self._by_keys.setdefault(conv.exact, []).append(conv)
            first = 1 if msgs and msgs[0].get("role") in ("system", "developer") else 0
            return conv, first
        (kind, n), conv = best
        if kind == 0:  # history rewritten: the agent's new input follows its last assistant
            last = max((i for i, m in enumerate(msgs) if m.get("role") == "assistant"), default=-1)
            return conv, last + 1
        echoed = n < len(keys) and keys[n][0] == "assistant" and conv.reply_key is not None
        return conv, n + (1 if kind == 2 or echoed else 0)  # the reply, altered: not logged twice

    def _candidates(self, keys: Sequence[Key]) -> list[Conversation]:
        """The conversations :meth:`find` may pick for ``keys``, oldest first: those
        whose keys are a prefix of ``keys`` (or ``keys`` itself), and those that share
        ``keys`` through their first reply (a rewritten history shares at least that)."""
        chain = _chain(keys)
        found = {}
        for n, h in enumerate(chain):
            for conv in self._by_keys.get((n, h), ()):
                found[id(conv)] = conv
        first = next((i for i, k in enumerate(keys) if k[0] == "assistant"), None)
        if first is not None:
            for conv in self._by_start.get((first + 1, chain[first + 1]), ()):
                found[id(conv)] = conv
        return sorted(found.values(), key=lambda c: c.order)

    def file(self, conv: Conversation, keys: list[Key]) -> None:
        """Set ``conv.keys`` to ``keys``, moving it in the indexes."""
        _unfile(self._by_keys, conv.exact, conv)
        if conv.start is not None:
            _unfile(self._by_start, conv.start, conv)
        chain = _chain(keys)
        conv.keys, conv.exact = keys, (len(keys), chain[-1])
        self._by_keys.setdefault(conv.exact, []).append(conv)
        first = next((i for i, k in enumerate(keys) if k[0] == "assistant"), None)
        conv.start = None if first is None else (first + 1, chain[first + 1])
        if conv.start is not None:
            self._by_start.setdefault(conv.start, []).append(conv)


def _same(key: Key, reply: Key | None) -> bool:
    """The agent's message is the reply (same text and calls; an empty text on either side is
    a match when the calls are the same: agents send ``null`` or ``""``)."""
    if reply is None or key[0] != "assistant":
        return False
    return key[2] == reply[2] and (key[1] == reply[1] or not key[1] or not reply[1])


def _chain(keys: Sequence[Key]) -> list[int]:
    """A hash of each prefix of ``keys`` (``[0]`` for none, then one per message), each made
    from the one before: a prefix is looked up in one pass, not hashed whole at each length
    (the candidates found are checked against their keys all the same)."""
    chain = [0]
    for key in keys:
        chain.append(hash((chain[-1], key)))
    return chain


def _unfile(index: dict[tuple[int, int], list[Conversation]], at: tuple[int, int],
            conv: Conversation) -> None:  # fmt: skip
    """Take ``conv`` out of ``index[at]`` (dropping the entry when it empties)."""
    bucket = index.get(at)
    if bucket is not None:
        bucket[:] = [c for c in bucket if c is not conv]
        if not bucket:
            del index[at]


def _shared(a: Sequence[Key], b: Sequence[Key]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
