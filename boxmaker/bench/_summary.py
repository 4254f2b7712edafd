"""The tables of a scored bench: accuracy per category with intervals, BFCL's overall figure,
pass^k, beside boxmaker's costs.

Accuracy per (setting, category) is the mean over entries of each entry's mean score over its
repeats; its interval is a percentile bootstrap over entries
(:func:`boxmaker.score.paired_bootstrap`, seeded). pass^k (with k repeats) is the share of
entries right in all k runs. BFCL's overall figure is BFCL's own formula
(``generate_leaderboard_csv``): non-live = the unweighted mean of simple (itself the mean of
Python, Java and JavaScript), multiple, parallel and parallel-multiple; irrelevance = the mean
of non-live and live irrelevance; multi-turn = the mean of its four categories; overall = the
10/10/10/30/40 weighting of non-live, live, irrelevance, multi-turn and agentic. A category not
run counts 0 there, as BFCL counts it, so the overall of a slice is a floor: ``categories_run``
says how many of BFCL's scored categories it holds.

The costs are means per run from the batch's summary frame: prompt tokens processed, prefill
time, lost tokens (:mod:`boxmaker.cache`'s one loss rule), re-processed tokens
(:func:`reprocessed_in`: consecutive completions' timings, by :func:`boxmaker.cache.reprocessed`),
limit hits (leaving out
the single-turn stop the protocol itself sets), runs that got no completion, wall time.
"""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import BenchError, BoxmakerError
from ..session import open_log, split_turns
from ._bfcl import SINGLE_TURN
from ._run import SCORER, read_runs, read_slice

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BFCL_GROUPS",
    "bfcl_overall",
    "bfcl_summary",
    "category_of",
    "format_summary",
    "load_runs",
    "reprocessed_in",
]

BFCL_GROUPS: dict[str, tuple[str, ...]] = {
    "simple": ("simple_python", "simple_java", "simple_javascript"),
    "non_live": ("simple", "multiple", "parallel", "parallel_multiple"),
    "live": ("live_simple", "live_multiple", "live_parallel", "live_parallel_multiple"),
    "irrelevance": ("irrelevance", "live_irrelevance"),
    "multi_turn": (
        "multi_turn_base",
        "multi_turn_miss_func",
        "multi_turn_miss_param",
        "multi_turn_long_context",
    ),
    "agentic": ("web_search", "memory"),
    "web_search": ("web_search_base", "web_search_no_snippet"),
    "memory": ("memory_kv", "memory_vector", "memory_rec_sum"),
}
"""BFCL's groups, as its leaderboard builds them (the live group's mean is weighted by entry
counts; the others are unweighted means)."""

_OVERALL_WEIGHTS = {"non_live": 10, "live": 10, "irrelevance": 10, "multi_turn": 30, "agentic": 40}

_COSTS = {
    "processed_tokens": "processed_tokens",
    "prefill_ms": "prompt_ms",
    "lost_tokens": "lost_tokens",
    "reprocessed_tokens": "reprocessed_tokens",
    "generated_tokens": "generated_tokens",
}


def reprocessed_in(path: str | os.PathLike[str]) -> float:
    """Tokens the server processed again over one session log: the sum, over each completion
    after the first, of :func:`boxmaker.cache.reprocessed` of its timings and the previous
    completion's (the one definition: a reply sent back without its reasoning counts here,
    with or without a ``CacheLoss``). The log is read as every view reads it
    (:func:`boxmaker.session.open_log`, :func:`boxmaker.session.split_turns`). NaN when a
    pair's timings lack a count, or the log cannot be read."""
    import math

    from ..cache import reprocessed

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reading = split_turns(open_log(Path(path)))
    except BoxmakerError:
        return math.nan
    timings = [
        reading.records[c.usage].get("timings") or {}
        for turn in reading.turns
        for c in turn.completions
    ]
    total = 0
    for before, after in itertools.pairwise(timings):
        again = reprocessed(before, after)
        if again is None:
            return math.nan
        total += again[0]
    return float(total)


def category_of(task: str) -> str:
    """BFCL's category of an entry id (``simple_python_12`` -> ``simple_python``)."""
    return task.rsplit("_", 1)[0]


def bfcl_overall(accuracy: dict[str, float]) -> dict[str, float]:
    """BFCL's group figures and overall from per-category accuracies (0-1), categories not
    given counting 0, as BFCL counts a category not run (see the module docstring)."""

    def mean(names: Sequence[str]) -> float:
        return sum(accuracy.get(n, 0.0) for n in names) / len(names)

    acc = dict(accuracy)
    acc["simple"] = mean(BFCL_GROUPS["simple"])
    out = {"non_live": mean(BFCL_GROUPS["non_live"])}
    out["live"] = 0.0  # boxmaker runs no live category (BFCL weights them by entry count)
    out["irrelevance"] = mean(BFCL_GROUPS["irrelevance"])
    out["multi_turn"] = mean(BFCL_GROUPS["multi_turn"])
    acc["web_search"] = mean(BFCL_GROUPS["web_search"])
    acc["memory"] = mean(BFCL_GROUPS["memory"])
    out["agentic"] = (acc["web_search"] + acc["memory"]) / 2
    for name in ("simple",):
        out[name] = acc[name]
    weight = sum(_OVERALL_WEIGHTS.values())
    out["overall"] = sum(out[g] * w for g, w in _OVERALL_WEIGHTS.items()) / weight
    return out


def bfcl_summary(
    batch_dir: str | os.PathLike[str],
    by: str | Sequence[str] | None = None,
    *,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Per setting and category of a scored bench folder: accuracy with its interval, pass^k,
    and the costs per run (see the module docstring); a row ``category == "bfcl_overall"`` per
    setting holds BFCL's overall figure (its interval left NaN: BFCL gives none).

    Args:
        batch_dir: a bench folder scored by :func:`~boxmaker.bench.score_bfcl`.
        by: the grid's setting columns to group by (default: every grid key but the repeats'
            ``sampling.seed``).
        confidence, resamples, seed: of the bootstrap.

    Returns:
        One row per (setting, category): ``setting``, the ``by`` columns, ``category``,
        ``entries``, ``runs``, ``accuracy``, ``accuracy_low``, ``accuracy_high``, ``pass_k``
        (``k`` in ``frame.attrs``), ``no_completion`` (runs that got no completion), the cost
        columns, ``limit_hits``, ``wall_s``; ``frame.attrs`` also holds the bootstrap's
        settings and ``categories_run``.

    Raises:
        BenchError: not a bench folder, or no BFCL scores in it.
    """
    import numpy as np
    import pandas as pd

    from ..score import paired_bootstrap

    held = read_slice(batch_dir)
    scored, costs = load_runs(batch_dir)
    keys = _keys(scored, by)
    scored = scored.assign(
        category=scored["task"].astype(str).map(category_of),
        setting=_labels(scored, keys),
        value=scored["value"].astype(float),
    )
    data = scored.merge(costs, on="run", how="left")
    rows: list[dict[str, Any]] = []
    for setting, part in data.groupby("setting", sort=False):
        accuracy: dict[str, float] = {}
        first = part.iloc[0]
        for category in [c for c in held.categories if c in set(part["category"])]:
            mine = part[part["category"] == category]
            per_entry = mine.groupby("task")["value"].mean()
            boot = paired_bootstrap(
                per_entry.to_numpy(dtype=float)[None, :],
                resamples=resamples,
                confidence=confidence,
                seed=seed,
            )
            accuracy[category] = float(boot.mean[0])
            right_all = mine.groupby("task")["value"].min()
            row = {
                "setting": setting,
                **{k: first[k] for k in keys},
                "category": category,
                "entries": int(per_entry.size),
                "runs": len(mine),
                "accuracy": float(boot.mean[0]),
                "accuracy_low": float(boot.low[0]),
                "accuracy_high": float(boot.high[0]),
                "pass_k": float((right_all == 1.0).mean()),
                "no_completion": int((mine["requests"].fillna(0) == 0).sum()),
            }
            for name in (*_COSTS, "limit_hits", "wall_s"):
                row[name] = float(mine[name].astype("Float64").mean(skipna=False))
            rows.append(row)
        figures = bfcl_overall(accuracy)
        rows.append(
            {
                "setting": setting,
                **{k: first[k] for k in keys},
                "category": "bfcl_overall",
                "entries": int(part["task"].nunique()),
                "runs": len(part),
                "accuracy": figures["overall"],
                "accuracy_low": np.nan,
                "accuracy_high": np.nan,
            }
        )
    table = pd.DataFrame(rows)
    table.attrs.update(
        k=held.repeats,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
        categories_run=len(held.categories),
        bfcl_version=held.bfcl_version,
    )
    return table


def load_runs(folder: str | os.PathLike[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A bench folder's BFCL scores and costs per run: ``(scored, costs)``.

    ``scored``: ``run``, ``task``, ``scorer``, ``value``, ``explanation`` and the grid's
    setting columns (from ``scores.ndjson`` of boxmaker's batch folder, or a harness folder's
    ``runs.ndjson``); ``costs``: one row per run with ``run``, the cost columns, ``requests``
    (completions), ``limit_hits`` (the single-turn protocol's stop left out) and ``wall_s``.

    Raises:
        BenchError: no BFCL scores in the folder.
    """
    import pandas as pd

    from ..batch import frames as batch_frames
    from ..batch import scores
    from ..frames import summary as summary_frame

    root = Path(folder)
    if (root / "manifest.ndjson").exists():
        scored = scores(root)
        scored = scored[scored["scorer"] == SCORER] if not scored.empty else scored
        summary = batch_frames(root, "summary") if not scored.empty else None
    else:
        lines = read_runs(root)
        scored = pd.DataFrame(lines, columns=["run", "task", "value", "explanation", "log"])
        scored = scored.assign(scorer=SCORER)
        logs = {
            str(root / p): r
            for r, p in zip(scored["run"], scored["log"], strict=True)
            if isinstance(p, str)
        }
        summary = summary_frame(list(logs)) if logs else None
        if summary is not None:
            summary["run"] = [logs.get(str(p)) for p in summary["path"]]
            summary["task"] = summary["run"].map(
                dict(zip(scored["run"], scored["task"], strict=True))
            )
        scored = scored.drop(columns=["log"])
    if scored.empty or summary is None:
        raise BenchError(f"{folder}: no BFCL scores (boxmaker bench report {folder})")
    return scored, _run_costs(summary)


def _keys(scored: pd.DataFrame, by: str | Sequence[str] | None) -> list[str]:
    fixed = {"run", "task", "scorer", "version", "value", "explanation", "error", "time", "harness"}
    if by is None:
        return [c for c in scored.columns if c not in fixed and c != "sampling.seed"]
    keys = [by] if isinstance(by, str) else list(by)
    missing = [k for k in keys if k not in scored.columns]
    if missing:
        raise BenchError(f"unknown setting column(s) {missing}")
    return keys


def _labels(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    if not keys:
        return ["(all runs)"] * len(frame)
    return [", ".join(f"{k}={row[k]}" for k in keys) for _, row in frame[keys].iterrows()]


def _run_costs(summary: pd.DataFrame) -> pd.DataFrame:
    """Per run: the costs, its completions, limit hits less the single-turn protocol's stop,
    wall time."""
    import pandas as pd

    out = pd.DataFrame({"run": summary["run"]})
    for name, source in _COSTS.items():
        out[name] = summary[source]
    out["reprocessed_tokens"] = [reprocessed_in(p) for p in summary["path"]]
    out["requests"] = summary["requests"]
    single = summary["task"].astype(str).map(category_of).isin(SINGLE_TURN)
    stop = summary["tool_iterations_hits"].where(single, 0).clip(upper=1)
    out["limit_hits"] = summary["limit_hits"] - stop
    out["wall_s"] = (summary["ended"] - summary["started"]).dt.total_seconds()
    return out


def format_summary(table: pd.DataFrame) -> str:
    """``table`` (from :func:`bfcl_summary`) as fixed-width text, one line per setting and
    category, with a header naming BFCL's version, k and the bootstrap."""
    attrs = table.attrs
    k = attrs.get("k", 1)
    lines = [
        f"BFCL v4 (bfcl-eval {attrs.get('bfcl_version')}), scored by BFCL's checkers; "
        f"{float(attrs.get('confidence', 0.95)):.0%} bootstrap intervals over entries "
        f"({attrs.get('resamples')} resamples, seed {attrs.get('seed')})",
        f"{'category':<18} {'n':>4} {'accuracy':>19} {f'pass^{k}':>7} {'prefill ms':>10} "
        f"{'reproc tok':>10} {'lost tok':>8} {'hits':>5} {'no compl':>8} {'wall s':>7}",
    ]
    for setting, part in table.groupby("setting", sort=False):
        if table["setting"].nunique() > 1 or setting != "(all runs)":
            lines.append(f"[{setting}]")
        for row in part.to_dict("records"):
            if row["category"] == "bfcl_overall":
                runs = attrs.get("categories_run")
                lines.append(
                    f"{'BFCL overall':<18} {row['entries']:>4} {row['accuracy']:>19.3f}"
                    f"   (BFCL's formula; {runs} of its 21 scored categories run, the others "
                    "count 0)"
                )
                continue
            acc = f"{row['accuracy']:.3f} [{row['accuracy_low']:.2f},{row['accuracy_high']:.2f}]"
            lines.append(
                f"{row['category']:<18} {row['entries']:>4} {acc:>19} {row['pass_k']:>7.2f} "
                f"{_num(row['prefill_ms']):>10} {_num(row['reprocessed_tokens']):>10} "
                f"{_num(row['lost_tokens']):>8} {_num(row['limit_hits'], 2):>5} "
                f"{row['no_completion']:>8} {_num(row['wall_s'], 1):>7}"
            )
    return "\n".join(lines)


def _num(value: Any, digits: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if number != number else f"{number:.{digits}f}"
