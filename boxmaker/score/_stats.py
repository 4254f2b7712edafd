"""Success rates with paired bootstrap confidence intervals, vectorised (numpy, pure).

A batch gives a matrix of scores: one row per setting, one column per task (the task's mean
score under that setting; NaN where the setting has no scored run of the task). The bootstrap
resamples **tasks** with replacement, the same tasks for every setting in each resample, so
settings are compared on the same draws (paired by task, as the runs are). Each resample is a
vector of counts (how often each task was drawn); every setting's resampled mean is then one
matrix product, so 2,000 resamples of 10,000 tasks cost a few products, not a Python loop per
resample. Intervals are percentile intervals (the ``percentile`` method of
:func:`scipy.stats.bootstrap`, which the tests check them against). The seed is an argument,
so an interval is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Bootstrap", "paired_bootstrap"]


@dataclass(frozen=True)
class Bootstrap:
    """Per setting (arrays of length S): the observed mean, its interval, and the difference
    to the baseline setting with its interval (0 and a zero-width interval for the baseline
    itself; NaN everywhere without a baseline)."""

    mean: np.ndarray[Any, np.dtype[np.float64]]
    low: np.ndarray[Any, np.dtype[np.float64]]
    high: np.ndarray[Any, np.dtype[np.float64]]
    diff: np.ndarray[Any, np.dtype[np.float64]]
    diff_low: np.ndarray[Any, np.dtype[np.float64]]
    diff_high: np.ndarray[Any, np.dtype[np.float64]]


def paired_bootstrap(
    values: Any,
    *,
    baseline: int | None = None,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
    chunk: int = 250,
) -> Bootstrap:
    """Means and paired percentile intervals of each row of ``values``.

    Args:
        values: S x T scores (settings x tasks), each in ``[0, 1]`` or NaN for a missing one.
        baseline: the row the others are compared with, or ``None``.
        resamples: bootstrap resamples (B).
        confidence: the interval's coverage, in ``(0, 1)``.
        seed: seeds :func:`numpy.random.default_rng`; the same seed gives the same intervals.
        chunk: resamples drawn at a time (bounds memory to ``chunk x T`` counts).

    Raises:
        ValueError: ``values`` is not 2-D with at least one task, ``resamples`` < 1, or
            ``confidence`` outside ``(0, 1)``.
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] == 0:
        raise ValueError(f"values must be settings x tasks with a task, not {v.shape}")
    if resamples < 1 or not 0.0 < confidence < 1.0:
        raise ValueError("resamples must be >= 1 and confidence in (0, 1)")
    present = ~np.isnan(v)
    complete = bool(present.all())  # the usual case: one matrix product per chunk
    filled = np.where(present, v, 0.0).astype(np.float32)
    weight = present.astype(np.float32)
    both = weight * weight[baseline] if baseline is not None else weight
    rng = np.random.default_rng(seed)
    s, t = v.shape
    means = np.empty((s, resamples))
    diffs = np.empty((s, resamples))
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        draws = rng.integers(0, t, size=(b, t))
        counts = np.bincount((draws + t * np.arange(b)[:, None]).ravel(), minlength=b * t)
        c = counts.reshape(b, t).T.astype(np.float32)  # T x b: how often each task was drawn
        sums = filled @ c  # S x b
        with np.errstate(invalid="ignore", divide="ignore"):
            m = sums / t if complete else sums / (weight @ c)
            if baseline is not None and complete:
                d = m - m[baseline]
            elif baseline is not None:  # paired on the tasks both settings have
                d = ((filled * both) @ c - (filled[baseline] * both) @ c) / (both @ c)
        means[:, start : start + b] = m
        if baseline is not None:
            diffs[:, start : start + b] = d
    tail = (1.0 - confidence) / 2.0 * 100.0
    with np.errstate(invalid="ignore"):
        observed = np.nanmean(np.where(present, v, np.nan), axis=1)
    low, high = np.nanpercentile(means, [tail, 100.0 - tail], axis=1)
    if baseline is None:
        nan = np.full(s, np.nan)
        return Bootstrap(observed, low, high, nan, nan.copy(), nan.copy())
    both_present = present & present[baseline]
    with np.errstate(invalid="ignore"):
        diff = np.nanmean(np.where(both_present, v, np.nan), axis=1) - np.nanmean(
            np.where(both_present, v[baseline], np.nan), axis=1
        )
    d_low, d_high = np.nanpercentile(diffs, [tail, 100.0 - tail], axis=1)
    return Bootstrap(observed, low, high, diff, d_low, d_high)
