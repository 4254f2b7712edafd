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

import logging
import os
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from ..cache import SlotStore
from ..config import Config
from ..errors import ConfigError, ServerError
from ..session import check_folder
from ..tools import Registry
from ._executors import import_ray, run_processes, run_ray, run_threads
from ._manifest import Manifest, manifest
from ._queue import BatchState, ProgressHook
from ._run import RunRegistry, discover_slots, tools_of
from ._state import BatchProgress
from ._tasks import ForkTask, Task, expand, flatten_settings, load_grid, load_tasks

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


class _HasUrl(Protocol):
    url: str


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
    ray = import_ray() if executor == "ray" else None
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
        batch = BatchState(
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
        batch.deferred = True  # the hook is called between the executor's steps (flush)
        try:
            if ray is not None:
                run_ray(ray, batch, slots, base, registry, ray_address, stores)
            elif executor == "processes":
                run_processes(batch, slots, base, registry, stores, workers)
            else:
                run_threads(batch, slots, base, registry, stores)
            batch.give_up_queue()
        finally:
            batch.deferred = False
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
