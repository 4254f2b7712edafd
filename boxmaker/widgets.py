"""ipywidgets views of the turn loop: :class:`ChatPanel` (live) and :class:`SessionView` (a log).

Both consume only the public hooks: the events :func:`boxmaker.turn.run_turn` passes to its
``on_event`` (:mod:`boxmaker.events`) and the records of a session log
(:mod:`boxmaker.records`). Nothing here is called by the loop.

The transcript is a pure function of those events: :class:`Transcript` folds events and records
into plain data (:class:`TurnView` per user message, with its blocks, counters and badges), and
:func:`render_turn` turns one :class:`TurnView` into HTML. Both work without a kernel, so a test
can drive them with event sequences; the widgets only copy the results into widget values.

Coalescing: :class:`ChatPanel`'s hook only appends the event to a buffer (thread-safe, cheap).
A flusher thread folds the buffer into the transcript and copies it to the widgets at most
:data:`MAX_FLUSHES_PER_S` times a second, and once more when the turn ends, so the widgets see
every fragment exactly once whatever the token rate.

Keyboard: the input is an ``ipywidgets.Textarea``; a small script (in an ``HTML`` widget, run
by the browser through an ``<img onerror>`` handler, since ``innerHTML`` does not run
``<script>``) turns Enter, and a click on Send, into "append :data:`SUBMIT` to the value",
which the panel sees as a send; Shift+Enter inserts a new line as usual. The marker travels
with the text itself, so the kernel always sends the whole text (a button's click message can
overtake a value update that ipywidgets holds back while the kernel is busy). Where a front end
strips that handler, Enter makes a new line and the Send button sends through its own click.
"""

from __future__ import annotations

import html
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import markdown as md

from .errors import TurnError
from .events import (
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallStarted,
    TurnEvent,
    Waiting,
)
from .records import (
    Assistant,
    CacheLoss,
    LimitHit,
    Record,
    ToolResult,
    Usage,
    User,
)
from .session import Session
from .turn import Runtime, run_turn

__all__ = [
    "MAX_FLUSHES_PER_S",
    "SUBMIT",
    "AnswerBlock",
    "ChatPanel",
    "LiveState",
    "ReasoningBlock",
    "SessionView",
    "ToolBlock",
    "Transcript",
    "TurnView",
    "counters_text",
    "render_block",
    "render_markdown",
    "render_turn",
]

MAX_FLUSHES_PER_S = 15.0
"""Most widget refreshes :class:`ChatPanel` makes per second while a turn streams."""


# -- the transcript as data (pure) ------------------------------------------------------------


@dataclass
class ReasoningBlock:
    """Reasoning of one completion: ``text`` as streamed, ``tokens`` reasoning deltas (about
    one token each), ``capped`` when the thinking cap ended it."""

    text: str = ""
    tokens: int = 0
    capped: bool = False


@dataclass
class AnswerBlock:
    """The content of one completion, exactly as streamed (Markdown source)."""

    text: str = ""


@dataclass
class ToolBlock:
    """One tool call: the model's ``name`` and ``arguments`` text and its ``id``; ``call`` the
    session's call number once known; the result's fields once the result is in."""

    id: str
    name: str
    arguments: str
    call: int | None = None
    result: str | None = None
    data_class: str = ""
    untrusted: bool = False
    truncated: bool = False


Block = ReasoningBlock | AnswerBlock | ToolBlock


@dataclass
class TurnView:
    """One turn: the user message, the blocks in the order they arrived, counters and badges.

    Counters sum the turn's completions (``Usage`` records): ``prompt`` (``prompt_n``, tokens
    processed), ``cached`` (``cache_n``, tokens reused), ``generated`` (``predicted_n``),
    ``reasoning`` tokens, and ``ms`` (``prompt_ms + predicted_ms``). ``badges`` holds one
    ``(kind, text)`` per ``LimitHit`` (kind = the limit) and ``CacheLoss`` (kind
    ``"cache_loss"``). ``ended`` says why the turn stopped early (``None``: it did not, or
    it is still running).
    """

    user: str
    blocks: list[Block] = field(default_factory=list)
    completions: int = 0
    prompt: int = 0
    cached: int = 0
    generated: int = 0
    reasoning: int = 0
    ms: float = 0.0
    badges: list[tuple[str, str]] = field(default_factory=list)
    ended: str | None = None

    def answer(self) -> str:
        """The answer text of the turn: every content fragment joined, in order."""
        return "".join(b.text for b in self.blocks if isinstance(b, AnswerBlock))


@dataclass
class LiveState:
    """What the running completion is doing: ``status`` (``""``, ``"Queued"``,
    ``"Processing prompt"``, ``"Waiting"``, ``"Generating at N tokens/s"``, ``"Retrying in N s"``,
    ``"Done"``...), prompt ``progress`` as ``(processed, total, cache)`` tokens or ``None``."""

    status: str = ""
    progress: tuple[int, int, int] | None = None
    first_token_at: float | None = None
    tokens: int = 0


class Transcript:
    """Folds turn events and session records into :class:`TurnView` s (no widgets, no kernel).

    Feed it with :meth:`apply` (the live event stream of :func:`~boxmaker.turn.run_turn`) or
    :meth:`extend` (records of a stored log: the same records the live stream carries, without
    the client events). Both give the same turns; the live stream adds :attr:`live` state.

    Args:
        clock: seconds on a monotonic clock, for the generation rate (tests pass a fake).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.turns: list[TurnView] = []
        self.live = LiveState()
        self._clock = clock
        self._streamed = False

    def extend(self, events: Iterable[TurnEvent | Record]) -> Transcript:
        """Apply each event in order; returns ``self``."""
        for event in events:
            self.apply(event)
        return self

    def _turn(self) -> TurnView:
        if not self.turns:  # a log that starts without a user message
            self.turns.append(TurnView(user=""))
        return self.turns[-1]

    def _last(self, kind: type[ReasoningBlock] | type[AnswerBlock]) -> Any:
        blocks = self._turn().blocks
        if not blocks or not isinstance(blocks[-1], kind):
            blocks.append(kind())
        return blocks[-1]

    def apply(self, event: TurnEvent | Record, at: float | None = None) -> None:
        """Fold one event or record into the transcript.

        Args:
            event: the event or record.
            at: when it arrived, on the ``clock``'s scale (``None``: now); a hook that buffers
                events passes their arrival times so the generation rate stays true.
        """
        live = self.live
        if isinstance(event, User):
            self.turns.append(TurnView(user=event.content))
            self.live = LiveState()
            self._streamed = False
        elif isinstance(event, Queued):
            live.status, live.progress, live.first_token_at, live.tokens = "Queued", None, None, 0
        elif isinstance(event, Progress):
            live.status = "Processing prompt"
            live.progress = (event.processed, event.total, event.cache)
        elif isinstance(event, Waiting):
            live.status = "Waiting"
        elif isinstance(event, Reasoning | Content):
            self._stream(event, self._clock() if at is None else at)
        elif isinstance(event, ThinkingCapped):
            self._last(ReasoningBlock).capped = True
        elif isinstance(event, Retrying):
            live.status = f"Retrying in {event.delay_s:g} s (attempt {event.attempt})"
        elif isinstance(event, Assistant):
            self._assistant(event)
        elif isinstance(event, ToolCallStarted):
            block = self._pending(lambda b: b.call is None and b.name == event.name)
            if block is not None:
                block.call = event.call
            live.status = f"Running {event.name}"
        elif isinstance(event, ToolResult):
            self._tool_result(event)
        elif isinstance(event, Usage):
            self._usage(event)
        elif isinstance(event, CacheLoss):
            lost = event.expected - event.reused
            text = f"cache loss: {lost} tokens re-processed ({event.reused} of {event.expected})"
            self._turn().badges.append(("cache_loss", text))
        elif isinstance(event, LimitHit):
            self._turn().badges.append((event.kind, f"{event.kind}: {event.detail}"))

    def _stream(self, event: Reasoning | Content, now: float) -> None:
        live = self.live
        if live.first_token_at is None:
            live.first_token_at = now
        live.tokens += 1
        elapsed = now - live.first_token_at
        rate = f"{(live.tokens - 1) / elapsed:.0f}" if elapsed > 0 else "…"
        live.status = f"Generating at {rate} tokens/s"
        live.progress = None
        self._streamed = True
        if isinstance(event, Reasoning):
            block = self._last(ReasoningBlock)
            block.text += event.text
            block.tokens += 1
        else:
            self._last(AnswerBlock).text += event.text

    def _assistant(self, record: Assistant) -> None:
        turn = self._turn()
        if not self._streamed:  # from a log: no deltas came before
            if record.reasoning:
                turn.blocks.append(ReasoningBlock(text=record.reasoning))
            if record.content:
                turn.blocks.append(AnswerBlock(text=record.content))
        self._streamed = False
        for c in record.tool_calls:
            turn.blocks.append(ToolBlock(id=c.id, name=c.name, arguments=c.arguments))

    def _pending(self, match: Callable[[ToolBlock], bool]) -> ToolBlock | None:
        for block in self._turn().blocks:
            if isinstance(block, ToolBlock) and block.result is None and match(block):
                return block
        return None

    def _tool_result(self, record: ToolResult) -> None:
        block = self._pending(lambda b: b.id == record.tool_call_id)
        if block is None:
            block = ToolBlock(id=record.tool_call_id, name=record.name, arguments="")
            self._turn().blocks.append(block)
        block.call = record.call
        block.result = record.content
        block.data_class = record.data_class
        block.untrusted = record.untrusted
        block.truncated = record.truncated

    def _usage(self, record: Usage) -> None:
        turn, t = self._turn(), record.timings
        turn.completions += 1
        turn.prompt += int(t.get("prompt_n", 0))
        turn.cached += int(t.get("cache_n", 0))
        turn.generated += int(t.get("predicted_n", 0))
        turn.reasoning += record.reasoning_tokens
        turn.ms += float(t.get("prompt_ms", 0.0)) + float(t.get("predicted_ms", 0.0))
        if record.reasoning_tokens:  # the log's count beats the number of deltas seen
            blocks = [b for b in turn.blocks if isinstance(b, ReasoningBlock)]
            if blocks and blocks[-1].tokens == 0:
                blocks[-1].tokens = record.reasoning_tokens
        cut = record.finish_reason == "length"
        self.live.status = "Cut at max_tokens" if cut else "Done"
        self.live.progress = None

    def end_turn(self, reason: str | None) -> None:
        """Mark the last turn finished; ``reason`` says why it ended early (``None``: answered)."""
        if self.turns:
            self.turns[-1].ended = reason
        self.live.status = f"Ended: {reason}" if reason else "Done"
        self.live.progress = None


# -- rendering (pure) -------------------------------------------------------------------------

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
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def render_markdown(text: str) -> str:
    """Markdown to HTML (python-markdown with fenced code and tables); raw HTML is escaped,
    so a model cannot inject markup into the page."""
    return md.markdown(html.escape(text, quote=False), extensions=["fenced_code", "tables"])


def render_block(block: Block, *, streaming: bool = False) -> str:
    """One block as HTML: reasoning as a collapsible ``<details>`` with its token count (open
    while ``streaming``), a tool call with its pretty JSON arguments and its result (data class,
    untrusted and truncated marked), an answer as rendered Markdown."""
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
    """One turn as an HTML fragment: user message, blocks, counters, badges, how it ended."""
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


# -- widgets ----------------------------------------------------------------------------------


def _widgets() -> Any:
    import ipywidgets

    return ipywidgets


class _TranscriptBox:
    """A VBox with one HTML widget per turn; only the turns that changed are re-rendered."""

    def __init__(self) -> None:
        w = _widgets()
        self.box = w.VBox([])
        self.box.add_class("bxm-transcript")
        self.items: list[Any] = []

    def show(self, turns: Sequence[TurnView], streaming: bool) -> None:
        w = _widgets()
        for i, turn in enumerate(turns):
            if i == len(self.items):
                self.items.append(w.HTML())
                self.box.children = tuple(self.items)
            value = render_turn(turn, streaming=streaming and i == len(turns) - 1)
            if self.items[i].value != value:
                self.items[i].value = value


class SessionView:
    """A transcript rendered from a stored session log, for reviewing past runs and cassettes.

    Args:
        path_or_session: a log file (``<id>.jsonl``, e.g.
            ``cassettes/demo-turns.session.jsonl``) or an open :class:`~boxmaker.session.Session`.

    Attributes:
        transcript: the folded :class:`Transcript`.
        widget: the ipywidgets ``VBox`` shown in a notebook (also shown by displaying the view).

    A log file is opened read-only (``Session.open(path, repair=False)``): never repaired or
    written, so a log another process is still writing can be reviewed.

    Raises:
        SessionError: the log cannot be read or a line in it is corrupt.
    """

    def __init__(self, path_or_session: str | os.PathLike[str] | Session) -> None:
        if isinstance(path_or_session, Session):
            records = list(path_or_session.records)
            title = str(path_or_session.path)
        else:
            records = list(Session.open(path_or_session, repair=False).records)
            title = str(path_or_session)
        self.transcript = Transcript().extend(records)
        w = _widgets()
        self._box = _TranscriptBox()
        self._box.show(self.transcript.turns, streaming=False)
        header = w.HTML(f"<b>Session log</b> {html.escape(title)} ({len(records)} records)")
        self.widget = w.VBox([header, self._box.box])

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def html(self) -> str:
        """The whole transcript as one HTML string (no widgets needed to read it)."""
        return "".join(render_turn(t) for t in self.transcript.turns)


SUBMIT = "\ue000"
"""A private-use character the Enter handler appends to the input's value to mean "send"."""

_KEYS_JS = (
    "<img src='data:,' alt='' style='display:none' onerror=\""
    "(function(img){var root=img.closest('.bxm-panel')||document;"
    "var area=root.querySelector('.bxm-input textarea');"
    "var send=root.querySelector('.bxm-send');"
    "if(!area||!send){setTimeout(function(){img.onerror();},200);return;}"
    "if(area.dataset.bxm)return;area.dataset.bxm='1';"
    "function submit(){area.value+='\\ue000';"
    "area.dispatchEvent(new Event('input',{bubbles:true}));}"
    "area.addEventListener('keydown',function(ev){"
    "if(ev.key==='Enter'&&!ev.shiftKey&&!ev.isComposing){"
    "ev.preventDefault();ev.stopPropagation();submit();}});"
    "send.addEventListener('click',function(ev){"
    "ev.stopImmediatePropagation();ev.preventDefault();submit();},true);"
    '})(this)">'
)
"""Enter, and a click on Send, append :data:`SUBMIT` to the value (synced like any typing, so
the kernel gets the whole text, in order); Shift+Enter keeps the textarea's new line. Run by the
browser; without it, the Send button's own click handler sends."""


class ChatPanel:
    """A live chat with the turn loop: input, Send and Stop, and a streaming transcript.

    Each Send runs :func:`~boxmaker.turn.run_turn` on ``session`` in a worker thread; the
    panel's hook buffers every event, and a flusher thread copies the folded transcript to
    the widgets at most :data:`MAX_FLUSHES_PER_S` times a second (plus once at the turn's end).
    Stop sets ``runtime.cancel``: the client closes the stream (llama.cpp stops generating),
    the turn ends with ``TurnCancelled`` and the log stays well formed.

    Args:
        runtime: config, client, tools and cancel switch (shared with the worker thread).
        session: the log the turns extend; turns already in it are shown first.
        max_flushes_per_s: cap on widget refreshes per second.

    Attributes:
        transcript: the folded :class:`Transcript` (read it under :attr:`lock` while a turn runs).
        input, send_button, stop_button, progress, progress_label, progress_row, status, widget:
            the ipywidgets (the progress row shows only while a prompt is processed; ``widget``
            is the whole panel; displaying the panel shows it).
        outcomes: one entry per finished turn: the :class:`~boxmaker.turn.TurnOutcome` or the
            :class:`~boxmaker.errors.TurnError` that ended it.
        flushes: widget refreshes made so far.

    Keyboard: Enter sends, Shift+Enter inserts a new line (see the module docstring).
    """

    def __init__(
        self,
        runtime: Runtime,
        session: Session,
        *,
        max_flushes_per_s: float = MAX_FLUSHES_PER_S,
    ) -> None:
        w = _widgets()
        self.runtime = runtime
        self.session = session
        self.lock = threading.Lock()
        self.transcript = Transcript().extend(session.records)
        self.outcomes: list[Any] = []
        self.flushes = 0
        self._interval = 1.0 / max_flushes_per_s
        self._buffer: list[tuple[float, TurnEvent | Record]] = []
        self._buffer_lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self._dirty = threading.Event()
        self._running = False

        self.input = w.Textarea(
            placeholder="Message (Enter sends, Shift+Enter new line)",
            layout=w.Layout(width="auto", height="4em"),
        )
        self.input.add_class("bxm-input")
        self.send_button = w.Button(description="Send", button_style="primary", icon="paper-plane")
        self.send_button.add_class("bxm-send")
        self.stop_button = w.Button(description="Stop", button_style="danger", disabled=True)
        self.stop_button.add_class("bxm-stop")
        self.progress = w.IntProgress(value=0, min=0, max=1, description="Prompt")
        self.progress_label = w.HTML("")
        self.progress_row = w.HBox(
            [self.progress, self.progress_label], layout=w.Layout(display="none")
        )
        self.status = w.HTML("")
        self.status.add_class("bxm-status")
        self._box = _TranscriptBox()
        self._keys = w.HTML(_KEYS_JS)
        self.send_button.on_click(lambda _b: self.send(self.input.value))
        self.input.observe(self._on_input, names="value")
        self.stop_button.on_click(lambda _b: self.stop())
        self.widget = w.VBox(
            [
                self._box.box,
                self.progress_row,
                self.status,
                self.input,
                w.HBox([self.send_button, self.stop_button]),
                self._keys,
            ]
        )
        self.widget.add_class("bxm-panel")
        self.flush()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _on_input(self, change: dict[str, Any]) -> None:
        """Enter was pressed (the value holds :data:`SUBMIT`): send the text before it."""
        value = change["new"]
        if SUBMIT in value:
            text = value.replace(SUBMIT, "")
            if not self.send(text):
                self.input.value = text  # busy or blank: keep what was typed

    def html(self) -> str:
        """The transcript as shown now (what the widgets hold), as one HTML string."""
        return "".join(item.value for item in self._box.items)

    # -- the hook ---------------------------------------------------------------------------

    def on_event(self, event: TurnEvent | Record) -> None:
        """The ``on_event`` hook: buffer the event (cheap, thread-safe); the flusher shows it."""
        at = time.monotonic()
        with self._buffer_lock:
            self._buffer.append((at, event))
        self._dirty.set()

    def flush(self) -> None:
        """Fold the buffered events into :attr:`transcript` and copy it to the widgets."""
        with self._buffer_lock:
            events, self._buffer = self._buffer, []
        with self.lock:
            for at, event in events:
                self.transcript.apply(event, at)
            live = self.transcript.live
            self._box.show(self.transcript.turns, streaming=self._running)
            processed, total, cache = live.progress or (0, 0, 0)
            if live.progress is not None:
                _set(self.progress, "max", max(total, 1))
                _set(self.progress, "value", processed)
                _set(
                    self.progress_label,
                    "value",
                    f"{processed} / {total} tokens ({cache} cached, "
                    f"{max(processed - cache, 0)} new)",
                )
            elif not self._running:
                _set(self.progress, "value", 0)
                _set(self.progress_label, "value", "")
            _set(self.progress_row.layout, "display", None if live.progress else "none")
            _set(self.status, "value", html.escape(live.status))
            self.flushes += 1

    def _flusher(self) -> None:
        while self._running:
            self._dirty.wait(timeout=self._interval)
            started = time.monotonic()
            if self._dirty.is_set():
                self._dirty.clear()
                self.flush()
            time.sleep(max(0.0, self._interval - (time.monotonic() - started)))

    # -- sending ----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a turn is running."""
        return self._worker is not None and self._worker.is_alive()

    def send(self, text: str) -> bool:
        """Start a turn with the user message ``text`` in a worker thread.

        Returns:
            ``False`` (and does nothing) when ``text`` is blank or a turn is running.
        """
        if not text.strip() or self.busy:
            return False
        self.input.value = ""
        self.send_button.disabled = True
        self.stop_button.disabled = False
        self._running = True
        flusher = threading.Thread(target=self._flusher, name="bxm-flusher", daemon=True)
        self._worker = threading.Thread(
            target=self._run, args=(text, flusher), name="bxm-turn", daemon=True
        )
        flusher.start()
        self._worker.start()
        return True

    def _run(self, text: str, flusher: threading.Thread) -> None:
        reason: str | None = None
        try:
            self.outcomes.append(run_turn(self.session, self.runtime, text, self.on_event))
        except TurnError as exc:
            self.outcomes.append(exc)
            reason = f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # shown in the panel rather than lost in a thread
            self.outcomes.append(exc)
            reason = f"{type(exc).__name__}: {exc}"
        finally:
            self._running = False
            self._dirty.set()
            flusher.join()
            self.flush()  # the final flush: everything buffered reaches the widgets
            with self.lock:
                self.transcript.end_turn(reason)
                self._box.show(self.transcript.turns, streaming=False)
                _set(self.status, "value", html.escape(self.transcript.live.status))
            self.send_button.disabled = False
            self.stop_button.disabled = True

    def stop(self) -> None:
        """Cancel the running turn (sets ``runtime.cancel``); the worker ends it cleanly."""
        if self.busy:
            self.runtime.cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running turn ended; returns ``False`` on timeout."""
        worker = self._worker
        if worker is not None:
            worker.join(timeout)
            return not worker.is_alive()
        return True

    def ask(self, text: str, timeout: float | None = None) -> Any:
        """:meth:`send` then :meth:`wait`; returns the turn's outcome or the error that ended it
        (for notebooks and scripts that drive the panel programmatically).

        Raises:
            RuntimeError: a turn is running already, or ``text`` is blank.
            TimeoutError: the turn is still running after ``timeout`` seconds (it goes on;
                :meth:`stop` ends it).
        """
        if not self.send(text):
            raise RuntimeError("a turn is running or the message is blank")
        if not self.wait(timeout):
            raise TimeoutError(f"the turn is still running after {timeout} s")
        return self.outcomes[-1] if self.outcomes else None


def _set(widget: Any, name: str, value: Any) -> None:
    """Set a trait only when it changes (each change is one message to the front end)."""
    if getattr(widget, name) != value:
        setattr(widget, name, value)
