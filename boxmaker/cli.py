"""``boxmaker ...`` commands.

- ``boxmaker demo [--dir DIR]``: starts the embedded llama.cpp server on the shipped model,
  runs a short session with the demo tools, streams it to the terminal, then prints one row
  per request (``prompt_n``, ``cache_n``, ``predicted_n``, reasoning tokens, ``prompt_ms``,
  ``predicted_ms``) and the session log's path. No network.
- ``boxmaker chat --url URL``: the same loop, interactive, against any llama-server.
- ``boxmaker serve [MODEL.gguf] [--port N]``: serve a model (default: the shipped one) on
  127.0.0.1 until Ctrl-C.
- ``boxmaker report PATH... [--html FILE]``: usage, cache loss and limit hits of session logs.
- ``boxmaker cassette show|check PATH...``: a cassette's transcript; check that every chat
  request extends the previous one.
- ``boxmaker replay CASSETTE [--tool-iterations N] ...``: re-run the loop on a recording with
  other limits.
- ``boxmaker log upgrade PATH...``: rewrite session logs of an older schema in the current one
  (atomically; :func:`boxmaker.logfile.upgrade_log`).
- ``boxmaker batch TASKS.jsonl --url URL [--url URL ...] --dir DIR [--grid FILE]`` (or
  ``--embedded --parallel N``; ``--ray auto|ADDRESS``): every task under every grid setting,
  on every slot of every server, with a progress bar; rerun the same command to resume
  (:mod:`boxmaker.batch`).

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

from .client import Client
from .config import ClientConfig, Config, load_config
from .demo import DEMO_PROMPTS, DEMO_SYSTEM, ConsoleView, demo_registry, format_usage_table
from .errors import BoxmakerError, TurnError
from .logfile import upgrade_log
from .records import SCHEMA_VERSION, Baseline, CacheLoss
from .session import Session
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
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        print(f"chatting with {client_cfg.url} (tools: get_weather, get_time; Ctrl-D ends)")
        _run_session(runtime, Path(args.dir), None, args.system)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from .server import serve_forever

    serve_forever(args.model, port=args.port, n_ctx=args.ctx, n_threads=args.threads)
    return 0


def _report(args: argparse.Namespace) -> int:
    from .report import run_report

    return run_report(args.paths, html=args.html)


def _cassette(args: argparse.Namespace) -> int:
    from . import cassettes

    if args.action == "show":
        return cassettes.cli_show(args.paths)
    return cassettes.cli_check(args.paths)


def _replay(args: argparse.Namespace) -> int:
    from .cassettes import cli_replay

    return cli_replay(args)


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
    replay.add_argument("--tool-iterations", type=int, default=None, help="loop.tool_iterations")
    replay.add_argument("--no-repeat-detection", action="store_true", help="repeat_detection off")
    replay.add_argument("--tool-result-cap", type=int, default=None, help="characters")
    replay.add_argument("--thinking-tokens", type=int, default=None, help="thinking.turn_tokens")
    replay.set_defaults(run=_replay)

    log = sub.add_parser("log", help="session log maintenance")
    log.add_argument(
        "action", choices=("upgrade",), help="upgrade: rewrite older logs in the current schema"
    )
    log.add_argument("paths", nargs="+", help="session logs (.jsonl)")
    log.set_defaults(run=_log)

    batch = sub.add_parser("batch", help="run tasks x a config grid on every slot, resumable")
    batch.add_argument("tasks", help="tasks, JSON Lines: {id, messages, system?, tools?, config?}")
    batch.add_argument("--dir", required=True, help="the batch directory (rerun to resume)")
    batch.add_argument("--url", action="append", help="a llama-server base URL (repeatable)")
    batch.add_argument("--grid", default=None, help="config grid, JSON or TOML: key -> values")
    batch.add_argument("--config", default=None, help="base config, TOML")
    batch.add_argument("--tries", type=int, default=3, help="attempts before a run fails (3)")
    batch.add_argument("--embedded", action="store_true", help="also run the embedded server")
    batch.add_argument("--parallel", type=int, default=4, help="embedded server's slots (4)")
    batch.add_argument("--model", default=None, help="embedded: GGUF (default: shipped model)")
    batch.add_argument("--ctx", type=int, default=4096, help="embedded: context per slot")
    batch.add_argument("--threads", type=int, default=None, help="embedded: CPU threads")
    batch.add_argument(
        "--ray",
        default=None,
        metavar="auto|local|ADDRESS",
        help="run each run as a Ray task (auto: the running cluster; local: start one)",
    )
    batch.set_defaults(run=_batch)
    return parser


def _batch(args: argparse.Namespace) -> int:
    from .batch import load_grid, run_batch
    from .batchview import TerminalProgress, describe

    config = load_config(args.config) if args.config else Config()
    grid = load_grid(args.grid) if args.grid else None
    servers: list[object] = list(args.url or [])
    if not servers and not args.embedded:
        print("boxmaker batch: give --url URL (one or more) or --embedded", file=sys.stderr)
        return 2
    progress = TerminalProgress()
    with contextlib.ExitStack() as stack:
        if args.embedded:
            from .server import EmbeddedServer

            n = args.parallel
            embedded = EmbeddedServer(
                args.model, n_ctx=args.ctx * n, n_parallel=n, n_threads=args.threads
            )
            servers.append(stack.enter_context(embedded))
        try:
            result = run_batch(
                args.tasks,
                args.dir,
                servers=servers,  # type: ignore[arg-type]  # URLs and an EmbeddedServer
                grid=grid,
                config=config,
                max_tries=args.tries,
                executor="ray" if args.ray else "threads",
                ray_address=None if args.ray in (None, "local") else args.ray,
                on_progress=progress,
            )
        except KeyboardInterrupt:
            progress.close()
            print(f"\ninterrupted; run the same command again to resume {args.dir}")
            return 130
        finally:
            progress.close()
    print(describe(result))
    for run, reason in result.failures:
        print(f"failed {run}: {reason}")
    print(f"batch {args.dir}: logs in {Path(args.dir) / 'logs'}, manifest.ndjson beside them")
    return 1 if result.failed else 0


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
