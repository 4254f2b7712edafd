"""The paired bootstrap: the same intervals as scipy.stats.bootstrap (percentile, paired), the
same intervals for the same seed, narrower with more tasks, and about the stated coverage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from boxmaker.score import paired_bootstrap


def _scores(rng: np.random.Generator, rates: list[float], tasks: int) -> np.ndarray:
    """Settings x tasks of 0/1 scores, correlated by task (some tasks are harder)."""
    hardness = rng.normal(0.0, 1.0, tasks)
    out = []
    for rate in rates:
        logit = np.log(rate / (1 - rate)) - hardness
        out.append((rng.random(tasks) < 1 / (1 + np.exp(-logit))).astype(float))
    return np.array(out)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_intervals_agree_with_scipy_within_a_hundredth(seed: int) -> None:
    rng = np.random.default_rng(seed)
    values = _scores(rng, [0.6, 0.7], 300)
    ours = paired_bootstrap(values, baseline=0, resamples=20_000, seed=seed)
    one = stats.bootstrap(
        (values[1],), np.mean, method="percentile", n_resamples=20_000, random_state=seed
    )
    assert abs(ours.low[1] - one.confidence_interval.low) < 0.01
    assert abs(ours.high[1] - one.confidence_interval.high) < 0.01
    diff = stats.bootstrap(
        (values[1], values[0]),
        lambda a, b, axis=-1: np.mean(a, axis=axis) - np.mean(b, axis=axis),
        paired=True,
        method="percentile",
        n_resamples=20_000,
        random_state=seed,
    )
    assert abs(ours.diff_low[1] - diff.confidence_interval.low) < 0.01
    assert abs(ours.diff_high[1] - diff.confidence_interval.high) < 0.01
    assert ours.diff[0] == 0.0 and ours.diff_low[0] == 0.0 and ours.diff_high[0] == 0.0
    assert ours.mean[1] == pytest.approx(values[1].mean())


def test_the_same_seed_gives_the_same_intervals_and_another_seed_others() -> None:
    values = _scores(np.random.default_rng(0), [0.5, 0.8], 80)
    a = paired_bootstrap(values, baseline=0, seed=7)
    b = paired_bootstrap(values, baseline=0, seed=7)
    c = paired_bootstrap(values, baseline=0, seed=8)
    assert np.array_equal(a.low, b.low) and np.array_equal(a.diff_high, b.diff_high)
    fields = ("low", "high", "diff_low", "diff_high")
    assert any(not np.array_equal(getattr(a, f), getattr(c, f)) for f in fields)


def test_pairing_by_task_narrows_the_difference_of_correlated_settings() -> None:
    rng = np.random.default_rng(5)
    values = _scores(rng, [0.5, 0.55], 400)
    paired = paired_bootstrap(values, baseline=0, resamples=4000, seed=1)
    unpaired = stats.bootstrap(
        (values[1], values[0]),
        lambda a, b, axis=-1: np.mean(a, axis=axis) - np.mean(b, axis=axis),
        paired=False,
        method="percentile",
        n_resamples=4000,
        random_state=1,
    )
    width = paired.diff_high[1] - paired.diff_low[1]
    assert width < unpaired.confidence_interval.high - unpaired.confidence_interval.low


def test_missing_tasks_and_bad_arguments() -> None:
    values = np.array([[1.0, 0.0, np.nan, 1.0], [1.0, 1.0, 1.0, np.nan]])
    boot = paired_bootstrap(values, baseline=0, resamples=500, seed=0)
    assert boot.mean[0] == pytest.approx(2 / 3) and boot.mean[1] == 1.0
    assert boot.diff[1] == pytest.approx(1.0 - 0.5)  # only the tasks both have: 0 and 1
    with pytest.raises(ValueError):
        paired_bootstrap(np.zeros((2, 0)))
    with pytest.raises(ValueError):
        paired_bootstrap(np.zeros((1, 3)), confidence=1.0)


@settings(max_examples=15, deadline=None)
@given(rate=st.floats(0.1, 0.9), seed=st.integers(0, 2**16))
def test_the_interval_narrows_as_runs_grow(rate: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    small = (rng.random((1, 40)) < rate).astype(float)
    large = (rng.random((1, 640)) < rate).astype(float)
    w_small = np.diff(
        np.r_[
            paired_bootstrap(small, resamples=400, seed=seed).low,
            paired_bootstrap(small, resamples=400, seed=seed).high,
        ]
    )
    w_large = np.diff(
        np.r_[
            paired_bootstrap(large, resamples=400, seed=seed).low,
            paired_bootstrap(large, resamples=400, seed=seed).high,
        ]
    )
    assert w_large[0] < w_small[0]


@settings(max_examples=5, deadline=None)
@given(rate=st.floats(0.2, 0.8), seed=st.integers(0, 2**16))
def test_the_interval_covers_the_true_rate_about_as_often_as_stated(rate: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    batches = 300
    covered = 0
    for i in range(batches):
        values = (rng.random((1, 150)) < rate).astype(float)
        boot = paired_bootstrap(values, resamples=400, confidence=0.9, seed=i)
        covered += bool(boot.low[0] <= rate <= boot.high[0])
    # 90% stated; a percentile interval of n=150 undercovers a little; 300 batches give a
    # binomial spread of about +-3 points at 2 sigma
    assert 0.83 <= covered / batches <= 0.96
