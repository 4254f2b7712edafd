"""What a turn runs with (``Runtime``) and what an answered turn gives (``TurnOutcome``)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..cache import CacheForensics, WarmStart
from ..client import ChatClient
from ..config import Config
from ..records import Usage
from ..tools import Registry, ToolPort
from ._fork import Replay

__all__ = ["Runtime", "TurnOutcome"]


@dataclass(kw_only=True)
class Runtime:
    """What a turn runs with: knobs, client, tools, and a cancel switch.

    Attributes:
        config: every limit and knob (:class:`boxmaker.config.Config`).
        client: streams completions (:class:`boxmaker.client.Client` or a fake).
        registry: the tools the loop can dispatch.
        port: where port tools go (``None``: port tools answer that no port is connected).
        cancel: set it (any thread) to stop the running turn; never cleared nor set by the loop.
        forensics: explains cache losses (remembers each session's last request).
        replay: a fork's replay of its parent's tool results (:class:`Replay`); ``None``:
            every tool runs.
        warm: what :func:`boxmaker.cache.warm_fork` did for a fork (its answer): recorded,
            with the reuse its first completion measured, in the fork's ``Warmed`` record
            (ignored for another session than the one it was made for).
    """

    config: Config
    client: ChatClient
    registry: Registry
    port: ToolPort | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    forensics: CacheForensics = field(default_factory=CacheForensics)
    replay: Replay | None = None
    warm: WarmStart | None = None


@dataclass(frozen=True, kw_only=True)
class TurnOutcome:
    """A turn that answered: ``content`` is the final answer text ("" if the model sent none),
    ``usage`` the :class:`Usage` of the turn's last completion."""

    content: str
    usage: Usage
