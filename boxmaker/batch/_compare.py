"""Which setting is better: success rates with paired bootstrap intervals, beside the costs that
only a llama.cpp run has (prefill time, lost cache, limit hits).

:func:`compare` reads a scored batch (``scores.ndjson``, see :func:`score_batch`) and its logs;
:func:`compare_frame` does the same from frames already in memory. One row per setting (the
values of the ``by`` columns); the success rate's interval comes from
:func:`boxmaker.score.paired_bootstrap`, which resamples tasks, the same tasks for every setting
(paired by task); the seed, the number of resamples and the confidence are arguments and are
kept in ``frame.attrs``, so a table can be made again exactly. In a batch of forks
(:class:`~boxmaker.batch.ForkTask`) the costs are each fork's own (the frames' summary leaves
the parent's copied records out, ``from_parent``, and starts a fork when it was made), so the
settings compare from the fork point on. A cost a run's logs do not hold (a server that sent
no ``timings``) makes its setting's mean unknown (NaN), never a mean of the known runs.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..score import TARGET_SCORER, paired_bootstrap
from ._runner import frames
from ._score import scores

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["COST_COLUMNS", "compare", "compare_frame", "format_compare"]

COST_COLUMNS: dict[str, str] = {
    "generated_tokens": "generated tokens per run (llama.cpp predicted_n, summed)",
    "processed_tokens": "prompt tokens processed per run (prompt_n, summed)",
    "prefill_ms": "prompt processing per run, ms (prompt_ms, summed)",
    "lost_tokens": "previous prompts' tokens not reused per run (cache losses, expected - reused)",
    "reprocessed_tokens": "tokens the server processed again per run (cache losses, the "
    "replies included)",
    "wall_s": "wall time per run, s (first to last record)",
}
"""The cost columns of :func:`compare` (means over a setting's runs), and what each holds;
``<kind>_hits`` columns follow, one per limit kind, the mean hits per run."""

_FIXED = {"run", "task", "scorer", "version", "value", "explanation", "error", "time"}


def compare(
    batch_dir: str | Path,
    by: str | Sequence[str] | None = None,
    *,
    scorer: str = TARGET_SCORER,
    baseline: Any = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """Compare the settings of a scored batch.

    Args:
        batch_dir: the batch's folder, scored by :func:`score_batch`.
        by: the setting columns to group by (dotted config keys of the grid); default every
            grid key.
        scorer: whose scores are compared (default the targets' scorer).
        baseline: the setting the others are compared with: its label as in the frame's
            ``setting`` column, or its row number; default the first setting.
        confidence, resamples, seed: of the bootstrap (see
            :func:`boxmaker.score.paired_bootstrap`).

    Returns:
        One row per setting: the ``by`` columns, ``setting`` (a label), ``runs``, ``tasks``,
        ``success`` (mean score), ``success_low`` / ``success_high``, ``diff`` (to the
        baseline) with ``diff_low`` / ``diff_high``, the :data:`COST_COLUMNS` and one
        ``<kind>_hits`` column per limit kind. ``frame.attrs`` holds ``seed``, ``resamples``,
        ``confidence``, ``scorer`` and ``baseline``.

    Raises:
        ConfigError: no scores of ``scorer``, an unknown ``by`` column or baseline.
        SessionError: the manifest, the scores or a log cannot be read.
    """
    summary = frames(batch_dir, "summary")
    return compare_frame(
        scores(batch_dir),
        summary,
        by,
        scorer=scorer,
        baseline=baseline,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )


def compare_frame(
    scored: pd.DataFrame,
    costs: pd.DataFrame | None = None,
    by: str | Sequence[str] | None = None,
    *,
    scorer: str = TARGET_SCORER,
    baseline: Any = None,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """:func:`compare` from frames: ``scored`` (the :func:`scores` frame, or any frame with
    ``run``, ``task``, ``scorer``, ``value`` and the setting columns) and ``costs`` (the batch
    ``summary`` frame, one row per run, or ``None`` for no cost columns).

    Raises:
        ConfigError: as :func:`compare`.
    """
    import numpy as np
    import pandas as pd

    mine = scored[scored["scorer"] == scorer]
    if mine.empty:
        have = sorted(str(s) for s in scored["scorer"].dropna().unique())
        if have:
            raise ConfigError(
                f"no scores of scorer {scorer!r}; the batch has scores of: {', '.join(have)} "
                "(--scorer NAME)"
            )
        raise ConfigError(f"no scores of scorer {scorer!r}: run `boxmaker score` first")
    keys = _keys(mine, by)
    mine = mine.assign(setting=_labels(mine, keys))
    per_task = mine.groupby(["setting", "task"], sort=True)["value"].mean().astype(float)
    settings = _ordered(mine, keys)  # by the settings' values (80 before 400), not as text
    matrix = per_task.unstack("task").reindex(settings)
    base = _baseline(settings, baseline)
    boot = paired_bootstrap(
        matrix.to_numpy(dtype=float),
        baseline=base,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
    )
    first = mine.groupby("setting", sort=True).first().reindex(settings)
    out = pd.DataFrame({k: first[k] for k in keys}, index=settings) if keys else None
    table = pd.DataFrame(index=pd.Index(settings, name="setting"))
    if out is not None:
        table = table.join(out)
    table["runs"] = mine.groupby("setting", sort=True)["run"].nunique()
    table["tasks"] = matrix.notna().sum(axis=1)
    for name, values in (
        ("success", boot.mean),
        ("success_low", boot.low),
        ("success_high", boot.high),
        ("diff", boot.diff),
        ("diff_low", boot.diff_low),
        ("diff_high", boot.diff_high),
    ):
        table[name] = np.asarray(values, dtype=float)
    if costs is not None and not costs.empty:
        table = table.join(_costs(mine, costs))
    table = table.reset_index()
    table.attrs.update(
        seed=seed,
        resamples=resamples,
        confidence=confidence,
        scorer=scorer,
        baseline=settings[base],
    )
    return table


def _keys(frame: pd.DataFrame, by: str | Sequence[str] | None) -> list[str]:
    if by is None:
        return [c for c in frame.columns if c not in _FIXED]
    keys = [by] if isinstance(by, str) else list(by)
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        known = ", ".join(c for c in frame.columns if c not in _FIXED) or "none"
        raise ConfigError(f"unknown setting column(s) {missing}; the batch's are: {known}")
    return keys


def _labels(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    if not keys:
        return ["(all runs)"] * len(frame)
    label = frame[keys[0]].astype(str).radd(f"{keys[0]}=")
    for key in keys[1:]:
        label = label + f", {key}=" + frame[key].astype(str)
    return list(label)


def _ordered(frame: pd.DataFrame, keys: list[str]) -> list[str]:
    """The settings' labels in the order of their values (numbers as numbers)."""
    firsts = frame.drop_duplicates("setting")
    if not keys:
        return list(firsts["setting"])

    def order(row: tuple[Any, ...]) -> tuple[tuple[int, Any], ...]:
        return tuple((0, v) if isinstance(v, numbers.Real) else (1, str(v)) for v in row)

    pairs = zip(firsts[keys].itertuples(index=False, name=None), firsts["setting"], strict=True)
    return [label for _, label in sorted(pairs, key=lambda p: order(p[0]))]


def _baseline(settings: list[str], baseline: Any) -> int:
    if baseline is None:
        return 0
    if isinstance(baseline, int) and not isinstance(baseline, bool):
        if 0 <= baseline < len(settings):
            return baseline
    elif baseline in settings:
        return settings.index(baseline)
    raise ConfigError(f"baseline {baseline!r} is none of the settings: {settings}")


def _costs(scored: pd.DataFrame, costs: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    runs = scored[["run", "setting"]].drop_duplicates("run")
    data = costs.merge(runs, on="run", how="inner")
    out = pd.DataFrame(index=pd.Index(sorted(runs["setting"].unique()), name="setting"))
    grouped = data.groupby("setting", sort=True)
    sources = {
        "generated_tokens": "generated_tokens",
        "processed_tokens": "processed_tokens",
        "prefill_ms": "prompt_ms",
        "lost_tokens": "lost_tokens",
        "reprocessed_tokens": "reprocessed_tokens",
    }
    for name, source in sources.items():
        if source in data.columns:
            out[name] = grouped[source].agg(_mean)
    if {"started", "ended"} <= set(data.columns):
        wall = (data["ended"] - data["started"]).dt.total_seconds()
        out["wall_s"] = wall.groupby(data["setting"]).agg(_mean)
    for column in sorted(c for c in data.columns if c.endswith("_hits") and c != "limit_hits"):
        out[column] = grouped[column].agg(_mean)
    return out


def _mean(values: pd.Series) -> float:
    """The mean of a setting's runs, NaN when one is unknown (never the known runs' mean)."""
    return float(values.astype("Float64").mean(skipna=False))


def format_compare(table: pd.DataFrame) -> str:
    """``table`` (from :func:`compare`) as fixed-width text: one line per setting, each
    setting column (the ``by`` keys) a column of its own, as wide as its longest value (a
    label is never cut: two settings that differ past 40 characters read apart), the success
    rate with its interval, the difference to the baseline, and the main costs (``unknown``
    where a run's logs did not say); a header line names the scorer, the baseline and the
    bootstrap's seed, resamples and confidence."""
    attrs = table.attrs
    head = [
        f"scorer {attrs.get('scorer')}, baseline {attrs.get('baseline')!s}; "
        f"paired bootstrap over tasks: {attrs.get('resamples')} resamples, "
        f"seed {attrs.get('seed')}, {float(attrs.get('confidence', 0.95)):.0%} intervals"
    ]
    columns = list(table.columns)
    keys = columns[columns.index("setting") + 1 : columns.index("runs")] or ["setting"]
    hits = [c for c in table.columns if c.endswith("_hits")]
    rows: list[list[str]] = []
    for row in table.to_dict("records"):
        success = f"{row['success']:.2f} [{row['success_low']:.2f},{row['success_high']:.2f}]"
        diff = (
            "baseline"
            if row["setting"] == attrs.get("baseline")
            else f"{row['diff']:+.2f} [{row['diff_low']:+.2f},{row['diff_high']:+.2f}]"
        )
        total_hits = sum(float(row[c]) for c in hits) if hits else float("nan")
        rows.append(
            [
                *(str(row[k]) for k in keys),
                str(int(row["runs"])),
                success,
                diff,
                _num(row.get("generated_tokens")),
                _num(row.get("prefill_ms")),
                _num(row.get("lost_tokens")),
                _num(row.get("reprocessed_tokens")),
                _num(total_hits, 2),
            ]
        )
    names = [*keys, "runs", "success", "diff", "gen tok", "prefill ms", "lost tok"]
    names += ["re-proc tok", "hits"]
    widths = [max(len(n), *(len(r[i]) for r in rows)) for i, n in enumerate(names)]
    left = len(keys)  # the settings' values read left-aligned, the numbers right-aligned

    def line(cells: list[str]) -> str:
        return " ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([*head, line(names), *(line(r) for r in rows)])


def _num(value: Any, digits: int = 0) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "unknown"
    return "unknown" if number != number else f"{number:.{digits}f}"


def success_vs_cost(table: pd.DataFrame, cost: str = "prefill_ms", ax: Any = None) -> Any:
    """Each setting of ``table`` (from :func:`compare`) as a point: its success rate (y, with
    the interval as an error bar) against one cost column (x, a mean per run), labelled; the
    baseline drawn hollow. Returns the matplotlib Figure (a new one, not registered with
    pyplot, unless ``ax`` is given).

    Raises:
        ConfigError: ``cost`` is not a column of ``table``.
    """
    from matplotlib.figure import Figure  # matplotlib only when a plot is made

    if cost not in table.columns:
        known = [c for c in table.columns if c in COST_COLUMNS or c.endswith("_hits")]
        raise ConfigError(f"{cost!r} is not a cost column; the table has {known}")
    if ax is None:
        figure = Figure(figsize=(7.0, 4.0), layout="constrained")
        ax = figure.add_subplot()
    else:
        figure = ax.get_figure()
    x = table[cost].astype(float).to_numpy()
    y = table["success"].astype(float).to_numpy()
    low = y - table["success_low"].astype(float).to_numpy()
    high = table["success_high"].astype(float).to_numpy() - y
    base = table.attrs.get("baseline")
    for i, label in enumerate(table["setting"]):
        hollow = label == base
        ax.errorbar(
            x[i],
            y[i],
            yerr=[[low[i]], [high[i]]],
            fmt="o",
            mfc="white" if hollow else None,
            capsize=4,
            color=f"C{i % 10}",
            label=str(label).replace("$", r"\$") + (" (baseline)" if hollow else ""),
        )
    name = f"{cost[:-5]} limit hits per run" if cost.endswith("_hits") else cost
    ax.set_xlabel(COST_COLUMNS.get(cost, name).replace("$", r"\$"))
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    confidence = float(table.attrs.get("confidence", 0.95))
    ax.set_title(f"success ({confidence:.0%} paired bootstrap interval) vs cost", fontsize=10)
    ax.legend(fontsize=8, loc="best")
    return figure
