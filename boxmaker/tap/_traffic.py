"""The requests in flight through the tap, so that its writer threads work in the gaps.

Writing an exchange costs CPU under the GIL (the log parses the answer; the cassette scrubs
and serializes it, a long stream in one C call that the interpreter cannot interrupt), and
an agent sends its next request as soon as the previous answer ended: written at once, the
previous exchange would hold the GIL while the tap forwards the next request (measured: a
1,009-event answer recorded into a cassette delayed the next request's first event by about
20 ms). So each writer waits for a quiet moment first: no request in flight for
:data:`QUIET_S`, or :data:`AT_MOST_S` at most (busy traffic is written anyway).
"""

from __future__ import annotations

import threading
import time

__all__ = ["AT_MOST_S", "QUIET_S", "Traffic"]

QUIET_S = 0.02
"""Seconds with no request in flight before a writer goes on (an agent's next request,
sent right after the answer, comes first)."""

AT_MOST_S = 2.0
"""Seconds a writer waits for a quiet moment at most."""


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

    def wait_quiet(self, quiet_s: float = QUIET_S, at_most_s: float = AT_MOST_S) -> None:
        """Return once no request has been in flight for ``quiet_s`` seconds, after
        ``at_most_s`` seconds at most, or at once when the tap is stopping (:meth:`close`)."""
        deadline = time.monotonic() + at_most_s
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
