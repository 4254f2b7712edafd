"""ipywidgets views of the turn loop: :class:`ChatPanel` (live) and :class:`SessionView` (a log).

Both consume only the public hooks: the events :func:`boxmaker.turn.run_turn` passes to its
``on_event`` (:mod:`boxmaker.events`) and the records of a session log
(:mod:`boxmaker.records`). Nothing here is called by the loop.

The widgets hold no logic of their own: :class:`~boxmaker.transcript.Transcript` folds events
and records into plain turns (:mod:`boxmaker.transcript`), :func:`~boxmaker.render.render_turn`
turns one into safe HTML (:mod:`boxmaker.render`, where the rules for untrusted model text are),
and the widgets copy the result into widget values. Only the last turn of a transcript ever
changes, so a refresh re-renders that one alone, however long the session.

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

This module imports ipywidgets; ``import boxmaker`` does not import it (the package loads
:class:`ChatPanel` and :class:`SessionView` on first use).
"""

from __future__ import annotations

import html
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

import ipywidgets as ipw

from .errors import TurnError
from .events import TurnEvent
from .records import Record
from .render import render_turn
from .session import Session
from .transcript import Transcript, TurnView
from .turn import Runtime, run_turn

__all__ = ["MAX_FLUSHES_PER_S", "SUBMIT", "ChatPanel", "SessionView"]

MAX_FLUSHES_PER_S = 15.0
"""Most widget refreshes :class:`ChatPanel` makes per second while a turn streams."""


class _TranscriptBox:
    """A VBox with one HTML widget per turn.

    Only the last turn of a transcript changes (see :class:`~boxmaker.transcript.Transcript`),
    so :meth:`show` re-renders the turn shown last and any new ones; the turns before keep
    their HTML. A refresh costs the same after 2 turns or 2,000.
    """

    def __init__(self) -> None:
        self.box = ipw.VBox([])
        self.box.add_class("bxm-transcript")
        self.items: list[Any] = []

    def show(self, turns: Sequence[TurnView], streaming: bool) -> None:
        """Bring the widgets up to ``turns``; the last turn is rendered as ``streaming``."""
        for i in range(max(len(self.items) - 1, 0), len(turns)):
            if i == len(self.items):
                self.items.append(ipw.HTML())
                self.box.children = tuple(self.items)
            value = render_turn(turns[i], streaming=streaming and i == len(turns) - 1)
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

    A log file is opened read-only (``Session.open(path, read_only=True)``): never repaired or
    written, so a log another process is still writing can be reviewed.

    Raises:
        SessionError: the log cannot be read or a line in it is corrupt.
    """

    def __init__(self, path_or_session: str | os.PathLike[str] | Session) -> None:
        if isinstance(path_or_session, Session):
            records = list(path_or_session.records)
            title = str(path_or_session.path)
        else:
            records = list(Session.open(path_or_session, read_only=True).records)
            title = str(path_or_session)
        self.transcript = Transcript().extend(records)
        self._box = _TranscriptBox()
        self._box.show(self.transcript.turns, streaming=False)
        header = ipw.HTML(f"<b>Session log</b> {html.escape(title)} ({len(records)} records)")
        self.widget = ipw.VBox([header, self._box.box])

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
        self.status = ipw.HTML("")
        self.status.add_class("bxm-status")
        self._box = _TranscriptBox()
        self._keys = ipw.HTML(_KEYS_JS)
        self.send_button.on_click(lambda _b: self.send(self.input.value))
        self.input.observe(self._on_input, names="value")
        self.stop_button.on_click(lambda _b: self.stop())
        self.widget = ipw.VBox(
            [
                self._box.box,
                self.progress_row,
                self.status,
                self.input,
                ipw.HBox([self.send_button, self.stop_button]),
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
