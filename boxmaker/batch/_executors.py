"""Where a batch's runs run: threads of this process (one per slot), worker processes of this
machine (the slots shared out among them, each with a thread per slot of its share), or Ray
tasks. Each takes runs from the :class:`~boxmaker.batch._queue.BatchState`, runs them with
:func:`~boxmaker.batch._run.run_one`, books their outcomes there, and gives the progress hook
its turn between its steps; :func:`~boxmaker.batch.run_batch` (``_runner``) says what each
keeps and how Ctrl-C stops it."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import connection as mp_connection
from pathlib import Path
from typing import Any

from ..cache import SlotStore
from ..client import Client
from ..config import Config
from ..errors import ConfigError
from ..tools import Registry
from ._queue import BatchState
from ._run import RunOutcome, RunRegistry, run_alone, run_one
from ._tasks import RunSpec

__all__ = ["import_ray", "run_processes", "run_ray", "run_threads", "stop_batch"]


def run_threads(
    batch: BatchState,
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
        for i, slot in enumerate(slots):
            threads.append(threading.Thread(target=work, args=slot, daemon=True))
            threads[-1].name = f"boxmaker-batch-{i}"
            threads[-1].start()
        while any(t.is_alive() for t in threads):
            if batch.stop.is_set():
                stop_batch(batch)  # the caller's cancel event
            batch.flush()
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if any(t.is_alive() for t in threads):  # Ctrl-C, or an error here: cancel, then
            stop_batch(batch)  # wait for the workers to book their runs; another Ctrl-C
            while any(t.is_alive() for t in threads):  # does not cut the wait
                try:
                    batch.flush()
                    time.sleep(0.05)
                except KeyboardInterrupt:
                    continue
        for client in clients.values():
            client.close()
    if interrupted:
        raise KeyboardInterrupt


def _work_on(
    batch: BatchState,
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


def stop_batch(batch: BatchState) -> None:
    """Stop the batch: no new runs, every in-flight turn cancelled (``stop`` is their token)."""
    with batch.cond:
        batch.stop.set()
        batch.cond.notify_all()


def run_processes(
    batch: BatchState,
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
        stop_batch(batch)
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
    batch: BatchState,
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


def import_ray() -> Any:
    """The ``ray`` module (the optional extra ``boxmaker[ray]``).

    Raises:
        ConfigError: Ray is not installed.
    """
    try:
        import ray
    except ImportError as exc:
        raise ConfigError('executor="ray" needs Ray: pip install "boxmaker[ray]"') from exc
    return ray


def run_ray(
    ray: Any,
    batch: BatchState,
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


def _cancel_ray(ray: Any, batch: BatchState, pending: dict[Any, tuple[RunSpec, str, int]]) -> None:
    """Stop the batch and cancel its Ray tasks (a ``KeyboardInterrupt`` inside each: the turn
    in flight is left without its ``TurnEnd`` and sent again on a rerun); book each one."""
    stop_batch(batch)
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
