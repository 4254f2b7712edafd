"""Benchmark: how long ``boxmaker --help`` and ``import boxmaker`` take, as whole processes.

Each measurement starts a new Python process (the interpreter of this run, with this
checkout first on ``PYTHONPATH``), so it counts what a user waits for: the interpreter's own
start, ``site``, and every module boxmaker imports. Two commands:

- help: ``from boxmaker.cli import main; main(["--help"])``, what the ``boxmaker`` console
  script runs for ``boxmaker --help`` (output thrown away);
- import: ``import boxmaker``.

A process's time is its CPU time (user + system, from :func:`resource.getrusage` of the
children): on a shared machine the wall time also counts the other processes' turns, while
the CPU time is what the start costs (on an idle machine the two agree within a few ms, as
the start is single-threaded and reads warm files). The median of ``--repeat`` runs is
reported, the runs of the two commands alternating; the wall-time medians are given too.

The last line printed is::

    help_s X.XX import_s Y.YY (wall: help_s .. import_s ..; N runs each)

Goal: ``help_s <= 0.30`` and ``import_s <= 0.50`` (issue 21).

Run: ``PYTHONPATH=. python benchmarks/startup.py [--repeat 9]`` (from the repo root).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = {
    "help": "from boxmaker.cli import main; main(['--help'])",
    "import": "import boxmaker",
}


def run_once(code: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one ``python -c code`` process; raises on a failure."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    """Measure both commands ``--repeat`` times each and print the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=9, help="processes per command (9)")
    args = parser.parse_args()
    cpu: dict[str, list[float]] = {name: [] for name in COMMANDS}
    wall: dict[str, list[float]] = {name: [] for name in COMMANDS}
    run_once(COMMANDS["import"])  # warm the file cache and the .pyc files
    for _ in range(args.repeat):
        for name, code in COMMANDS.items():
            c, w = run_once(code)
            cpu[name].append(c)
            wall[name].append(w)
    for name in COMMANDS:
        print(f"{name}: cpu {sorted(round(t, 3) for t in cpu[name])}")
    med = {name: statistics.median(cpu[name]) for name in COMMANDS}
    wmed = {name: statistics.median(wall[name]) for name in COMMANDS}
    print(
        f"help_s {med['help']:.2f} import_s {med['import']:.2f} "
        f"(wall: help_s {wmed['help']:.2f} import_s {wmed['import']:.2f}; {args.repeat} runs each)"
    )


if __name__ == "__main__":
    main()
