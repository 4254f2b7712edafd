"""Benchmark: runs per second of a batch on the embedded server with 1 slot and with N slots.

Each run is the demo session (``boxmaker.demo.DEMO_PROMPTS``, one turn each, with the demo
tools) on the shipped tiny model. The same batch runs twice, into fresh directories, on an
embedded server with the same CPU threads: once with 1 slot, once with ``--slots`` slots (each
slot ``--ctx`` tokens of context). llama.cpp decodes the sequences of busy slots together in one
batch, so more slots give more runs per second until the CPU is full.

    python benchmarks/batch.py [--runs 32] [--slots 4] [--threads 1] [--ctx 4096]

Prints one line per setting (runs, seconds, runs/s, generated tokens/s, and the CPU this
process used per second of wall time: the embedded server and the runner share it); the
last line is
``speedup X.XX``: runs per second with ``--slots`` slots divided by runs per second with 1
(goal: at least 2.0).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from boxmaker.batch import Task, run_batch
from boxmaker.demo import DEMO_PROMPTS, DEMO_SYSTEM, demo_registry
from boxmaker.server import EmbeddedServer


def measure(runs: int, slots: int, threads: int, ctx: int) -> float:
    """Runs per second of ``runs`` demo sessions on a server with ``slots`` slots."""
    tasks = [
        Task(id=f"demo{i:03d}", messages=DEMO_PROMPTS, system=DEMO_SYSTEM) for i in range(runs)
    ]
    with (
        EmbeddedServer(n_ctx=ctx * slots, n_parallel=slots, n_threads=threads) as server,
        tempfile.TemporaryDirectory() as folder,
    ):
        started, cpu = time.perf_counter(), os.times()
        progress = run_batch(tasks, folder, servers=[server], registry=demo_registry())
        seconds = time.perf_counter() - started
        after = os.times()
    busy = (after.user + after.system - cpu.user - cpu.system) / seconds
    assert progress.done == runs and not progress.failed, progress.failures
    rate = runs / seconds
    print(
        f"{slots} slot(s): {runs} runs in {seconds:.1f} s, {rate:.2f} runs/s, "
        f"{progress.tokens / seconds:.0f} generated tokens/s, "
        f"{busy:.2f} cores busy in this process (server and runner)",
        flush=True,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=32, help="runs (demo sessions) per setting")
    parser.add_argument("--slots", type=int, default=4, help="slots of the second setting")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of llama.cpp")
    parser.add_argument("--ctx", type=int, default=4096, help="context per slot in tokens")
    args = parser.parse_args()
    one = measure(args.runs, 1, args.threads, args.ctx)
    many = measure(args.runs, args.slots, args.threads, args.ctx)
    print(f"speedup {many / one:.2f}")


if __name__ == "__main__":
    main()
