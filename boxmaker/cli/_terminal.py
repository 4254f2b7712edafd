"""Interactive turns in a terminal: ``boxmaker chat`` and ``boxmaker demo``.

The interactive half of the CLI (:mod:`boxmaker.cli` parses the command line and calls
:func:`run_demo` / :func:`run_chat`). A turn runs in a worker thread while the main thread
waits on an event (never on ``Thread.join(timeout)``, which a Ctrl-C can cut short on Python
3.11); Ctrl-C during a turn cancels the turn's token and waits until the turn has ended
(``[turn cancelled]``); at an idle chat prompt it ends the chat like Ctrl-D; a full session
stops sending; a closed stdout (``| head``) cancels the turn and exits 141. With
``--slot-save-path DIR`` (the folder the server saves slots in; ``demo`` starts its embedded
server with it) the session's slot is saved at each turn's end (:meth:`SlotStore.saver`), so a
later ``boxmaker fork --slot-save-path DIR`` finds it. It prints: it is part of the CLI.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from ..cache import SlotStore
from ..client import Client
from ..config import ClientConfig, Config, load_config
from ..demo import DEMO_PROMPTS, DEMO_SYSTEM, demo_registry
from ..errors import (
    BoxmakerError,
    ServerError,
    SessionFull,
    StreamCut,
    TurnCancelled,
    TurnError,
    TurnInferError,
)
from ..events import Hook, TurnEvent
from ..records import Baseline, CacheLoss, Record
from ..server import EmbeddedServer
from ..session import Session
from ..tools import Registry, ToolPort
from ..tools.approval import ApprovalPort, ConsolePrompt
from ..turn import CancelToken, Runtime, TurnRunner
from ..view import ConsoleView, format_usage_table, terminal_safe
from ._chat import CHAT_COMMANDS, check_server, resume_session

__all__ = ["run_chat", "run_demo"]


class _Interrupts:
    """While active (a ``with`` block on the main thread), Ctrl-C (SIGINT) cancels
    :attr:`cancel` (the running turn's token, set by :func:`_turn`) and is counted in
    :attr:`presses` instead of raising ``KeyboardInterrupt``; the old handler comes back at the
    end. Off the main thread (no signal handlers there) it does nothing."""

    def __init__(self) -> None:
        self.cancel: CancelToken | None = None
        self.presses = 0
        self._installed = False
        self._old: Any = None

    def _handle(self, signum: int, frame: object) -> None:
        self.presses += 1
        if self.cancel is not None:
            self.cancel.cancel()

    def __enter__(self) -> _Interrupts:
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, signal.SIG_DFL if self._old is None else self._old)
            self._installed = False


class _PipeGuard:
    """The console view as the turn's worker calls it: once stdout's reader has gone (a broken
    pipe, ``boxmaker demo | head``) it stops writing and cancels the turn; :func:`_turn` then
    raises ``BrokenPipeError`` on the main thread."""

    def __init__(self, view: ConsoleView, cancel: CancelToken) -> None:
        self.view = view
        self.cancel = cancel
        self.broken = False

    def __call__(self, event: TurnEvent | Record) -> None:
        if self.broken:
            return
        try:
            self.view(event)
        except BrokenPipeError:
            self.broken = True
            self.cancel.cancel()


def _turn(
    session: Session,
    runtime: Runtime,
    text: str,
    view: ConsoleView,
    interrupts: _Interrupts,
    saver: Hook | None = None,
) -> BaseException | None:
    """Run one turn in a worker thread so Ctrl-C can cancel it; return how it failed (None:
    answered).

    Returns only once the worker has finished, so nothing else (a prompt, another turn) can
    overlap a cancelled turn still writing: the worker's own ``done`` event is waited for, not
    ``Thread.join(timeout)``, which on Python 3.11 can return at once after a
    ``KeyboardInterrupt`` (it marks the thread stopped while it runs). Ctrl-C while waiting
    cancels the turn's token (never cleared, so a press as the turn starts is not lost),
    prints ``[stopping the turn]`` (``[still stopping the turn]`` on later presses) and is
    otherwise absorbed. Errors other than :class:`TurnError` (a log that cannot be written)
    are raised. ``saver`` also gets every event (a slot saved at the turn's end).
    """
    token = CancelToken()
    guard = _PipeGuard(view, token)

    def hook(event: TurnEvent | Record) -> None:
        guard(event)
        if saver is not None:
            saver(event)

    runner = TurnRunner(session, runtime, text, hook, cancel=token)
    interrupts.cancel = token
    if interrupts.presses:
        token.cancel()  # pressed before this turn: it stops at once
    runner.start()
    seen = 0
    while not runner.done:
        try:
            runner.wait(0.1)
        except KeyboardInterrupt:  # only when no SIGINT handler could be installed
            interrupts.presses += 1
            token.cancel()
        if interrupts.presses > seen and not guard.broken:
            try:
                view.end()
                print(f"  [{'still ' if seen else ''}stopping the turn]", flush=True)
            except BrokenPipeError:
                guard.broken = True  # raised below, once the worker has finished
            seen = interrupts.presses
    if guard.broken:
        raise BrokenPipeError(errno.EPIPE, "stdout was closed by its reader")
    view.end()
    exc = runner.error
    if exc is None:
        return None
    if isinstance(exc, TurnCancelled):
        print("  [turn cancelled]", flush=True)
    elif isinstance(exc, SessionFull):
        print(terminal_safe(f"  [session full: {exc}]"), flush=True)  # the server's words
    elif isinstance(exc, TurnError):
        print(terminal_safe(f"  [turn ended: {type(exc).__name__}: {exc}]"), flush=True)
    else:
        raise exc
    return exc


def _finish(session: Session) -> None:
    """Close ``session`` and print its usage table and path; a failed close is raised after
    printing (the records are in memory)."""
    failure: BoxmakerError | OSError | None = None
    try:
        session.close()
    except (BoxmakerError, OSError) as exc:
        failure = exc
    print("\n" + format_usage_table(session.records))
    if any(isinstance(r, CacheLoss) for r in session.records):
        print(
            "\nCache losses at the start of a turn are expected with Qwen3-style templates: "
            "they drop the\nreasoning of earlier turns once a new user message comes, so the "
            "prompt re-renders from there\n(history_rewritten). "
            'A config with [history] reasoning = "keep" keeps them, and the cache.'
        )
    print(f"\nsession log: {session.path}", flush=True)
    if failure is not None:
        raise failure


def _abandon(session: Session) -> None:
    """Close ``session`` while another exception is on its way out (which it must not mask)."""
    with contextlib.suppress(BoxmakerError, OSError):
        session.close()


FULL_DEMO = (
    "  The session no longer fits the server's context, so the demo stops here. Run it again "
    "with a larger --ctx (tokens)."
)
FULL_CHAT = (
    "  The session no longer fits the server's context; nothing more is sent to it. Type /new "
    "to start a new session (the conversation starts over), or Ctrl-D to end; or restart the "
    "server with a larger context (llama-server -c N, boxmaker serve --ctx N)."
)


def _saver(store: SlotStore | None, session: Session, runtime: Runtime) -> Hook | None:
    """The hook that saves ``session``'s slot at each turn's end (``None`` without a store)."""
    if store is None or not isinstance(runtime.client, Client):
        return None
    return store.saver(session, runtime.client)


def _demo_session(runtime: Runtime, directory: Path, store: SlotStore | None = None) -> int:
    """Run the demo's prompts; Ctrl-C cancels the running turn and ends the demo (130), a full
    session ends it too (1); another failed turn makes the exit code 1. The usage table and
    the log path are printed in every case. With a ``store`` the slot is saved at each turn's
    end."""
    baseline = Baseline(system=DEMO_SYSTEM, tools=runtime.registry.definitions())
    session = Session.create(directory, baseline)
    saver = _saver(store, session, runtime)
    view = ConsoleView()
    code = 0
    try:
        with _Interrupts() as interrupts:
            for text in DEMO_PROMPTS:
                print(f"\nyou> {text}", flush=True)
                failure = _turn(session, runtime, text, view, interrupts, saver)
                if interrupts.presses:
                    code = 130
                    break
                if isinstance(failure, SessionFull):
                    print(FULL_DEMO, flush=True)
                    code = 1
                    break
                if failure is not None:
                    code = 1  # a turn failed: the demo goes on, its exit code says so
    except BaseException:
        _abandon(session)
        raise
    _finish(session)
    return code


def _chat_session(
    runtime: Runtime,
    directory: Path,
    baseline: Baseline,
    session: Session | None,
    store: SlotStore | None = None,
) -> int:
    """Read messages until Ctrl-D or ``/quit``; one turn each. Ctrl-C in a turn cancels it;
    Ctrl-C at the prompt drops the line being typed and says how to end (it ended the chat).
    After :class:`SessionFull` nothing is sent to that session; ``/new``
    starts a new one. ``session`` is a resumed one, or ``None``: then the log is made at the
    first message (a chat ended before it leaves no file and prints no table). Exit code 1
    when turns were tried and none reached the server. With a ``store`` each session's slot
    is saved at each turn's end."""
    view = ConsoleView()
    full = False
    tried = reached = False
    try:
        while True:
            try:
                text = input("\nyou> ").strip()
            except EOFError:
                break
            except KeyboardInterrupt:
                print("\n[Ctrl-C: the line is dropped; /quit or Ctrl-D ends the chat]", flush=True)
                continue
            if text in ("/quit", "/exit"):
                break
            if text == "/new":
                if session is not None:
                    _finish(session)
                session, full = None, False
                print("[new session: its log is made at the first message]", flush=True)
            elif full and text:
                print(FULL_CHAT, flush=True)
            elif text:
                if session is None:
                    session = Session.create(directory, baseline)
                with _Interrupts() as interrupts:
                    saver = _saver(store, session, runtime)
                    failure = _turn(session, runtime, text, view, interrupts, saver)
                tried = True
                reached = reached or not _unreachable(failure)
                if isinstance(failure, SessionFull):
                    full = True
                    print(FULL_CHAT, flush=True)
    except BaseException:
        if session is not None:
            _abandon(session)
        raise
    if session is not None:
        _finish(session)
        print(f"(boxmaker chat --resume {session.path} goes on with it)", flush=True)
    if tried and not reached:
        print(f"boxmaker chat: never reached {runtime.config.client.url}", file=sys.stderr)
        return 1
    return 0


def _unreachable(failure: BaseException | None) -> bool:
    """The turn failed without an answer from the server (no HTTP status, no body, not a stream
    cut: connection refused, timed out before a response)."""
    if not isinstance(failure, TurnInferError):
        return False
    cause = failure.cause
    return cause.status is None and not cause.body and not isinstance(cause, StreamCut)


def run_demo(args: argparse.Namespace) -> int:
    """``boxmaker demo``: the demo prompts on the embedded server (or ``--url``); the usage
    table and the log path at the end; exit 1 when a turn failed, 130 after Ctrl-C."""
    config = Config(client=ClientConfig(url=args.url or "http://127.0.0.1:8080"))
    if args.url:
        print(f"running the demo against {args.url}", flush=True)
        check_server(config.client)  # one line and exit 1, not three turns of retries
        return _demo_with(config, Path(args.dir), args.slot_save_path)
    if args.model is not None and not Path(args.model).is_file():
        raise ServerError(f"{args.model}: no such model file (a GGUF)")
    server = EmbeddedServer(
        args.model, n_ctx=args.ctx, n_threads=args.threads, slot_save_path=args.slot_save_path
    )
    print(f"starting the embedded llama.cpp server on {server.model_path.name} ...", flush=True)
    with server:
        print(f"server at {server.url}", flush=True)
        config = Config(client=ClientConfig(url=server.url))
        return _demo_with(config, Path(args.dir), args.slot_save_path)


def _demo_with(config: Config, directory: Path, slots: str | None = None) -> int:
    with Client(config.client) as client:
        store = _store(slots, client)
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        return _demo_session(runtime, directory, store)


def _store(folder: str | None, client: Client) -> SlotStore | None:
    """The saved slots in ``folder`` (``--slot-save-path``), checked at once: a folder the
    store cannot use or a server that cannot save slots is a ``SlotError`` before any turn."""
    if folder is None:
        return None
    store = SlotStore(folder)
    store.check(client)
    print(f"the slot is saved at each turn's end in {folder}", flush=True)
    return store


def run_chat(args: argparse.Namespace) -> int:
    """``boxmaker chat``: an interactive session with any llama-server (see the module
    docstring); exit 1 when the server was never reached."""
    config = load_config(args.config) if args.config else Config()
    client_cfg = dataclasses.replace(
        config.client,
        url=args.url or config.client.url,
        api_key=args.api_key if args.api_key is not None else config.client.api_key,
    )
    config = dataclasses.replace(config, client=client_cfg)
    check_server(config.client)  # one line and exit 1 now, rather than retries at the prompt
    with Client(config.client) as client, contextlib.ExitStack() as stack:
        registry, port = (Registry(), None) if args.no_tools else _tools(config, stack)
        session = stack.enter_context(resume_session(args.resume)) if args.resume else None
        folder = Path(args.dir) if args.dir is not None else None
        if folder is None:  # a resumed session's folder holds the next ones (/new) too
            folder = session.path.parent if session is not None else Path("sessions")
        baseline = Baseline(system=args.system, tools=registry.definitions())
        if session is not None:  # the next sessions (/new) start as it did, --no-tools aside
            baseline = session.baseline
            if args.no_tools:
                baseline = dataclasses.replace(baseline, tools=())
            print(f"resuming {session.path} ({len(session.records)} records)")
        runtime = Runtime(config=config, client=client, registry=registry, port=port)
        store = _store(args.slot_save_path, client)
        tools = ", ".join(registry.names) or "none"
        print(f"chatting with {client_cfg.url} (tools: {tools}; Ctrl-D ends; Ctrl-C stops a turn)")
        print(CHAT_COMMANDS)
        return _chat_session(runtime, folder, baseline, session, store)


def _tools(config: Config, stack: contextlib.ExitStack) -> tuple[Registry, ToolPort | None]:
    """The demo tools; or, with MCP servers configured, theirs behind a y/n prompt."""
    if not config.mcp.servers:
        return demo_registry(), None
    from ..tools.mcp import McpPort  # the mcp SDK only when a server is configured

    registry = Registry()
    port = stack.enter_context(McpPort(config))
    port.register(registry)
    return registry, ApprovalPort(port, config.approval, ConsolePrompt())
