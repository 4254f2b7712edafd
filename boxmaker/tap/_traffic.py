"""The requests in flight through the tap, so that its writer threads work in the gaps.

Writing an exchange costs CPU under the GIL (the log parses the answer; the cassette scrubs
and serializes it, a long stream in one C call that the interpreter cannot interrupt), and
an agent sends its next request as soon as the previous answer ended: written at once, the
previous exchange would hold the GIL while the tap forwards the next request (measured: a
1,009-event answer recorded into a cassette delayed the next request's first event by about
20 ms). So each writer prefers a quiet moment: no request in flight for :data:`QUIET_S`;
but it waits for one :data:`AT_MOST_S` at most after the exchange's answer ended, so that
under steady traffic (never quiet) every exchange is still written at once (issue 36: a wait
of up to 2 s before each exchange wrote one exchange every 2 s under 8 agents, and a kill
lost thousands of answered ones).
"""

from __future__ import annotations

import threading
import time

__all__ = ["AT_MOST_S", "QUIET_S", "Traffic"]

QUIET_S = 0.02
"""Seconds with no request in flight before a writer goes on (an agent's next request,
sent right after the answer, comes first)."""

AT_MOST_S = 0.1
"""Seconds after an exchange's answer ended that a writer waits for a quiet moment, at most
(an exchange queued longer ago is written without waiting)."""


class Traffic:
    """A count of the requests in flight (the proxy's side: :meth:`enter`, :meth:`leave`) and
    a wait for a quiet moment (the writers' side: :meth:`wait_quiet`)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._flying = 0
        self._quiet_since = time.monotonic()
        self._closing = False

    def enter(self) -> None:
        """A request came."""
        with self._cond:
            self._flying += 1

    def leave(self) -> None:
        """A request's answer ended (or it failed)."""
        with self._cond:
            self._flying -= 1
            if self._flying == 0:
                self._quiet_since = time.monotonic()
                self._cond.notify_all()

    def wait_quiet(
        self,
        quiet_s: float = QUIET_S,
        at_most_s: float = AT_MOST_S,
        *,
        since: float | None = None,
    ) -> None:
        """Return once no request has been in flight for ``quiet_s`` seconds, at
        ``since + at_most_s`` at the latest (``since``: a ``time.monotonic()`` time, the
        exchange's answer's end; ``None``: now), or at once when the tap is stopping
        (:meth:`close`)."""
        deadline = (time.monotonic() if since is None else since) + at_most_s
        with self._cond:
            while not self._closing:
                now = time.monotonic()
                if now >= deadline:
                    return
                if self._flying == 0:
                    rest = self._quiet_since + quiet_s - now
                    if rest <= 0:
                        return
                    self._cond.wait(min(rest, deadline - now))
                else:
                    self._cond.wait(deadline - now)

    def close(self) -> None:
        """The tap is stopping: writers no longer wait."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
