"""Benchmark: BFCL v4 on a local model through three agent harnesses, and the recordings the
offline tests replay.

Runs a BFCL slice (``--limit`` entries per category, drawn with ``--seed``) on one server (the
embedded one with the shipped model, or ``--model`` / ``BOXMAKER_TEST_MODEL``'s GGUF) through
boxmaker's loop (a batch) and through pydantic-ai and the OpenAI Agents SDK pointed at the tap,
scores every run by BFCL's own checkers, and prints the per-category table of each harness
and their comparison (accuracy and re-processed tokens per task, with intervals):

    python benchmarks/bfcl.py --dir runs/bfcl [--limit 5] [--seed 0] [--parallel 1]

With ``--record DIR`` the boxmaker loop's traffic is recorded into ``DIR/bfcl-boxmaker.yaml``
(a cassette the offline tests replay through the batch), each other harness's through the
tap's cassette into ``DIR/<harness>/<run>.yaml``; the bench folder itself (logs, manifest,
``runs.ndjson``) is what the offline tests score again.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

from boxmaker.bench import (
    bfcl_summary,
    compare_harnesses,
    format_harnesses,
    format_summary,
    run_bfcl,
    run_harness,
)
from boxmaker.cassettes import use_cassette
from boxmaker.server import EmbeddedServer

HARNESSES = ("boxmaker", "pydantic-ai", "openai-agents")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", required=True, help="the bench root (one folder per harness)")
    parser.add_argument("--limit", type=int, default=5, help="entries per category (5)")
    parser.add_argument("--seed", type=int, default=None, help="draw the entries with it")
    parser.add_argument("--category", action="append", help="a BFCL category (default all)")
    parser.add_argument("--model", default=None, help="GGUF (default: the shipped model)")
    parser.add_argument("--ctx", type=int, default=8192, help="context per slot (8192)")
    parser.add_argument("--parallel", type=int, default=1, help="the server's slots (1)")
    parser.add_argument("--record", default=None, help="record the cassettes into this folder")
    parser.add_argument("--harness", action="append", help="harnesses (default all three)")
    args = parser.parse_args()
    root = Path(args.dir)
    harnesses = tuple(args.harness or HARNESSES)
    sliced = {"limit": args.limit, "seed": args.seed}
    if args.category:
        sliced["categories"] = tuple(args.category)
    record = Path(args.record) if args.record else None
    with EmbeddedServer(
        args.model, n_ctx=args.ctx * args.parallel, n_parallel=args.parallel
    ) as server:
        for harness in harnesses:
            started = time.monotonic()
            folder = root / harness
            if harness == "boxmaker":
                with contextlib.ExitStack() as stack:
                    if record is not None:
                        record.mkdir(parents=True, exist_ok=True)
                        stack.enter_context(use_cassette(record / "bfcl-boxmaker.yaml", "all"))
                    run_bfcl(folder, servers=[server], **sliced)
            else:
                cassettes = None if record is None else record / harness
                run_harness(harness, folder, server=server, cassette_dir=cassettes, **sliced)
            print(f"== {harness} ({time.monotonic() - started:.0f} s)")
            print(format_summary(bfcl_summary(folder)))
    if len(harnesses) > 1:
        print("== harnesses, on the same tasks and server")
        print(format_harnesses(compare_harnesses(root, harnesses)))


if __name__ == "__main__":
    main()
