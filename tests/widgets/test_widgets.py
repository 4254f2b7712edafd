"""Widget tests without a server: event sequences and scripted clients drive the panel."""

from __future__ import annotations

import html
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ipywidgets as ipw
import nbformat
import pytest
from hostile import HOSTILE_MARKDOWN, live_hazards
from hypothesis import given
from hypothesis import strategies as st

import boxmaker
import boxmaker.view._render
import boxmaker.widgets
import boxmaker.widgets._draw
from boxmaker.client import Completion
from boxmaker.config import Config, LoopLimits, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import RequestCancelled, SessionError, TurnCancelled
from boxmaker.events import (
    ClientEvent,
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallStarted,
    Waiting,
)
from boxmaker.records import Assistant, Baseline, CacheLoss, LimitHit, ToolResult, Usage, User
from boxmaker.records import ToolCall as Call
from boxmaker.session import LogReadWarning, Session
from boxmaker.testing import ScriptedClient, Step, answer, call, calls, timings
from boxmaker.turn import Runtime
from boxmaker.view import (
    AnswerBlock,
    ReasoningBlock,
    ToolBlock,
    Transcript,
    render_block,
    render_turn,
)
from boxmaker.view._render import render_markdown
from boxmaker.widgets import SUBMIT, ChatPanel, SessionView
from boxmaker.widgets._draw import CHUNK_CHARS

ROOT = Path(__file__).resolve().parents[2]


def _session(tmp_path: Path) -> Session:
    return Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))


def _panel(tmp_path: Path, client: Any, **loop: Any) -> ChatPanel:
    config = Config(loop=LoopLimits(**loop))
    runtime = Runtime(config=config, client=client, registry=demo_registry())
    return ChatPanel(runtime, _session(tmp_path))


def _text(panel: ChatPanel) -> str:
    return panel.html()


# -- the pure transcript ----------------------------------------------------------------------

LIVE_TURN: list[Any] = [
    User(content="Weather in Oslo?"),
    Queued(),
    Progress(total=100, cache=40, processed=70, time_ms=5.0),
    Waiting(),
    Reasoning("I should "),
    Reasoning("call it"),
    ThinkingCapped(reasoning_tokens=2),
    Assistant(
        content=None,
        reasoning="I should call it",
        tool_calls=(Call(id="c1", name="get_weather", arguments='{"city": "Oslo"}'),),
    ),
    Usage(timings=timings(40, 60, 7), reasoning_tokens=2, thinking_capped=True),
    LimitHit(kind="thinking_cap", detail="reasoning ended after 2 tokens"),
    ToolCallStarted(name="get_weather", call=1, arguments='{"city": "Oslo"}'),
    ToolResult(
        call=1,
        tool_call_id="c1",
        name="get_weather",
        content="x" * 10,
        data_class="web",
        untrusted=True,
        truncated=True,
    ),
    LimitHit(kind="tool_result_cap", detail="get_weather result of 50 characters cut to 10"),
    Queued(),
    Content("It is **sunny** "),
    Content("in Oslo."),
    Assistant(content="It is **sunny** in Oslo."),
    Usage(timings=timings(100, 20, 5)),
    CacheLoss(expected=120, reused=100),
]


def test_transcript_folds_a_live_turn() -> None:
    clock = iter(range(100))
    t = Transcript(clock=lambda: float(next(clock))).extend(LIVE_TURN[:3])
    assert t.live.status == "Processing prompt" and t.live.progress == (70, 100, 40)
    t.extend(LIVE_TURN[3:])
    (turn,) = t.turns
    assert turn.user == "Weather in Oslo?"
    kinds = [type(b) for b in turn.blocks]
    assert kinds == [ReasoningBlock, ToolBlock, AnswerBlock]
    reasoning, tool, _ = turn.blocks
    assert isinstance(reasoning, ReasoningBlock) and reasoning.text == "I should call it"
    assert reasoning.tokens == 2 and reasoning.capped
    assert isinstance(tool, ToolBlock) and tool.call == 1 and tool.result == "x" * 10
    assert tool.untrusted and tool.truncated and tool.data_class == "web"
    assert turn.answer() == "It is **sunny** in Oslo."
    assert (turn.prompt, turn.cached, turn.generated, turn.reasoning) == (80, 140, 12, 2)
    assert turn.ms == pytest.approx(1.5 * 80 + 10.0 * 12)
    assert [k for k, _ in turn.badges] == ["thinking_cap", "tool_result_cap", "cache_loss"]
    page = render_turn(turn)
    assert "<strong>sunny</strong>" in page
    assert "Reasoning (2 tokens, capped)" in page and "<details" in page
    assert "Tool call #1: get_weather" in page
    assert "&quot;city&quot;: &quot;Oslo&quot;" in page  # pretty JSON, escaped
    assert "untrusted" in page and "truncated" in page and "data class: web" in page
    assert "prompt 80 · cached 140 · generated 12 · reasoning 2 tokens" in page
    assert "cache loss: 20 tokens lost (100 of 120 reused)" in page


def test_status_line_follows_the_request() -> None:
    t = Transcript(clock=iter([0.0, 0.5, 1.0]).__next__)
    t.apply(User(content="hi"))
    t.apply(Retrying(attempt=1, delay_s=0.5, reason="connection refused"))
    assert t.live.status == "Retrying in 0.5 s (attempt 1)"
    t.apply(Queued())
    assert t.live.status == "Queued"
    t.apply(Waiting())
    assert t.live.status == "Waiting"
    for _ in range(3):
        t.apply(Content("a"))
    assert t.live.status == "Generating at 2 tokens/s"
    t.end_turn("TurnCancelled: the turn was cancelled")
    assert t.live.status.startswith("Ended: TurnCancelled")
    assert "Turn ended: TurnCancelled" in render_turn(t.turns[0])


def test_generation_rate_uses_arrival_times() -> None:
    t = Transcript(clock=lambda: 100.0)  # folded late, all at once: arrival times count
    t.apply(User(content="hi"))
    for i in range(11):
        t.apply(Content("a"), at=i * 0.05)
    assert t.live.status == "Generating at 20 tokens/s"


def test_model_markup_is_escaped() -> None:
    t = Transcript().extend([User(content="<b>me</b>"), Assistant(content="<script>x</script>")])
    page = render_turn(t.turns[0])
    assert "<script>x" not in page and "&lt;script&gt;" in page and "<b>me</b>" not in page


def _modules_after(statement: str) -> set[str]:
    """The top-level modules loaded by ``statement`` in a fresh interpreter."""
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {name.split(".")[0] for name in out.stdout.split()}


def test_transcript_and_rendering_do_not_import_widgets() -> None:
    assert "ipywidgets" not in _modules_after("import boxmaker.view")
    package = _modules_after("import boxmaker")
    assert not {"ipywidgets", "markdown"} & package
    loaded = _modules_after("from boxmaker import ChatPanel, SessionView")
    assert "ipywidgets" in loaded


def test_the_package_loads_the_widget_classes_on_first_use() -> None:
    assert boxmaker.ChatPanel is ChatPanel and boxmaker.SessionView is SessionView
    assert {"ChatPanel", "SessionView"} <= set(dir(boxmaker))
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = boxmaker.Nope


def test_streamed_fragments_are_joined_once_when_read() -> None:
    t = Transcript(clock=lambda: 0.0).extend([User(content="hi")])
    for i in range(1000):
        t.apply(Reasoning(f"r{i} "))
    for i in range(1000):
        t.apply(Content(f"c{i} "))
    reasoning, answer = t.turns[0].blocks
    assert isinstance(reasoning, ReasoningBlock) and isinstance(answer, AnswerBlock)
    assert len(reasoning.parts) == 1000 and len(answer.parts) == 1000  # no join per fragment
    assert answer.text == "".join(f"c{i} " for i in range(1000))
    assert answer.parts == [answer.text]  # joined once, kept joined
    t.apply(Content("end"))
    assert t.turns[0].answer().endswith("c999 end") and reasoning.tokens == 1000


@given(
    fragments=st.lists(st.text(max_size=6), max_size=30),
    start=st.integers(min_value=0, max_value=200),
    read_at=st.integers(min_value=0, max_value=30),
)
def test_tail_is_the_text_from_a_character_on(
    fragments: list[str], start: int, read_at: int
) -> None:
    block = AnswerBlock()
    for i, fragment in enumerate(fragments):
        if i == read_at:
            _ = block.text  # reading joins the fragments: tail must still be right
        block.append(fragment)
    whole = "".join(fragments)
    assert block.size == len(whole)
    assert block.tail(start) == whole[start:]
    assert ReasoningBlock(parts=list(fragments)).tail(start) == whole[start:]


def test_a_refresh_renders_only_the_last_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    panel = _panel(tmp_path, ScriptedClient([]))
    for i in range(30):
        panel.on_event(User(content=f"q{i}"))
        panel.on_event(Assistant(content=f"a{i}"))
    panel.flush()
    assert len(panel._box.views) == 30
    rendered: list[str] = []

    def counting(block: Any, *, streaming: bool = False) -> str:
        rendered.append(block.text)
        return render_block(block, streaming=streaming)

    def never(turn: Any, *, streaming: bool = False) -> str:
        raise AssertionError(f"turn {turn.user} rendered whole")

    monkeypatch.setattr(boxmaker.widgets._draw, "render_block", counting)
    monkeypatch.setattr(boxmaker.widgets._draw, "render_turn", never)
    panel.on_event(Content(" more"))
    panel.flush()
    assert rendered == ["a29 more"]  # the block that grew, nothing else
    assert "a29 more" in panel._box.views[29].html()
    panel.on_event(User(content="q30"))
    panel.on_event(Assistant(content="a30"))
    panel.flush()
    assert rendered == ["a29 more", "a30"]
    assert len(panel._box.views) == 31 and "q30" in panel.html()
    assert panel._box.box.children and len(panel._box.box.children) == 1  # one page of turns
    assert all(len(page.children) <= 32 for page in panel._box.box.children)


def _html_changes(root: Any) -> list[str]:
    """Every ``value`` an HTML widget under ``root`` is set to from now on (widgets added
    later too)."""
    changes: list[str] = []
    watched: set[int] = set()

    def watch(widget: Any) -> None:
        if id(widget) in watched:
            return
        watched.add(id(widget))
        if isinstance(widget, ipw.HTML):
            changes.append(widget.value)  # a new widget sends its value once
            widget.observe(lambda ch: changes.append(ch["new"]), names="value")
        if isinstance(widget, ipw.Box):
            for child in widget.children:
                watch(child)
            widget.observe(lambda ch: [watch(c) for c in ch["new"]], names="children")  # type: ignore[func-returns-value]

    watch(root)
    changes.clear()
    return changes


def test_a_streaming_answer_is_drawn_by_appending(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    panel = _panel(tmp_path, ScriptedClient([]))
    panel._running = True
    panel.on_event(User(content="write"))
    panel.on_event(Reasoning("<think> & "))
    panel.flush()
    changes = _html_changes(panel._box.box)
    markdown_calls: list[int] = []
    original = boxmaker.view._render.render_markdown

    def counting(text: str) -> str:
        markdown_calls.append(len(text))
        return original(text)

    monkeypatch.setattr(boxmaker.view._render, "render_markdown", counting)
    pieces = [f"w{i} <b>&" if i % 7 == 0 else f"w{i} **x**\n" for i in range(4000)]
    for i, piece in enumerate(pieces):
        panel.on_event(Content(piece))
        if i % 40 == 39:
            panel.flush()
    text = "".join(pieces)
    sent = sum(len(c) for c in changes)
    assert markdown_calls == []  # nothing rendered as Markdown while it streams
    assert max(len(c) for c in changes) <= len(html.escape(text[:CHUNK_CHARS])) + 200
    assert sent < 3 * len(html.escape(text))  # each piece sent about once (was: every draw)
    live = panel._box.views[0].views[1][0]
    chunks = [w.value for page in live.body.children for w in page.children]
    assert "".join(chunks) == html.escape(text, quote=False)  # shown as text, escaped
    assert live_hazards("".join(chunks), tags=PANEL_TAGS) == []
    reasoning_view = panel._box.views[0].views[0][0]
    assert "&lt;think&gt; &amp;" in reasoning_view.value  # the reasoning ended: rendered once
    panel.on_event(Assistant(content=text, reasoning="<think> & "))
    panel.flush()
    assert markdown_calls == [len(text)]  # the answer's Markdown, once, when it ended
    panel.on_event(Usage(timings=timings(0, 10, 4000)))
    panel._running = False
    panel.flush()
    assert markdown_calls == [len(text)]
    assert panel.html() == render_turn(panel.transcript.turns[0])


# -- untrusted model text ---------------------------------------------------------------------

PANEL_TAGS = frozenset(
    {"style", "div", "span", "details", "summary", "pre", "b", "i"}  # the transcript's own
    | {"p", "br", "hr", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "code", "blockquote"}
    | {"ul", "ol", "li", "a", "table", "thead", "tbody", "tr", "th", "td"}  # Markdown
)
"""Every tag a rendered transcript may hold."""


@pytest.mark.parametrize("name", list(HOSTILE_MARKDOWN))
def test_hostile_markdown_renders_inert(name: str) -> None:
    text = HOSTILE_MARKDOWN[name]
    assert live_hazards(render_markdown(text), tags=PANEL_TAGS) == []
    turn = Transcript().extend([User(content=text), Assistant(content=text)]).turns[0]
    assert live_hazards(render_turn(turn), tags=PANEL_TAGS) == []


def test_hostile_markup_stays_visible_as_text() -> None:
    page = render_markdown("<script>alert(1)</script>\n\nand <img src=x onerror=alert(1)>")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert render_markdown("[click](javascript:alert(1))") == (
        '<p><a target="_blank" rel="noopener noreferrer nofollow">click</a></p>'
    )
    assert "![pic](https://evil.example/x.png)" in render_markdown(
        "![pic](https://evil.example/x.png)"
    )


def test_normal_markdown_still_renders() -> None:
    page = render_markdown(
        "# Title\n\n**bold**, *it*, `a < b` and [docs](https://example.org/a?b=1&c=2), "
        "<https://example.org>, <me@example.org>, [mail](mailto:me@example.org).\n\n"
        "- one\n- two\n\nthen\n\n1. first\n\n> quoted\n\n"
        "| left | right |\n|:-----|------:|\n| 1 | 2 |\n\n"
        "```python\nif x < 1 and y > 2:\n    pass\n```"
    )
    link = 'target="_blank" rel="noopener noreferrer nofollow"'
    assert "<h1>Title</h1>" in page
    assert "<strong>bold</strong>, <em>it</em>, <code>a &lt; b</code>" in page
    assert f'<a href="https://example.org/a?b=1&amp;c=2" {link}>docs</a>' in page
    assert f'<a href="https://example.org" {link}>https://example.org</a>' in page
    assert f'<a href="mailto:me@example.org" {link}>mail</a>' in page
    assert "me@example.org</a>" in page.split("mail</a>")[0]  # the autolinked address
    assert "<ul>\n<li>one</li>\n<li>two</li>\n</ul>" in page
    assert "<ol>\n<li>first</li>\n</ol>" in page
    assert "<blockquote>" in page
    assert '<th style="text-align:left">left</th>' in page
    assert '<td style="text-align:right">2</td>' in page
    assert "<pre><code>if x &lt; 1 and y &gt; 2:\n    pass\n</code></pre>" in page
    assert live_hazards(page, tags=PANEL_TAGS) == []


def test_hostile_text_is_inert_in_the_panel_and_the_session_view(tmp_path: Path) -> None:
    bad = "<img src=x onerror=alert(1)>"
    steps = [
        Step(reasoning="<script>", tool_calls=[call(bad, {"city": bad}), call("get_time", bad)]),
        calls(call("get_weather", {"city": f"[x](javascript:alert(1)) {bad}"})),
    ]
    steps += [answer(text) for text in HOSTILE_MARKDOWN.values()]
    panel = _panel(tmp_path, ScriptedClient(steps))
    for name in HOSTILE_MARKDOWN:
        outcome = panel.ask(f"say {name} {bad}", timeout=10)
        assert not isinstance(outcome, Exception), outcome
    view = SessionView(panel.session.path)
    assert len(view.transcript.turns) == len(HOSTILE_MARKDOWN)
    for page in (panel.html(), view.html()):
        assert live_hazards(page, tags=PANEL_TAGS) == []
        assert page.count("&lt;img src=x onerror=alert(1)&gt;") >= len(HOSTILE_MARKDOWN)
    assert "Tool call #1: &lt;img src=x onerror=alert(1)&gt;" in view.html()
    assert live_hazards(view.widget.children[0].value, tags=PANEL_TAGS) == []


# -- the panel --------------------------------------------------------------------------------


def test_panel_runs_a_turn_with_tool_call_in_a_worker(tmp_path: Path) -> None:
    client = ScriptedClient(
        [
            calls(call("get_weather", {"city": "Oslo"}), timings=timings(0, 50)),
            answer("Sunny in *Oslo*.", timings=timings(50, 20)),
        ]
    )
    panel = _panel(tmp_path, client)
    seen: list[threading.Thread] = []
    original = panel.on_event

    def hook(event: Any) -> None:
        seen.append(threading.current_thread())
        original(event)

    panel.on_event = hook  # type: ignore[method-assign]
    outcome = panel.ask("Weather in Oslo?", timeout=10)
    assert outcome.content == "Sunny in *Oslo*."
    assert seen and all(t is not threading.main_thread() for t in seen)
    text = _text(panel)
    assert "You:</b> Weather in Oslo?" in text
    assert "Tool call #1: get_weather" in text and "data class: public" in text
    assert "Sunny in <em>Oslo</em>." in text
    assert "prompt 70 · cached 50 · generated 10" in text
    assert panel.status.value == "Done"
    assert not panel.send_button.disabled and panel.stop_button.disabled
    assert panel.transcript.turns[-1].answer() == "Sunny in *Oslo*."


def test_panel_shows_progress_then_clears_it(tmp_path: Path) -> None:
    panel = _panel(tmp_path, ScriptedClient([]))
    panel._running = True
    panel.on_event(User(content="hi"))
    panel.on_event(Progress(total=200, cache=120, processed=150, time_ms=3.0))
    panel.flush()
    assert (panel.progress.value, panel.progress.max) == (150, 200)
    assert panel.progress_label.value == "150 / 200 tokens (120 cached, 30 new)"
    assert panel.status.value == "Processing prompt"
    assert panel.progress_row.layout.display is None  # shown
    panel.on_event(Content("x"))
    panel._running = False
    panel.flush()
    assert panel.progress.value == 0 and panel.progress_label.value == ""
    assert panel.progress_row.layout.display == "none"


def test_panel_badges_for_limits(tmp_path: Path) -> None:
    same = call("get_weather", {"city": "Oslo"})
    panel = _panel(tmp_path, ScriptedClient([calls(same), calls(same), calls(same)]))
    outcome = panel.ask("loop", timeout=10)
    assert type(outcome).__name__ == "TurnLimit"
    text = _text(panel)
    assert "bxm-badge-repeated_call" in text and "Turn ended: TurnLimit" in text
    assert "This call was not run" in text


class BlockingClient:
    """Streams a few content tokens, then waits on ``cancel`` like a long generation would."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        assert cancel is not None
        on_event(Queued())
        for word in ("partial ", "answer"):
            on_event(Content(word))
        self.started.set()
        if not cancel.wait(10):
            raise AssertionError("never cancelled")
        raise RequestCancelled("the stream was closed")


def test_stop_cancels_the_turn_and_the_log_stays_well_formed(tmp_path: Path) -> None:
    client = BlockingClient()
    panel = _panel(tmp_path, client)
    assert panel.send("tell me a long story")
    assert client.started.wait(5) and panel.busy
    assert not panel.stop_button.disabled
    panel.stop_button.click()
    assert panel.wait(5)
    assert isinstance(panel.outcomes[-1], TurnCancelled)
    assert panel.runner is not None and panel.runner.cancel.is_set()
    assert [type(r).__name__ for r in panel.session.records] == ["User", "TurnEnd"]
    reopened = Session.open(panel.session.path, read_only=True)
    assert len(reopened.records) == 2  # the User and the TurnEnd(cancelled)
    reopened.close()
    assert "partial answer" in _text(panel) and "Turn ended: TurnCancelled" in _text(panel)
    assert panel.status.value.startswith("Ended: TurnCancelled")
    # the panel goes on: the next turn runs (it has a token of its own)
    panel.runtime.client = ScriptedClient([answer("again")])
    assert panel.ask("next", timeout=5).content == "again"


def test_a_stop_pressed_as_the_turn_starts_is_not_lost(tmp_path: Path) -> None:
    client = ScriptedClient([answer("too late")])
    panel = _panel(tmp_path, client)
    with panel.session._lock:  # holds the worker at the turn's start (the loop cleared there)
        assert panel.send("hello") and panel.busy
        panel.stop()
    assert panel.wait(5)
    assert isinstance(panel.outcomes[-1], TurnCancelled)
    assert [type(r).__name__ for r in panel.session.records] == ["User", "TurnEnd"]
    assert "too late" not in _text(panel)


def test_send_ignores_blank_text_and_clears_the_input(tmp_path: Path) -> None:
    panel = _panel(tmp_path, ScriptedClient([answer("ok")]))
    assert not panel.send("   ")
    panel.input.value = "hello"
    panel.send_button.click()
    assert panel.wait(5)
    assert panel.input.value == "" and panel.transcript.turns[-1].user == "hello"


# -- coalescing -------------------------------------------------------------------------------


class BurstClient:
    """Streams ``n`` one-character Content events as fast as it can."""

    def __init__(self, pieces: list[str], pause_every: int = 0, pause_s: float = 0.0) -> None:
        self.pieces = pieces
        self.pause_every = pause_every
        self.pause_s = pause_s

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        on_event(Queued())
        for i, piece in enumerate(self.pieces):
            on_event(Content(piece))
            if self.pause_every and i % self.pause_every == 0:
                time.sleep(self.pause_s)
        text = "".join(self.pieces)
        return Completion(
            id="x",
            content=text,
            reasoning=None,
            tool_calls=(),
            finish_reason="stop",
            timings=timings(0, 10, len(self.pieces)),
            usage={},
            reasoning_tokens=0,
            thinking_capped=False,
        )


def _count_updates(panel: ChatPanel) -> list[str]:
    """Record every ``value`` change of the panel's widgets, turn widgets added later too."""
    changes = _html_changes(panel._box.box)
    for w in (panel.status, panel.progress, panel.progress_label):
        w.observe(lambda ch: changes.append(str(ch["new"])), names="value")
    return changes


@pytest.mark.parametrize(("pause_every", "pause_s", "max_updates"), [(0, 0.0, 30), (250, 0.05, 60)])
def test_coalescing_5000_content_events(
    tmp_path: Path, pause_every: int, pause_s: float, max_updates: int
) -> None:
    pieces = [f"{i % 10}" if i % 97 else " **w** " for i in range(5000)]
    client = BurstClient(pieces, pause_every, pause_s)
    panel = _panel(tmp_path, client)
    # 5,000 tokens in one completion: past the default max_tokens, which the turn enforces
    panel.runtime.config = Config(sampling=SamplingConfig(max_tokens=None))
    panel.ask("warm up the first turn widget", timeout=10)
    changes = _count_updates(panel)
    flushes_before = panel.flushes
    started = time.monotonic()
    panel.ask("burst", timeout=30)
    elapsed = time.monotonic() - started
    flushes = panel.flushes - flushes_before
    assert flushes <= 15 * elapsed + 3, (flushes, elapsed)
    assert len(changes) <= max_updates, (len(changes), elapsed)
    assert panel.transcript.turns[-1].answer() == "".join(pieces)
    last = [r for r in panel.session.records if isinstance(r, Assistant)][-1]
    assert last.content == "".join(pieces)


def test_direct_burst_on_the_hook_is_coalesced(tmp_path: Path) -> None:
    panel = _panel(tmp_path, ScriptedClient([]))
    panel.on_event(User(content="hi"))
    panel.flush()
    changes = _count_updates(panel)
    pieces = [chr(65 + i % 26) for i in range(5000)]
    for p in pieces:
        panel.on_event(Content(p))
    panel.flush()
    assert len(changes) <= 3
    assert panel.transcript.turns[0].answer() == "".join(pieces)
    assert "".join(pieces) in _text(panel)


# -- a stored log -----------------------------------------------------------------------------


def test_session_view_renders_a_log_like_the_live_panel(tmp_path: Path) -> None:
    client = ScriptedClient(
        [
            Step(reasoning="think", tool_calls=[call("get_time", {"city": "Tokyo"})]),
            answer("It is noon."),
        ]
    )
    panel = _panel(tmp_path, client)
    panel.ask("Time in Tokyo?", timeout=10)
    view = SessionView(panel.session.path)
    (turn,) = view.transcript.turns
    (live,) = panel.transcript.turns
    assert [type(b) for b in turn.blocks] == [type(b) for b in live.blocks]
    assert turn.answer() == live.answer() == "It is noon."
    tool = turn.blocks[1]
    assert isinstance(tool, ToolBlock) and tool.call == 1 and "Tokyo" in (tool.result or "")
    assert "Tool call #1: get_time" in view.html()
    assert SessionView(panel.session).html() == view.html()


def test_session_view_on_the_shipped_cassette_log() -> None:
    path = ROOT / "cassettes" / "demo-turns.session.jsonl"
    view = SessionView(path)
    with Session.open(path) as session:
        users = [r for r in session.records if isinstance(r, User)]
    assert [t.user for t in view.transcript.turns] == [u.content for u in users]
    assert all(t.completions >= 1 for t in view.transcript.turns)
    assert "demo-turns.session.jsonl" in view.widget.children[0].value


def test_session_view_reads_a_log_being_written_without_touching_it(tmp_path: Path) -> None:
    session = _session(tmp_path)
    session.append(User(content="first"))
    session.append(Assistant(content="answer"))
    session.close()
    with session.path.open("ab") as fh:
        fh.write(b'{"type": "user", "content": "half writ')  # a writer mid-line
    before = session.path.read_bytes()
    with pytest.warns(
        LogReadWarning, match=r"dropped a torn last line .*\(read-only: file untouched\)"
    ):
        view = SessionView(session.path)  # the warning was provoked and not asserted (issue 21)
    assert [t.user for t in view.transcript.turns] == ["first"]
    assert view.transcript.turns[0].answer() == "answer"
    assert session.path.read_bytes() == before
    assert not session.path.with_name(session.path.name + ".torn").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(before.split(b"\n")[0] + b"\nnot json\n")
    with pytest.raises(SessionError, match=r"bad.jsonl:2"):
        SessionView(bad)


def test_enter_sends_script_is_in_the_panel(tmp_path: Path) -> None:
    panel = _panel(tmp_path, ScriptedClient([]))
    assert "bxm-input" in panel.input._dom_classes
    assert "shiftKey" in panel._keys.value and "\\ue000" in panel._keys.value


def test_submit_marker_in_the_input_sends_the_text(tmp_path: Path) -> None:
    client = BlockingClient()
    panel = _panel(tmp_path, client)
    panel.input.value = "two\nlines" + SUBMIT  # what the Enter handler leaves in the value
    assert client.started.wait(5)
    assert panel.session.records[0] == User(
        content="two\nlines", time=panel.session.records[0].time
    )
    assert panel.input.value == ""
    panel.input.value = "typed while busy" + SUBMIT
    assert panel.input.value == "typed while busy"  # kept, not sent
    panel.stop()
    assert panel.wait(5)


# -- against the embedded server --------------------------------------------------------------


@pytest.mark.live
def test_stop_live_ends_the_request_at_the_server(tmp_path: Path) -> None:
    import httpx

    from boxmaker.client import Client
    from boxmaker.config import ClientConfig, SamplingConfig
    from boxmaker.server import EmbeddedServer

    with EmbeddedServer(n_ctx=4096, n_threads=1) as server:
        config = Config(
            client=ClientConfig(url=server.url, retry_attempts=0),
            sampling=SamplingConfig(max_tokens=200),
        )
        with Client(config.client) as client:
            runtime = Runtime(config=config, client=client, registry=demo_registry())
            panel = ChatPanel(runtime, _session(tmp_path))
            hook = panel.on_event

            def stop_at_first_token(event: Any) -> None:
                hook(event)
                if isinstance(event, Reasoning | Content):
                    panel.stop_button.click()

            panel.on_event = stop_at_first_token  # type: ignore[method-assign]
            outcome = panel.ask("What is the weather in Paris?", timeout=60)
            assert isinstance(outcome, TurnCancelled)
            kinds = [type(r).__name__ for r in panel.session.records]
            assert kinds == ["Capabilities", "User", "TurnEnd"]  # /props, then the turn
            assert "Turn ended: TurnCancelled" in _text(panel)
            # the server stopped generating: its slot is idle again at once
            slots = httpx.get(f"{server.url}/slots", timeout=5)
            if slots.status_code == 200:
                deadline = time.monotonic() + 2
                while any(s.get("is_processing") for s in slots.json()):
                    assert time.monotonic() < deadline, slots.json()
                    time.sleep(0.05)
                    slots = httpx.get(f"{server.url}/slots", timeout=5)
            # and the panel goes on with the same session
            panel.on_event = hook  # type: ignore[method-assign]
            panel.ask("Hello!", timeout=60)
            kinds = [type(r).__name__ for r in panel.session.records]
            assert kinds[:4] == ["Capabilities", "User", "TurnEnd", "User"]
            assert "Assistant" in kinds
            assert panel.transcript.turns[-1].completions >= 1


# -- what a saved notebook keeps --------------------------------------------------------------


class PromptThenWait:
    """Reports prompt progress, then waits on ``cancel`` as a long prompt would."""

    def __init__(self) -> None:
        self.started = threading.Event()

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        assert cancel is not None
        on_event(Queued())
        on_event(Progress(total=2155, cache=0, processed=2155, time_ms=900.0))
        self.started.set()
        if not cancel.wait(10):
            raise AssertionError("never cancelled")
        raise RequestCancelled("the stream was closed")


def test_progress_row_hidden_after_a_cancel_in_prompt_processing(tmp_path: Path) -> None:
    client = PromptThenWait()
    panel = _panel(tmp_path, client)
    assert panel.send("a long prompt")
    assert client.started.wait(5)
    deadline = time.monotonic() + 5
    while panel.progress_row.layout.display == "none":  # the flusher shows the row
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert panel.progress_label.value.startswith("2155 / 2155 tokens")
    panel.stop()
    assert panel.wait(5)
    assert isinstance(panel.outcomes[-1], TurnCancelled)
    assert panel.progress_row.layout.display == "none"
    assert panel.progress_label.value == "" and panel.progress.value == 0
    assert panel.status.value.startswith("Ended: TurnCancelled")


def test_static_html_of_panel_and_view_is_the_transcript_and_inert(tmp_path: Path) -> None:
    bad = "<img src=x onerror=alert(1)>"
    panel = _panel(tmp_path, ScriptedClient([answer(f"**two** {bad}"), answer("ok")]))
    panel.ask(f"first\nsecond {bad}", timeout=10)
    bundle = panel.static_html()
    assert set(bundle) == {"text/html"}
    page = bundle["text/html"]
    assert page.startswith(f"<div class='bxm-static bxm-static-{panel._key}'>")
    assert panel.html() in page and "<strong>two</strong>" in page
    assert "first\nsecond &lt;img" in page  # the two lines as written
    assert live_hazards(page, tags=PANEL_TAGS) == []
    assert f".bxm-static-{panel._key}{{display:none}}" in panel._keys.value  # live: hidden
    view = SessionView(panel.session.path)
    assert view.html() == panel.html()


@pytest.mark.live  # starts a kernel
def test_an_executed_saved_notebook_shows_the_conversation_in_html(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbclient import NotebookClient
    from nbconvert import HTMLExporter
    from nbformat.v4 import new_code_cell, new_notebook
    from test_notebooks import _kernel_name

    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # this checkout's boxmaker in the kernel
    setup = (
        "import tempfile\n"
        "from boxmaker.testing import ScriptedClient, answer\n"
        "from boxmaker import Baseline, Config, Runtime, Session, SessionView\n"
        "from boxmaker.demo import demo_registry\n"
        "from boxmaker.widgets import ChatPanel\n"
        "client = ScriptedClient([answer('Sunny in **Oslo**.'), answer('Rome: <b>warm</b>.')])\n"
        "runtime = Runtime(config=Config(), client=client, registry=demo_registry())\n"
        "session = Session.create(tempfile.mkdtemp(), Baseline())\n"
        "panel = ChatPanel(runtime, session)"
    )
    cells = [
        new_code_cell(setup),
        new_code_cell("panel"),
        new_code_cell("_ = panel.ask('Weather in Oslo?', timeout=30)"),
        new_code_cell("_ = panel.ask('And in\\nRome?', timeout=30)"),
        new_code_cell("SessionView(session.path)"),
    ]
    nb = new_notebook(cells=cells)
    NotebookClient(
        nb,
        timeout=60,
        kernel_name=_kernel_name(),
        resources={"metadata": {"path": str(ROOT / "tests")}},
        store_widget_state=False,  # as JupyterLab and Notebook 7 save by default
    ).execute()
    saved = tmp_path / "saved.ipynb"
    nbformat.write(nb, saved)
    panel_outputs = nbformat.read(saved, as_version=4).cells[1].outputs
    kinds = [sorted(o.get("data", {})) for o in panel_outputs]
    assert kinds == [
        ["application/vnd.jupyter.widget-view+json", "text/plain"],
        ["text/html"],  # the static copy, updated at the end of each turn
    ]
    exporter = HTMLExporter(exclude_input=True)
    page, _ = exporter.from_notebook_node(nbformat.read(saved, as_version=4))
    for text in ("Weather in Oslo?", "<strong>Oslo</strong>", "And in\nRome?", "&lt;b&gt;warm"):
        assert page.count(text) == 2, text  # the panel's copy and the SessionView's
    assert "model not found" not in page


def test_a_cache_loss_badge_says_its_cause_and_opens_on_the_escaped_windows(
    tmp_path: Path,
) -> None:
    loss = CacheLoss(
        expected=777,
        reused=571,
        position=571,
        cause="history_rewritten",
        old_window="assistant\n<think>\n<script>alert(1)</script>",
        new_window="assistant\n<tool_call>\n<img src=x onerror=alert(1)>",
    )
    session = _session(tmp_path)
    session.extend(
        [User(content="q"), Assistant(content="a"), loss, CacheLoss(expected=9, reused=1)]
    )
    view = SessionView(session.path)
    (turn,) = view.transcript.turns
    assert turn.badges == [
        (
            "cache_loss",
            "cache loss (history_rewritten at token 571): 206 tokens lost (571 of 777 reused)",
        ),
        ("cache_loss", "cache loss: 8 tokens lost (1 of 9 reused)"),
    ]
    assert turn.windows == {0: (loss.old_window, loss.new_window)}
    page = view.html()
    assert "<details class='bxm-loss'><summary><span class='bxm-badge bxm-badge-cache_loss'" in page
    assert "&lt;think&gt;\n&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert live_hazards(page, tags=PANEL_TAGS) == []
    assert page.count("<details class='bxm-loss'>") == 1  # the loss without windows: a badge


# -- a lone surrogate (issue 23) ----------------------------------------------------------------

LONE = "before \ud800 after"
"""What ``"\\ud800"`` in a JSON answer gives: no UTF-8 encodes it."""


def test_a_lone_surrogate_in_an_answer_leaves_the_panel_usable(tmp_path: Path) -> None:
    """It killed the worker thread (the sanitizer could not encode it): Send stayed disabled."""
    panel = _panel(tmp_path, ScriptedClient([answer(LONE, reasoning="r\udfffr"), answer("next")]))
    assert panel.send("hi") and panel.wait(10)
    assert panel.send_button.disabled is False and panel.stop_button.disabled is True
    page = panel.html()
    assert "before \ufffd after" in page and "\ud800" not in page
    page.encode("utf-8")  # what a widget's comm message and a saved notebook need
    assert panel.send("again") and panel.wait(10)
    assert "next" in panel.html()


def test_session_view_shows_a_log_with_a_lone_surrogate(tmp_path: Path) -> None:
    panel = _panel(tmp_path, ScriptedClient([answer(LONE)]))
    assert panel.send("hi") and panel.wait(10)
    view = SessionView(panel.session.path)
    assert "before \ufffd after" in view.html()
    view.html().encode("utf-8")


# -- following a log another writer grows (issue 28) ---------------------------------------------


def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_session_view_follows_a_log_as_another_writer_appends(tmp_path: Path) -> None:
    """A tapped conversation (or a batch run) grows while a notebook shows it: ``follow``
    refreshes on a thread; a log moved away stops it, saying why in the header."""
    with Session.create(tmp_path, Baseline(), session_id="grow") as writer:
        writer.extend([User(content="first question"), Assistant(content="first answer")])
        view = SessionView(writer.path)
        stop = view.follow(0.02)
        writer.extend([User(content="second question"), Assistant(content="second answer")])
        _until(lambda: "second answer" in view.html(), "the appended turn shown")
        assert "(4 records)" in view._header.value
        stop.set()
        writer.extend([User(content="third question")])
        time.sleep(0.2)
        assert "third question" not in view.html()  # stopped: no more reads
    again = view.follow(0.02)
    (tmp_path / "grow.jsonl").rename(tmp_path / "moved.jsonl")
    _until(lambda: "stopped: SessionError" in view._header.value, "the header says it stopped")
    again.set()
    with pytest.raises(ValueError, match="interval_s"):
        view.follow(0)
