"""ipywidgets views of the turn loop: :class:`ChatPanel` (live) and :class:`SessionView` (a log).

Both consume only the public hooks: the events :func:`boxmaker.turn.run_turn` passes to its
``on_event`` (:mod:`boxmaker.events`) and the records of a session log
(:mod:`boxmaker.records`). Nothing here is called by the loop.

The widgets hold no logic of their own: :class:`~boxmaker.view.Transcript` folds events
and records into plain turns (:mod:`boxmaker.view`), :mod:`boxmaker.view` turns them
into safe HTML (the rules for untrusted model text are there), and
:class:`~boxmaker.widgets._draw.TranscriptBox` draws them by appending
(:mod:`boxmaker.widgets`): a finished block is rendered once, the block still
streaming is sent as the text that came since the last refresh, and only the last turn is
ever drawn again, so a refresh costs the same however long the session and the answer.

Coalescing: :class:`ChatPanel`'s hook only appends the event to a buffer (thread-safe, cheap).
A flusher thread folds the buffer into the transcript and copies it to the widgets at most
:data:`MAX_FLUSHES_PER_S` times a second (fewer when a refresh is slow: it waits at least as
long as the last refresh took), and once more when the turn ends, so the widgets see every
fragment exactly once whatever the token rate.

Keyboard: the input is an ``ipywidgets.Textarea``; a small script (in an ``HTML`` widget, run
by the browser through an ``<img onerror>`` handler, since ``innerHTML`` does not run
``<script>``) turns Enter, and a click on Send, into "append :data:`SUBMIT` to the value",
which the panel sees as a send; Shift+Enter inserts a new line as usual. The marker travels
with the text itself, so the kernel always sends the whole text (a button's click message can
overtake a value update that ipywidgets holds back while the kernel is busy). Where a front end
strips that handler, Enter makes a new line and the Send button sends through its own click.
The same script marks the textarea ``data-lm-suppress-shortcuts`` (JupyterLab and Notebook 7
then leave its keys alone: Shift+Enter does not run the cell) and keeps the transcript box,
of fixed height so that the input, Send and Stop never move, scrolled to the new text unless
the reader scrolled up. Tested in JupyterLab, Notebook 7 and Voila in headless Chromium.

Saved notebooks: displaying a panel or a view shows the widget and, as a second output, the
transcript as static ``text/html`` (the panel updates it at the end of each turn). The live
widget hides that copy with a style; a notebook saved without widget state (JupyterLab's and
Notebook 7's default), a notebook viewer or nbconvert shows it, so the conversation stays
readable without a kernel. It is the same sanitized HTML the widgets show.

This module imports ipywidgets; ``import boxmaker`` does not import it (the package loads
:class:`ChatPanel` and :class:`SessionView` on first use).
"""

from __future__ import annotations

import html
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import ipywidgets as ipw
from IPython import display as ipd

from ..events import TurnEvent
from ..records import Record
from ..session import Session
from ..tools.approval import PendingCall
from ..turn import Runtime, TurnRunner
from ..view import TRANSCRIPT_CSS, Transcript, render_turn
from ._draw import WIDGET_CSS, TranscriptBox, set_if_changed

__all__ = ["MAX_FLUSHES_PER_S", "SUBMIT", "ChatPanel", "SessionView"]

MAX_FLUSHES_PER_S = 15.0
"""Most widget refreshes :class:`ChatPanel` makes per second while a turn streams."""


def _static(content: str, key: str) -> dict[str, str]:
    """A ``text/html`` bundle of a transcript's static HTML, marked with ``key`` so that a live
    view on the page can hide it (a saved notebook, nbconvert or a notebook viewer shows it)."""
    return {"text/html": f"<div class='bxm-static bxm-static-{key}'>{content}</div>"}


def _hide_static(key: str) -> str:
    """A ``<style>`` that hides the static HTML marked ``key`` while the live widget is shown."""
    return f"<style>.bxm-static-{key}{{display:none}}</style>"


class SessionView:
    """A transcript rendered from a stored session log, for reviewing past runs and cassettes.

    Args:
        path_or_session: a log file (``<id>.jsonl``, e.g.
            ``cassettes/demo-turns.session.jsonl``) or an open :class:`~boxmaker.session.Session`.

    Attributes:
        transcript: the folded :class:`Transcript`.
        widget: the ipywidgets ``VBox`` shown in a notebook (also shown by displaying the view).

    A log file is opened read-only (``Session.open(path, read_only=True)``): never repaired or
    written, so a log another process is still writing can be reviewed.

    Raises:
        SessionError: the log cannot be read or a line in it is corrupt.
    """

    def __init__(self, path_or_session: str | os.PathLike[str] | Session) -> None:
        self._source = path_or_session
        records = self._records()
        self._title = str(
            path_or_session.path if isinstance(path_or_session, Session) else path_or_session
        )
        self.transcript = Transcript().extend(records)
        self._seen = len(records)
        self._box = TranscriptBox()
        self._box.add_finished(self.transcript.turns)
        self._key = uuid.uuid4().hex
        self._header = ipw.HTML(self._head())
        self.widget = ipw.VBox([self._header, self._box.box])

    def _records(self) -> list[Record]:
        source = self._source
        if isinstance(source, Session):
            return list(source.records)
        with Session.open(source, read_only=True) as session:
            return list(session.records)

    def _head(self) -> str:
        return (
            f"{WIDGET_CSS}{_hide_static(self._key)}"
            f"<b>Session log</b> {html.escape(self._title)} ({self._seen} records)"
        )

    def refresh(self) -> int:
        """Read the log again and show what was appended since (a log another process is
        writing: a ``boxmaker tap`` session, a batch run); returns the number of new records.
        The last turn shown is drawn again (it may have been still running), the new ones
        after it.

        Raises:
            SessionError: as the constructor.
        """
        records = self._records()
        new = len(records) - self._seen
        if new <= 0:
            return 0
        shown = len(self._box.views)
        self.transcript = Transcript().extend(records)
        turns = self.transcript.turns
        if shown and shown <= len(turns):
            set_if_changed(self._box.views[shown - 1], "value", render_turn(turns[shown - 1]))
        self._box.add_finished(turns[shown:])
        self._seen = len(records)
        set_if_changed(self._header, "value", self._head())
        return new

    def follow(self, interval_s: float = 1.0) -> threading.Event:
        """Follow the log as it grows: :meth:`refresh` every ``interval_s`` seconds on a daemon
        thread, until the returned event is set (or the kernel ends). A log that cannot be
        read any more (moved, corrupted) stops the following and says why in the header.

        Args:
            interval_s: seconds between reads (each reads the whole log: keep it >= 0.1 for
                long logs).

        Raises:
            ValueError: ``interval_s`` is not positive.
        """
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        stop = threading.Event()

        def run() -> None:
            while not stop.wait(interval_s):
                try:
                    self.refresh()
                except Exception as exc:  # shown, not raised on a thread nobody watches
                    why = html.escape(f"{type(exc).__name__}: {exc}")
                    set_if_changed(self._header, "value", f"{self._head()} <i>stopped: {why}</i>")
                    return

        threading.Thread(target=run, name="boxmaker-session-follow", daemon=True).start()
        return stop

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """Display the widget and, as a second output, :meth:`html` as static ``text/html``
        (hidden while the widget is live; what a saved notebook shows without a kernel)."""
        _display(self.widget)
        _display(_static(self.html(), self._key), raw=True)

    def html(self) -> str:
        """The whole transcript as one HTML string (no widgets needed to read it)."""
        return self._box.html()


SUBMIT = "\ue000"
"""A private-use character the Enter handler appends to the input's value to mean "send"."""

_KEYS_JS = (
    "<img src='data:,' alt='' style='display:none' onerror=\""
    "(function(img){var root=img.closest('.bxm-panel')||document;"
    "var area=root.querySelector('.bxm-input textarea');"
    "var send=root.querySelector('.bxm-send');"
    "var box=root.querySelector('.bxm-transcript');"
    "if(!area||!send||!box){setTimeout(function(){img.onerror();},200);return;}"
    "if(area.dataset.bxm)return;area.dataset.bxm='1';"
    "area.setAttribute('data-lm-suppress-shortcuts','true');"
    "function submit(){area.value+='\\ue000';"
    "area.dispatchEvent(new Event('input',{bubbles:true}));}"
    "area.addEventListener('keydown',function(ev){"
    "if(ev.key==='Enter'&&!ev.shiftKey&&!ev.isComposing){"
    "ev.preventDefault();ev.stopPropagation();submit();}});"
    "send.addEventListener('click',function(ev){"
    "ev.stopImmediatePropagation();ev.preventDefault();submit();},true);"
    "var stick=true;"
    "box.addEventListener('scroll',function(){"
    "stick=box.scrollTop+box.clientHeight>=box.scrollHeight-24;});"
    "new MutationObserver(function(){if(stick){box.scrollTop=box.scrollHeight;}})"
    ".observe(box,{childList:true,subtree:true,characterData:true});"
    "box.scrollTop=box.scrollHeight;"
    '})(this)">'
)
"""Run by the browser (an ``<img onerror>`` handler: ``innerHTML`` does not run ``<script>``).

- Enter, and a click on Send, append :data:`SUBMIT` to the value (synced like any typing, so
  the kernel gets the whole text, in order); Shift+Enter keeps the textarea's new line.
  Without the script, the Send button's own click handler sends.
- The textarea gets ``data-lm-suppress-shortcuts``: Lumino (JupyterLab, Notebook 7) then
  skips its keyboard shortcuts for keys typed there, so Shift+Enter does not run the cell and
  letters are not notebook commands.
- The transcript box (bounded height) follows new text, unless the reader scrolled up.
"""


class ChatPanel:
    """A live chat with the turn loop: input, Send and Stop, and a streaming transcript.

    Each Send runs the turn on ``session`` in a :class:`~boxmaker.turn.TurnRunner` (a worker
    thread); the panel's hook buffers every event, and a flusher thread copies the folded
    transcript to the widgets at most :data:`MAX_FLUSHES_PER_S` times a second (plus once at
    the turn's end). Stop cancels the turn's own :class:`~boxmaker.turn.CancelToken` (also a
    Stop pressed as the turn starts): the client closes the stream (llama.cpp stops
    generating), the turn ends with ``TurnCancelled`` and the log stays well formed.

    Args:
        runtime: config, client and tools (shared with the worker thread).
        session: the log the turns extend; turns already in it are shown first.
        max_flushes_per_s: cap on widget refreshes per second.
        transcript_height: CSS height of the transcript box (it scrolls, follows new text
            unless the reader scrolled up, and can be resized by its corner), so the input,
            Send and Stop stay in one place while an answer streams.

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
        transcript_height: str = "360px",
    ) -> None:
        self.runtime = runtime
        self.session = session
        self.lock = threading.Lock()
        self.transcript = Transcript().extend(session.records)
        self.outcomes: list[Any] = []
        self.flushes = 0
        self._interval = 1.0 / max_flushes_per_s
        self._buffer: list[tuple[float, TurnEvent | Record]] = []
        self._buffer_lock = threading.Lock()
        self.runner: TurnRunner | None = None  # the last turn's (its cancel token, outcome)
        self._dirty = threading.Event()
        self._running = False

        self.input = ipw.Textarea(
            placeholder="Message (Enter sends, Shift+Enter new line)",
            layout=ipw.Layout(width="auto", height="4em"),
        )
        self.input.add_class("bxm-input")
        self.send_button = ipw.Button(
            description="Send", button_style="primary", icon="paper-plane"
        )
        self.send_button.add_class("bxm-send")
        self.stop_button = ipw.Button(description="Stop", button_style="danger", disabled=True)
        self.stop_button.add_class("bxm-stop")
        self.progress = ipw.IntProgress(value=0, min=0, max=1, description="Prompt")
        self.progress_label = ipw.HTML("")
        self.progress_row = ipw.HBox(
            [self.progress, self.progress_label], layout=ipw.Layout(display="none")
        )
        self.progress_row.add_class("bxm-progress")
        self.status = ipw.HTML("")
        self.status.add_class("bxm-status")
        self._approval: PendingCall | None = None
        self.approval_label = ipw.HTML("")
        self.approve_button = ipw.Button(description="Approve", button_style="success")
        self.approve_button.add_class("bxm-approve")
        self.deny_button = ipw.Button(description="Deny", button_style="warning")
        self.deny_button.add_class("bxm-deny")
        self.approval_reason = ipw.Text(placeholder="reason (optional)")
        self.approval_row = ipw.VBox(
            [
                self.approval_label,
                ipw.HBox([self.approve_button, self.deny_button, self.approval_reason]),
            ],
            layout=ipw.Layout(display="none"),
        )
        self.approval_row.add_class("bxm-approval")
        self.approve_button.on_click(lambda _b: self._decide(True))
        self.deny_button.on_click(lambda _b: self._decide(False))
        self._box = TranscriptBox()
        self._box.add_finished(self.transcript.turns)
        self._box.box.layout = ipw.Layout(height=transcript_height, overflow="auto")
        self._box.box.add_class("bxm-scroll")
        self._key = uuid.uuid4().hex
        self._displayed = False
        self._keys = ipw.HTML(TRANSCRIPT_CSS + WIDGET_CSS + _hide_static(self._key) + _KEYS_JS)
        self.send_button.on_click(lambda _b: self.send(self.input.value))
        self.input.observe(self._on_input, names="value")
        self.stop_button.on_click(lambda _b: self.stop())
        self.widget = ipw.VBox(
            [
                self._box.box,
                # one row of fixed height: the controls below never move when it changes
                ipw.HBox(
                    [self.progress_row, self.status],
                    layout=ipw.Layout(height="2.5em", align_items="center", overflow="hidden"),
                ),
                self.input,
                ipw.HBox([self.send_button, self.stop_button]),
                self.approval_row,  # below the controls: they never move when it shows
                self._keys,
            ]
        )
        self.widget.add_class("bxm-panel")
        self.flush()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def _ipython_display_(self) -> None:
        """Display the widget and, as a second output, the transcript as static ``text/html``
        (:meth:`static_html`; a display that each turn's end updates). The live widget hides
        it; a saved notebook keeps it, so the conversation reads without a kernel (reopened,
        on a notebook viewer, converted by nbconvert)."""
        _display(self.widget)
        _display(self.static_html(), raw=True, display_id=self._key)
        self._displayed = True

    def static_html(self) -> dict[str, str]:
        """The transcript as a ``text/html`` bundle, marked so the live panel can hide it."""
        with self.lock:
            return _static(self._box.html(), self._key)

    def _on_input(self, change: dict[str, Any]) -> None:
        """Enter was pressed (the value holds :data:`SUBMIT`): send the text before it."""
        value = change["new"]
        if SUBMIT in value:
            text = value.replace(SUBMIT, "")
            if not self.send(text):
                self.input.value = text  # busy or blank: keep what was typed

    def html(self) -> str:
        """The transcript as shown now, as one HTML string (a streaming block as Markdown)."""
        with self.lock:
            return self._box.html()

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
            self._box.show(self.transcript, live=self._running)
            self._draw_live()
            self._draw_approval()
            self.flushes += 1

    def _draw_live(self) -> None:
        """Copy the running request's state (progress, status) to the widgets; the progress
        row shows only while a prompt is processed (hidden at every turn end)."""
        live = self.transcript.live
        processed, total, cache = live.progress or (0, 0, 0)
        if live.progress is not None:
            set_if_changed(self.progress, "max", max(total, 1))
            set_if_changed(self.progress, "value", processed)
            set_if_changed(
                self.progress_label,
                "value",
                f"{processed} / {total} tokens ({cache} cached, {max(processed - cache, 0)} new)",
            )
        elif not self._running:
            set_if_changed(self.progress, "value", 0)
            set_if_changed(self.progress_label, "value", "")
        set_if_changed(self.progress_row.layout, "display", None if live.progress else "none")
        set_if_changed(self.status, "value", html.escape(live.status))

    # -- approval -----------------------------------------------------------------------------

    def ask_approval(self, pending: PendingCall) -> None:
        """An ``ask`` callback for :class:`~boxmaker.tools.approval.ApprovalPort`: show the call
        (tool, why, its arguments) with Approve, Deny and a reason box; the person's click
        decides it (recorded ``by="panel"``). Returns at once (the port waits for the
        decision, and denies on its timeout or on Stop, which hides the row again)."""
        with self.lock:
            self._approval = pending
        self._dirty.set()
        if not self._running:
            self.flush()

    def _decide(self, approve: bool) -> None:
        """Approve or Deny was clicked: decide the shown call with the reason box's text."""
        with self.lock:
            pending, self._approval = self._approval, None
        if pending is not None:
            decide = pending.approve if approve else pending.deny
            decide(by="panel", reason=self.approval_reason.value.strip())
        self.approval_reason.value = ""
        self.flush()

    def _draw_approval(self) -> None:
        """Show the call waiting for a decision, or hide the row once it is decided (here, by
        code, by the timeout or by Stop). Caller holds :attr:`lock`."""
        pending = self._approval
        if pending is not None and pending.done:
            pending = self._approval = None
        if pending is None:
            set_if_changed(self.approval_row.layout, "display", "none")
            return
        e = html.escape
        text = (
            f"<b>{e(pending.tool)}</b> needs approval: {e(pending.why)}"
            f"<pre class='bxm-args'>{e(pending.pretty_arguments())}</pre>"
        )
        set_if_changed(self.approval_label, "value", text)
        set_if_changed(self.approval_row.layout, "display", None)

    def _flusher(self) -> None:
        """Flush while the turn runs: at most once per interval, and idle at least as long as
        the last flush took (rendering a long answer's Markdown can take longer than an
        interval; the turn's own thread then still gets half the time)."""
        while self._running:
            self._dirty.wait(timeout=self._interval)
            started = time.monotonic()
            if self._dirty.is_set():
                self._dirty.clear()
                self.flush()
            spent = time.monotonic() - started
            time.sleep(max(self._interval - spent, spent))

    # -- sending ----------------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        """Whether a turn is running."""
        return self.runner is not None and not self.runner.done

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
        self.runner = TurnRunner(
            self.session,
            self.runtime,
            text,
            self.on_event,
            on_done=lambda runner: self._finish(runner, flusher),
            name="bxm-turn",
        )
        flusher.start()
        self.runner.start()
        return True

    def _finish(self, runner: TurnRunner, flusher: threading.Thread) -> None:
        """The turn has ended (on its worker thread): keep its outcome, refresh the widgets."""
        error = runner.error
        self.outcomes.append(runner.outcome if error is None else error)
        reason = None if error is None else f"{type(error).__name__}: {error}"
        self._running = False
        self._dirty.set()
        flusher.join()
        try:
            self.flush()  # the final flush: everything buffered reaches the widgets
            with self.lock:
                self.transcript.end_turn(reason)
                self._box.show(self.transcript, live=False)
                self._draw_live()
        finally:  # whatever the drawing met, the panel takes the next message
            self.send_button.disabled = False
            self.stop_button.disabled = True
        if self._displayed:  # the saved notebook's copy follows each turn
            _display(self.static_html(), raw=True, display_id=self._key, update=True)

    def stop(self) -> None:
        """Cancel the running turn (its :class:`~boxmaker.turn.CancelToken`, never cleared, so
        not lost however early it is pressed); the worker ends it cleanly."""
        if self.runner is not None:
            self.runner.stop()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the running turn ended; returns ``False`` on timeout."""
        return self.runner is None or self.runner.wait(timeout)

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


def _display(obj: Any, **kwargs: Any) -> None:
    """``IPython.display.display`` (untyped there)."""
    show: Callable[..., Any] = ipd.display
    show(obj, **kwargs)
