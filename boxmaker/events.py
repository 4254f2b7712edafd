"""The events a turn emits to its ``on_event`` hook, as plain frozen dataclasses.

Client events (from one streamed ``/v1/chat/completions`` request, llama.cpp terms):

========================  ==========================================================
``Queued``                the server accepted the request (HTTP 200), no chunk yet
``Progress``              ``prompt_progress``: prompt tokens ``processed`` of ``total``
                          (``cache`` of them reused from the slot), ``time_ms`` so far
``Waiting``               prompt processed, no token yet (sent once per request)
``Reasoning``             a ``delta.reasoning_content`` fragment
``Content``               a ``delta.content`` fragment
``ToolCallDelta``         a ``delta.tool_calls[i]`` fragment (arguments arrive in pieces)
``ThinkingCapped``        the reasoning budget ended reasoning (``thinking_budget_tokens``
                          in the server's sampler, or ``reasoning_end`` sent as fallback)
``CapNotEnforced``        a thinking cap is set but could not be enforced (``detail`` why)
``Retrying``              the request failed in a retryable way; next attempt after a delay
``SlotWait``              the slot is held by another request in flight; waiting for it
========================  ==========================================================

Turn events add ``ToolCallStarted`` and the records the turn appends to the session log
(:mod:`boxmaker.records`: ``User``, ``Assistant``, ``Usage``, ``CacheLoss``, ``ToolResult``,
``LimitHit``), passed to the hook as they are written. ``ToolCallDelta`` is not passed on by the
turn (``ToolCallStarted`` comes once the call is complete); a caller that drops them can
skip making them (``Client.chat(..., tool_call_deltas=False)``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias, TypeVar

from .records import Record

__all__ = [
    "CapNotEnforced",
    "ClientEvent",
    "Content",
    "Hook",
    "Progress",
    "Queued",
    "Reasoning",
    "Retrying",
    "SlotWait",
    "ThinkingCapped",
    "ToolCallDelta",
    "ToolCallStarted",
    "TurnEvent",
    "Waiting",
    "guarded",
]


@dataclass(frozen=True, slots=True)
class Queued:
    """The server answered HTTP 200; no stream chunk has arrived yet."""


@dataclass(frozen=True, slots=True)
class Progress:
    """llama.cpp's ``prompt_progress``: tokens of the prompt processed so far.

    ``total`` prompt tokens, ``cache`` of them reused from the slot's cache, ``processed``
    done so far (including the cached ones), ``time_ms`` milliseconds spent so far.
    """

    total: int
    cache: int
    processed: int
    time_ms: float


@dataclass(frozen=True, slots=True)
class Waiting:
    """The prompt is processed; the first generated token has not arrived yet."""


@dataclass(frozen=True, slots=True)
class Reasoning:
    """A fragment of ``delta.reasoning_content`` (about one token)."""

    text: str


@dataclass(frozen=True, slots=True)
class Content:
    """A fragment of ``delta.content`` (about one token)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of ``delta.tool_calls[index]``; ``id`` and ``name`` only where sent."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class ThinkingCapped:
    """The reasoning budget ended reasoning after ``reasoning_tokens`` reasoning deltas of this
    completion: llama.cpp's sampler did (``thinking_budget_tokens``; the event comes when the
    answer starts), or, on a server that ignored it, ``reasoning_end`` was sent through
    llama.cpp's reasoning control (the event comes when it was accepted)."""

    reasoning_tokens: int


@dataclass(frozen=True, slots=True)
class CapNotEnforced:
    """A thinking cap is set but the client could neither count nor end this completion's
    reasoning in time: the server ignored ``thinking_budget_tokens`` and refused
    ``reasoning_end``, or sent reasoning the client could only count once it had ended, or
    sent no reasoning the client can see (no reasoning field, no ``<think>`` tags).
    ``reasoning_tokens`` reasoning deltas came so far; ``detail`` says which case and what
    to change. Emitted at most once per completion (the no-reasoning-seen case once per
    client); the turn records it as a ``LimitHit(kind="thinking_cap")`` whose detail starts
    with ``"not enforced:"``."""

    reasoning_tokens: int
    detail: str


@dataclass(frozen=True, slots=True)
class Retrying:
    """Attempt ``attempt`` (1 = the first retry) follows after ``delay_s`` seconds."""

    attempt: int
    delay_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class SlotWait:
    """The request waits: its llama.cpp slot is held by another request in flight (of this
    process or another one on this machine); sent once, before the wait.

    ``url`` is the server's base URL, ``slot`` the ``id_slot`` waited for (``None``: the first
    of the server's slots to be free).
    """

    url: str
    slot: int | None


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    """A complete tool call is about to be handled; ``call`` is its session number."""

    name: str
    call: int
    arguments: str


ClientEvent: TypeAlias = (
    Queued
    | Progress
    | Waiting
    | Reasoning
    | Content
    | ToolCallDelta
    | ThinkingCapped
    | CapNotEnforced
    | Retrying
    | SlotWait
)
"""Any event of one streamed request."""

TurnEvent: TypeAlias = (
    Queued
    | Progress
    | Waiting
    | Reasoning
    | Content
    | ThinkingCapped
    | CapNotEnforced
    | Retrying
    | SlotWait
    | ToolCallStarted
    | Record
)
"""Any event a turn passes to its hook: client events (but ``ToolCallDelta``),
``ToolCallStarted``, and each record as it is appended."""


_E = TypeVar("_E")

Hook: TypeAlias = Callable[[TurnEvent], None]
"""A turn's ``on_event`` callback: called with each :data:`TurnEvent` in order."""


def guarded(
    on_event: Callable[[_E], None] | None, log: logging.Logger, name: str = "on_event"
) -> Callable[[_E], None]:
    """``on_event`` wrapped so that an error inside it (an ``Exception``) goes no further (a
    hook's bug must not leave a log half written, nor a batch waiting for a run): the first
    of each kind (its type) is logged on ``log`` with its traceback (``ERROR``), the later
    ones of that kind at ``DEBUG`` (a broken widget called per token printed one traceback
    per token; a second kind, as a slot saver's failing beside it, is still said); the hook
    is called again on the next event. ``None`` gives a no-op. ``name``: the hook's name in
    the message (``on_event``, ``on_progress``). The rule for the callbacks boxmaker calls
    per event: a turn's ``on_event``, a batch's ``on_progress``. Safe to call from several
    threads at once."""
    if on_event is None:
        return lambda event: None
    hook = on_event
    said: set[type[BaseException]] = set()
    lock = threading.Lock()

    def emit(event: _E) -> None:
        try:
            hook(event)
        except Exception as exc:
            with lock:
                first = type(exc) not in said
                said.add(type(exc))
            if first:
                log.exception(
                    "%s hook raised %s on %s (said once for this kind of error; the hook is "
                    "called again on the next event)",
                    name,
                    type(exc).__name__,
                    type(event).__name__,
                )
            else:
                log.debug("%s hook raised %s again", name, type(exc).__name__, exc_info=True)

    return emit
