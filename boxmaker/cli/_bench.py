"""``boxmaker bench``: benchmarks researchers cite, on a local model (:mod:`boxmaker.bench`).

- ``boxmaker bench setup``: install BFCL's package without its dependencies (``pip install
  --no-deps bfcl-eval==VERSION``, into this Python's environment).
- ``boxmaker bench bfcl (--url URL ... | --embedded) [--dir DIR] [--category C ...]
  [--limit N] [--seed S] [--repeats K] [--temperature T] [--grid FILE] [--harness NAME ...]``:
  a BFCL slice through boxmaker's loop as a batch (rerun to resume), scored by BFCL's
  checkers, then the table per category; with ``--harness`` other agent loops too, each
  through the tap on the same server, and their comparison.
- ``boxmaker bench report DIR``: score a bench folder again (offline) and print its tables.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

from ..config import Config, load_config
from ..view import terminal_safe
from ._flags import add_ctx, number, server_ctx

__all__ = ["add_bench", "run_bench"]

HARNESS_HELP = (
    "an agent loop to run the tasks through (repeatable; default boxmaker): boxmaker, "
    "pydantic-ai, openai-agents; with two or more, each in <dir>/<harness> and compared"
)


def add_bench(sub: Any) -> None:
    """Add ``bench`` and its actions to the ``boxmaker`` parser."""
    bench = sub.add_parser("bench", help="benchmarks researchers cite (BFCL), on a local model")
    actions = bench.add_subparsers(dest="action", required=True)
    setup = actions.add_parser(
        "setup", help="install BFCL's package without its dependencies (pip --no-deps)"
    )
    setup.set_defaults(run=_setup)
    bfcl = actions.add_parser(
        "bfcl", help="BFCL v4 categories as batch tasks, scored by BFCL's own checkers"
    )
    bfcl.add_argument("--dir", default="bfcl", help="the bench folder (rerun to resume; ./bfcl)")
    bfcl.add_argument("--url", action="append", help="a llama-server base URL (repeatable)")
    bfcl.add_argument("--embedded", action="store_true", help="run the embedded server")
    bfcl.add_argument(
        "--category",
        action="append",
        help="a BFCL category (repeatable; default all six: simple_python, multiple, parallel, "
        "parallel_multiple, irrelevance, multi_turn_base)",
    )
    bfcl.add_argument("--limit", type=int, default=None, help="entries per category (all)")
    bfcl.add_argument("--seed", type=int, default=None, help="draw the entries with this seed")
    bfcl.add_argument("--repeats", type=int, default=1, help="runs per entry, for pass^k (1)")
    bfcl.add_argument("--temperature", type=float, default=None, help="sampling temperature")
    bfcl.add_argument("--grid", default=None, help="config grid, JSON or TOML: key -> values")
    bfcl.add_argument("--config", default=None, help="base config, TOML")
    bfcl.add_argument(
        "--harness",
        action="append",
        help=HARNESS_HELP,
    )
    number(bfcl, "--parallel", "n_parallel", 2, "embedded: the server's slots")
    bfcl.add_argument("--model", default=None, help="embedded: GGUF (default: shipped model)")
    add_ctx(bfcl, 8192)
    number(bfcl, "--threads", "n_threads", None, "embedded: CPU threads")
    bfcl.set_defaults(run=_bfcl)
    report = actions.add_parser("report", help="score a bench folder again and print its tables")
    report.add_argument("dir", help="the bench folder")
    report.set_defaults(run=_report)


def run_bench(args: argparse.Namespace) -> int:
    """Run the chosen ``bench`` action."""
    code: int = args.run(args)
    return code


def _setup(args: argparse.Namespace) -> int:
    from ..bench import BFCL_VERSION

    command = [sys.executable, "-m", "pip", "install", "--no-deps", f"bfcl-eval=={BFCL_VERSION}"]
    print("boxmaker bench setup: " + " ".join(command[2:]))
    return subprocess.call(command)


def _bfcl(args: argparse.Namespace) -> int:
    from ..batch import TerminalProgress, describe_progress, load_grid
    from ..bench import bfcl_summary, format_summary, run_bfcl, run_harness

    if not args.url and not args.embedded:
        print("boxmaker bench bfcl: give --url URL (one or more) or --embedded", file=sys.stderr)
        return 2
    config = load_config(args.config) if args.config else Config()
    if args.temperature is not None:
        config = config.with_settings(
            {"sampling.temperature": args.temperature}, source="--temperature"
        )
    grid = load_grid(args.grid) if args.grid else None
    harnesses = list(dict.fromkeys(args.harness or ["boxmaker"]))
    categories = tuple(args.category) if args.category else None
    servers: list[Any] = list(args.url or [])
    slice_args: dict[str, Any] = {"limit": args.limit, "seed": args.seed}
    if categories is not None:
        slice_args["categories"] = categories
    failed = False
    with contextlib.ExitStack() as stack:
        if args.embedded:
            from ..server import EmbeddedServer

            n = args.parallel
            embedded = EmbeddedServer(
                args.model, n_ctx=server_ctx(args), n_parallel=n, n_threads=args.threads
            )
            servers.append(stack.enter_context(embedded))
        root = Path(args.dir)
        for harness in harnesses:
            folder = root if len(harnesses) == 1 else root / harness
            print(f"== {harness}: {folder}")
            if harness == "boxmaker":
                progress = TerminalProgress()
                try:
                    result = run_bfcl(
                        folder,
                        servers=servers,
                        repeats=args.repeats,
                        grid=grid,
                        config=config,
                        on_progress=progress,
                        **slice_args,
                    )
                except KeyboardInterrupt:
                    progress.close()
                    print(f"\ninterrupted; run the same command again to resume {folder}")
                    return 130
                finally:
                    progress.close()
                print(describe_progress(result))
                for run, reason in result.failures:
                    print(terminal_safe(f"failed {run}: {reason}"))
                failed = failed or bool(result.failed)
            else:
                run_harness(
                    harness,
                    folder,
                    server=servers[0],
                    repeats=args.repeats,
                    config=config,
                    **slice_args,
                )
            print(terminal_safe(format_summary(bfcl_summary(folder))))
    if len(harnesses) > 1:
        from ..bench import compare_harnesses, format_harnesses

        print("== harnesses, on the same tasks and server")
        print(terminal_safe(format_harnesses(compare_harnesses(root, harnesses))))
    return 1 if failed else 0


def _report(args: argparse.Namespace) -> int:
    from ..bench import bfcl_summary, format_summary, score_bfcl

    score_bfcl(args.dir)
    print(terminal_safe(format_summary(bfcl_summary(args.dir))))
    return 0
