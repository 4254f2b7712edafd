"""Scoring and comparing at batch scale: 10,000 tasks x 8 settings (80,000 runs).

Scores every run with a target scorer (answer and trajectory matched on synthetic records: the
Python part, once per run, reported as ``score_us_per_run``), then compares the 8 settings from
the scores frame with the paired bootstrap (2,000 resamples over the 10,000 tasks). The last
line is ``compare_s X.XX``: the comparison of the scored runs (frame to table, the bootstrap
included); goal <= 2 s on the project's 2-core machine.

    python benchmarks/compare.py [--tasks 10000] [--settings 8] [--resamples 2000]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pandas as pd

from boxmaker.batch import compare_frame
from boxmaker.records import Assistant, ToolCall, User
from boxmaker.score import apply, parse_target, target_scorer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--settings", type=int, default=8)
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    scorer = target_scorer(
        parse_target(
            {
                "answer": {"contains": "34 C"},
                "calls": [{"name": "get_weather", "arguments": {"city": "Lisbon"}}],
            }
        )
    )
    good = ToolCall(id="c", name="get_weather", arguments='{"city": "Lisbon"}')
    bad = ToolCall(id="c", name="get_weather", arguments='{"city": "Lisboa"}')
    runs = [
        (User(content="q"), Assistant(content=None, tool_calls=(call,)), Assistant(content=text))
        for call in (good, bad)
        for text in ("In Lisbon it is 34 C.", "It is 12 C.")
    ]
    n = args.tasks * args.settings
    picks = rng.integers(0, len(runs), n)
    start = time.perf_counter()
    values = [apply(scorer, runs[i]).value for i in picks]
    scored_s = time.perf_counter() - start
    settings = np.repeat(np.arange(args.settings), args.tasks)
    frame = pd.DataFrame(
        {
            "run": [
                f"t{t}.{s}"
                for s, t in zip(
                    settings, np.tile(np.arange(args.tasks), args.settings), strict=True
                )
            ],
            "task": np.tile(np.arange(args.tasks), args.settings),
            "setting.value": settings,
            "scorer": "target",
            "value": values,
        }
    )
    start = time.perf_counter()
    table = compare_frame(frame, by="setting.value", resamples=args.resamples, seed=0)
    compare_s = time.perf_counter() - start
    print(
        json.dumps(
            {
                "runs": n,
                "settings": args.settings,
                "resamples": args.resamples,
                "score_s": round(scored_s, 3),
                "score_us_per_run": round(scored_s / n * 1e6, 1),
                "widest_interval": round(float((table.success_high - table.success_low).max()), 4),
            }
        )
    )
    print(f"compare_s {compare_s:.2f}")


if __name__ == "__main__":
    main()
