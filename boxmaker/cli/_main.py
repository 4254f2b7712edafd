"""``boxmaker ...`` commands.

- ``boxmaker demo [--dir DIR] [--url URL] [--slot-save-path DIR]``: starts the embedded
  llama.cpp server on the shipped model (or uses the llama-server at ``URL``), runs a short
  session with the demo tools, streams it to the terminal, then prints one row per request
  (``prompt_n``, ``cache_n``, ``predicted_n``, reasoning tokens, ``prompt_ms``,
  ``predicted_ms``) and the session log's path. No network without ``--url``. Ctrl-C cancels
  the running turn and ends the demo (the table and the path are still printed). With
  ``--slot-save-path`` the slot is saved at each turn's end (for ``boxmaker fork``).
- ``boxmaker chat --url URL [--slot-save-path DIR]``: the same loop, interactive, against any
  llama-server (with ``--slot-save-path``, the slot saved at each turn's end). Ctrl-C
  in a turn cancels it (``[turn cancelled]``, the prompt comes back once it has stopped);
  Ctrl-C or Ctrl-D at the prompt ends the chat. Once the session no longer fits the server's
  context nothing more is sent to it; ``/new`` starts a new session. With ``[[mcp.servers]]``
  in ``--config``, the tools are those servers' (instead of the demo's), and calls the
  ``[approval]`` policy names wait for a y/n answer on the terminal.
- ``boxmaker serve [MODEL.gguf] [--port N] [-c N] [-np N] [-t N] [--[no-]kv-unified]
  [--cache-ram N] [--swa-full] [--ctx-checkpoints N] [--[no-]reasoning-preserve]
  [--[no-]cache-idle-slots]``: serve a model (default: the shipped one) on 127.0.0.1 until
  Ctrl-C, the flags named and defaulted as llama-server's but ``--no-cache-idle-slots``
  (boxmaker pins each session's requests to its slot:
  :class:`boxmaker.server.EmbeddedServer`). Numbers out of :data:`boxmaker.server.LIMITS` are
  refused as bad usage, before llama.cpp could abort.
- ``boxmaker report PATH... [--html FILE]``: usage, cache loss and limit hits of session logs.
- ``boxmaker export parquet|otel|inspect|atif PATH... ...``: the logs in other tools' formats;
  ``boxmaker import atif FILE... [--dir DIR]``: an ATIF trajectory as a session log
  (:mod:`boxmaker.cli._export`).
- ``boxmaker cassette show|check PATH...``: a cassette's transcript; check that every chat
  request extends the previous one.
- ``boxmaker replay CASSETTE [--tool-iterations N] [--loop-cycle K] [--demo-tools] ...``: re-run
  the loop on a recording with other limits and loop-guard knobs (tools: the recorded results,
  or the demo tools run again).
- ``boxmaker replay LOG.jsonl [--tool-iterations N] ...``: the same limits over a session
  log's own calls (a tapped agent's too; :func:`boxmaker.tap.what_if_log`): which would have
  fired, and where.
- ``boxmaker tap --upstream URL [--port P] [--host ADDR] [--dir DIR] [--no-forensics]
  [--cassette PATH] [--allow-host NAME] [--allow-origin ORIGIN] [--max-body-bytes N]``:
  a pass-through proxy (on 127.0.0.1 unless ``--host`` says otherwise) in front of a
  llama-server, writing boxmaker session logs of the agents pointed at it (and, with
  ``--cassette``, a scrubbed cassette of every exchange), until Ctrl-C, SIGTERM or SIGHUP
  (:mod:`boxmaker.tap`; what it lets in: :class:`boxmaker.config.TapConfig`).
- ``boxmaker doctor --url URL [--api-key KEY] [--json]``: probe a llama-server with small
  requests and say what is set up right for agent loops, and what to change (exit 1 if a
  check failed).
- ``boxmaker cache explain LOG --url URL [--reasoning drop|keep] [--json]``: each cache loss of
  a session log with where and why (re-rendered through a llama-server with the same model;
  :func:`boxmaker.cache.explain_log`).
- ``boxmaker log upgrade PATH...``: rewrite session logs of an older schema in the current one
  (atomically; :func:`boxmaker.session.upgrade_log`).
- ``boxmaker bench setup|bfcl|report ...``: BFCL v4 on a local model, scored by BFCL's own
  checkers, and the same tasks through other agent harnesses (:mod:`boxmaker.cli._bench`).
- ``boxmaker batch TASKS.jsonl --url URL [--url URL ...] --dir DIR [--grid FILE]`` (or
  ``--embedded --parallel N``; ``--ray auto|ADDRESS``): every task under every grid setting,
  on every slot of every server, with a progress bar; rerun the same command to resume
  (:mod:`boxmaker.batch`). A task line with ``fork`` and ``at`` forks that log at that turn
  under every setting (``--slot-save-path``: where the servers save slots: every run's slot
  saved at its turn ends, a fork's parent's restored).

Exit codes: 0 done, 1 a boxmaker error or an OS error (one line on stderr, no traceback; also
a demo stopped by a full session), 2 bad usage, 130 interrupted, 141 stdout closed by its
reader (a broken pipe).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..config import ClientConfig, TapConfig
from ..errors import BoxmakerError
from ..view import terminal_safe
from . import _commands as commands
from ._bench import add_bench
from ._chat import CHAT_COMMANDS
from ._export import add_export_commands
from ._flags import add_ctx
from ._flags import number as _number

__all__ = ["main"]


TAP_BODY_DEFAULT = TapConfig().max_body_bytes
"""``--max-body-bytes``' default: :attr:`boxmaker.config.TapConfig.max_body_bytes`'s."""


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is out of range: it must be at least 1")
    return value


def _coverage(text: str) -> float:
    """An argparse type: an interval's coverage, a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"{value} is out of range: it must be between 0 and 1")
    return value


class _Parser(argparse.ArgumentParser):
    """argparse's parser without abbreviations (``--thread`` is no ``--threads``, ``--htm``
    no ``--html``: a typo is an error), whose subcommands report a flag they do not know with
    their own usage, not the top command's."""

    def __init__(self, *args: Any, top: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.top = top

    def parse_known_args(  # type: ignore[override]  # argparse's overloads
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extra = super().parse_known_args(args, namespace)
        if extra and not self.top:
            self.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed, extra


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="boxmaker",
        description="Agent turn loops on llama.cpp's server, for research.",
        top=True,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ctx_help = "context size in tokens, all slots together"

    demo = sub.add_parser("demo", help="run a short session on the embedded server, offline")
    demo.add_argument("--dir", default="sessions", help="where session logs go (./sessions)")
    demo.add_argument("--model", default=None, help="GGUF to serve (default: shipped model)")
    _number(demo, "--ctx", "n_ctx", 4096, ctx_help)
    _number(demo, "--threads", "n_threads", 1, "CPU threads")
    demo.add_argument(
        "--url", default=None, help="use this running llama-server instead of the embedded one"
    )
    demo.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="save the session's slot at each turn's end in DIR (the embedded server is "
        "started with it; with --url, the folder that server saves slots in), for warm forks",
    )
    demo.set_defaults(run=commands.demo)

    chat = sub.add_parser(
        "chat", help="chat interactively with any llama-server", epilog=CHAT_COMMANDS
    )
    chat.add_argument(
        "--url",
        default=None,
        help=f"llama-server base URL (default: the --config file's, else {ClientConfig().url})",
    )
    chat.add_argument("--config", default=None, help="TOML config file")
    chat.add_argument(
        "--api-key",
        default=None,
        help="the server's API key (its --api-key; default: the --config file's, if any)",
    )
    chat.add_argument(
        "--no-tools",
        action="store_true",
        help="offer the model no tools (a chat template without tool support: llama.cpp drops "
        "them from the prompt without a word)",
    )
    chat.add_argument(
        "--dir",
        default=None,
        help="where session logs go (default: ./sessions; with --resume, the resumed log's "
        "folder, where /new puts the next session too)",
    )
    first = chat.add_mutually_exclusive_group()
    first.add_argument("--system", default="", help="system prompt of a new session")
    first.add_argument(
        "--resume",
        default=None,
        metavar="LOG",
        help="go on with this session log (.jsonl; its system prompt and tools are kept)",
    )
    chat.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="the folder the server saves slots in (its --slot-save-path, on this machine): "
        "the session's slot is saved there at each turn's end, for warm forks",
    )
    chat.set_defaults(run=commands.chat)

    fork = sub.add_parser(
        "fork", help="branch a session log at a turn into a new log; run on under other settings"
    )
    fork.add_argument("log", help="the parent's session log (.jsonl); only read")
    fork.add_argument("--at", type=int, default=None, metavar="TURN", help="the turn (1-based)")
    point = fork.add_mutually_exclusive_group()
    point.add_argument(
        "--rerun", action="store_true", help="branch before turn TURN's answer and run it again"
    )
    point.add_argument(
        "--edit",
        nargs=2,
        metavar=("CALL", "TEXT"),
        help="replace tool call CALL's result by TEXT (recorded as an edit) and go on",
    )
    fork.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config setting of the fork (loop.tool_iterations=2), recorded in the fork",
    )
    fork.add_argument("--say", default=None, help="a new user message to run in the fork")
    fork.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="the server's --slot-save-path: restore the parent's slot saved at the fork's "
        "turn before the fork's turn runs, and save the fork's slot at its turn's end",
    )
    fork.add_argument(
        "--replay",
        choices=("on", "off", "stop"),
        default="on",
        help="the parent's tool results while the calls match (on: the default here; a "
        "batch's fork tasks default to off), never (off), or stop at the first call that "
        "differs (stop)",
    )
    fork.add_argument("--config", default=None, help="TOML config file")
    fork.add_argument("--url", default=None, help="llama-server base URL for the fork's turn")
    fork.add_argument("--dir", default=None, help="where the fork goes (the parent's folder)")
    fork.set_defaults(run=commands.fork)

    serve = sub.add_parser("serve", help="serve a GGUF model on 127.0.0.1 until Ctrl-C")
    serve.add_argument("model", nargs="?", default=None, help="GGUF (default: shipped model)")
    _number(serve, "--port", "port", 8080, "TCP port, 0 picks a free one")
    _number(serve, ("-c", "--ctx", "--ctx-size"), "n_ctx", 4096, ctx_help)
    auto = "4 slots sharing one unified KV cache, as llama-server"
    _number(serve, ("-np", "--parallel"), "n_parallel", None, "slots", unset=auto)
    _number(serve, ("-t", "--threads"), "n_threads", None, "CPU threads")
    serve.add_argument(
        "--kv-unified",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one KV pool for all slots (default: on when -np is not given, as llama-server)",
    )
    ram = "cross-request prompt cache in MiB, 0 off, -1 no limit"
    _number(serve, ("-cram", "--cache-ram"), "cache_ram_mib", 8192, ram)
    serve.add_argument(
        "--swa-full",
        action="store_true",
        help="full-size cache for sliding-window models: the slot's cache is reused instead "
        "of a context checkpoint (default off)",
    )
    _number(serve, "--ctx-checkpoints", "ctx_checkpoints", None, "context checkpoints per slot")
    serve.add_argument(
        "--reasoning-preserve",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep earlier turns' reasoning in templates that support it (default on)",
    )
    serve.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="where POST /slots/{id}?action=save|restore keeps slots (warm forks); default off",
    )
    serve.add_argument(
        "--cache-idle-slots",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="save idle slots to the RAM cache and clear them when another slot starts a task "
        "(llama-server's default on; off here: a session's pinned requests then find their "
        "slot as they left it)",
    )
    serve.set_defaults(run=commands.serve)

    report = sub.add_parser("report", help="usage, cache loss and limit hits of session logs")
    report.add_argument("paths", nargs="+", help="session logs or directories (recursive)")
    report.add_argument("--html", default=None, help="write a self-contained HTML report here")
    report.add_argument(
        "--json",
        action="store_true",
        help="print the sessions, turns, cache losses and limit hits as JSON (the frames' "
        "columns; unknown values null) instead of the text tables",
    )
    report.set_defaults(run=commands.report)

    add_export_commands(sub, _DefaultsHelp)

    cassette = sub.add_parser("cassette", help="read and check recorded cassettes")
    actions = cassette.add_subparsers(dest="action", required=True)
    for action, text in (
        ("show", "print each cassette's transcript"),
        ("check", "check that every chat request extends the previous one (exit 1 if not)"),
    ):  # a subcommand each, so that `cassette show --help` is its own help
        one = actions.add_parser(action, help=text, description=text)
        one.add_argument("paths", nargs="+", help="cassette YAML files")
        one.set_defaults(run=commands.cassette)

    replay = sub.add_parser("replay", help="re-run the loop on a cassette with other limits")
    replay.add_argument(
        "cassette", help="cassette YAML file, or a session log (.jsonl: its own calls)"
    )
    replay.add_argument(
        "--tool-iterations", type=int, default=None, help="loop.tool_iterations (-1: off)"
    )
    replay.add_argument("--no-repeat-detection", action="store_true", help="repeat_detection off")
    replay.add_argument("--tool-result-cap", type=int, default=None, help="characters (-1: no cap)")
    replay.add_argument(
        "--thinking-tokens", type=int, default=None, help="loop.thinking_tokens (default: off)"
    )
    replay.add_argument("--loop-cycle", type=int, help="loop.cycle_length K (-1: off)")
    replay.add_argument("--loop-repeats", type=int, help="loop.cycle_repeats R")
    replay.add_argument(
        "--repeat-exempt",
        action="append",
        default=[],
        metavar="NAME",
        help="loop.repeat_exempt: a tool left out of the repeat, cycle and stale-result rules "
        "(a status poll is meant to repeat); repeatable",
    )
    replay.add_argument("--on-limit", choices=("stop", "answer"), help="loop.on_limit")
    replay.add_argument(
        "--demo-tools",
        action="store_true",
        help="run the demo tools (default: the results recorded in the cassette answer)",
    )
    replay.set_defaults(run=commands.replay)

    tap = sub.add_parser(
        "tap", help="a logging pass-through proxy in front of a llama-server, for any agent"
    )
    tap.add_argument("--upstream", required=True, help="the llama-server's base URL")
    _number(tap, "--port", "port", 8089, "port to listen on, 0 picks a free one")
    tap.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0 lets other "
        "machines use the upstream with the agents' credentials)",
    )
    tap.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="another name the agents reach the tap by (their Host header; the loopback "
        "names and --host are always accepted); repeatable",
    )
    tap.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="a browser origin allowed to use the tap (http://localhost:8888; '*': any); "
        "without it a browser's request is refused; repeatable",
    )
    tap.add_argument(
        "--max-body-bytes",
        type=int,
        default=TAP_BODY_DEFAULT,
        metavar="N",
        help=f"largest request body in bytes; larger is refused with 413 "
        f"(default {TAP_BODY_DEFAULT}, 16 MiB)",
    )
    tap.add_argument("--dir", default="sessions", help="where session logs go (./sessions)")
    tap.add_argument(
        "--no-forensics", action="store_true", help="log cache losses without asking why"
    )
    tap.add_argument(
        "--cassette",
        metavar="PATH",
        help="also record every exchange, scrubbed, into this cassette (YAML; replaced)",
    )
    tap.set_defaults(run=commands.tap)

    log_actions = sub.add_parser("log", help="session log maintenance").add_subparsers(
        dest="action", required=True
    )  # a subcommand, so that `log upgrade --help` is its own help
    text = "rewrite older logs in the current schema, in place and atomically"
    log = log_actions.add_parser("upgrade", help=text, description=text)
    log.add_argument("paths", nargs="+", help="session logs (.jsonl)")
    log.set_defaults(run=commands.log)

    cache_help = "why did the prompt cache miss? (cache forensics)"
    cache_actions = sub.add_parser("cache", help=cache_help).add_subparsers(
        dest="action", required=True
    )
    text = "explain each cache loss of a log: where the prompt first differed, and why"
    cache = cache_actions.add_parser("explain", help=text, description=text)
    cache.add_argument(
        "logs", nargs="+", metavar="LOG", help="session logs or directories (recursive), as report"
    )
    cache.add_argument("--url", required=True, help="a llama-server with the session's model")
    cache.add_argument("--api-key", default=None, help="its API key (--api-key), if any")
    cache.add_argument(
        "--reasoning", choices=("drop", "keep"), default="drop", help="the session's history"
    )
    cache.add_argument("--json", action="store_true", help="print the losses as JSON")
    cache.set_defaults(run=commands.cache)

    doctor = sub.add_parser("doctor", help="check a llama-server's setup for agent loops")
    doctor.add_argument("--url", required=True, help="the llama-server's base URL")
    doctor.add_argument("--api-key", default=None, help="its API key (--api-key), if any")
    doctor.add_argument("--json", action="store_true", help="print the checks as JSON")
    doctor.add_argument(
        "--probe-tokens",
        type=_at_least_one,
        default=160,
        metavar="N",
        help="max_tokens of each probe (160: room for reasoning and a tool call; fewer is "
        "faster on a model that rambles, whose tool-call and reasoning verdicts then may fail)",
    )
    doctor.set_defaults(run=commands.doctor)

    add_bench(sub)

    batch = sub.add_parser("batch", help="run tasks x a config grid on every slot, resumable")
    batch.add_argument(
        "tasks",
        help="tasks, JSON Lines: {id, messages, system?, tools?, config?, target?}, or a fork "
        "of a log: {id, fork: LOG, at: TURN, rerun?, replay?, messages?, config?, target?}",
    )
    batch.add_argument("--dir", required=True, help="the batch directory (rerun to resume)")
    batch.add_argument("--url", action="append", help="a llama-server base URL (repeatable)")
    batch.add_argument("--grid", default=None, help="config grid, JSON or TOML: key -> values")
    batch.add_argument("--config", default=None, help="base config, TOML")
    batch.add_argument("--tries", type=int, default=3, help="attempts before a run fails (3)")
    batch.add_argument("--embedded", action="store_true", help="also run the embedded server")
    _number(batch, "--parallel", "n_parallel", 4, "embedded: the server's slots")
    batch.add_argument("--model", default=None, help="embedded: GGUF (default: shipped model)")
    add_ctx(batch, 4096)
    _number(batch, "--threads", "n_threads", None, "embedded: CPU threads")
    batch.add_argument(
        "--slot-save-path",
        default=None,
        metavar="DIR",
        help="where the servers save slots (the embedded one is started with it; with --url, "
        "the folder those servers save in, on this machine): each run's slot is saved at its "
        "turn ends, and a fork task's run restores its parent's slot saved at the fork's turn",
    )
    spread = batch.add_mutually_exclusive_group()
    spread.add_argument(
        "--ray",
        default=None,
        metavar="auto|local|ADDRESS",
        help="run each run as a Ray task (auto: the running cluster; local: start one)",
    )
    spread.add_argument(
        "--workers",
        type=_at_least_one,
        default=None,
        metavar="N",
        help="share the slots out among N worker processes of this machine, where one "
        "process cannot keep a GPU server's slots busy (default: threads in this process "
        "below 32 slots in all, from 32 one worker process per CPU on Linux)",
    )
    batch.set_defaults(run=commands.batch)

    score = sub.add_parser("score", help="score a batch's runs (targets, scorers), offline")
    score.add_argument("batch_dir", metavar="BATCH", help="the batch directory")
    score.add_argument(
        "--scorer",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="a Scorer, or a function of a run's records, to run too (repeatable)",
    )
    score.set_defaults(run=commands.score)

    compare = sub.add_parser("compare", help="success rates per setting, with intervals")
    compare.add_argument("batch_dir", metavar="BATCH", help="a scored batch directory")
    compare.add_argument("--by", action="append", default=None, help="a setting key (repeatable)")
    compare.add_argument("--scorer", default="target", help="whose scores to compare")
    compare.add_argument("--baseline", default=None, help="the baseline setting's label")
    compare.add_argument(
        "--resamples", type=_at_least_one, default=2000, help="bootstrap resamples (at least 1)"
    )
    compare.add_argument("--seed", type=int, default=0, help="the bootstrap's seed")
    compare.add_argument(
        "--confidence", type=_coverage, default=0.95, help="interval coverage (between 0 and 1)"
    )
    compare.add_argument("--json", action="store_true", help="print the table as JSON")
    compare.set_defaults(run=commands.compare)
    for command in [*sub.choices.values(), *actions.choices.values()]:
        command.formatter_class = _DefaultsHelp
    return parser


class _DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` shows each option's default, unless its help says it already or there is
    none (``None``, ``""``, a flag's ``False``, a repeatable option's ``[]``)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False, "", argparse.SUPPRESS) or action.default == []:
            return text
        if "default" in text or str(action.default) in text:
            return text
        return super()._get_help_string(action)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``boxmaker`` console script; returns the exit code.

    Every :class:`BoxmakerError` and ``OSError`` ends as one line ``boxmaker: <message>`` on
    stderr (exit 1), never a traceback; Ctrl-C outside a turn prints ``boxmaker: interrupted``
    on stderr and exits 130. When stdout is a pipe
    its reader closed (``boxmaker report ... | head -1``), the rest of the output is dropped and
    the exit code is 141 (128 + SIGPIPE, what a shell shows for a program SIGPIPE ended), as the
    Python docs recommend for ``BrokenPipeError`` (stdout is pointed at ``os.devnull`` so the
    final flush at exit cannot fail again).
    """
    try:
        args = _parser().parse_args(argv)
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:
        with contextlib.suppress(OSError, ValueError):  # a stdout without a descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except (BoxmakerError, OSError) as exc:
        print(terminal_safe(f"boxmaker: {exc}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # outside a turn: starting a server, checking one, ...
        print("boxmaker: interrupted", file=sys.stderr)
        return 130
    return code
