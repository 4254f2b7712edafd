"""Progress displays of a batch: a tqdm bar for terminals, a ``BatchView`` widget for notebooks.

Both are progress hooks of :func:`boxmaker.batch.run_batch` (called with a
:class:`~boxmaker.batch.BatchProgress` after changes, on the caller's thread) and redraw at
most a few times a second, whatever the rate of changes; the last snapshot (``finished``) is
always drawn. ipywidgets is imported only when a :class:`BatchView` is made, so the terminal
display does not load it.
"""

from __future__ import annotations

import html
import sys
import threading
import time
from collections import deque
from typing import Any, TextIO

from tqdm import tqdm

from ._state import BatchProgress

__all__ = ["MAX_UPDATES_PER_S", "BatchView", "TerminalProgress", "describe_progress"]

MAX_UPDATES_PER_S = 15.0
"""Most redraws :class:`BatchView` makes per second (as :class:`~boxmaker.widgets.ChatPanel`)."""

_RATE_WINDOW_S = 5.0
"""Seconds over which the live token rate is measured."""


def describe_progress(progress: BatchProgress, tokens_per_s: float | None = None) -> str:
    """One line of text: runs done (skipped), failed, running on busy/all slots, servers down,
    tokens per second (``tokens_per_s``, or the whole call's rate), seconds elapsed."""
    rate = progress.tokens_per_s if tokens_per_s is None else tokens_per_s
    parts = [f"{progress.done}/{progress.total} runs done"]
    if progress.skipped:
        parts.append(f"{progress.skipped} done before")
    parts.append(f"{progress.failed} failed")
    parts.append(f"{progress.running}/{progress.slots} slots busy")
    if progress.servers_down:
        parts.append(f"{progress.servers_down} servers down")
    parts.append(f"{rate:.0f} tokens/s")
    parts.append(f"{progress.elapsed_s:.1f} s")
    if progress.stopped:
        parts.append("stopped")
    return ", ".join(parts)


class _Throttle:
    """Decides when to redraw: at most ``per_s`` times a second, and always at the end."""

    def __init__(self, per_s: float) -> None:
        self.interval = 1.0 / per_s
        self.last = -float("inf")

    def due(self, progress: BatchProgress) -> bool:
        now = time.monotonic()
        if progress.finished or now - self.last >= self.interval:
            self.last = now
            return True
        return False


class TerminalProgress:
    """A tqdm progress bar of a batch: runs done of all (with ETA), failed, busy slots and
    tokens per second in the postfix; at most 10 redraws a second.

    Args:
        file: where the bar goes (default ``sys.stderr``).

    Call :meth:`close` at the end (the ``finished`` snapshot closes it too).
    """

    def __init__(self, file: TextIO | None = None) -> None:
        self.file = file or sys.stderr
        self.bar: Any = None
        self._lock = threading.Lock()
        self._throttle = _Throttle(10.0)

    def __call__(self, progress: BatchProgress) -> None:
        """Show ``progress`` (a progress hook)."""
        with self._lock:
            if self.bar is None:
                self.bar = tqdm(
                    total=progress.total,
                    initial=progress.skipped,
                    unit="run",
                    file=self.file,
                    dynamic_ncols=True,
                    mininterval=0.1,
                )
            if not self._throttle.due(progress):
                return
            self.bar.update(progress.done + progress.failed - self.bar.n)
            postfix = (
                f"failed {progress.failed}, slots {progress.running}/{progress.slots}, "
                f"{progress.tokens_per_s:.0f} tok/s"
            )
            self.bar.set_postfix_str(postfix, refresh=True)
            if progress.finished:
                self.bar.close()

    def close(self) -> None:
        """Close the bar (idempotent)."""
        with self._lock:
            if self.bar is not None:
                self.bar.close()


class BatchView:
    """A notebook view of a running batch: a progress bar of runs, a status line (runs done,
    failed, slots busy, live token rate over the last 5 s, time) and the failures.

    Pass it as ``on_progress`` to :func:`~boxmaker.batch.run_batch`; it redraws at most
    ``max_updates_per_s`` times a second, and once more for the last snapshot.

    Args:
        max_updates_per_s: cap on redraws per second.

    Attributes:
        progress: the ``IntProgress`` of runs done; status: the status ``HTML``;
            failures: the failures ``HTML``; widget: the whole view (displaying the view shows
            it).
        last: the last :class:`BatchProgress` received (``None`` before the first).
        updates: redraws made so far.
    """

    def __init__(self, *, max_updates_per_s: float = MAX_UPDATES_PER_S) -> None:
        import ipywidgets as ipw  # only when a notebook view is made

        self.progress = ipw.IntProgress(value=0, min=0, max=1, description="Runs")
        self.status = ipw.HTML("waiting for the batch")
        self.failures = ipw.HTML("")
        self.widget = ipw.VBox([self.progress, self.status, self.failures])
        self.widget.add_class("bxm-batch")
        self.last: BatchProgress | None = None
        self.updates = 0
        self._lock = threading.Lock()
        self._throttle = _Throttle(max_updates_per_s)
        self._tokens: deque[tuple[float, int]] = deque()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __call__(self, progress: BatchProgress) -> None:
        """Take a snapshot (a progress hook); redraw when due."""
        with self._lock:
            self.last = progress
            now = time.monotonic()
            self._tokens.append((now, progress.tokens))
            while len(self._tokens) > 2 and now - self._tokens[1][0] > _RATE_WINDOW_S:
                self._tokens.popleft()
            if self._throttle.due(progress):
                self._draw(progress)

    def live_rate(self) -> float:
        """Tokens generated per second over the last 5 s (the whole call's rate when the batch
        has finished)."""
        if self.last is not None and self.last.finished:
            return self.last.tokens_per_s
        if len(self._tokens) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._tokens[0], self._tokens[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0

    def _draw(self, progress: BatchProgress) -> None:
        self.progress.max = max(progress.total, 1)
        self.progress.value = progress.done + progress.failed
        self.progress.bar_style = "danger" if progress.failed else ""
        if progress.finished and not progress.failed:
            self.progress.bar_style = "success"
        self.status.value = html.escape(describe_progress(progress, self.live_rate()))
        items = "".join(
            f"<li><b>{html.escape(run)}</b>: {html.escape(reason[:300])}</li>"
            for run, reason in progress.failures[-5:]
        )
        self.failures.value = f"<ul>{items}</ul>" if items else ""
        self.updates += 1
