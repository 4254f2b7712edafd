"""The transcript as HTML: what the widgets show of each turn.

:func:`render_turn` turns one :class:`~boxmaker.transcript.TurnView` into an HTML fragment for
the widgets (:mod:`boxmaker.widgets`): reasoning, tool calls and results escaped into
``<pre>``, answers rendered as Markdown (:func:`render_markdown`), counters and badges.

It depends on the pure transcript (:mod:`boxmaker.transcript`) and ``markdown``; never on
ipywidgets.
"""

from __future__ import annotations

import html
import json

import markdown

from .transcript import AnswerBlock, Block, ReasoningBlock, TurnView

__all__ = [
    "counters_text",
    "render_block",
    "render_markdown",
    "render_turn",
]


def render_markdown(text: str) -> str:
    """Markdown to HTML (python-markdown with fenced code and tables); raw HTML is escaped,
    so a model cannot inject markup into the page."""
    return markdown.markdown(html.escape(text, quote=False), extensions=["fenced_code", "tables"])


# -- the transcript as HTML -------------------------------------------------------------------

_BADGE_COLOURS = {"cache_loss": "#b36b00"}
_CSS = (
    "<style>"
    ".bxm-turn{font-family:var(--jp-ui-font-family,sans-serif);margin:6px 0;}"
    ".bxm-user{background:#eef3ff;border-radius:6px;padding:4px 8px;margin:4px 0;"
    "white-space:pre-wrap;}"
    ".bxm-tool{border-left:3px solid #888;padding:2px 8px;margin:4px 0;}"
    ".bxm-tool pre,.bxm-reasoning pre{white-space:pre-wrap;margin:2px 0;font-size:90%;}"
    ".bxm-reasoning summary{color:#666;cursor:pointer;}"
    ".bxm-badge{display:inline-block;border-radius:8px;padding:0 6px;margin:2px;"
    "color:white;font-size:85%;}"
    ".bxm-counters{color:#555;font-size:85%;}"
    "</style>"
)


def _pretty(arguments: str) -> str:
    """Tool-call arguments as indented JSON, or as given when they are not JSON (or nest too
    deep for Python's parser)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


def render_block(block: Block, *, streaming: bool = False) -> str:
    """One block as an HTML fragment.

    Reasoning as a collapsible ``<details>`` with its token count (open while ``streaming``),
    a tool call with its pretty JSON arguments and its result (data class, untrusted and
    truncated marked), both escaped into ``<pre>``; an answer through :func:`render_markdown`.
    """
    e = html.escape
    if isinstance(block, ReasoningBlock):
        capped = ", capped" if block.capped else ""
        return (
            f"<details class='bxm-reasoning'{' open' if streaming else ''}>"
            f"<summary>Reasoning ({block.tokens} tokens{capped})</summary>"
            f"<pre>{e(block.text)}</pre></details>"
        )
    if isinstance(block, AnswerBlock):
        return f"<div class='bxm-answer'>{render_markdown(block.text)}</div>"
    number = f" #{block.call}" if block.call is not None else ""
    out = [
        f"<div class='bxm-tool'><b>Tool call{number}: {e(block.name)}</b>",
        f"<pre class='bxm-args'>{e(_pretty(block.arguments))}</pre>",
    ]
    if block.result is None:
        out.append("<i>running…</i>")
    else:
        marks = [f"data class: {e(block.data_class)}"]
        if block.untrusted:
            marks.append("<b style='color:#c00'>untrusted</b>")
        if block.truncated:
            marks.append("<b style='color:#b36b00'>truncated</b>")
        out.append(f"<div>Result ({', '.join(marks)}):</div>")
        out.append(f"<pre class='bxm-result'>{e(block.result)}</pre>")
    out.append("</div>")
    return "".join(out)


def counters_text(turn: TurnView) -> str:
    """The turn's counters in one line, e.g. ``prompt 571 · cached 0 · generated 24 ·
    reasoning 0 tokens · 92 ms (1 completion)``."""
    n = turn.completions
    return (
        f"prompt {turn.prompt} · cached {turn.cached} · generated {turn.generated} · "
        f"reasoning {turn.reasoning} tokens · {turn.ms:.0f} ms "
        f"({n} completion{'s' if n != 1 else ''})"
    )


def render_turn(turn: TurnView, *, streaming: bool = False) -> str:
    """One turn as an HTML fragment: a ``<style>`` for the ``bxm-`` classes, the user message,
    the blocks (:func:`render_block`; the last one open while ``streaming``), counters
    (:func:`counters_text`), badges and how the turn ended, all but the answers escaped."""
    e = html.escape
    last = len(turn.blocks) - 1
    parts = [_CSS, "<div class='bxm-turn'>"]
    if turn.user:
        parts.append(f"<div class='bxm-user'><b>You:</b> {e(turn.user)}</div>")
    parts += [render_block(b, streaming=streaming and i == last) for i, b in enumerate(turn.blocks)]
    if turn.completions:
        parts.append(f"<div class='bxm-counters'>{e(counters_text(turn))}</div>")
    for kind, text in turn.badges:
        colour = _BADGE_COLOURS.get(kind, "#c0392b")
        parts.append(
            f"<span class='bxm-badge bxm-badge-{e(kind)}' style='background:{colour}'>"
            f"{e(text)}</span>"
        )
    if turn.ended:
        parts.append(f"<div class='bxm-ended'><i>Turn ended: {e(turn.ended)}</i></div>")
    parts.append("</div>")
    return "".join(parts)
