"""The state of one :func:`~boxmaker.batch.run_batch` call while it runs: the queue of runs
(cache affinity: :meth:`BatchState.pop`), their tries, the counters of
:class:`~boxmaker.batch.BatchProgress`, the manifest's lines, and the progress hook, called
between the executor's steps on the caller's thread (:meth:`BatchState.flush`). The
executors (:mod:`~boxmaker.batch._executors`) take runs from it and book their outcomes in
it; every method takes its lock."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..errors import SessionError
from ..events import TurnEvent, guarded
from ..records import Record, Usage
from ._manifest import Manifest, read_manifest
from ._run import RunOutcome
from ._state import BatchProgress, log_state
from ._tasks import ForkTask, RunSpec

LOGGER = logging.getLogger("boxmaker.batch")

__all__ = ["AFFINITY_WINDOW", "FLUSH_S", "BatchState", "ProgressHook"]

ProgressHook = Callable[[BatchProgress], None]
"""Called with a :class:`~boxmaker.batch.BatchProgress` after changes, on the thread that
called :func:`~boxmaker.batch.run_batch` (the changes of ``FLUSH_S``, 0.05 s, at most in one
call, and once at the end; throttle further in the display if needed, as
:class:`~boxmaker.batch.BatchView` does)."""

FLUSH_S = 0.05
"""Seconds between two calls of a batch's progress hook, at least (but the last)."""


class BatchState:
    """The shared state of one :func:`~boxmaker.batch.run_batch` call: the queue, tries,
    counters, manifest.

    Every method takes :attr:`cond`'s lock; the manifest is written under it."""

    def __init__(
        self,
        runs: Sequence[RunSpec],
        logs_dir: Path,
        book: Manifest,
        max_tries: int,
        on_progress: ProgressHook | None,
        stop: threading.Event,
    ) -> None:
        self.cond = threading.Condition()
        self.logs_dir, self.book, self.max_tries = logs_dir, book, max_tries
        self.on_progress = (
            None if on_progress is None else guarded(on_progress, LOGGER, "on_progress")
        )
        self.stop = stop
        # while the executor runs, the hook is called on the caller's thread (flush) only
        self.deferred, self.changed, self._flushed = False, False, 0.0
        self.total, self.started = len(runs), time.monotonic()
        self.queue: deque[RunSpec] = deque()
        self.tries: dict[str, int] = {}
        self.down: set[str] = set()
        self.running, self.done, self.skipped, self.tokens = 0, 0, 0, 0
        self.slots_of: dict[str, int] = {}
        self.failures: list[tuple[str, str]] = []
        self.home: dict[str, tuple[str, int]] = {}  # a prefix (its log) -> the slot it ran on
        self.resolved: dict[str, str] = {}  # a fork task's parent as given -> resolved
        self.logs_root = logs_dir.resolve()
        self._prefixes: dict[str, str] = {}  # a run's id -> _prefix()
        known = read_manifest(book.path.parent) if book.path.stat().st_size else {}
        for spec in runs:
            if spec.id not in known:
                book.write(spec.id, "planned", **_planned(spec))
            try:
                state = log_state(logs_dir / f"{spec.id}.jsonl")
            except SessionError as exc:  # a corrupt log fails its run only; the rest go on
                reason = f"its log cannot be read: {exc}"
                self.failures.append((spec.id, reason))
                book.write(spec.id, "failed", reason=reason)
                continue
            if state.finished(len(spec.task.turns)):
                self.done += 1
                self.skipped += 1
                if known.get(spec.id, {}).get("state") != "done":
                    book.write(spec.id, "done", turns=state.turns_done, outcome=state.last_outcome)
            else:
                self.queue.append(spec)
        self._homes_from_parents_batches()

    def _homes_from_parents_batches(self) -> None:
        """Where each fork task's parent ran, when it ran in a batch (its log at
        ``<batch>/logs/<run>.jsonl``): the server and slot of its last ``running`` line, the
        first place to look for its prefix (a slot that may still hold it, a server whose
        folder holds its saved slot). A parent's manifest that cannot be read is skipped: it
        only orders the queue."""
        read: dict[Path, dict[str, dict[str, Any]]] = {}
        for spec in self.queue:
            task = spec.task
            if not isinstance(task, ForkTask):
                continue
            parent = Path(task.parent)
            folder = parent.parent.parent
            if parent.parent.name != "logs" or not (folder / "manifest.ndjson").is_file():
                continue
            if folder not in read:
                try:
                    read[folder] = read_manifest(folder)
                except SessionError:
                    read[folder] = {}
            entry = read[folder].get(parent.stem, {})
            server, slot = entry.get("server"), entry.get("slot")
            if isinstance(server, str) and isinstance(slot, int):
                self.home.setdefault(self._prefix(spec), (server.rstrip("/"), slot))

    def snapshot(self, finished: bool = False) -> BatchProgress:
        """The counters now."""
        with self.cond:
            return BatchProgress(
                total=self.total,
                done=self.done,
                skipped=self.skipped,
                failed=len(self.failures),
                running=self.running,
                slots=sum(n for url, n in self.slots_of.items() if url not in self.down),
                servers_down=len(self.down),
                tokens=self.tokens,
                elapsed_s=time.monotonic() - self.started,
                failures=tuple(self.failures),
                stopped=self.stop.is_set(),
                finished=finished,
            )

    def notify(self, finished: bool = False) -> None:
        """Give the progress hook a snapshot (:func:`~boxmaker.events.guarded`: a hook that
        raises an error is said once and the batch goes on). While :attr:`deferred` (every
        executor, while it runs), a change is only marked, and the executor's loop on the
        caller's thread gives it (:meth:`flush`) between its steps: a hook called on a worker
        ran under the batch's lock (a slow display held every worker) and, raising, left its
        run marked running and the batch waiting for it without end; a Ctrl-C inside a hook
        called while the driver took or booked a run lost that run's place."""
        if self.on_progress is None:
            return
        if self.deferred and not finished:
            self.changed = True
            return
        self.changed = False
        self.on_progress(self.snapshot(finished))

    def flush(self) -> None:
        """On the caller's thread, between the executor's steps: give the hook the snapshot
        when something changed since the last one, :data:`FLUSH_S` after it at the soonest
        (a Ctrl-C inside the hook is the executor's Ctrl-C)."""
        if not self.changed or self.on_progress is None:
            return
        now = time.monotonic()
        if now - self._flushed < FLUSH_S:
            return
        self.changed, self._flushed = False, now
        self.on_progress(self.snapshot())

    def pop(self, url: str, slot: int) -> RunSpec | None:
        """The next run for ``url``'s ``slot`` (marked running), or ``None`` when none waits.

        Cache affinity: a run whose prefix (a fork task's parent, or a run's own log when it
        continues) last ran on this slot comes first, then a run whose prefix ran nowhere in
        this batch yet, then any: forks of one parent follow each other on one slot, where its
        prefix stays warm. The manifest's ``running`` line says ``affinity: "slot"`` for a
        run placed on the slot that held its prefix."""
        with self.cond:
            if self.stop.is_set() or url in self.down or not self.queue:
                return None
            here = (url, slot)
            window = itertools.islice(self.queue, AFFINITY_WINDOW)
            homes = [self.home.get(self._prefix(spec)) for spec in window]
            at = next((i for i, h in enumerate(homes) if h == here), None)
            if at is None:
                at = next((i for i, h in enumerate(homes) if h is None), 0)
            spec = self.queue[at]
            del self.queue[at]
            affinity = {"affinity": "slot"} if homes[at] == here else {}
            self.home[self._prefix(spec)] = self.home[self._own(spec)] = here
            self.running += 1
            self.book.write(
                spec.id,
                "running",
                server=url,
                slot=slot,
                attempt=self.tries.get(spec.id, 0) + 1,
                **affinity,
            )
        self.notify()
        return spec

    def _prefix(self, spec: RunSpec) -> str:
        """The log whose prefix ``spec``'s first request extends: a fork task's parent, else
        the run's own log (found once per run: pop() asks it of every run in its window)."""
        key = self._prefixes.get(spec.id)
        if key is None:
            task = spec.task
            if isinstance(task, ForkTask):
                key = self.resolved.get(str(task.parent))
                if key is None:
                    key = self.resolved[str(task.parent)] = str(Path(task.parent).resolve())
            else:
                key = self._own(spec)
            self._prefixes[spec.id] = key
        return key

    def _own(self, spec: RunSpec) -> str:
        return str(self.logs_root / f"{spec.id}.jsonl")

    def take(self, url: str, slot: int) -> RunSpec | None:
        """Like :meth:`pop`, but waits while runs are in flight (they may come back)."""
        with self.cond:
            while True:
                spec = self.pop(url, slot)
                if spec is not None or self.stop.is_set() or url in self.down:
                    return spec
                if not self.running:
                    return None
                self.cond.wait(0.5)

    def add_tokens(self, event: TurnEvent | Record) -> None:
        """The hook of thread-executor runs: count generated tokens."""
        if isinstance(event, Usage):
            with self.cond:
                self.tokens += int(event.timings.get("predicted_n", 0))
            self.notify()

    def settle(self, spec: RunSpec, url: str, outcome: RunOutcome) -> None:
        """Book an attempt's outcome: done, failed, back to the queue, or interrupted."""
        warm = {} if outcome.warm is None else {"warm": outcome.warm}
        if outcome.warm_detail:
            warm["warm_detail"] = outcome.warm_detail
        with self.cond:
            self.running -= 1
            if outcome.state == "done":
                self.done += 1
                turns, last = outcome.turns, outcome.outcome
                self.book.write(spec.id, "done", turns=turns, outcome=last, **warm)
            elif outcome.state == "cancelled":
                self.book.write(spec.id, "interrupted", turns=outcome.turns, **warm)
            elif outcome.state == "server_down":
                if url not in self.down:
                    self.down.add(url)
                    self.book.write(None, "server_down", server=url, reason=outcome.reason)
                self.book.write(spec.id, "retry", reason=f"server down: {outcome.reason}", **warm)
                self.queue.appendleft(spec)
            else:
                self.tries[spec.id] = tries = self.tries.get(spec.id, 0) + 1
                if tries >= self.max_tries:
                    reason = f"failed {tries} times; last: {outcome.reason}"
                    self.failures.append((spec.id, reason))
                    self.book.write(spec.id, "failed", reason=reason, turns=outcome.turns, **warm)
                else:
                    self.book.write(spec.id, "retry", reason=outcome.reason, **warm)
                    self.queue.append(spec)
            self.cond.notify_all()
        self.notify()

    def give_up_queue(self) -> None:
        """After the workers: runs still queued had no server left (unless stopped)."""
        with self.cond:
            while self.queue and not self.stop.is_set():
                spec = self.queue.popleft()
                reason = "no server left: " + ", ".join(sorted(self.down))
                self.failures.append((spec.id, reason))
                self.book.write(spec.id, "failed", reason=reason)


def _planned(spec: RunSpec) -> dict[str, Any]:
    """The fields of a run's ``planned`` manifest line: ``task``, ``settings``, ``messages``
    (turns to run), ``target`` when the task has one, ``fork`` for a :class:`ForkTask`."""
    task = spec.task
    line: dict[str, Any] = {
        "task": task.id,
        "settings": dict(spec.settings),
        "messages": len(task.turns),
    }
    if task.target is not None:
        line["target"] = dict(task.target)
    if isinstance(task, ForkTask):
        parent = str(Path(task.parent).resolve())
        line["fork"] = {"parent": parent, "at": task.at, "rerun": task.rerun, "replay": task.replay}
    return line


AFFINITY_WINDOW = 256
"""Queued runs :meth:`BatchState.pop` looks through for one whose prefix ran on the asking slot."""
