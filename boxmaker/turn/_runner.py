"""One turn on a worker thread with Stop, and the cancel token it stops with.

Widgets, the terminal chat and batch all run turns off their own thread and stop them from
another. The rules that make a Stop reliable live here, once:

- the caller makes the token (:class:`CancelToken`), before the turn starts, and keeps it;
- cancelling is once and for good, from any thread: a token is never cleared (its
  :meth:`~CancelToken.clear` raises), so a Stop pressed just before the turn starts, or while
  it starts, is not lost;
- the run only reads the token (:func:`~boxmaker.turn.run_turn` never clears what it is
  given); the next turn gets a new token.

The token is a :class:`threading.Event` (cancelled = set), so the client's and the tools'
``cancel`` parameters take it as they are (pydantic-ai's ``CancellationToken`` has the same
contract: made by the caller, cancelled once from any thread, never reset by the run).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Self

from ..errors import BoxmakerError
from ..events import Hook
from ..session import Session
from ._loop import Runtime, TurnOutcome, run_turn

__all__ = ["CancelToken", "TurnRunner"]


class CancelToken(threading.Event):
    """A cancel switch made by the caller and cancelled once, for good, from any thread.

    A :class:`threading.Event` that can be set but never cleared: pass it wherever boxmaker
    takes a ``cancel`` event (:func:`~boxmaker.turn.run_turn`'s ``cancel``,
    :class:`~boxmaker.turn.Runtime`'s ``cancel``, the client's ``chat_with_retry``, tool
    dispatch). Make one per turn (:class:`TurnRunner` does).

    Raises:
        BoxmakerError: from :meth:`clear` (a token is cancelled for good: make a new one).
    """

    def cancel(self) -> None:
        """Cancel (idempotent, thread-safe): the run sees it at its next check, within about
        0.1 s while a request streams (the client shuts the socket)."""
        self.set()

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` (or ``set``) was called."""
        return self.is_set()

    def clear(self) -> None:
        """Refused: a token stays cancelled (use a new token for the next turn)."""
        raise BoxmakerError("a CancelToken is cancelled for good; make a new one for a new turn")


class TurnRunner:
    """One turn of :func:`~boxmaker.turn.run_turn` on a worker thread, with stop and wait.

    Make it, then :meth:`start` it; :meth:`stop` (from any thread, before or after the start)
    cancels the turn's token, and the turn ends with ``TurnCancelled`` and a well-formed log.
    The outcome or the exception that ended the turn is kept (:attr:`outcome`,
    :attr:`error`); nothing is lost in the thread.

    Args:
        session: the log the turn extends.
        runtime: config, client, tools (shared with the worker thread).
        content: the user message.
        on_event: ``run_turn``'s hook; called on the worker thread.
        cancel: the turn's cancel token (default: a new :class:`CancelToken`); a plain
            :class:`threading.Event` is accepted and is never cleared either.
        on_done: called with the runner on the worker thread once the turn has ended (its
            outcome or error set), before :meth:`wait` returns: a view's last refresh.
        name: the worker thread's name.

    Attributes:
        cancel: the token :meth:`stop` cancels.
        outcome: the :class:`~boxmaker.turn.TurnOutcome` once the turn answered, else ``None``.
        error: the exception that ended the turn (a ``TurnError`` for a limit, a full
            session, a cancel or an inference error; anything else a tool, hook or log write
            raised), else ``None``.
    """

    def __init__(
        self,
        session: Session,
        runtime: Runtime,
        content: str,
        on_event: Hook | None = None,
        *,
        cancel: threading.Event | None = None,
        on_done: Callable[[TurnRunner], None] | None = None,
        name: str = "boxmaker-turn",
    ) -> None:
        self.session, self.runtime, self.content, self.on_event = (
            session,
            runtime,
            content,
            on_event,
        )
        self.cancel = CancelToken() if cancel is None else cancel
        self.outcome: TurnOutcome | None = None
        self.error: BaseException | None = None
        self._on_done = on_done
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Self:
        """Start the turn on its worker thread (once); returns the runner."""
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            self.outcome = run_turn(
                self.session, self.runtime, self.content, self.on_event, cancel=self.cancel
            )
        except BaseException as exc:  # kept for the caller's thread
            self.error = exc
        try:
            if self._on_done is not None:
                self._on_done(self)
        finally:
            self._done.set()

    def stop(self) -> None:
        """Cancel the turn (idempotent; before :meth:`start` too: the turn then ends at once)."""
        self.cancel.set()

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called."""
        return self._thread.ident is not None

    @property
    def done(self) -> bool:
        """Whether the turn has ended (answered or raised)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the turn has ended, at most ``timeout`` seconds (``None``: no bound);
        returns whether it has. Waits on an event, not ``Thread.join`` (a join cut by Ctrl-C
        can leave a live thread looking finished on Python 3.11)."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> TurnOutcome:
        """:meth:`wait`, then the outcome.

        Raises:
            TimeoutError: the turn still runs after ``timeout`` seconds (it goes on).
            TurnError: (or whatever ended the turn) re-raised on the caller's thread.
        """
        if not self.wait(timeout):
            raise TimeoutError(f"the turn is still running after {timeout} s")
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome
