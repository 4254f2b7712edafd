"""boxmaker.frames.plots: each plot returns a Figure with the right number of bars or lines, and
draws into a given Axes."""

from __future__ import annotations

from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

from matplotlib.container import BarContainer
from matplotlib.figure import Figure
from test_frames import RECORDS, at, usage

from boxmaker.frames import _build as frames
from boxmaker.frames import plots
from boxmaker.records import LIMIT_KINDS, Baseline, CacheLoss, LimitHit, User
from boxmaker.session import Session


@pytest.fixture
def loaded(tmp_path: Path) -> frames.Frames:
    with Session.create(tmp_path, Baseline(time=at(-1)), session_id="s1") as one:
        one.extend(RECORDS)
    with Session.create(tmp_path, Baseline(time=at(-1)), session_id="s2") as two:
        two.extend([User(content="x", time=at(0)), usage(0, 10, 2, 1), usage(5, 10, 2, 2)])
        two.extend([CacheLoss(expected=12, reused=5, time=at(2))])
        two.extend([LimitHit(kind="thinking_cap", detail="d", time=at(3))])
    return frames.load(tmp_path)


def bars(figure: Figure) -> list[BarContainer]:
    return [c for c in figure.axes[0].containers if isinstance(c, BarContainer)]


def test_tokens_per_request_stacks_three_series(loaded: frames.Frames) -> None:
    figure = plots.tokens_per_request(loaded.requests)
    assert isinstance(figure, Figure)
    containers = bars(figure)
    assert [c.get_label() for c in containers] == ["cached", "processed", "generated"]
    assert all(len(c) == len(loaded.requests) == 7 for c in containers)
    top = [b.get_y() + b.get_height() for b in containers[-1]]
    expected = loaded.requests.prompt_tokens + loaded.requests.generated_tokens
    assert top == [float(v) for v in expected]


def test_time_per_request_stacks_prompt_and_generation(loaded: frames.Frames) -> None:
    figure = plots.time_per_request(loaded.requests)
    containers = bars(figure)
    assert [c.get_label() for c in containers] == ["prompt", "generation"]
    assert all(len(c) == 7 for c in containers)


def test_cache_reuse_one_line_per_session_and_losses_marked(loaded: frames.Frames) -> None:
    figure = plots.cache_reuse(loaded.requests, loaded.cache_losses)
    lines = figure.axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["s1", "s2", "cache loss"]
    marks = lines[-1]
    assert list(np.asarray(marks.get_xdata())) == [2.0, 2.0]  # s1 request 2, s2 request 2
    assert len(plots.cache_reuse(loaded.requests).axes[0].get_lines()) == 2


def test_cache_reuse_of_many_sessions_without_losses_draws_no_empty_legend(
    tmp_path: Path,
) -> None:
    """More than 8 sessions are drawn unlabelled; with no loss marked there is nothing for a
    legend (matplotlib warned, an error in the HTML report of a 12-run batch)."""
    for n in range(9):
        with Session.create(tmp_path, Baseline(time=at(-1)), session_id=f"s{n}") as one:
            one.extend([User(content="x", time=at(0)), usage(0, 10, 2, 1)])
    many = frames.load(tmp_path)
    ax = plots.cache_reuse(many.requests).axes[0]
    assert len(ax.get_lines()) == 9 and ax.get_legend() is None


def test_limit_hits_one_bar_per_kind(loaded: frames.Frames) -> None:
    figure = plots.limit_hits_per_kind(loaded.limit_hits)
    (container,) = bars(figure)
    assert len(container) == len(LIMIT_KINDS)
    heights = dict(zip(LIMIT_KINDS, (b.get_height() for b in container), strict=True))
    assert heights == {
        "tool_iterations": 1,
        "repeated_call": 0,
        "thinking_cap": 2,
        "context_full": 1,
        "tool_result_cap": 1,
        "loop": 0,
        **dict.fromkeys(LIMIT_KINDS[6:], 0),  # the turn's client-side bounds (issue 23)
    }


def test_plots_draw_into_a_given_axes(loaded: frames.Frames) -> None:
    figure = Figure()
    axes = figure.subplots(2, 2).ravel()
    assert plots.tokens_per_request(loaded.requests, ax=axes[0]) is figure
    assert plots.time_per_request(loaded.requests, ax=axes[1]) is figure
    assert plots.cache_reuse(loaded.requests, loaded.cache_losses, ax=axes[2]) is figure
    assert plots.limit_hits_per_kind(loaded.limit_hits, ax=axes[3]) is figure
    assert len(figure.axes) == 4
    assert all(ax.has_data() for ax in axes)


def test_plots_of_empty_frames() -> None:
    empty = frames.load([])
    for figure in (
        plots.tokens_per_request(empty.requests),
        plots.time_per_request(empty.requests),
        plots.cache_reuse(empty.requests, empty.cache_losses),
        plots.limit_hits_per_kind(empty.limit_hits),
    ):
        assert isinstance(figure, Figure)


def test_lost_tokens_by_cause_stacks_one_series_per_cause(loaded: frames.Frames) -> None:
    figure = plots.lost_tokens_by_cause(loaded.cache_losses)
    containers = bars(figure)
    # s1 lost 40 tokens at its request 2 (history_edited); s2 7 at request 2, not explained
    assert [c.get_label() for c in containers] == ["history_edited", "not explained"]
    assert [[b.get_height() for b in c] for c in containers] == [[40.0], [7.0]]
    assert [b.get_y() for b in containers[1]] == [40.0]  # stacked on the first
    assert figure.axes[0].get_ylabel() == "lost tokens"


def test_an_empty_limit_hits_plot_starts_at_zero() -> None:
    """Issue 21: with no hit the y axis ran from -0.055 to 0.055."""
    figure = plots.limit_hits_per_kind(frames.load([]).limit_hits)
    assert figure.axes[0].get_ylim() == (0.0, 1.1)


@pytest.mark.parametrize("causes", [1, 3, 5])
def test_no_lost_tokens_bar_is_under_the_legend(tmp_path: Path, causes: int) -> None:
    """Issue 21: the tallest bar was drawn under the legend (upper left, over request 1)."""
    names = ["history_rewritten", "history_edited", "evicted", "truncated", "template_changed"]
    with Session.create(tmp_path, Baseline(time=at(-1)), session_id="s") as session:
        session.extend([User(content="x", time=at(0))])
        for n, cause in enumerate(names[:causes]):  # the first request loses the most
            session.extend([CacheLoss(expected=900 - n, reused=0, time=at(1 + n), cause=cause)])
    losses = frames.load(tmp_path).cache_losses
    losses = losses.assign(request=1)  # every loss on one bar: the tallest stack
    figure = plots.lost_tokens_by_cause(losses)
    ax = figure.axes[0]
    figure.canvas.draw()
    drawn = ax.get_legend()
    assert drawn is not None
    legend = drawn.get_window_extent()
    tops = [bar.get_window_extent().y1 for c in ax.containers for bar in c]
    assert max(tops) < legend.y0
