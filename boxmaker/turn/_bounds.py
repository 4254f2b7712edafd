"""The turn's client-side bounds: whatever the server streams, every turn ends.

A server may ignore ``max_tokens`` and the thinking budget and stream for ever, send
thousands of tool calls or megabytes of arguments, or stall between tokens. :class:`TurnBounds`
holds the bounds of :class:`~boxmaker.config.LoopLimits` for one turn and gives the loop its
named check points: :meth:`TurnBounds.before_completion` (completions per turn),
:meth:`TurnBounds.relay` (counts each streamed delta and closes the stream past a bound),
:meth:`TurnBounds.after_completion` (the same bounds on a completion that came whole) and
:meth:`TurnBounds.cancelled` (a cancel set by the deadline is the deadline). Each bound that
fires is a :class:`~boxmaker.errors.TurnLimit` of its own kind; the loop ends the turn with
it (a ``LimitHit`` and a ``TurnEnd`` of that outcome).

No I/O and no thread: the deadline is a time that the turn's own cancel
(:attr:`TurnBounds.cancel`: set once the deadline has passed, or seen set when the caller's
token is) compares with the clock whenever it is asked; everything that waits for a turn's
cancel asks it at least every :data:`PARENT_POLL_S` seconds (the client's watch closes the
connection within about 0.1 s, a waiting tool sees it set). The caller's token is never set
by the deadline, so a turn that ran out of time leaves it as it was.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

from ..client import Completion
from ..config import Config
from ..errors import StreamStopped, TurnCancelled, TurnError, TurnLimit
from ..events import ClientEvent, Content, Hook, Reasoning, Retrying, ToolCallDelta

__all__ = ["THINKING_GRACE", "TOKEN_GRACE", "BoundHit", "TurnBounds"]

TOKEN_GRACE = 16
"""Deltas a completion may stream past ``sampling.max_tokens`` before the client closes it: a
delta holds at least one token, so a server that honours ``max_tokens`` stays below; the grace
covers a token split into two events (a ``<think>`` tag moved to reasoning)."""

THINKING_GRACE = 64
"""Reasoning deltas past the thinking cap's budget before the client closes the stream: the
client sends ``reasoning_end`` at the budget plus 2 (a server ignoring the budget); a server
that honours that stops within the tokens in flight, far below this."""


class BoundHit(StreamStopped):
    """Internal: raised from the event relay to close the stream; ``limit`` says which bound,
    ``completion`` what had arrived (set by the client, :class:`~boxmaker.errors.StreamStopped`).
    Never leaves the turn: the loop records the completion and ends the turn with
    :attr:`limit`."""

    def __init__(self, limit: TurnLimit) -> None:
        super().__init__(str(limit))
        self.limit = limit


class TurnCancel(threading.Event):
    """The cancel of one turn: set once its deadline has passed, and set too whenever the
    caller's token (``parent``) is. ``wait`` looks at the parent and the clock every
    :data:`PARENT_POLL_S` seconds (neither can wake it), so a caller's cancel or the deadline
    reaches a waiting reader within that.

    Args:
        parent: the caller's token.
        deadline: the time (``clock``'s) past which the turn is cancelled; ``None``: none.
        clock: seconds, monotonic.

    Attributes:
        expired: the deadline passed (and set the event).
    """

    def __init__(
        self,
        parent: threading.Event,
        deadline: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self._parent = parent
        self._deadline = deadline
        self._clock = clock
        self.expired = False

    def is_set(self) -> bool:
        """The deadline passed, or the caller's token is set."""
        if super().is_set() or self._parent.is_set():
            return True
        if self._deadline is not None and self._clock() >= self._deadline:
            self.expired = True
            self.set()
            return True
        return False

    def clear_deadline(self) -> None:
        """No deadline from now on (the turn is over)."""
        self._deadline = None

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until :meth:`is_set` (or ``timeout`` seconds); its value then."""
        end = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            step = PARENT_POLL_S if end is None else min(PARENT_POLL_S, end - time.monotonic())
            if step <= 0:
                break
            super().wait(step)
        return self.is_set()


PARENT_POLL_S = 0.02
"""How often a waiting :class:`TurnCancel` looks at the caller's token and the clock, in
seconds."""


class TurnBounds:
    """The client-side bounds of one turn (:class:`~boxmaker.config.LoopLimits`).

    Args:
        config: the knobs: ``loop.completion_tokens``, ``loop.completions``,
            ``loop.turn_deadline_s``, ``loop.tool_calls_per_completion``,
            ``loop.tool_argument_chars``, ``loop.thinking_tokens`` and ``sampling.max_tokens``.
        cancel: the caller's cancel token (``runtime.cancel`` or ``run_turn(cancel=...)``);
            :attr:`cancel` is set when it is, and by the deadline (which leaves it alone).
        clock: seconds, monotonic (:func:`time.monotonic`).

    Use as a context manager: entering starts the deadline (from then on :attr:`cancel` is
    set once ``loop.turn_deadline_s`` have passed), leaving stops it.
    """

    def __init__(
        self,
        config: Config,
        cancel: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = config.loop
        self._max_tokens = config.sampling.max_tokens
        self._parent = cancel
        self._clock = clock
        self.cancel = TurnCancel(cancel, clock=clock)
        """The turn's cancel: what the client and the loop watch."""
        self._started = 0.0
        self.completions = 0
        """Completions asked for so far in this turn."""

    @property
    def expired(self) -> bool:
        """The deadline passed (and set :attr:`cancel`)."""
        return self.cancel.expired

    def __enter__(self) -> TurnBounds:
        """Start the turn's deadline (``loop.turn_deadline_s``)."""
        self._started = self._clock()
        deadline = self._loop.turn_deadline_s
        at = None if deadline is None else self._started + deadline
        self.cancel = TurnCancel(self._parent, at, self._clock)
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop the deadline: the turn's cancel no longer looks at the clock."""
        self.cancel.clear_deadline()

    def before_completion(self) -> TurnLimit | None:
        """Count one more completion; the limit when it is one too many (``completions``)."""
        self.completions += 1
        cap = self._loop.completions
        if cap is not None and self.completions > cap:
            detail = f"{self.completions} completions in one turn, at most {cap}"
            return TurnLimit("completions", self.completions, cap, detail)
        return None

    def cancelled(self, message: str) -> TurnError:
        """The error for a cancel seen by the loop: ``turn_deadline`` when the deadline set it,
        else :class:`~boxmaker.errors.TurnCancelled` with ``message``."""
        if not self.expired:
            return TurnCancelled(message)
        deadline = self._loop.turn_deadline_s or 0.0
        spent = self._clock() - self._started
        detail = f"the turn ran {spent:.1f} s, past its deadline of {deadline:g} s"
        return TurnLimit("turn_deadline", math.ceil(spent), math.ceil(deadline), detail)

    def token_bound(self, reasoning_budget: int | None) -> tuple[int | None, int | None]:
        """The bounds of one completion: (deltas in all, reasoning deltas), ``None`` for none."""
        caps = [self._loop.completion_tokens]
        if self._max_tokens is not None:
            caps.append(self._max_tokens + TOKEN_GRACE)
        total = min((c for c in caps if c is not None), default=None)
        thinking = None if reasoning_budget is None else reasoning_budget + THINKING_GRACE
        return total, thinking

    def relay(self, emit: Hook, reasoning_budget: int | None) -> Callable[[ClientEvent], None]:
        """An event hook for one completion that counts what streams and passes each event
        to ``emit`` (but :class:`~boxmaker.events.ToolCallDelta`, which the turn does not pass
        on). Past a bound it raises :class:`BoundHit`, which makes the client close the stream
        (llama.cpp then stops generating). Counted: each ``Reasoning``, ``Content`` and
        ``ToolCallDelta`` as one token; tool calls by their ``index``; argument characters per
        index; a :class:`~boxmaker.events.Retrying` (the client streams the completion anew)
        starts the counts again."""
        total, thinking = self.token_bound(reasoning_budget)
        loop = self._loop
        calls_cap, args_cap = loop.tool_calls_per_completion, loop.tool_argument_chars
        tokens = reasoning = 0
        arguments: dict[int, int] = {}

        def hook(event: ClientEvent) -> None:
            nonlocal tokens, reasoning
            if isinstance(event, Reasoning | Content | ToolCallDelta):
                tokens += 1
                if total is not None and tokens > total:
                    raise BoundHit(self._tokens_limit(tokens, total))
                if isinstance(event, Reasoning):
                    reasoning += 1
                    if thinking is not None and reasoning > thinking:
                        raise BoundHit(self._thinking_limit(reasoning, thinking))
                elif isinstance(event, ToolCallDelta):
                    index = event.index
                    size = arguments.get(index, 0) + len(event.arguments or "")
                    arguments[index] = size
                    limit = self._calls_limit(len(arguments), calls_cap) or self._args_limit(
                        size, args_cap
                    )
                    if limit is not None:
                        raise BoundHit(limit)
                    return
            elif isinstance(event, Retrying):  # a new attempt streams anew (a full KV pool)
                tokens = reasoning = 0
                arguments.clear()
            emit(event)

        return hook

    def after_completion(self, completion: Completion) -> TurnLimit | None:
        """The same call bounds on a finished completion (a client that sent no deltas)."""
        loop = self._loop
        calls = completion.tool_calls
        limit = self._calls_limit(len(calls), loop.tool_calls_per_completion)
        for call in calls:
            limit = limit or self._args_limit(len(call.arguments), loop.tool_argument_chars)
        return limit

    def _tokens_limit(self, tokens: int, bound: int) -> TurnLimit:
        detail = (
            f"the server streamed more than {bound} tokens in one completion (completion_tokens "
            f"{self._loop.completion_tokens}, max_tokens {self._max_tokens}); stream closed"
        )
        return TurnLimit("completion_tokens", tokens, bound, detail)

    def _thinking_limit(self, reasoning: int, bound: int) -> TurnLimit:
        detail = (
            f"the server reasoned {reasoning} tokens, {THINKING_GRACE} past the thinking "
            "budget, ignoring thinking_budget_tokens and reasoning_end; stream closed"
        )
        return TurnLimit("completion_tokens", reasoning, bound, detail)

    @staticmethod
    def _calls_limit(calls: int, cap: int | None) -> TurnLimit | None:
        if cap is None or calls <= cap:
            return None
        detail = f"one completion made more than {cap} tool calls; none was run"
        return TurnLimit("tool_calls", calls, cap, detail)

    @staticmethod
    def _args_limit(chars: int, cap: int | None) -> TurnLimit | None:
        if cap is None or chars <= cap:
            return None
        detail = f"a tool call's arguments grew past {cap:,} characters; nothing was run"
        return TurnLimit("tool_arguments", chars, cap, detail)
