"""``boxmaker fork LOG --at TURN``: branch a session log into a new log, and run on in it.

The fork is made by :meth:`boxmaker.session.Session.fork` (the parent is only read); the
``--set KEY=VALUE`` pairs are recorded in its ``Forked`` record and laid on the config the
fork runs with (:meth:`boxmaker.config.Config.with_settings`). With ``--rerun``, ``--edit``
or ``--say`` a turn runs on the server (``--url``, else the ``--config`` file's), with the
parent's tool results replayed while the calls match (``--replay``), once the server has
answered ``GET /health`` (a wrong URL or no server makes no log); without, only the log is
made. Before the turn the parent's prompt cache is looked for (:func:`boxmaker.cache.warm_fork`:
a slot, else with ``--slot-save-path`` the parent's saved slot restored); after it, the line
``cache: ...`` says what the fork's first request measured (its ``Warmed`` record: the share
of the parent's prefix reused, and why when it is not warm). With ``--slot-save-path`` the
fork's own slot is saved at its turn's end too. Exit 0 on an answer, 1 when the turn ended
otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tomllib
import warnings
from typing import Any

from ..cache import ColdFork, SlotStore, WarmStart, describe_warmth, warm_fork
from ..client import Client
from ..config import Config, load_config
from ..errors import ConfigError, TurnError
from ..records import TurnEnd, Warmed
from ..session import Session
from ..turn import Replay, Runtime, continue_fork
from ._chat import check_server
from ._terminal import _tools

__all__ = ["parse_settings", "run_fork"]


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``["loop.tool_iterations=2", "sampling.temperature=0.2", "history.reasoning=drop"]``
    -> ``{"loop.tool_iterations": 2, ...}``: each value read as a TOML value (numbers,
    booleans, quoted strings, arrays), else taken as a bare string.

    Raises:
        ConfigError: a pair without ``=`` or a key that is not ``section.key``.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or "." not in key:
            raise ConfigError(f"--set {pair!r}: write it as section.key=value")
        try:
            out[key] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[key] = text
    return out


def _warm(fork: Session, runtime: Runtime, client: Client, store: SlotStore | None) -> WarmStart:
    """Bring the parent's prompt cache to the fork's slot (:func:`boxmaker.cache.warm_fork`;
    a fresh process knows no slot's contents, so without ``store`` only the server itself
    can still hold it); a :class:`~boxmaker.cache.ColdFork` warning's reason is kept in the
    answer's ``detail``, not printed: the measured line says it after the turn."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ColdFork)
        start = warm_fork(fork, client, store, config=runtime.config)
    for w in caught:
        if not issubclass(w.category, ColdFork):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return start


def cache_line(fork: Session, start: WarmStart) -> str:
    """What the fork's first request measured, in one line (its ``Warmed`` record,
    :func:`boxmaker.cache.describe_warmth`); when no completion came, what was tried."""
    warmed = next((r for r in fork.records if isinstance(r, Warmed)), None)
    if warmed is not None:
        return f"cache: {describe_warmth(warmed)}"
    tried = {"slot": f"slot {start.slot} was to hold the parent's prefix",
             "restored": f"{start.file} was restored into slot {start.slot}",
             "cold": start.detail}[start.how]  # fmt: skip
    return f"cache: not measured (no completion of the fork): {tried}"


def run_fork(args: argparse.Namespace) -> int:
    """``boxmaker fork``: make the fork (its path printed), then run its turn when asked."""
    settings = parse_settings(args.set)
    config = load_config(args.config) if args.config else Config()
    config = config.with_settings(settings, source="--set")
    if args.at is None and not args.edit:
        raise ConfigError("say where to fork: --at TURN (or --edit CALL TEXT)")
    call, result = (int(args.edit[0]), args.edit[1]) if args.edit else (None, None)
    runs = bool(args.rerun or args.edit or args.say)
    code = 0
    with contextlib.ExitStack() as stack:
        runtime: Runtime | None = None
        store = None
        if runs:  # all before the fork's log is made: a failure leaves no log, and the
            # tools' set-up (seconds of imports) is not counted in the fork's turn time
            url = args.url or config.client.url
            config = dataclasses.replace(config, client=dataclasses.replace(config.client, url=url))
            check_server(config.client)
            registry, port = _tools(config, stack)
            client = stack.enter_context(Client(config.client))
            runtime = Runtime(config=config, client=client, registry=registry, port=port)
            if args.slot_save_path is not None:
                store = SlotStore(args.slot_save_path)  # a folder it cannot use: said now
                store.check(client)  # a server that cannot save: said now
        with Session.open(args.log, read_only=True) as parent:
            fork = parent.fork(
                args.at,
                rerun=args.rerun,
                call=call,
                result=result,
                settings=settings,
                directory=args.dir,
            )
        with fork:
            turn = fork.forked.turn if fork.forked else "?"
            print(f"fork {fork.path} of {parent.path} (turn {turn})")
            if runtime is not None:
                code = _run(fork, args, runtime, client, store)
    return code


def _run(
    fork: Session,
    args: argparse.Namespace,
    runtime: Runtime,
    client: Client,
    store: SlotStore | None,
) -> int:
    """The fork's turn: its cache warmed (:func:`_warm`), the parent's tool results replayed
    as ``--replay`` asks, its slot saved at the turn's end with a ``store``; print what the
    first request's cache reuse measured (:func:`cache_line`), the answer and how far the
    replay followed the parent; 0 on an answer, else 1."""
    runtime.warm = start = _warm(fork, runtime, client, store)
    replay = None if args.replay == "off" else Replay.of(fork, stop=args.replay == "stop")
    runtime.replay = replay
    saver = None if store is None else store.saver(fork, client)
    try:
        outcome = continue_fork(fork, runtime, args.say, saver)
    except TurnError as exc:
        print(cache_line(fork, start))
        print(f"the fork's turn ended without an answer: {exc}")
        return 1
    print(cache_line(fork, start))
    ended = next((r for r in reversed(fork.records) if isinstance(r, TurnEnd)), None)
    if ended is not None and ended.outcome != "answered":  # e.g. cut at max_tokens
        why = f": {ended.detail}" if ended.detail else ""
        print(f"the fork's turn ended {ended.outcome}{why}; its last text:")
    print(outcome.content)
    if replay is not None:
        at = replay.diverged_at
        where = "none" if at is None else f"call {at + 1} ({replay.why})"
        n = replay.position - (replay.diverged_at is not None)
        results = "tool result" if n == 1 else "tool results"
        print(f"replayed {n} {results}; first differing call: {where}")
    return 0
