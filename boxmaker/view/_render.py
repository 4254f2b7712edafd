"""Model text made safe to show: the transcript as HTML, and text for a terminal.

Everything a model writes (answers, reasoning, tool-call names and arguments, and tool results,
which may come from the web) is untrusted. This module is the one place that turns it into
something shown, for the widgets (:mod:`boxmaker.widgets`), the console view
(:class:`ConsoleView`) and ``boxmaker cassette show``:

- HTML (:func:`render_turn`, :func:`render_block`, and the pieces a live view draws while a
  block streams, :func:`render_stream_head` and :func:`render_text`): reasoning, tool calls
  and results are escaped into ``<pre>``; answers are rendered as Markdown by
  :func:`render_markdown`, which treats raw HTML in the text as text, leaves images as their
  Markdown source text (a rendered answer fetches nothing, so a model cannot send the
  conversation to a server through an image address), and passes the result through the
  ``nh3`` sanitizer (Python bindings of the Rust ``ammonia`` library): an allow-list of tags
  and attributes, links kept only with an ``http``, ``https`` or ``mailto`` address. Relative
  links (``/logout``, ``../x``, ``#top``) lose their address too, since in a notebook they
  would point into the Jupyter server. A link that loses its address stays as its text.
- Terminal (:func:`terminal_safe`): control characters, which would let model text move the
  cursor, retitle the window, clear the screen or hide text, are shown as ``\\x1b``-style
  escapes.

It depends on the pure transcript (:mod:`boxmaker.view`), ``markdown`` and ``nh3``;
never on ipywidgets.
"""

from __future__ import annotations

import functools
import html
import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec

from ._transcript import AnswerBlock, Block, ReasoningBlock, TurnView

_P = ParamSpec("_P")

__all__ = [
    "LINK_SCHEMES",
    "TRANSCRIPT_CSS",
    "counters_text",
    "render_block",
    "render_markdown",
    "render_stream_head",
    "render_text",
    "render_turn",
    "render_turn_foot",
    "render_user",
    "terminal_safe",
]

LINK_SCHEMES = frozenset({"http", "https", "mailto"})
"""The only URL schemes a link in rendered model text keeps (others lose their address)."""

_TAGS = frozenset(
    {"p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "code", "pre"}
    | {"blockquote", "ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td"}
)
"""What python-markdown (with fenced code and tables, raw HTML and images off) can emit."""

if TYPE_CHECKING:
    import markdown
    import nh3


@functools.cache
def _sanitizer() -> nh3.Cleaner:
    """The ``nh3`` cleaner of :func:`render_markdown`, made on first use (markdown and nh3 are
    imported only when HTML is rendered, not by ``import boxmaker`` or the command line)."""
    import nh3

    return nh3.Cleaner(
        tags=set(_TAGS),
        clean_content_tags={"script", "style"},
        attributes={"a": {"href", "title"}, "th": {"style"}, "td": {"style"}},
        filter_style_properties={"text-align"},  # the tables extension aligns columns this way
        url_schemes=set(LINK_SCHEMES),
        url_relative="deny",
        link_rel="noopener noreferrer nofollow",
        set_tag_attribute_values={"a": {"target": "_blank"}},  # never replace the notebook page
    )


def _untrusted_markdown() -> markdown.Markdown:
    """python-markdown without raw HTML and without images, both shown as the text they are.

    Deregisters the ``html_block`` preprocessor and the ``html`` inline pattern, so markup in
    the text reaches the output escaped, and the image patterns, so ``![alt](url)`` stays that
    text (python-markdown never reads ``[alt](url)`` after a ``!`` as a link).
    """
    import markdown

    converter = markdown.Markdown(extensions=["fenced_code", "tables"])
    converter.preprocessors.deregister("html_block")
    for name in ("html", "image_link", "image_reference", "short_image_ref"):
        converter.inlinePatterns.deregister(name)
    return converter


_SURROGATES = re.compile("[\ud800-\udfff]")
"""A lone surrogate (``\\ud800`` in a JSON string gives one): no UTF-8 encodes it, so the
sanitizer, a widget's comm message and a file write would fail on it."""


def scalar_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, the replacement character, so it
    can be encoded as UTF-8 (for HTML, a widget, a file); any other text is returned as is."""
    return _SURROGATES.sub("\ufffd", text)


def _scalar_html(render: Callable[_P, str]) -> Callable[_P, str]:
    """A renderer whose HTML is :func:`scalar_text` (model and tool text reach it whole)."""

    @functools.wraps(render)
    def scalar(*args: _P.args, **kwargs: _P.kwargs) -> str:
        return scalar_text(render(*args, **kwargs))

    return scalar


def render_markdown(text: str) -> str:
    """Untrusted Markdown to safe HTML.

    Args:
        text: Markdown source (a model's answer).

    Returns:
        An HTML fragment: python-markdown with fenced code and tables, raw HTML in ``text``
        escaped, images left as their source text, then sanitized by ``nh3``: only the tags
        python-markdown emits, no event handlers or styles (table alignment aside), links kept
        only with a scheme in :data:`LINK_SCHEMES` (``rel="noopener noreferrer nofollow"``,
        opened in a new tab).
    """
    return _sanitizer().clean(_untrusted_markdown().convert(scalar_text(text)))


_CONTROLS = re.compile("\r\n|[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Every C0 control but tab and newline, DEL, and every C1 control (U+0080-U+009F, among them
the 8-bit CSI U+009B and OSC U+009D); a Windows line end is matched whole."""


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\r\n":
        return "\n"
    return "\\r" if char == "\r" else f"\\x{ord(char):02x}"


def terminal_safe(text: str) -> str:
    """``text`` with its control characters made visible, for printing to a terminal.

    A terminal acts on control characters instead of showing them: ``ESC`` starts sequences
    that move the cursor, clear the screen (``\\x1b[2J``), set the window title
    (``\\x1b]0;...\\x07``) or write to the clipboard; ``CR`` and backspace overwrite what was
    printed; C1 characters such as U+009B act like ``ESC [``. Each such character (C0 but tab
    and newline, DEL, C1) is replaced by its escape, ``\\x1b``, ``\\x07``, ``\\x9b``...
    (``\\r`` for a lone carriage return; a ``\\r\\n`` line end becomes ``\\n``). Everything
    else, tab and newline among it, is kept.

    Args:
        text: model or server text (any length; a stream may pass fragment by fragment, but a
            ``\\r\\n`` split across two fragments then shows as ``\\r`` and a new line).

    Returns:
        Text without any C0 (but tab and newline), DEL or C1 character.
    """
    return _CONTROLS.sub(_visible, text)


# -- the transcript as HTML -------------------------------------------------------------------

_BADGE_COLOURS = {"cache_loss": "#b36b00"}
TRANSCRIPT_CSS = (
    "<style>"
    ".bxm-turn{font-family:var(--jp-ui-font-family,sans-serif);margin:6px 0;}"
    ".bxm-user{background:#eef3ff;border-radius:6px;padding:4px 8px;margin:4px 0;"
    "white-space:pre-wrap;}"
    ".bxm-tool{border-left:3px solid #888;padding:2px 8px;margin:4px 0;}"
    ".bxm-tool pre,.bxm-reasoning pre{white-space:pre-wrap;margin:2px 0;font-size:90%;}"
    ".bxm-reasoning summary{color:#666;cursor:pointer;}"
    ".bxm-loss{display:inline-block;}.bxm-loss summary{cursor:pointer;}"
    ".bxm-loss pre{white-space:pre-wrap;margin:2px 0;font-size:90%;background:#f6f6f6;}"
    ".bxm-badge{display:inline-block;border-radius:8px;padding:0 6px;margin:2px;"
    "color:white;font-size:85%;}"
    ".bxm-counters{color:#555;font-size:85%;}"
    ".bxm-stream-head{color:#666;}"
    "</style>"
)
"""The ``<style>`` for the ``bxm-`` classes, at the head of every rendered turn."""


def _pretty(arguments: str) -> str:
    """Tool-call arguments as indented JSON, or as given when they are not JSON (or nest too
    deep for Python's parser)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError):
        return arguments


@_scalar_html
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
    reasoning 0 tokens · 92 ms (1 completion)``; a counter the server did not send is
    ``unknown``."""
    n = turn.completions

    def shown(value: float | None, form: str = "") -> str:
        return "unknown" if value is None else format(value, form)

    return (
        f"prompt {shown(turn.prompt)} · cached {shown(turn.cached)} · "
        f"generated {shown(turn.generated)} · reasoning {shown(turn.reasoning)} tokens · "
        f"{shown(turn.ms, '.0f')} ms ({n} completion{'s' if n != 1 else ''})"
    )


@_scalar_html
def render_user(turn: TurnView) -> str:
    """The turn's user message as an escaped ``bxm-user`` block (``""`` when it has none)."""
    return f"<div class='bxm-user'><b>You:</b> {html.escape(turn.user)}</div>" if turn.user else ""


@_scalar_html
def render_turn_foot(turn: TurnView) -> str:
    """What follows a turn's blocks: counters (:func:`counters_text`), one badge per limit hit
    or cache loss (a loss with text windows as a ``<details>`` that opens on them: what the
    slot held and the new prompt around the divergence), and how the turn ended; all
    escaped."""
    e = html.escape
    parts = []
    if turn.completions:
        parts.append(f"<div class='bxm-counters'>{e(counters_text(turn))}</div>")
    for i, (kind, text) in enumerate(turn.badges):
        colour = _BADGE_COLOURS.get(kind, "#c0392b")
        badge = (
            f"<span class='bxm-badge bxm-badge-{e(kind)}' style='background:{colour}'>"
            f"{e(text)}</span>"
        )
        if i not in turn.windows:
            parts.append(badge)
            continue
        old, new = turn.windows[i]  # model and tool text: escaped, shown as it is
        parts.append(
            f"<details class='bxm-loss'><summary>{badge}</summary>"
            f"<div>slot held:</div><pre>{e(old)}</pre>"
            f"<div>new prompt:</div><pre>{e(new)}</pre></details>"
        )
    if turn.ended:
        parts.append(f"<div class='bxm-ended'><i>Turn ended: {e(turn.ended)}</i></div>")
    return "".join(parts)


@_scalar_html
def render_turn(turn: TurnView, *, streaming: bool = False) -> str:
    """One turn as an HTML fragment: a ``<style>`` for the ``bxm-`` classes, the user message
    (:func:`render_user`), the blocks (:func:`render_block`; the last one open while
    ``streaming``) and :func:`render_turn_foot`, all but the answers escaped."""
    last = len(turn.blocks) - 1
    parts = [TRANSCRIPT_CSS, "<div class='bxm-turn'>", render_user(turn)]
    parts += [render_block(b, streaming=streaming and i == last) for i, b in enumerate(turn.blocks)]
    parts += [render_turn_foot(turn), "</div>"]
    return "".join(parts)


# -- a block while it streams ----------------------------------------------------------------


@_scalar_html
def render_stream_head(block: ReasoningBlock | AnswerBlock) -> str:
    """The line above a block that is still streaming: ``Reasoning (N tokens)…`` for
    reasoning, nothing for an answer (its text follows as :func:`render_text`)."""
    if isinstance(block, ReasoningBlock):
        return f"<div class='bxm-stream-head'>Reasoning ({block.tokens} tokens)…</div>"
    return ""


@_scalar_html
def render_text(text: str) -> str:
    """A piece of streaming model text, escaped, to be shown as it is (``white-space:
    pre-wrap``); pieces escaped apart and shown one after the other read as the whole text
    escaped (escaping is per character). Its Markdown is rendered once, when the block ends
    (:func:`render_block`)."""
    return html.escape(text, quote=False)
