"""``boxmaker report PATH... [--html FILE]``: usage, cache loss and limit hits of session logs.

The text report (printed) has one table per question: the sessions (:func:`boxmaker.frames.
summary`), turns by outcome, limit hits by kind, cache losses by session and by cause (what
cache forensics found: the tokens of the previous prompts not reused, ``lost_tokens``, and the
tokens and time the server spent processing again, ``reprocessed_tokens`` and
``reprocessed_ms``), tool calls by tool. Only what happened is shown (an outcome no turn had, a
limit that never fired: no row), and a value a log does not hold is ``unknown``, never 0: a
total over an unknown is unknown (:mod:`boxmaker.frames`' rule). ``--json``
(:func:`format_json`) gives the sessions and turns as the frames hold them.
The HTML report holds the same tables and the plots of :mod:`boxmaker.frames.plots`, embedded as
base64 PNG images, in one self-contained file (no scripts, styles inline, nothing fetched).

:func:`gather` reads the logs and says what it left out; nothing here prints (the command's
output and exit codes are :mod:`boxmaker.cli`'s).
"""

from __future__ import annotations

import base64
import html as html_lib
import io
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd

from . import _build as frames

__all__ = [
    "UNKNOWN",
    "Gathered",
    "Section",
    "fit_text",
    "format_html",
    "format_json",
    "format_text",
    "gather",
    "tables",
]

UNKNOWN = "unknown"
"""How the text and HTML reports show a value the logs do not hold."""

_T = TypeVar("_T")

SESSION_COLUMNS = (
    "session",
    "turns",
    "answered_turns",
    "requests",
    "tool_calls",
    "cached_tokens",
    "processed_tokens",
    "generated_tokens",
    "reasoning_tokens",
    "prompt_ms",
    "generation_ms",
    "cache_reuse_ratio",
    "cache_losses",
    "lost_tokens",
    "reprocessed_tokens",
    "limit_hits",
)
"""The summary columns the report's sessions table shows."""

FORK_REPORT_COLUMNS = (
    "session",
    "parent_session",
    "fork_turn",
    "fork_point",
    "fork_settings",
    "inherited_turns",
    "inherited_requests",
    "turns",
    "requests",
    "processed_tokens",
    "cache_reuse_ratio",
    "limit_hits",
)
"""The summary columns of the report's ``Forks`` table (shown when a log is a fork): what it
copied from its parent (``inherited_*``), then its own turns, completions and costs (the
summary's totals leave the copies out)."""

PER_REQUEST_PLOTS = 4
"""The per-request plots show at most this many sessions (the ones with most requests)."""


def tables(loaded: frames.Frames) -> dict[str, pd.DataFrame]:
    """The report's tables, by title, from the frames of :func:`boxmaker.frames.load`.

    ``Sessions`` (a row per session and a ``total`` row), ``Turns by outcome`` (every outcome
    of :data:`boxmaker.frames.TURN_OUTCOMES`), ``Limit hits by kind`` (every kind),
    ``Cache losses by session``, ``Cache losses by cause`` (losses without a cause as
    ``not explained``), ``Tool calls by tool`` (the calls answered: ``results``, the rows of
    :func:`boxmaker.frames.tool_calls`; the Sessions table's ``tool_calls`` counts the calls
    the model made, answered or not), and ``Forks`` when a log is a fork. Only what
    happened has a row (an outcome of no turn, a kind that never fired: none). A total over a
    value a log does not hold is ``<NA>`` (shown as :data:`UNKNOWN`). Milliseconds are
    rounded to 0.1, ratios to 0.001.

    Every record is counted once: a fork's rows copied from its parent (``from_parent``) are
    left out of every table (they are the parent's), and the summary's totals are a log's
    own already.
    """
    s = loaded.summary
    sessions = s[list(SESSION_COLUMNS)].copy()
    sessions["session"] = sessions["session"].astype("string")
    prompt = s.prompt_tokens.sum(skipna=False)
    total: dict[str, Any] = {
        name: sessions[name].sum(skipna=False) for name in SESSION_COLUMNS if name != "session"
    }
    total |= {
        "session": "total",
        "cache_reuse_ratio": _share(s.cached_tokens.sum(skipna=False), prompt),
    }
    total_row = pd.DataFrame([total], columns=list(SESSION_COLUMNS)).astype(sessions.dtypes)
    sessions = pd.concat([sessions, total_row], ignore_index=True)

    t = _own(loaded.turns)
    outcomes = t.groupby("outcome", observed=True).agg(
        turns=("turn", "size"),
        requests=("requests", _total),
        tool_calls=("tool_calls", _total),
        generated_tokens=("generated_tokens", _total),
        mean_wall_ms=("wall_ms", "mean"),
    )
    hits = (
        _own(loaded.limit_hits)
        .groupby("kind", observed=True)
        .agg(
            hits=("kind", "size"),
            sessions=("session", "nunique"),
            ended_turns=("ended_turn", "sum"),
        )
    )
    c = _own(loaded.cache_losses)
    losses = c.groupby("session", observed=True).agg(
        losses=("lost_tokens", "size"),
        lost_tokens=("lost_tokens", _total),
        reprocessed_tokens=("reprocessed_tokens", _total),
        reprocessed_ms=("reprocessed_ms", _total),
    )
    by_cause = c.assign(cause=c["cause"].astype("string").fillna("not explained"))
    causes = by_cause.groupby("cause").agg(
        losses=("lost_tokens", "size"),
        sessions=("session", "nunique"),
        lost_tokens=("lost_tokens", _total),
        reprocessed_tokens=("reprocessed_tokens", _total),
        reprocessed_ms=("reprocessed_ms", _total),
    )
    tc = _own(loaded.tool_calls)
    tools = tc.groupby("name", observed=True).agg(
        results=("call", "size"),
        ran=("ran", "sum"),
        truncated=("truncated", "sum"),
        mean_arguments_chars=("arguments_chars", "mean"),
        mean_result_chars=("result_chars", "mean"),
    )
    out = {
        "Sessions": sessions,
        "Turns by outcome": outcomes.reset_index(),
        "Limit hits by kind": hits.reset_index(),
        "Cache losses by session": losses.reset_index(),
        "Cache losses by cause": causes.sort_values("lost_tokens", ascending=False).reset_index(),
        "Tool calls by tool": tools.reset_index(),
    }
    if s["parent_session"].notna().any():  # only when there are forks among the logs
        forked = s[s["parent_session"].notna()]
        out["Forks"] = forked[list(FORK_REPORT_COLUMNS)].astype({"session": "string"})
    return {title: _rounded(df) for title, df in out.items()}


def _shown(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every missing value as :data:`UNKNOWN` (pandas prints ``<NA>`` for its
    nullable dtypes whatever ``na_rep`` says)."""
    return df.astype(object).where(df.notna(), UNKNOWN)


def _total(values: pd.Series) -> Any:
    """A table's total: unknown (``<NA>``) when a value is."""
    return values.sum(skipna=False)


def _share(part: Any, whole: Any) -> Any:
    """``part / whole``, ``<NA>`` when either is unknown or ``whole`` is 0."""
    if pd.isna(part) or pd.isna(whole) or not whole:
        return pd.NA
    return part / whole


def _own(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of a per-row frame that are not copies of a fork's parent's records."""
    return df[~df["from_parent"].to_numpy(dtype=bool)]


def _rounded(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for name in df.columns:
        if str(df[name].dtype) in ("Float64", "float64"):
            digits = 3 if name.endswith("ratio") else 1
            df[name] = df[name].astype("Float64").round(digits)
    return df


TEXT_WIDTH = 100
"""Widest line of the text report, in characters: a wider table is cut into blocks of
columns, each block led by the table's first column (the session, the kind, ...)."""


def format_text(loaded: frames.Frames, *, width: int = TEXT_WIDTH) -> str:
    """The text report: each of :func:`tables` under its title (``(none)`` when empty), its
    lines at most ``width`` characters where the columns allow it (see :data:`TEXT_WIDTH`)."""
    parts = []
    for title, df in tables(loaded).items():
        body = fit_text(df, width) if len(df) else "(none)"
        parts.append(f"{title}\n{'-' * len(title)}\n{body}\n")
    return "\n".join(parts)


def fit_text(df: pd.DataFrame, width: int = TEXT_WIDTH) -> str:
    """``df`` as text (no index) in blocks of whole columns, each at most ``width`` characters
    wide (a single column wider than that stays whole), each led by the first column."""
    df = _shown(df)
    first, rest = df.columns[0], list(df.columns[1:])
    blocks: list[list[str]] = [[]]
    for name in rest:
        trial = df[[first, *blocks[-1], name]].to_string(index=False)
        if blocks[-1] and max(map(len, trial.splitlines())) > width:
            blocks.append([])
        blocks[-1].append(name)
    return "\n\n".join(df[[first, *block]].to_string(index=False) for block in blocks)


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=96)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: right; }
th { background: #f0f0f0; }
img { max-width: 100%; display: block; margin: 0.5em 0 1.5em; }
"""


@dataclass(frozen=True)
class Section:
    """A section the caller adds to the HTML report, after the tables and plots of the logs
    (the command adds a batch's runs and its comparison of settings: parts this module does
    not import).

    Attributes:
        title: the section's heading (escaped).
        table: a frame shown as an HTML table (cells escaped), or ``None``.
        text: a paragraph above the table (escaped; for a header line or why a part is absent).
        figures: matplotlib figures embedded as PNG images, each titled by its first axes.
    """

    title: str
    table: pd.DataFrame | None = None
    text: str = ""
    figures: tuple[Any, ...] = ()


def format_html(
    loaded: frames.Frames,
    *,
    title: str = "boxmaker report",
    left_out: Sequence[str] = (),
    sections: Sequence[Section] = (),
) -> str:
    """A self-contained HTML report: :func:`tables`, then the plots as embedded PNG images
    (``data:image/png;base64,...``): limit hits per kind, cache reuse along the sessions, lost
    tokens by cause (when there are losses), and
    tokens and time per request for the sessions with the most requests (at most
    :data:`PER_REQUEST_PLOTS`). ``left_out`` lists the logs (or lines) that could not be read,
    shown first so a reader knows what the numbers do not cover; ``sections`` follow the plots
    (see :class:`Section`)."""
    from . import plots  # matplotlib only when a report with plots is made

    body = [f"<h1>{html_lib.escape(title)}</h1>"]
    if left_out:
        items = "".join(f"<li>{html_lib.escape(m)}</li>" for m in left_out)
        body.append(f"<h2>Left out</h2><ul>{items}</ul>")
    for name, df in tables(loaded).items():
        body.append(f"<h2>{html_lib.escape(name)}</h2>")
        body.append(_shown(df).to_html(index=False, border=0) if len(df) else "<p>(none)</p>")
    body.append("<h2>Plots</h2>")
    req = loaded.requests  # per-session curves: a fork's whole conversation, copies included
    own_losses = _own(loaded.cache_losses)
    figures = [
        plots.limit_hits_per_kind(_own(loaded.limit_hits)),
        plots.cache_reuse(req, loaded.cache_losses),
    ]
    if len(own_losses):
        figures.append(plots.lost_tokens_by_cause(own_losses))
    busiest = req.groupby("session", observed=True).size().sort_values(ascending=False)
    for session in list(busiest.index[:PER_REQUEST_PLOTS]):
        rows = req[req["session"] == session]
        for draw in (plots.tokens_per_request, plots.time_per_request):
            figure = draw(rows)
            title = f"{figure.axes[0].get_title()}: {session}"
            figure.axes[0].set_title(title, parse_math=False)  # a "$" in an id is no mathtext
            figures.append(figure)
    body.extend(_image(figure) for figure in figures)
    for section in sections:
        body.append(f"<h2>{html_lib.escape(section.title)}</h2>")
        if section.text:
            body.append(f"<p>{html_lib.escape(section.text)}</p>")
        if section.table is not None:
            table = section.table
            body.append(table.to_html(index=False, na_rep="", border=0) if len(table) else "")
        body.extend(_image(figure) for figure in section.figures)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html_lib.escape(title)}</title><style>{_STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _image(figure: Any) -> str:
    """``figure`` as an ``<img>`` with its first axes' title as the alternative text."""
    alt = html_lib.escape(figure.axes[0].get_title(), quote=True)
    return f'<img alt="{alt}" src="{_png(figure)}">'


def format_json(loaded: frames.Frames, *, left_out: Sequence[str] = ()) -> str:
    """The report as JSON: ``sessions`` (the :func:`boxmaker.frames.summary` rows), ``turns``
    (the :func:`boxmaker.frames.turns` rows), ``cache_losses`` and ``limit_hits`` (their
    frames' rows), each a list of objects with the frames' column names and units; times as
    ISO 8601 UTC text, a value the logs do not hold as ``null``; ``left_out``: what could not
    be read. Copies of a fork's parent's records are rows with ``from_parent`` true, as in the
    frames."""
    import json

    def rows(df: pd.DataFrame) -> list[dict[str, Any]]:
        out = []
        for row in df.astype(object).to_dict("records"):
            out.append({str(k): _plain(v) for k, v in row.items()})
        return out

    body = {
        "sessions": rows(loaded.summary),
        "turns": rows(loaded.turns),
        "cache_losses": rows(loaded.cache_losses),
        "limit_hits": rows(loaded.limit_hits),
        "left_out": list(left_out),
    }
    return json.dumps(body, ensure_ascii=True, indent=1, allow_nan=False)  # inert in a terminal


def _plain(value: Any) -> Any:
    """A frame's cell as JSON: ``null`` for a missing value, ISO 8601 for a time."""
    if value is None or value is pd.NA or value is pd.NaT:
        return None
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, pd.Timestamp):
        return value.isoformat()
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    return value


def _collect(call: Callable[[], _T], messages: list[str]) -> _T:
    """Run ``call``, keeping its :class:`~boxmaker.frames.LogReadWarning` messages."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", frames.LogReadWarning)
        result = call()
    for w in caught:
        if issubclass(w.category, frames.LogReadWarning):
            messages.append(str(w.message))
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return result


@dataclass(frozen=True)
class Gathered:
    """The session logs under some paths, read for a report.

    Attributes:
        loaded: the frames of every readable log, ``None`` when there is nothing to report.
        left_out: why logs (or paths) were left out, one message each (file and line).
        logs: how many logs were found.
        error: why there is nothing to report (no log found, none readable), else ``None``.
    """

    loaded: frames.Frames | None
    left_out: tuple[str, ...]
    logs: int
    error: str | None = None


def gather(paths: Sequence[str]) -> Gathered:
    """Find and read the session logs under ``paths`` (files, or directories searched
    recursively for ``*.jsonl``), keeping the :class:`~boxmaker.frames.LogReadWarning` of each
    log left out as a message instead of warning."""
    problems: list[str] = []
    logs = _collect(lambda: frames.find_logs(list(paths), strict=False), problems)
    if not logs:
        error = f"no session logs (*.jsonl) found in {', '.join(paths)}"
        return Gathered(None, tuple(problems), 0, error)
    loaded = _collect(lambda: frames.load(logs), problems)
    if loaded.summary.empty:
        error = f"none of the {len(logs)} session logs is readable"
        return Gathered(None, tuple(problems), len(logs), error)
    return Gathered(loaded, tuple(problems), len(logs))
