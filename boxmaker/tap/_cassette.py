"""The tap's cassette: every upstream exchange the tap forwards, written on a thread of its own.

The proxy hands each exchange it forwarded (the request as sent upstream, the answer's status,
headers and bytes as the agent got them) to :meth:`TapCassette.submit`, a queue put; the
thread, in a quiet moment (no request in flight: :mod:`~boxmaker.tap._traffic`), scrubs and
appends it with :class:`boxmaker.cassettes.CassetteWriter` (the rules of
:func:`boxmaker.cassettes.use_cassette`: no credential, no header but ``Accept`` and
``Content-Type`` reaches the file). The tap's own side requests (cache forensics asking the
template and the tokenizer) are not the agent's traffic and are not recorded, as inside
:func:`~boxmaker.cassettes.use_cassette`. A file that cannot be written (a full disk) is said
once; forwarding goes on, nothing more is recorded.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import CassetteError
from ._traffic import Traffic

__all__ = ["Recorded", "TapCassette"]

LOGGER = logging.getLogger("boxmaker.tap")


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """One exchange forwarded upstream, as the proxy saw it (headers as raw byte pairs,
    decoded on the writer thread; see :meth:`boxmaker.cassettes.CassetteWriter.add` for each
    field)."""

    method: str
    uri: str
    request_headers: list[tuple[bytes, bytes]]
    request_body: bytes
    status: int
    reason: str | None
    response_headers: list[tuple[bytes, bytes]]
    body: bytes
    error: str | None = None


class TapCassette:
    """Record the exchanges the tap forwards into a vcrpy-compatible cassette (a writer thread).

    Args:
        path: the cassette file (YAML, boxmaker's readable form; replaced by the first
            exchange; read it with :func:`boxmaker.cassettes.use_cassette`, the pytest plugin
            or ``boxmaker cassette show``).
        traffic: the tap's requests in flight: each exchange is written in a quiet moment
            (:class:`~boxmaker.tap._traffic.Traffic`; ``None``: at once).

    Attributes:
        path: the file.
        recorded: interactions written so far.
        problems: what could not be recorded, in words (a write failure is said once).
    """

    def __init__(self, path: str | Path, *, traffic: Traffic | None = None) -> None:
        from ..cassettes import CassetteWriter  # vcrpy: imported only when a cassette is asked

        self.path = Path(path)
        self.problems: list[str] = []
        self._writer: Any = CassetteWriter(self.path)
        self._failed = False
        self._traffic = traffic
        self._queue: queue.SimpleQueue[Recorded | None] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="boxmaker-tap-cassette", daemon=True)
        self._thread.start()

    @property
    def recorded(self) -> int:
        """Interactions written to the file so far."""
        return int(self._writer.count)

    def begin(self) -> None:
        """Count one exchange on its way (so that :meth:`wait` waits for it too);
        :meth:`submit` or :meth:`drop` ends it."""
        with self._idle:
            self._pending += 1

    def submit(self, exchange: Recorded) -> None:
        """Queue one exchange begun with :meth:`begin` (never blocks, never raises)."""
        self._queue.put(exchange)

    def drop(self) -> None:
        """End an exchange begun with :meth:`begin` that will not be submitted (the upstream
        was not reached: no answer to record)."""
        self._done()

    def _done(self) -> None:
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Wait until every exchange begun so far is written; ``False`` on timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def close(self) -> None:
        """Write what is queued and close the file. Idempotent."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        try:
            self._writer.close()
        except CassetteError as exc:
            self._fail(exc)

    def _run(self) -> None:
        while True:
            exchange = self._queue.get()
            if exchange is None:
                return
            try:
                if self._traffic is not None:
                    self._traffic.wait_quiet()
                if not self._failed:
                    self._writer.add(
                        method=exchange.method,
                        uri=exchange.uri,
                        request_headers=_text(exchange.request_headers),
                        request_body=exchange.request_body,
                        status=exchange.status,
                        response_headers=_text(exchange.response_headers),
                        body=exchange.body,
                        reason=exchange.reason,
                        error=exchange.error,
                    )
            except Exception as exc:  # the thread never dies: the agent's traffic goes on
                self._fail(exc)
            finally:
                self._done()

    def _fail(self, exc: Exception) -> None:
        if not self._failed:
            self._failed = True
            why = str(exc) if isinstance(exc, CassetteError) else f"{type(exc).__name__}: {exc}"
            text = f"the cassette stopped recording (forwarding goes on): {why}"
            self.problems.append(text)
            LOGGER.warning("%s", text)


def _text(headers: list[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    return [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
