"""The bodies of the ``boxmaker`` commands (``args``: the parsed command line, from
:mod:`boxmaker.cli._main`'s parser, which names each as its ``run``); each returns the exit
code. The heavier ones import their parts only when they run (pandas for a report, the client
for a session)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import warnings
from pathlib import Path

from ..config import ClientConfig, Config, HistoryConfig, TapConfig
from ..demo import demo_registry
from ..records import SCHEMA_VERSION
from ..server import EmbeddedServer
from ..session import LogReadWarning, read_logs, upgrade_log
from ..view import terminal_safe

__all__ = [
    "batch",
    "cache",
    "cassette",
    "chat",
    "compare",
    "demo",
    "doctor",
    "fork",
    "log",
    "pool_warning",
    "replay",
    "report",
    "score",
    "serve",
    "tap",
    "upstream_down",
]


def serve(args: argparse.Namespace) -> int:
    """``serve``: the embedded server on 127.0.0.1 until Ctrl-C; the URL once it is healthy."""
    server = EmbeddedServer(
        args.model,
        n_ctx=args.ctx,
        n_parallel=args.parallel,
        n_threads=args.threads,
        port=args.port,
        kv_unified=args.kv_unified,
        cache_ram_mib=args.cache_ram,
        swa_full=args.swa_full,
        ctx_checkpoints=args.ctx_checkpoints,
        reasoning_preserve=args.reasoning_preserve,
        slot_save_path=args.slot_save_path,
        cache_idle_slots=args.cache_idle_slots,
    )
    with server:
        print(f"serving {server.model_path} at {server.url} (Ctrl-C stops)", flush=True)
        kv = "unified KV" if server.kv_unified else "KV split"
        print(f"{server.n_parallel} slot(s), {kv}, n_ctx {server.n_ctx}", flush=True)
        if server.kv_unified and server.n_parallel > 1:
            print(pool_warning(server.n_parallel, server.n_ctx), file=sys.stderr, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopping", file=sys.stderr, flush=True)
    return 0


def pool_warning(slots: int, n_ctx: int) -> str:
    """What ``serve`` says of slots sharing one KV pool: sessions on every slot at once get
    ``n_ctx / slots`` tokens each before llama.cpp fails every running request."""
    return (
        f"warning: the {slots} slots share one KV pool of {n_ctx} tokens: {slots} sessions at "
        f"once hold {n_ctx // slots} tokens each before llama.cpp fails every running request "
        '("Context size has been exceeded"; boxmaker waits and retries). For N sessions of T '
        "tokens: -np N -c N*T (--no-kv-unified gives each slot its own n_ctx/N)"
    )


def report(args: argparse.Namespace) -> int:
    """``report``: see :func:`boxmaker.cli._report.run_report`."""
    from ._report import run_report  # pandas, matplotlib: only for a report

    return run_report(args)


def batch(args: argparse.Namespace) -> int:
    """``batch``: see :func:`boxmaker.cli._batch.run_batch_command`."""
    from ._batch import run_batch_command  # pandas, the client: only for a batch

    return run_batch_command(args)


def score(args: argparse.Namespace) -> int:
    """``score``: see :func:`boxmaker.cli._batch.run_score`."""
    from ._batch import run_score

    return run_score(args)


def compare(args: argparse.Namespace) -> int:
    """``compare``: see :func:`boxmaker.cli._batch.run_compare`."""
    from ._batch import run_compare

    return run_compare(args)


def cassette(args: argparse.Namespace) -> int:
    """``cassette show``: each transcript; ``cassette check``: one line per cassette and one per
    break of the prefix (exit 1 when one fails)."""
    from .. import cassettes  # vcrpy: imported only when a cassette command runs

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


def replay(args: argparse.Namespace) -> int:
    """``replay``: print the what-if report (exit 0 also when the replay stopped where the
    cassette ends: that is a finding, printed last; exit 1 when nothing of the cassette could
    be played: its first request is not one boxmaker's loop sends)."""
    from ..cassettes import what_if  # vcrpy: imported only when a cassette command runs

    given = {
        "tool_iterations": args.tool_iterations,
        "tool_result_cap": args.tool_result_cap,
        "thinking_tokens": args.thinking_tokens,
        "repeat_detection": False if args.no_repeat_detection else None,
        "cycle_length": args.loop_cycle,
        "cycle_repeats": args.loop_repeats,
        "repeat_exempt": tuple(args.repeat_exempt) or None,
        "on_limit": args.on_limit,
    }  # a flag not given keeps LoopLimits' default; -1 turns a limit off
    limits = dataclasses.replace(Config().loop, **{k: v for k, v in given.items() if v is not None})
    if str(args.cassette).endswith(".jsonl"):  # a session log (a tapped agent's): its own calls
        from ..tap import what_if_log  # uvicorn, httpx: imported only when this command runs

        print(terminal_safe("\n".join(what_if_log(args.cassette, limits).lines)))
        return 0
    report = what_if(args.cassette, limits, registry=demo_registry() if args.demo_tools else None)
    print(terminal_safe("\n".join(report.lines)))
    if report.stopped is not None and report.played == 0 and report.total:
        print(
            f"boxmaker replay: nothing of {args.cassette} could be replayed: its first request "
            "is not one boxmaker's loop sends (a tapped agent's traffic: replay the tap's "
            "session log instead, boxmaker replay LOG.jsonl)",
            file=sys.stderr,
        )
        return 1
    return 0


def upstream_down(url: str) -> str | None:
    """Why the tap's upstream does not answer ``GET /health`` (2 s), ``None`` when it does
    (any HTTP answer counts: a server still loading says 503)."""
    import httpx

    try:
        httpx.get(f"{url}/health", timeout=2.0)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return None


def tap(args: argparse.Namespace) -> int:
    """``tap``: serve until SIGINT (Ctrl-C), SIGTERM or SIGHUP, the logs written before it
    exits (0); what could not be logged goes to stderr (once)."""
    import logging

    from ..tap import Tap  # uvicorn, httpx: imported only when the tap runs

    logging.basicConfig(format="boxmaker tap: %(message)s")
    config = TapConfig(
        host=args.host,
        max_body_bytes=args.max_body_bytes,
        allowed_hosts=tuple(args.allow_host),
        allowed_origins=tuple(args.allow_origin),
    )
    tap = Tap(
        args.upstream,
        directory=args.dir,
        port=args.port,
        forensics=not args.no_forensics,
        cassette=args.cassette,
        config=config,
    )
    tap.bind()
    where = "this machine only" if config.loopback else "reachable from other machines"
    print(f"boxmaker tap: listening on {tap.url} ({where}) -> {tap.upstream}", flush=True)
    also = f"; cassette {args.cassette}" if args.cassette else ""
    print(f"  point the agent at {tap.url}/v1; logs in {args.dir}{also}", flush=True)
    if not config.loopback:
        print(
            f"  warning: anyone who can reach {config.host}:{tap.port} can use the upstream "
            "with the agents' credentials",
            flush=True,
        )
    down = upstream_down(tap.upstream)
    if down is not None:  # said at once, not at the agent's first request (a 502 then)
        print(
            f"  warning: the upstream does not answer GET /health ({down}): start "
            "llama-server there, or give the right --upstream; the tap waits for it",
            flush=True,
        )
    stopped = tap.serve_forever()  # SIGINT, SIGTERM, SIGHUP: the logs written first
    if stopped is not None:
        print(f"boxmaker tap: stopped by {stopped.name}", file=sys.stderr)
    for path in tap.log.sessions if tap.log else ():
        print(path)
    if tap.log is not None and tap.log.written:
        log = tap.log
        logged = log.written - log.failed - log.skipped
        print(
            f"{logged} exchange(s) written, each within {log.slowest_s:.3f} s of its answer's end"
            + (f"; {log.skipped} forwarded unread (said above)" if log.skipped else "")
            + (f"; {log.failed} not logged (said above)" if log.failed else "")
        )
    if tap.cassette is not None and tap.cassette.recorded:
        print(f"{tap.cassette.path}: {tap.cassette.recorded} interaction(s) recorded")
    return 0


def log(args: argparse.Namespace) -> int:
    for path in args.paths:
        schema, steps = upgrade_log(path)
        if steps:
            print(f"{path}: schema {schema} -> {SCHEMA_VERSION} ({', '.join(steps)})")
        else:
            print(f"{path}: schema {schema}, already current")
    return 0


def cache(args: argparse.Namespace) -> int:
    """``cache explain``: one block per loss of each log (or JSON); the logs as ``report``
    takes them (files or folders, the one source iterator: a copy of a session, or a log the
    session refuses, is said on stderr and left out); exit 1 when a loss could not be
    explained."""
    from ..cache import explain_log  # httpx: imported only when a command talks to a server

    config = Config(history=HistoryConfig(reasoning=args.reasoning))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LogReadWarning)
        logs = [log.path for log in read_logs(args.logs)]
    for w in caught:
        print(terminal_safe(f"boxmaker cache explain: {w.message}"), file=sys.stderr)
    explained = {path: explain_log(path, args.url, config=config, api_key=args.api_key)
                 for path in logs}  # fmt: skip
    failed = any(e.found is None for losses in explained.values() for e in losses)
    for path, losses in explained.items():
        odd = [e for e in losses if e.settings_differ]
        if odd:
            other = "keep" if args.reasoning == "drop" else "drop"
            print(terminal_safe(
                f"boxmaker cache explain: warning: {path}: the prompt rebuilt from the log "
                f"with --reasoning {args.reasoning} is {odd[0].rebuilt_tokens} tokens where "
                f"the server counted {odd[0].prompt_tokens} (request {odd[0].request}; "
                f"{len(odd)} of {len(losses)} loss(es)): the session ran with other settings "
                f"(or another model), and the causes may be wrong; try --reasoning {other}"
            ), file=sys.stderr)  # fmt: skip
    if args.json:
        if len(args.logs) == 1 and len(logs) == 1 and Path(args.logs[0]).is_file():
            print(json.dumps([e.to_json() for e in explained[logs[0]]], indent=2))
        else:
            body = {path: [e.to_json() for e in losses] for path, losses in explained.items()}
            print(json.dumps(body, indent=2))
        return 1 if failed else 0
    for path, losses in explained.items():
        print(f"{path}: {len(losses)} cache loss(es)")
        for e in losses:
            again = "unknown" if e.reprocessed is None else str(e.reprocessed)
            head = (
                f"request {e.request}: lost_tokens {e.lost_tokens} ({e.reused} of the previous "
                f"prompt's {e.expected} reused), reprocessed_tokens {again}"
            )
            if e.found is None:
                print(f"{head}, not explained: {terminal_safe(e.error or '')}")
                continue
            print(f"{head}, {e.found.cause} at token {e.found.position}: {e.found.detail}")
            for name, text in (("old", e.found.old_window), ("new", e.found.new_window)):
                print(f"  {name}: {terminal_safe(json.dumps(text or '', ensure_ascii=False))}")
    return 1 if failed else 0


def doctor(args: argparse.Namespace) -> int:
    """``doctor``: one line per check (or JSON); exit 1 when a check failed."""
    from .doctor import diagnose  # httpx: imported only when a command talks to a server

    args.url = ClientConfig(url=args.url).url  # 127.0.0.1:8080 without http:// said plainly
    print(
        f"probing {args.url}: GET /health, /props, /slots, four small streamed completions "
        f"(at most {args.probe_tokens} tokens each) and six pinned pairs for the slot check "
        "(a minute or more on a slow model) ...",
        file=sys.stderr,
        flush=True,
    )
    report = diagnose(args.url, api_key=args.api_key, probe_tokens=args.probe_tokens)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0 if report.ok else 1
    marks = {True: "ok", False: "FIX", None: "--"}
    width = max(len(c.name) for c in report.checks)
    print(f"llama-server at {report.url}")
    for c in report.checks:
        print(f"  {marks[c.ok]:<4} {c.name:<{width}}  {terminal_safe(c.seen)}")
        if c.fix:
            print(f"       {'':<{width}}  -> {terminal_safe(c.fix)}")
    print("all checks passed" if report.ok else "some checks failed: see -> above")
    return 0 if report.ok else 1


def demo(args: argparse.Namespace) -> int:
    """``demo``: see :func:`boxmaker.cli._terminal.run_demo`."""
    from ._terminal import run_demo  # the client, the loop and httpx: only for a session

    return run_demo(args)


def chat(args: argparse.Namespace) -> int:
    """``chat``: see :func:`boxmaker.cli._terminal.run_chat`."""
    from ._terminal import run_chat  # the client, the loop and httpx: only for a session

    return run_chat(args)


def fork(args: argparse.Namespace) -> int:
    """``fork``: see :func:`boxmaker.cli._fork.run_fork`."""
    from ._fork import run_fork  # the client, the loop and httpx: only for a fork

    return run_fork(args)
