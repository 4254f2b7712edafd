"""The batch runner: many scripted sessions over every slot of every llama-server, resumable.

Example::

    from boxmaker.batch import Task, run_batch, frames
    from boxmaker.demo import demo_registry

    tools = demo_registry()  # the tools the runs may call (Registry() for none)
    tasks = [Task(id="lisbon", messages=("What is the weather in Lisbon?",))]
    grid = {"loop.thinking_tokens": [16, 64], "loop.tool_result_cap": [40, 4000]}
    run_batch(tasks, "runs/b1", servers=["http://127.0.0.1:8080"], registry=tools, grid=grid)
    frames("runs/b1", "turns").groupby(["loop.thinking_tokens"])["outcome"].value_counts()

How it runs:

- Slots: each server's slots are found with ``GET /slots`` (llama.cpp answers one object per
  slot, each with its ``id``), else ``GET /props`` (``total_slots``). One worker per slot
  keeps one run in flight; a run stays on its slot for its whole life (every request carries
  that ``id_slot``, through ``Config(slots=SlotsConfig(main=slot))``), so each session keeps
  its prompt cache.
- Output: ``<batch_dir>/logs/<run id>.jsonl`` (one session log per run, its session id the run
  id) and ``<batch_dir>/manifest.ndjson`` (:class:`~boxmaker.batch._manifest.Manifest`).
  :func:`frames` gives any frame of :mod:`boxmaker.frames` with the task and setting columns
  joined in; ``boxmaker report <batch_dir>`` reads the logs.
- Resume: running the same batch again skips runs whose log is finished (every message has a
  finished turn, :func:`~boxmaker.batch._state.log_state`), continues the others from their logs
  (``Session.open`` repairs a torn tail; the loop answers calls left without results), and
  sends only the messages without a finished turn. A turn cut by a kill has no ``TurnEnd``:
  its message is sent again (the log keeps the cut attempt).
- Ctrl-C (or the ``cancel`` event): in-flight turns are cancelled (the event is every turn's
  cancel token, never cleared: the log gets its ``TurnEnd``), the workers are waited for, then
  ``KeyboardInterrupt`` is raised again (the event returns normally, with ``stopped``); a
  rerun picks up.
- Forks (:class:`ForkTask`): each run forks the parent log at the task's turn into its own
  log (the parent only read) and runs the fork's new turns under the run's setting. Before
  the fork's first request the run's slot is warmed (:func:`boxmaker.cache.warm_fork` pinned
  to it: the slot holds the parent's prefix as far as this process knows, else the parent's
  slot saved at that turn is restored into it, else cold); the manifest's ``warm`` and
  ``warm_detail`` say which. Resume counts only the fork's own turns (after the records its
  ``Forked`` record says were copied); a log left with its baseline alone by a kill is forked
  again.
- Faults: when a turn fails on an inference error, the server is probed (``GET /health``); a
  server that does not answer is given up on for this call, its runs go back to the queue and
  the other servers' slots take them (their logs go on). A run that fails otherwise is tried
  again, up to ``max_tries`` times, then marked ``failed`` with the reason.
- Worker processes (``executor="processes"``): where one process cannot keep up with the
  slots (a GPU server's 64 slots stream faster than one Python process reads), the slots are
  shared out among ``workers`` processes of this machine, each running its slots' runs on
  threads of its own (one client per server in each, its connections kept); this process keeps
  the queue, the tries and the manifest, as with threads, and writes a run's ``done`` line
  after its worker closed (fsynced) its log. The slot leases hold across the processes (their
  lock files). Ctrl-C (or ``cancel``) cancels the in-flight turns in every worker (each log gets
  its ``TurnEnd``), waits for them, then raises ``KeyboardInterrupt`` again. A worker that
  dies is started again; its runs in flight count as failed attempts. Progress comes per
  finished run (no live token count). On Linux the workers are forked (so tools defined in a
  notebook are theirs too, but not this process's other threads: a tool that needs one wants
  threads); elsewhere spawned (tools and tasks must then be importable). A driver killed
  outright takes its workers along (``PR_SET_PDEATHSIG``). ``executor="auto"`` picks them
  from :data:`PROCESSES_FROM` slots (:func:`pick_executor`); threads are the default.
- Ray (``executor="ray"``, the optional extra ``boxmaker[ray]``): the same plan, manifest and
  resume rules; each run is a Ray task that writes its log to ``batch_dir`` (which every node
  must reach, e.g. a shared file system), the driver keeps the slots and the manifest. Ctrl-C
  cancels the tasks (``ray.cancel``): a turn cut that way has no ``TurnEnd`` and is sent
  again on a rerun. Progress comes per finished run (no live token count).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import itertools
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..cache import SlotStore
from ..client import Client
from ..config import Config
from ..errors import ConfigError, ServerError, SessionError
from ..events import TurnEvent, guarded
from ..records import Record, Usage
from ..session import check_folder
from ..tools import Registry
from ._manifest import Manifest, manifest, read_manifest
from ._run import RunOutcome, RunRegistry, discover_slots, run_alone, run_one, tools_of
from ._state import BatchProgress, log_state
from ._tasks import ForkTask, RunSpec, Task, expand, flatten_settings, load_grid, load_tasks

LOGGER = logging.getLogger("boxmaker.batch")

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BatchProgress",
    "ForkTask",
    "ProgressHook",
    "Task",
    "frames",
    "load_grid",
    "load_tasks",
    "manifest",
    "run_batch",
]

ProgressHook = Callable[[BatchProgress], None]
"""Called with a :class:`BatchProgress` after changes, on the thread that called
:func:`run_batch` (the changes of each :data:`FLUSH_S` at most in one call, and once at the
end; throttle further in the display if needed, as :class:`~boxmaker.batch._view.BatchView`
does)."""

FLUSH_S = 0.05
"""Seconds between two calls of a batch's progress hook, at least (but the last)."""


class _HasUrl(Protocol):
    url: str


class _Batch:
    """The shared state of one :func:`run_batch` call: the queue, tries, counters, manifest.

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
"""Queued runs :meth:`_Batch.pop` looks through for one whose prefix ran on the asking slot."""


def _run_threads(
    batch: _Batch,
    slots: Sequence[tuple[str, int]],
    base: Config,
    registry: Registry | RunRegistry,
    stores: Mapping[str, SlotStore],
) -> None:
    """One worker thread per slot; waits for them (Ctrl-C: cancel in-flight turns, wait, and
    raise ``KeyboardInterrupt`` again)."""
    clients = {url: Client(dataclasses.replace(base.client, url=url)) for url, _ in slots}

    def work(url: str, slot: int) -> None:
        while (spec := batch.take(url, slot)) is not None:
            _work_on(batch, spec, url, slot, base, registry, clients[url], stores.get(url))

    # Polling is_alive, not Thread.join: a join cut by Ctrl-C can leave a live thread
    # looking finished (Python 3.11).
    threads: list[threading.Thread] = []
    interrupted = False
    try:
        batch.deferred = True  # the progress hook is called here, on the caller's thread
        for i, slot in enumerate(slots):
            threads.append(threading.Thread(target=work, args=slot, daemon=True))
            threads[-1].name = f"boxmaker-batch-{i}"
            threads[-1].start()
        while any(t.is_alive() for t in threads):
            if batch.stop.is_set():
                _stop(batch)  # the caller's cancel event
            batch.flush()
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if any(t.is_alive() for t in threads):  # Ctrl-C, or an error here: cancel, then
            _stop(batch)  # wait for the workers to book their runs; another Ctrl-C
            while any(t.is_alive() for t in threads):  # does not cut the wait
                try:
                    batch.flush()
                    time.sleep(0.05)
                except KeyboardInterrupt:
                    continue
        batch.deferred = False
        for client in clients.values():
            client.close()
    if interrupted:
        raise KeyboardInterrupt


def _work_on(
    batch: _Batch,
    spec: RunSpec,
    url: str,
    slot: int,
    base: Config,
    registry: Registry | RunRegistry,
    client: Client,
    store: SlotStore | None = None,
) -> None:
    """One attempt at ``spec`` on a worker thread, booked in the batch."""

    try:
        outcome = run_one(
            spec,
            batch.logs_dir,
            url,
            slot,
            base=base,
            registry=registry,
            client=client,
            cancel=batch.stop,
            on_event=batch.add_tokens,
            store=store,
        )
    except BaseException as exc:  # a bug, a config error, or SystemExit from a tool (on a
        # worker thread it exits nothing; uncaught, it left the run marked running and the
        # batch waiting for it without end): the attempt fails, the batch goes on
        outcome = RunOutcome("failed", reason=f"{type(exc).__name__}: {exc}")
    batch.settle(spec, url, outcome)


def _stop(batch: _Batch) -> None:
    """Stop the batch: no new runs, every in-flight turn cancelled (``stop`` is their token)."""
    with batch.cond:
        batch.stop.set()
        batch.cond.notify_all()


def _run_processes(
    batch: _Batch,
    slots: Sequence[tuple[str, int]],
    base: Config,
    registry: Registry | RunRegistry,
    stores: Mapping[str, SlotStore],
    workers: int | None,
) -> None:
    """The slots shared out among worker processes (slot ``i`` to worker ``i % n``), each
    running its runs on threads; this process keeps the queue and the manifest. Ctrl-C:
    cancel in-flight turns in every worker, wait for their outcomes, raise
    ``KeyboardInterrupt`` again.

    Each worker has a pipe of its own each way, and its process sentinel is watched beside
    them: nothing is shared between processes that a worker that dies could leave held (a
    lock of a ``multiprocessing.Queue``, the sleepers of a ``multiprocessing.Event``); a
    cancel goes to each worker down its pipe."""
    context: Any = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    n = max(1, min(workers or os.cpu_count() or 1, len(slots)))
    owner = {slot: i % n for i, slot in enumerate(slots)}
    urls = sorted({url for url, _slot in slots})
    sizes = [sum(1 for k in owner.values() if k == i) for i in range(n)]
    pool: list[_Worker] = []

    def start(i: int) -> _Worker:
        inbox, to_worker = context.Pipe(duplex=False)
        from_worker, outbox = context.Pipe(duplex=False)
        args = (inbox, outbox, batch.logs_dir, base, registry, stores, urls, sizes[i], os.getpid())
        process = context.Process(target=_process_worker, args=args, daemon=True)
        process.name = f"boxmaker-batch-worker-{i}"
        process.start()
        inbox.close()
        outbox.close()
        return _Worker(process, to_worker, from_worker)

    pool += [start(i) for i in range(n)]
    free = list(slots)
    pending: dict[tuple[str, int], RunSpec] = {}
    interrupted = False

    cancelled: list[bool] = []

    def cancel() -> None:  # every worker's turns in flight end (each log gets its TurnEnd)
        if not cancelled:
            cancelled.append(True)
            for worker in pool:
                worker.send(_CANCEL)

    try:
        batch.deferred = True  # the progress hook is called between the steps (flush)
        while True:
            if not batch.stop.is_set():
                free = [s for s in free if s[0] not in batch.down]
                while free and (spec := batch.pop(*free[0])) is not None:
                    where = free.pop(0)
                    pool[owner[where]].send((spec, *where))
                    pending[where] = spec
            batch.flush()
            if not pending:
                break
            if batch.stop.is_set():
                cancel()  # the caller's cancel event
            for i, outcome in _outcomes(pool, 0.2):
                if outcome is None:  # the worker died: its runs in flight failed; again
                    why = f"worker process died (exit code {pool[i].process.exitcode})"
                    for where in [w for w in pending if owner[w] == i]:
                        failed = RunOutcome("failed", reason=why)
                        batch.settle(pending.pop(where), where[0], failed)
                        free.append(where)
                    pool[i].close()
                    pool[i] = start(i)
                    continue
                url, slot, done = outcome
                with batch.cond:
                    batch.tokens += done.tokens
                batch.settle(pending.pop((url, slot)), url, done)
                free.append((url, slot))
    except KeyboardInterrupt:
        interrupted = True
        _stop(batch)
        cancel()
        _collect(batch, pool, pending, owner)
    finally:
        for worker in pool:
            worker.send(_CANCEL)
            worker.send(None)
        for worker in pool:
            worker.process.join(10)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
            worker.close()
        batch.deferred = False
    if interrupted:
        raise KeyboardInterrupt


_CANCEL = "cancel"  # down a worker's pipe: end the turns in flight


@dataclasses.dataclass
class _Worker:
    """A worker process of ``executor="processes"`` and this side of its two pipes."""

    process: Any
    inbox: Any  # runs to it: (spec, url, slot), _CANCEL, or None to end
    outbox: Any  # outcomes from it: (url, slot, RunOutcome)

    def send(self, item: Any) -> None:
        with contextlib.suppress(OSError):  # a worker that died reads nothing any more
            self.inbox.send(item)

    def close(self) -> None:
        self.inbox.close()
        self.outbox.close()


def _outcomes(pool: list[_Worker], timeout: float) -> list[tuple[int, Any]]:
    """The outcomes the workers sent within ``timeout`` seconds, as ``(worker, (url, slot,
    outcome))``, and ``(worker, None)`` for a worker that died."""
    ready = mp_connection.wait(
        [w.outbox for w in pool] + [w.process.sentinel for w in pool], timeout
    )
    got: list[tuple[int, Any]] = []
    for i, worker in enumerate(pool):
        if worker.outbox in ready:
            with contextlib.suppress(EOFError, OSError):
                while worker.outbox.poll():
                    got.append((i, worker.outbox.recv()))
        if worker.process.sentinel in ready and not worker.process.is_alive():
            got.append((i, None))
    return got


def _collect(
    batch: _Batch,
    pool: list[_Worker],
    pending: dict[tuple[str, int], RunSpec],
    owner: Mapping[tuple[str, int], int],
) -> None:
    """After a cancel: book the outcome of every run still in flight (another Ctrl-C does
    not cut the wait; a worker that died gives its runs up)."""
    while pending:
        try:
            got = _outcomes(pool, 0.2)
        except KeyboardInterrupt:
            continue
        for i, outcome in got:
            if outcome is None:
                for where in [w for w in pending if owner[w] == i]:
                    died = RunOutcome("cancelled", reason="worker process died")
                    batch.settle(pending.pop(where), where[0], died)
                continue
            url, slot, done = outcome
            if (url, slot) in pending:
                batch.settle(pending.pop((url, slot)), url, done)


def _die_with(driver: int) -> None:
    """End this worker when the driver (process ``driver``) dies, as a SIGKILL or the OOM
    killer ends it: Linux's ``PR_SET_PDEATHSIG`` (SIGKILL); elsewhere a thread that watches
    the parent's pid. A worker left behind held the manifest's lock (its inherited
    descriptor) and waited on its pipe for ever: the batch could not be run again."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != driver:  # it died before the call
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="boxmaker-batch-driver-watch", daemon=True).start()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _process_worker(
    inbox: Any,
    outbox: Any,
    logs_dir: Path,
    base: Config,
    registry: Registry | RunRegistry,
    stores: Mapping[str, SlotStore],
    urls: Sequence[str],
    threads: int,
    driver: int,
) -> None:
    """A worker process: the runs its inbox gives, each on a thread (at most ``threads`` at
    once: its slots), with one client per server; each outcome goes to ``outbox``. Ctrl-C
    is the driver's to handle (ignored here); :data:`_CANCEL` from the inbox sets the turns'
    cancel event (for good: the batch stops)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with(driver)
    stop = threading.Event()
    sending = threading.Lock()
    clients = {url: Client(dataclasses.replace(base.client, url=url)) for url in urls}

    def one(spec: RunSpec, url: str, slot: int) -> None:
        try:
            outcome = run_one(
                spec,
                logs_dir,
                url,
                slot,
                base=base,
                registry=registry,
                client=clients[url],
                cancel=stop,
                store=stores.get(url),
            )
        except BaseException as exc:  # as on threads (_work_on): the attempt fails, and the
            # driver hears of it (uncaught, it waited for this run's outcome without end)
            outcome = RunOutcome("failed", reason=f"{type(exc).__name__}: {exc}")
        with sending:
            outbox.send((url, slot, outcome))

    with ThreadPoolExecutor(max(1, threads), thread_name_prefix="boxmaker-batch") as pool:
        while (item := inbox.recv()) is not None:
            if item == _CANCEL:
                stop.set()
            else:
                pool.submit(one, *item)
    for client in clients.values():
        client.close()


def _import_ray() -> Any:
    """The ``ray`` module (the optional extra ``boxmaker[ray]``).

    Raises:
        ConfigError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as exc:
        raise ConfigError('executor="ray" needs Ray: pip install "boxmaker[ray]"') from exc
    return ray


def _run_ray(
    ray: Any,
    batch: _Batch,
    slots: Sequence[tuple[str, int]],
    base: Config,
    registry: Registry | RunRegistry,
    address: str | None,
    stores: Mapping[str, SlotStore],
) -> None:
    """Each run a Ray task (``ray.init(address)`` unless Ray is initialised already); the
    driver keeps the slots, the queue and the manifest."""
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False)
    task = ray.remote(num_cpus=0, max_retries=0)(run_alone)
    free = list(slots)
    pending: dict[Any, tuple[RunSpec, str, int]] = {}
    batch.deferred = True  # the progress hook is called between the steps (flush)
    try:
        while True:
            free = [s for s in free if s[0] not in batch.down]
            while free and (spec := batch.pop(*free[0])) is not None:
                url, slot = free.pop(0)
                ref = task.remote(spec, batch.logs_dir, url, slot, base, registry, stores.get(url))
                pending[ref] = (spec, url, slot)
            batch.flush()
            if not pending:
                break
            if batch.stop.is_set():  # the caller's cancel event
                _cancel_ray(ray, batch, pending)
                return
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.2)
            for ref in ready:
                spec, url, slot = pending.pop(ref)
                outcome = _ray_outcome(ray, ref)
                with batch.cond:
                    batch.tokens += outcome.tokens
                batch.settle(spec, url, outcome)
                free.append((url, slot))
    except KeyboardInterrupt:
        _cancel_ray(ray, batch, pending)
        raise
    finally:
        batch.deferred = False


def _cancel_ray(ray: Any, batch: _Batch, pending: dict[Any, tuple[RunSpec, str, int]]) -> None:
    """Stop the batch and cancel its Ray tasks (a ``KeyboardInterrupt`` inside each: the turn
    in flight is left without its ``TurnEnd`` and sent again on a rerun); book each one."""
    _stop(batch)
    for ref in pending:
        ray.cancel(ref)
    for ref, (spec, url, _slot) in pending.items():
        outcome = _ray_outcome(ray, ref)
        if outcome.state == "failed":  # the cancel, as Ray reports it
            outcome = RunOutcome("cancelled", reason=outcome.reason)
        batch.settle(spec, url, outcome)
    pending.clear()


def _ray_outcome(ray: Any, ref: Any) -> RunOutcome:
    """A finished Ray task's :class:`RunOutcome`; a task that raised is a failed attempt."""
    try:
        outcome: RunOutcome = ray.get(ref)
    except Exception as exc:  # Ray wraps the task's exception (or the cancel) in its own
        return RunOutcome("failed", reason=f"{type(exc).__name__}: {exc}")
    return outcome


def run_batch(
    tasks: Any,
    batch_dir: str | Path,
    *,
    servers: Sequence[str | _HasUrl],
    registry: Registry | RunRegistry,
    grid: Mapping[str, Sequence[Any]] | None = None,
    config: Config | None = None,
    max_tries: int = 3,
    executor: str = "threads",
    workers: int | None = None,
    ray_address: str | None = None,
    on_progress: ProgressHook | None = None,
    cancel: threading.Event | None = None,
) -> BatchProgress:
    """Run every task under every grid setting, as many at once as there are slots.

    Args:
        tasks: :class:`Task` and :class:`ForkTask` objects, mappings, a DataFrame or a JSON
            Lines path (:func:`~boxmaker.batch.load_tasks`); a fork task's parent is read
            here (its turns, :meth:`ForkTask.resolve`).
        batch_dir: the batch's directory (logs in ``logs/``, ``manifest.ndjson``); run the
            same batch into it again to resume.
        servers: llama-server base URLs, or objects with a ``url`` (an
            :class:`~boxmaker.server.EmbeddedServer`; one with a ``slot_save_path`` is where
            a fork finds its parent's saved slots).
        registry: the tools the runs may call (a task's ``tools`` picks among them;
            ``Registry()`` for none, ``boxmaker.demo.demo_registry()`` for the demo's), or a
            function giving each run a registry of its own (called with the run's id and task
            when the run starts, and once here to check the task's tools).
        grid: dotted config keys to lists of values; one run per task and combination.
        config: the base config (default ``Config()``); its ``client`` settings (timeouts,
            retries) apply to every server.
        max_tries: attempts of a failing run before it is marked failed.
        executor: ``"threads"`` (the default: one thread per slot, here), ``"processes"``
            (the slots shared out among ``workers`` processes of this machine, each with a
            thread per slot of its share: where one process cannot keep up with the slots),
            ``"ray"`` (one Ray task per run), or ``"auto"``: processes where ``workers`` is
            given, or the servers have :data:`PROCESSES_FROM` slots or more in all on a
            machine where this process may use more than one CPU and workers are forked
            (Linux), else threads (:func:`pick_executor`). Threads on that many slots say
            once (the ``boxmaker.batch`` logger) that processes would keep them busier. In
            worker processes the tools run there, forked from this process without its
            other threads: state a tool keeps in memory is the worker's copy, and a tool that
            needs a thread of this process (an event loop another thread runs, as an MCP
            port's) cannot get its answer there: such tools want threads. A fork task's
            first run on a slot does not know what the slot holds from an earlier batch in
            worker processes (it restores the parent's saved slot, or runs cold).
        workers: ``executor="processes"``: how many worker processes (default: the CPU
            count, at most one per slot).
        ray_address: ``ray.init(address=...)``: ``"auto"`` joins a running cluster, ``None``
            starts a local instance (unless Ray is initialised already).
        on_progress: called with a :class:`BatchProgress` on every change, and once at the end
            (``finished``), on this thread, between the executor's steps (the changes of
            :data:`FLUSH_S` at most in one snapshot); one that raises an error is said once
            on the ``boxmaker.batch`` logger and the batch goes on; Ctrl-C inside it is
            Ctrl-C.
            A ``SystemExit`` (or any error) raised on a worker by a run's tools is a failed
            attempt of that run.
        cancel: set it to stop like Ctrl-C (the call then returns, ``stopped``).

    Returns:
        The last :class:`BatchProgress` (runs done, skipped, failed with reasons).

    Raises:
        ConfigError: a malformed task, grid or config, an unknown tool name, a fork task's
            parent that cannot be read or has no such turn, an unknown executor, or Ray
            missing for ``executor="ray"``.
        ServerError: no server's slots could be read.
        SessionError: another runner holds this batch directory.
        KeyboardInterrupt: after Ctrl-C, once the in-flight turns are cancelled.
    """
    if executor not in ("auto", "threads", "processes", "ray"):
        raise ConfigError(
            f"executor must be 'auto', 'threads', 'processes' or 'ray', not {executor!r}"
        )
    ray = _import_ray() if executor == "ray" else None
    base = config or Config()
    loaded = [t.resolve() if isinstance(t, ForkTask) else t for t in load_tasks(tasks)]
    runs = expand(loaded, grid, base)  # each run's settings resolved here, once
    for spec in runs:
        offered = spec.task.tools if isinstance(spec.task, Task) else None
        missing = set(offered or ()) - set(tools_of(registry, spec).names)
        if missing:
            raise ConfigError(f"task {spec.task.id}: unknown tools {sorted(missing)}")
    slots: list[tuple[str, int]] = []
    problems: list[str] = []
    urls = [(s if isinstance(s, str) else s.url).rstrip("/") for s in servers]
    stores = {url: _store_of(server) for url, server in zip(urls, servers, strict=True)}
    for url in dict.fromkeys(urls):  # a server named twice still has its slots once
        try:
            slots += [(url, slot) for slot in discover_slots(url, api_key=base.client.api_key)]
        except ServerError as exc:
            problems.append(str(exc))
    if not slots:
        raise ServerError("no server to run on: " + ("; ".join(problems) or "none given"))
    root = Path(batch_dir)
    book = Manifest(root, secrets=[base.client.api_key, *_grid_keys(grid)])
    try:
        for problem in problems:
            book.write(None, "server_down", reason=problem)
        check_folder(root / "logs", what="batch logs folder")
        batch = _Batch(
            runs, root / "logs", book, max_tries, on_progress, cancel or threading.Event()
        )
        for url, _slot in slots:
            batch.slots_of[url] = batch.slots_of.get(url, 0) + 1
        batch.notify()
        if executor == "auto":
            executor = pick_executor(len(slots), workers)
        elif executor == "threads" and pick_executor(len(slots)) == "processes":
            LOGGER.warning(
                "%d slots on threads in one process, which may not keep them busy: "
                'executor="auto" (or "processes") shares them out among worker processes '
                "(tools then run there; see run_batch's executor)",
                len(slots),
            )
        try:
            if ray is not None:
                _run_ray(ray, batch, slots, base, registry, ray_address, stores)
            elif executor == "processes":
                _run_processes(batch, slots, base, registry, stores, workers)
            else:
                _run_threads(batch, slots, base, registry, stores)
            batch.give_up_queue()
        finally:
            batch.notify(finished=True)
    finally:
        book.close()
    return batch.snapshot(finished=True)


PROCESSES_FROM = 32
"""Slots (all servers together) from which ``executor="auto"`` runs the batch in worker
processes: on a stand-in GPU-rate server (``benchmarks/gpu_rate.py``, 1,000 tokens/s a slot,
32-token answers, 2 cores) one process's threads kept 0.95-0.99 of a bare asyncio client's
slot use at 8 and 16 slots (worker processes: 0.74-1.21, no better) but 0.56-0.80 at 32 and
0.62 at 64, where worker processes kept 1.03-1.08 and 1.02-1.36."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, as ``taskset`` or a scheduler's
    cgroup set it, where the platform tells; else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def pick_executor(slots: int, workers: int | None = None) -> str:
    """The executor ``executor="auto"`` runs a batch of ``slots`` slots (all servers
    together) with: ``"processes"`` where ``workers`` is given, or where ``slots`` is at least
    :data:`PROCESSES_FROM` and this process may use more than one CPU (:func:`usable_cpus`)
    on a platform that forks its workers (Linux: tools defined in a notebook reach them);
    else ``"threads"`` (one process; progress counts tokens live)."""
    if workers is not None:
        return "processes"
    forks = sys.platform == "linux"
    many = slots >= PROCESSES_FROM and usable_cpus() > 1
    return "processes" if forks and many else "threads"


def _store_of(server: str | _HasUrl) -> SlotStore:
    """The saved slots of a server, for forks: the local folder of an
    :class:`~boxmaker.server.EmbeddedServer` started with ``slot_save_path``, else the
    server's own (restores are asked of it; one without ``--slot-save-path`` says so, and the
    fork runs cold)."""
    folder = getattr(server, "slot_save_path", None)
    return SlotStore(Path(folder) if isinstance(folder, str | os.PathLike) else None)


def _grid_keys(grid: Mapping[str, Sequence[Any]] | None) -> list[str]:
    """The api keys a grid sets (``client.api_key``: each value), to hide in the manifest."""
    values = flatten_settings(grid or {}, "grid").get("client.api_key") or []
    return [v for v in values if isinstance(v, str)]


def frames(batch_dir: str | Path, name: str = "turns") -> pd.DataFrame:
    """A frame of :mod:`boxmaker.frames` (``requests``, ``turns``, ``cache_losses``,
    ``limit_hits``, ``tool_calls``, ``summary``, ``forks``) over a batch's logs, with ``run``,
    ``task`` and the grid setting columns of :func:`manifest` joined in by session id, so
    results can be grouped by task and setting (in a batch of :class:`ForkTask` runs, the forks
    of one parent by setting: ``forks`` has one row per run, its own usage beside the
    parent's). A fork's log holds its parent's records up to the fork point: their rows carry
    ``from_parent`` (true) and the ``summary`` totals leave them out (``inherited_turns``,
    ``inherited_requests`` count them), so sums over the runs count each completion once.

    Raises:
        ConfigError: ``name`` is not a frame.
        SessionError: the manifest is missing or unreadable.
    """
    from .. import frames as log_frames

    names = ("requests", "turns", "cache_losses", "limit_hits", "tool_calls", "summary", "forks")
    if name not in names:
        raise ConfigError(f"frame {name!r} is none of {', '.join(names)}")
    runs = manifest(batch_dir)  # first: a folder that is no batch's is said as such
    frame = getattr(log_frames, name)(Path(batch_dir) / "logs")
    keep = [
        c
        for c in runs.columns
        if c
        not in (
            "state",
            "server",
            "slot",
            "attempts",
            "turns",
            "outcome",
            "reason",
            "warm",
            "warm_detail",
        )
    ]
    runs = runs[keep]
    frame = frame.assign(run=frame["session"].astype(str))
    joined: pd.DataFrame = frame.merge(runs, on="run", how="left")
    return joined
