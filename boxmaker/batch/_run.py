"""One run of a batch on one llama.cpp slot, and how many slots a server has.

:func:`run_one` is what every executor of :mod:`boxmaker.batch` runs for a run (a worker
thread, or a Ray task on another node): it reads how far the run's log got
(:func:`~boxmaker.batch._plan.log_state`), reopens or creates the log, and sends the remaining
user messages, one :func:`~boxmaker.turn.run_turn` each, every request pinned to one slot
(``Config(slots=SlotsConfig(main=slot))``, llama.cpp's ``id_slot``); :func:`run_alone` is the
same in a process of its own (a Ray task). :func:`discover_slots` asks a server for its slots
(``GET /slots``, else ``GET /props``).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..client import ChatClient, Client
from ..config import Config, SlotsConfig
from ..errors import (
    ServerError,
    SessionError,
    SessionFull,
    TurnCancelled,
    TurnInferError,
    TurnLimit,
    TurnNotAnswered,
)
from ..events import Hook, TurnEvent
from ..records import Baseline, Record, Usage
from ..session import Session
from ..tools import Registry
from ..turn import Runtime, run_turn
from ._plan import RunSpec, log_state

__all__ = ["RunOutcome", "alive", "discover_slots", "run_alone", "run_one"]


def discover_slots(url: str, *, timeout_s: float = 5.0, api_key: str | None = None) -> list[int]:
    """The slot ids of the llama-server at ``url``.

    ``GET /slots`` (a JSON list, one object with an ``id`` per slot) when the server has the
    slots endpoint on; else ``GET /props`` ``total_slots`` (ids ``0 .. n-1``). With
    ``api_key`` (``ClientConfig.api_key``) both carry ``Authorization: Bearer <key>``, as
    llama-server started with ``--api-key`` requires.

    Raises:
        ServerError: the server does not answer, refuses the key or asks for one (HTTP 401 or
            403: the message says so and never shows the key), or neither endpoint gives a
            slot count.
    """
    base = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=timeout_s, headers=headers) as http:
            answer = http.get(f"{base}/slots")
            _check_key(base, answer, api_key)
            if answer.status_code == 200:
                items = answer.json()
                if isinstance(items, list):
                    ids = [s.get("id") for s in items if isinstance(s, dict)]
                    slots = [i for i in ids if isinstance(i, int)]
                    if slots and len(slots) == len(items):
                        return sorted(slots)
            answer = http.get(f"{base}/props")
            _check_key(base, answer, api_key)
            total = answer.json().get("total_slots") if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise ServerError(f"{base}: cannot read its slots: {exc!r}") from exc
    if isinstance(total, int) and total > 0:
        return list(range(total))
    raise ServerError(f"{base}: neither GET /slots nor GET /props says how many slots it has")


def _check_key(base: str, answer: httpx.Response, api_key: str | None) -> None:
    """A 401/403 is the key's fault, said as such (not hidden behind "no slot count")."""
    if answer.status_code in (401, 403):
        what = "refused the api key given" if api_key else "needs an api key"
        raise ServerError(
            f"{base}: {what} (HTTP {answer.status_code} to GET {answer.request.url.path}); "
            "set ClientConfig.api_key (api_key under [client] in the --config file) "
            "to its --api-key"
        )


def alive(url: str, *, api_key: str | None = None) -> bool:
    """Whether ``GET /health`` answers 200 within 3 s (with ``api_key`` as a Bearer token)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=3.0, headers=headers) as http:
            return http.get(f"{url.rstrip('/')}/health").status_code == 200
    except httpx.HTTPError:
        return False


@dataclass(frozen=True)
class RunOutcome:
    """What became of one attempt at a run.

    Attributes:
        state: ``done``, ``failed`` (the run's fault or unknown), ``server_down`` (its server
            no longer answers), ``cancelled``.
        turns: finished turns in its log.
        outcome: the last ``TurnEnd`` outcome (``None``: none yet).
        reason: why it failed ("" otherwise).
        tokens: tokens generated in this attempt (``predicted_n``).
    """

    state: str
    turns: int = 0
    outcome: str | None = None
    reason: str = ""
    tokens: int = 0


def _open_log(path: Path, spec: RunSpec, registry: Registry) -> Session:
    """The run's log, reopened for writing (repaired) or created with the task's baseline."""
    if path.exists() and path.stat().st_size > 0:
        return Session.open(path)
    path.unlink(missing_ok=True)  # a kill between creating the file and writing the baseline
    offered = registry.definitions()
    if spec.task.tools is not None:
        offered = tuple(d for d in offered if d["function"]["name"] in spec.task.tools)
    baseline = Baseline(system=spec.task.system, tools=offered)
    return Session.create(path.parent, baseline, session_id=spec.id)


def run_one(
    spec: RunSpec,
    logs_dir: Path,
    url: str,
    slot: int,
    *,
    base: Config,
    registry: Registry,
    client: ChatClient,
    cancel: threading.Event,
    on_event: Hook | None = None,
) -> RunOutcome:
    """Run (or continue) one run on one slot: the messages of its task without a finished
    turn, one turn each, in its log ``<logs_dir>/<run id>.jsonl``.

    Args:
        spec: the run.
        logs_dir: where its log is.
        url: the server's base URL; slot: the slot every request carries (``id_slot``).
        base: the batch's config (the task's overrides and the run's settings go on top).
        registry: the tools (the task's ``tools`` choose which are offered).
        client: streams completions from ``url``.
        cancel: set it to stop between turns and cancel the running one (each turn's cancel
            token: the loop never clears it, so a set before a turn starts is not lost).
        on_event: every turn event and record (``run_turn``'s hook).

    Returns:
        The :class:`RunOutcome`. A turn that ends on a limit or a full context is a finished
        turn (a full context ends the run); an inference error ends the attempt.

    Raises:
        ConfigError: the run's config is invalid (checked by :func:`run_batch` beforehand).
    """
    path = logs_dir / f"{spec.id}.jsonl"
    messages = spec.task.messages
    try:
        state = log_state(path)
        if state.finished(len(messages)):
            return RunOutcome("done", state.turns_done, state.last_outcome)
        config = spec.config(base)
        config = dataclasses.replace(
            config,
            client=dataclasses.replace(config.client, url=url),
            slots=SlotsConfig(main=slot),
        )
        session = _open_log(path, spec, registry)
    except SessionError as exc:
        return RunOutcome("failed", reason=str(exc))
    runtime = Runtime(config=config, client=client, registry=registry)
    tokens = 0

    def hook(event: TurnEvent | Record) -> None:
        nonlocal tokens
        if isinstance(event, Usage):
            tokens += int(event.timings.get("predicted_n", 0))
        if on_event is not None:
            on_event(event)

    result = RunOutcome("done")
    try:
        for message in messages[state.turns_done :]:
            if cancel.is_set():
                result = RunOutcome("cancelled")
                break
            try:
                run_turn(session, runtime, message, hook, cancel=cancel)
            except (TurnLimit, TurnNotAnswered):
                pass  # a finished turn (its TurnEnd says how): the run goes on
            except SessionFull:
                break  # a finished turn, and nothing more fits: the run is over
            except TurnCancelled:
                result = RunOutcome("cancelled")
                break
            except TurnInferError as exc:
                up = alive(url, api_key=config.client.api_key)
                result = RunOutcome("failed" if up else "server_down", reason=str(exc))
                break
    except SessionError as exc:
        result = RunOutcome("failed", reason=str(exc))
    finally:
        session.close()
    final = log_state(path)
    return dataclasses.replace(
        result, turns=final.turns_done, outcome=final.last_outcome, tokens=tokens
    )


def run_alone(
    spec: RunSpec, logs_dir: Path, url: str, slot: int, base: Config, registry: Registry
) -> RunOutcome:
    """:func:`run_one` in a process of its own (a Ray task on any node): its own client for
    ``url``, no cancel event (Ray cancels with a ``KeyboardInterrupt``), no live events.
    Its arguments and result are picklable."""
    with Client(dataclasses.replace(base.client, url=url)) as client:
        return run_one(
            spec,
            logs_dir,
            url,
            slot,
            base=base,
            registry=registry,
            client=client,
            cancel=threading.Event(),
        )
