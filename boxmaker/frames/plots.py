"""Plots of the usage frames (:mod:`boxmaker.frames`), with matplotlib.

Each function takes a frame (or a part of one: filter it to a session first to see one
session) and returns the :class:`~matplotlib.figure.Figure` it drew on. Given ``ax``, it draws
into that Axes (e.g. one panel of a grid) and returns the Axes' figure; without, it makes a new
Figure that is not registered with pyplot (so nothing is shown twice in Jupyter, and figures
made in a loop are freed).

- :func:`tokens_per_request`: stacked bars per request: cached / processed / generated tokens.
- :func:`cache_reuse`: the cache reuse ratio along each session, losses marked.
- :func:`time_per_request`: stacked bars per request: prompt and generation milliseconds.
- :func:`limit_hits_per_kind`: one bar per limit kind.
- :func:`lost_tokens_by_cause`: stacked bars per request: tokens lost to cache misses, by cause.

matplotlib is imported here only; ``import boxmaker`` does not load it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = [
    "CAUSE_COLORS",
    "cache_reuse",
    "limit_hits_per_kind",
    "lost_tokens_by_cause",
    "time_per_request",
    "tokens_per_request",
]

COLORS = {
    "cached": "#4c9f70",
    "processed": "#e0a030",
    "generated": "#4878b0",
    "prompt": "#e0a030",
    "generation": "#4878b0",
    "loss": "#c03030",
}
"""The colours of the series, shared by all plots."""

CAUSE_COLORS = {
    "history_rewritten": "#c03030",
    "history_edited": "#e0a030",
    "evicted": "#4878b0",
    "checkpoint": "#30a0a0",
    "truncated": "#8060b0",
    "unknown": "#808080",
    "idle_slot_cleared": "#70a040",
    "restore_cold": "#b07040",
    "slept": "#a0a0d0",
    "model_swapped": "#d070a0",
    "not explained": "#c8c8c8",
}
"""The colour of each cache-loss cause (:data:`boxmaker.cache.CAUSES`; ``not explained``: a
loss without a cause)."""

NOT_EXPLAINED = "not explained"
"""The label of losses without a cause (forensics off or failed, an older log)."""


def _axes(ax: Axes | None, width: float = 8.0, height: float = 3.5) -> tuple[Figure, Axes]:
    if ax is not None:
        figure = ax.get_figure()
        if not isinstance(figure, Figure):
            raise ValueError("the Axes is not on a Figure")
        return figure, ax
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.add_subplot()


def _plain(text: object) -> str:
    """``text`` from a log (a session id, a limit kind, a cause) as matplotlib shows it as
    it is: ``$`` escaped, else two of them start mathtext (a lone one fails the drawing)."""
    return str(text).replace("$", r"\$")


def _floats(series: pd.Series) -> Any:
    """A nullable column as a float array, ``<NA>`` as NaN (what matplotlib draws as a gap)."""
    return series.astype("Float64").to_numpy(dtype=float, na_value=np.nan)


def _request_axis(ax: Axes, n: int) -> Any:
    x = np.arange(1, n + 1)
    ax.set_xlabel("request (in frame order)")
    if n <= 30:
        ax.set_xticks(x)
    return x


def tokens_per_request(requests: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Stacked bars, one per row of ``requests``: cached, processed and generated tokens.

    Args:
        requests: a :func:`boxmaker.frames.requests` frame (columns ``cached_tokens``,
            ``processed_tokens``, ``generated_tokens``), in the order to draw.
        ax: draw into this Axes instead of a new Figure.

    Returns:
        The Figure drawn on (three bar containers of ``len(requests)`` bars each).
    """
    figure, ax = _axes(ax)
    x = _request_axis(ax, len(requests))
    bottom = np.zeros(len(requests))
    for column, label in (
        ("cached_tokens", "cached"),
        ("processed_tokens", "processed"),
        ("generated_tokens", "generated"),
    ):
        values = np.nan_to_num(_floats(requests[column]))
        ax.bar(x, values, bottom=bottom, label=label, color=COLORS[label])
        bottom = bottom + values
    ax.set_ylabel("tokens")
    ax.set_title("Tokens per request")
    ax.legend(loc="upper left")
    return figure


def time_per_request(requests: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Stacked bars, one per row of ``requests``: prompt and generation time.

    Args:
        requests: a :func:`boxmaker.frames.requests` frame (columns ``prompt_ms``,
            ``generation_ms``), in the order to draw.
        ax: draw into this Axes instead of a new Figure.

    Returns:
        The Figure drawn on (two bar containers of ``len(requests)`` bars each).
    """
    figure, ax = _axes(ax)
    x = _request_axis(ax, len(requests))
    prompt = np.nan_to_num(_floats(requests["prompt_ms"]))
    generation = np.nan_to_num(_floats(requests["generation_ms"]))
    ax.bar(x, prompt, label="prompt", color=COLORS["prompt"])
    ax.bar(x, generation, bottom=prompt, label="generation", color=COLORS["generation"])
    ax.set_ylabel("ms")
    ax.set_title("Time per request")
    ax.legend(loc="upper left")
    return figure


def cache_reuse(
    requests: pd.DataFrame,
    cache_losses: pd.DataFrame | None = None,
    *,
    ax: Axes | None = None,
) -> Figure:
    """The cache reuse ratio (``cached_tokens / prompt_tokens``) along each session, one line
    per session, with the requests that lost cache marked by a red cross.

    Args:
        requests: a :func:`boxmaker.frames.requests` frame (``session``, ``request``,
            ``cache_reuse_ratio``); x is the request number within the session.
        cache_losses: a :func:`boxmaker.frames.cache_losses` frame; its ``(session, request)``
            pairs are marked. ``None``: no marks.
        ax: draw into this Axes instead of a new Figure.

    Returns:
        The Figure drawn on: one line per session in ``requests``, plus one line of markers
        (no connecting line) when there are losses to mark.
    """
    figure, ax = _axes(ax)
    sessions = [str(s) for s in pd.unique(requests["session"])]
    for session in sessions:
        rows = requests[requests["session"] == session]
        ax.plot(
            _floats(rows["request"]),
            _floats(rows["cache_reuse_ratio"]),
            marker=".",
            label=_plain(session) if len(sessions) <= 8 else None,
        )
    if cache_losses is not None and len(cache_losses):
        keys = requests.set_index(["session", "request"])["cache_reuse_ratio"]
        marks = [
            (float(r), float(keys.get((s, r), np.nan)))
            for s, r in zip(cache_losses["session"], cache_losses["request"], strict=True)
            if s in sessions and not pd.isna(r)
        ]
        if marks:
            xs, ys = zip(*marks, strict=True)
            ax.plot(
                xs,
                ys,
                linestyle="none",
                marker="x",
                markersize=9,
                color=COLORS["loss"],
                label="cache loss",
            )
    ax.set_ylim(-0.05, 1.05)
    ax.set_xlabel("request in the session")
    ax.set_ylabel("cached / prompt tokens")
    ax.set_title("Cache reuse along the session")
    if ax.get_legend_handles_labels()[0]:  # more than 8 sessions are drawn unlabelled
        ax.legend(loc="lower right", fontsize="small")
    return figure


def limit_hits_per_kind(limit_hits: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """One bar per limit kind: how often it fired.

    Args:
        limit_hits: a :func:`boxmaker.frames.limit_hits` frame; its ``kind`` categories give
            the bars (all five kinds, zero included, plus any unknown kinds found).
        ax: draw into this Axes instead of a new Figure.

    Returns:
        The Figure drawn on (one bar container with a bar per kind).
    """
    figure, ax = _axes(ax)
    counts = limit_hits["kind"].value_counts(sort=False)
    kinds = [_plain(k) for k in counts.index]
    bars = ax.bar(kinds, counts.to_numpy(), color=COLORS["loss"])
    ax.bar_label(bars)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, max(1, int(counts.max()) if len(counts) else 0) * 1.1)  # no hit: 0 to 1
    ax.set_ylabel("hits")
    ax.set_title("Limit hits per kind")
    ax.tick_params(axis="x", labelrotation=20)
    return figure


def lost_tokens_by_cause(cache_losses: pd.DataFrame, *, ax: Axes | None = None) -> Figure:
    """Tokens lost to cache misses along the session, stacked by cause.

    Args:
        cache_losses: a :func:`boxmaker.frames.cache_losses` frame (``request``, ``cause``,
            ``lost_tokens``); filter it to one session to see that session (the requests of
            several sessions with the same number share a bar).
        ax: draw into this Axes instead of a new Figure.

    Returns:
        The Figure drawn on: one bar container per cause present (labelled with the cause,
        losses without one as :data:`NOT_EXPLAINED`), one bar per request that lost cache,
        its height the lost tokens (summed over sessions).
    """
    figure, ax = _axes(ax)
    frame = pd.DataFrame(
        {
            "request": _floats(cache_losses["request"]),
            "cause": cache_losses["cause"].astype("string").fillna(NOT_EXPLAINED),
            "lost": _floats(cache_losses["lost_tokens"]),
        }
    )
    table = frame.pivot_table(
        index="request", columns="cause", values="lost", aggfunc="sum", fill_value=0.0
    )
    order = [c for c in CAUSE_COLORS if c in table.columns]
    order += [str(c) for c in table.columns if c not in CAUSE_COLORS]
    x = table.index.to_numpy(dtype=float)
    bottom = np.zeros(len(x))
    for cause in order:
        heights = table[cause].to_numpy(dtype=float)
        ax.bar(x, heights, bottom=bottom, label=_plain(cause), color=CAUSE_COLORS.get(cause))
        bottom += heights
    if len(x) <= 30:
        ax.set_xticks(x)
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("request in the session")
    ax.set_ylabel("lost tokens")
    ax.set_title("Tokens lost to cache misses, by cause")
    if order:
        # headroom above the tallest bar for the legend (a row per cause, about 7 % of the
        # axes' height each, with its frame), so that no bar is drawn under it
        top = float(bottom.max()) if len(bottom) else 1.0
        ax.set_ylim(0, top / max(0.3, 1.0 - 0.08 * (len(order) + 1)))
        ax.legend(loc="upper left", fontsize="small")
    return figure
