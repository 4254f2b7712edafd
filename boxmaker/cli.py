"""``boxmaker ...`` commands.

- ``boxmaker demo [--dir DIR]``: starts the embedded llama.cpp server on the shipped model,
  runs a short session with the demo tools, streams it to the terminal, then prints one row
  per request (``prompt_n``, ``cache_n``, ``predicted_n``, reasoning tokens, ``prompt_ms``,
  ``predicted_ms``) and the session log's path. No network.
- ``boxmaker chat --url URL``: the same loop, interactive, against any llama-server. With
  ``[[mcp.servers]]`` in ``--config``, the tools are those servers' (instead of the demo's),
  and calls the ``[approval]`` policy names wait for a y/n answer on the terminal.
- ``boxmaker serve [MODEL.gguf] [--port N]``: serve a model (default: the shipped one) on
  127.0.0.1 until Ctrl-C.
- ``boxmaker report PATH... [--html FILE]``: usage, cache loss and limit hits of session logs.
- ``boxmaker cassette show|check PATH...``: a cassette's transcript; check that every chat
  request extends the previous one.
- ``boxmaker replay CASSETTE [--tool-iterations N] ...``: re-run the loop on a recording with
  other limits.
- ``boxmaker log upgrade PATH...``: rewrite session logs of an older schema in the current one
  (atomically; :func:`boxmaker.logfile.upgrade_log`).

Exit codes: 0 done, 1 a boxmaker error (message on stderr), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from .approval import ApprovalPort, ConsolePrompt
from .client import Client
from .config import ClientConfig, Config, load_config
from .demo import DEMO_PROMPTS, DEMO_SYSTEM, ConsoleView, demo_registry, format_usage_table
from .errors import BoxmakerError, TurnError
from .logfile import upgrade_log
from .records import SCHEMA_VERSION, Baseline, CacheLoss
from .render import terminal_safe
from .session import Session
from .tools import Registry, ToolPort
from .turn import Runtime, run_turn

__all__ = ["main"]


def _turn(session: Session, runtime: Runtime, text: str, view: ConsoleView) -> None:
    """Run one turn in a worker thread so Ctrl-C can cancel it and leave the log well formed."""
    failure: list[BaseException] = []

    def work() -> None:
        try:
            run_turn(session, runtime, text, view)
        except BaseException as exc:  # reported on the main thread
            failure.append(exc)

    worker = threading.Thread(target=work, name="boxmaker-turn", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(0.1)
    except KeyboardInterrupt:
        runtime.cancel.set()
        worker.join()
    view.end()
    if failure:
        exc = failure[0]
        if isinstance(exc, TurnError):
            print(f"  [turn ended: {type(exc).__name__}: {exc}]", flush=True)
        else:
            raise exc


def _run_session(
    runtime: Runtime, directory: Path, prompts: Sequence[str] | None, system: str
) -> Session:
    baseline = Baseline(system=system, tools=runtime.registry.definitions())
    session = Session.create(directory, baseline)
    view = ConsoleView()
    try:
        if prompts is not None:
            for text in prompts:
                print(f"\nyou> {text}", flush=True)
                _turn(session, runtime, text, view)
        else:
            while True:
                try:
                    text = input("\nyou> ").strip()
                except EOFError:
                    break
                if text in ("/quit", "/exit"):
                    break
                if text:
                    _turn(session, runtime, text, view)
    finally:
        session.close()
    print("\n" + format_usage_table(session.records))
    if any(isinstance(r, CacheLoss) for r in session.records):
        print(
            "\nCache losses at the start of a turn are expected with Qwen3-style templates: "
            "they drop the\nreasoning of earlier turns once a new user message comes, so the "
            "prompt re-renders from there."
        )
    print(f"\nsession log: {session.path}")
    return session


def _demo(args: argparse.Namespace) -> int:
    from .server import EmbeddedServer

    server = EmbeddedServer(args.model, n_ctx=args.ctx, n_threads=args.threads)
    print(f"starting the embedded llama.cpp server on {server.model_path.name} ...", flush=True)
    with server:
        print(f"server at {server.url}", flush=True)
        config = Config(client=ClientConfig(url=server.url))
        with Client(config.client) as client:
            runtime = Runtime(config=config, client=client, registry=demo_registry())
            _run_session(runtime, Path(args.dir), DEMO_PROMPTS, DEMO_SYSTEM)
    return 0


def _chat(args: argparse.Namespace) -> int:
    config = load_config(args.config) if args.config else Config()
    client_cfg = dataclasses.replace(config.client, url=args.url or config.client.url)
    config = dataclasses.replace(config, client=client_cfg)
    with Client(config.client) as client, contextlib.ExitStack() as stack:
        registry, port = _tools(config, stack)
        runtime = Runtime(config=config, client=client, registry=registry, port=port)
        tools = ", ".join(registry.names)
        print(f"chatting with {client_cfg.url} (tools: {tools}; Ctrl-D ends)")
        _run_session(runtime, Path(args.dir), None, args.system)
    return 0


def _tools(config: Config, stack: contextlib.ExitStack) -> tuple[Registry, ToolPort | None]:
    """The demo tools; or, with MCP servers configured, theirs behind a y/n prompt."""
    if not config.mcp.servers:
        return demo_registry(), None
    from .mcp_port import McpPort  # the mcp SDK only when a server is configured

    registry = Registry()
    port = stack.enter_context(McpPort(config))
    port.register(registry)
    return registry, ApprovalPort(port, config.approval, ConsolePrompt())


def _serve(args: argparse.Namespace) -> int:
    from .server import serve_forever

    serve_forever(args.model, port=args.port, n_ctx=args.ctx, n_threads=args.threads)
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import run_report

    return run_report(args.paths, html=args.html)


def _cassette(args: argparse.Namespace) -> int:
    """``cassette show``: each transcript; ``cassette check``: one line per cassette and one per
    break of the prefix (exit 1 when one fails)."""
    from . import cassettes  # vcrpy: imported only when a cassette command runs

    if args.action == "show":
        for n, path in enumerate(args.paths):
            print(("\n" if n else "") + terminal_safe(cassettes.transcript(path)))
        return 0
    failed = False
    for path in args.paths:
        check = cassettes.check_prefix(path)
        if check.ok:
            print(f"{path}: ok, {check.chat_requests} chat requests, each extends the previous one")
            continue
        failed = True
        n = len(check.problems)
        print(f"{path}: FAIL, {n} of {check.chat_requests} chat requests break the prefix")
        for line in check.problems:
            print(f"  {line}")
    return 1 if failed else 0


def _replay(args: argparse.Namespace) -> int:
    """``replay``: print the what-if report (exit 0 also when the replay stopped where the
    cassette ends: that is a finding, printed last)."""
    from .cassettes import what_if  # vcrpy: imported only when a cassette command runs

    given = {
        "tool_iterations": args.tool_iterations,
        "tool_result_cap": args.tool_result_cap,
        "thinking_tokens": args.thinking_tokens,
        "repeat_detection": False if args.no_repeat_detection else None,
    }  # a flag not given keeps LoopLimits' default; -1 turns a limit off
    limits = dataclasses.replace(Config().loop, **{k: v for k, v in given.items() if v is not None})
    report = what_if(args.cassette, limits)
    print(terminal_safe("\n".join(report.lines)))
    return 0


def _log(args: argparse.Namespace) -> int:
    for path in args.paths:
        schema, steps = upgrade_log(path)
        if steps:
            print(f"{path}: schema {schema} -> {SCHEMA_VERSION} ({', '.join(steps)})")
        else:
            print(f"{path}: schema {schema}, already current")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="boxmaker", description="Agent turn loops on llama.cpp's server, for research."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a short session on the embedded server, offline")
    demo.add_argument("--dir", default="sessions", help="where session logs go (./sessions)")
    demo.add_argument("--model", default=None, help="GGUF to serve (default: shipped model)")
    demo.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    demo.add_argument(
        "--threads", type=int, default=1, help="CPU threads for llama.cpp (1: the tiny model)"
    )
    demo.set_defaults(run=_demo)

    chat = sub.add_parser("chat", help="chat interactively with any llama-server")
    chat.add_argument("--url", default=None, help="llama-server base URL")
    chat.add_argument("--config", default=None, help="TOML config file")
    chat.add_argument("--dir", default="sessions", help="where session logs go (./sessions)")
    chat.add_argument("--system", default="", help="system prompt")
    chat.set_defaults(run=_chat)

    serve = sub.add_parser("serve", help="serve a GGUF model on 127.0.0.1 until Ctrl-C")
    serve.add_argument("model", nargs="?", default=None, help="GGUF (default: shipped model)")
    serve.add_argument("--port", type=int, default=8080, help="TCP port (0 picks a free one)")
    serve.add_argument("--ctx", type=int, default=4096, help="context size in tokens")
    serve.add_argument("--threads", type=int, default=None, help="CPU threads for llama.cpp")
    serve.set_defaults(run=_serve)

    report = sub.add_parser("report", help="usage, cache loss and limit hits of session logs")
    report.add_argument("paths", nargs="+", help="session logs or directories (recursive)")
    report.add_argument("--html", default=None, help="write a self-contained HTML report here")
    report.set_defaults(run=_report)

    cassette = sub.add_parser("cassette", help="read and check recorded cassettes")
    cassette.add_argument(
        "action",
        choices=("show", "check"),
        help="show: a transcript; check: every chat request extends the previous one",
    )
    cassette.add_argument("paths", nargs="+", help="cassette YAML files")
    cassette.set_defaults(run=_cassette)

    replay = sub.add_parser("replay", help="re-run the loop on a cassette with other limits")
    replay.add_argument("cassette", help="cassette YAML file")
    replay.add_argument(
        "--tool-iterations", type=int, default=None, help="loop.tool_iterations (-1: off)"
    )
    replay.add_argument("--no-repeat-detection", action="store_true", help="repeat_detection off")
    replay.add_argument("--tool-result-cap", type=int, default=None, help="characters (-1: no cap)")
    replay.add_argument(
        "--thinking-tokens", type=int, default=None, help="loop.thinking_tokens (default: off)"
    )
    replay.set_defaults(run=_replay)

    log = sub.add_parser("log", help="session log maintenance")
    log.add_argument(
        "action", choices=("upgrade",), help="upgrade: rewrite older logs in the current schema"
    )
    log.add_argument("paths", nargs="+", help="session logs (.jsonl)")
    log.set_defaults(run=_log)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``boxmaker`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        code: int = args.run(args)
    except BoxmakerError as exc:
        print(f"boxmaker: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
