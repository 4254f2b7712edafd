"""One run of a batch on one llama.cpp slot, and how many slots a server has.

:func:`run_one` is what every executor of :mod:`boxmaker.batch` runs for a run (a worker
thread, or a Ray task on another node): it reads how far the run's log got
(:func:`~boxmaker.batch._state.log_state`), reopens or creates the log, and sends the remaining
user messages, one :func:`~boxmaker.turn.run_turn` each, every request pinned to one slot
(``Config(slots=SlotsConfig(main=slot))``, llama.cpp's ``id_slot``); :func:`run_alone` is the
same in a process of its own (a Ray task). :func:`discover_slots` asks a server for its slots
(``GET /slots``, else ``GET /props``).

A run of a :class:`~boxmaker.batch._tasks.ForkTask` makes its log by forking the parent
(:meth:`boxmaker.session.Session.fork`, the run id as the fork's session id, the run's
overrides recorded in its ``Forked`` record) and, before the fork's first request, finds the
parent's prompt cache for the run's own slot (:func:`boxmaker.cache.warm_fork` pinned to it:
the slot holds the prefix, else the parent's saved slot is restored into it, else the fork
runs cold), and the manifest says what its first request measured (the fork's ``Warmed``
record: the share of the parent's prefix reused); the parent's tool results are replayed as
the task's ``replay`` says (:class:`boxmaker.turn.Replay`, which goes on where a resumed fork
left off). With a local slot folder (the server's ``--slot-save-path`` on this machine) every
run's slot is saved at each of its turn ends, so a later fork of it can be restored.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from ..cache import ColdFork, SlotStore, WarmStart, describe_warmth, warm_fork
from ..client import ChatClient, Client
from ..config import Config, SlotsConfig
from ..errors import (
    ForkDiverged,
    ServerError,
    SessionError,
    SessionFull,
    TurnCancelled,
    TurnInferError,
    TurnLimit,
    TurnNotAnswered,
)
from ..events import Hook, TurnEvent
from ..records import Baseline, Record, Usage, Warmed
from ..session import Session
from ..tools import Registry
from ..turn import Replay, Runtime, run_turn
from ._state import LogState, log_state, session_state
from ._tasks import ForkTask, RunSpec, Task

__all__ = ["RunOutcome", "RunRegistry", "alive", "discover_slots", "run_alone", "run_one"]

RunRegistry = Callable[[str, "Task | ForkTask"], Registry]
"""A registry of each run's own: called with the run's id and task before the run starts
(a benchmark whose tasks offer tools of one name with different schemas, or whose tools keep
a state per run: :class:`boxmaker.bench.RunTools`)."""


def tools_of(registry: Registry | RunRegistry, spec: RunSpec) -> Registry:
    """The registry a run uses: ``registry`` itself, or a :data:`RunRegistry`'s for the run."""
    return registry if isinstance(registry, Registry) else registry(spec.id, spec.task)


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
        with _client(base, timeout_s, headers) as http:
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


def _client(url: str, timeout_s: float, headers: dict[str, str]) -> httpx.Client:
    """An httpx client for a few requests to ``url``: for ``http://`` its direct transport
    makes no TLS context that loads the certificate store (about 30 ms a client, for a
    connection that never uses it); a proxy from the environment keeps httpx's own."""
    plain = httpx.HTTPTransport(verify=False) if url.startswith("http://") else None
    return httpx.Client(timeout=timeout_s, headers=headers, transport=plain)


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
        with _client(url, 3.0, headers) as http:
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
        warm: a fork's attempt that made the fork: how warm its first request found the
            parent's prefix, measured (its ``Warmed`` record's label: ``slot``, ``restored``,
            ``server``, ``partial``, ``cold``; ``unknown`` when no completion came);
            ``None`` otherwise.
        warm_detail: the measured reuse in words (:func:`boxmaker.cache.describe_warmth`:
            tokens reused of the prefix, the share, why it was not warm).
    """

    state: str
    turns: int = 0
    outcome: str | None = None
    reason: str = ""
    tokens: int = 0
    warm: str | None = None
    warm_detail: str = ""


def _open_log(path: Path, spec: RunSpec, registry: Registry, state: LogState) -> Session:
    """The run's log, reopened for writing (repaired) or created: with the task's baseline,
    or, for a :class:`ForkTask`, as a fork of its parent.

    Raises:
        SessionError: the log cannot be opened or made, or a fork task's log is no fork of
            its parent at its turn.
    """
    task = spec.task
    if isinstance(task, ForkTask):
        return _open_fork(path, spec, task, state)
    if path.exists() and path.stat().st_size > 0:
        return Session.open(path, sync="close")
    path.unlink(missing_ok=True)  # a kill between creating the file and writing the baseline
    offered = registry.definitions()
    if task.tools is not None:
        offered = tuple(d for d in offered if d["function"]["name"] in task.tools)
    baseline = Baseline(system=task.system, tools=offered)
    return Session.create(path.parent, baseline, session_id=spec.id, sync="close")


def _open_fork(path: Path, spec: RunSpec, task: ForkTask, state: LogState) -> Session:
    """A fork task's log: reopened when it holds the fork's copy (its own turns follow), else
    made by forking the parent (a log left with its baseline alone, by a kill between making
    the file and writing the copy in one all-or-nothing group, is made again).

    Raises:
        SessionError: the log holds records but no ``Forked`` record, or one of another fork
            point; the parent cannot be read or the fork written.
    """
    if path.exists() and state.records > 0:
        if state.copied == 0:
            raise SessionError(f"{path}: the log of fork task {task.id} is no fork")
        session = Session.open(path, sync="close")
        forked = session.forked
        point = "before_answer" if task.rerun else "after_turn"
        if forked is None or (forked.turn, forked.point) != (task.at, point):
            session.close()
            where = "no fork" if forked is None else f"{forked.point} of turn {forked.turn}"
            raise SessionError(
                f"{path}: the log is {where}, but task {task.id} forks "
                f"{point} of turn {task.at}: give the task another id"
            )
        return session
    path.unlink(missing_ok=True)  # empty, or the baseline alone
    overrides = {**task.config, **spec.settings}
    with Session.open(task.parent, read_only=True) as parent:
        return parent.fork(
            task.at,
            rerun=task.rerun,
            settings=overrides,
            directory=path.parent,
            session_id=spec.id,
        )


def _warm(
    session: Session, client: ChatClient, slot: int, store: SlotStore | None, config: Config
) -> WarmStart:
    """Find the parent's prompt cache for the fork's first request on the run's own ``slot``
    (:func:`~boxmaker.cache.warm_fork` pinned to it; a :class:`~boxmaker.cache.ColdFork`
    warning's reason is kept in the answer's ``detail``); what the request then reused is
    measured by the loop (the fork's ``Warmed`` record, :func:`_measured`)."""
    if not isinstance(client, Client):
        return WarmStart(how="cold", detail="the client knows no slots", session=session.id)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ColdFork)
        start = warm_fork(session, client, store, slot=slot, pinned=True, config=config)
    for w in caught:
        if not issubclass(w.category, ColdFork):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return start


def _measured(session: Session, start: WarmStart) -> tuple[str, str]:
    """The manifest's ``warm`` and ``warm_detail`` of the attempt that made a fork: its
    ``Warmed`` record's label and line; ``unknown`` with what was tried when no completion
    came."""
    warmed = next((r for r in session.records if isinstance(r, Warmed)), None)
    if warmed is not None:
        return warmed.how, describe_warmth(warmed)
    tried = start.detail or f"{start.how} (slot {start.slot}, {start.file or 'no file'})"
    return "unknown", f"not measured (no completion): {tried}"


def run_one(
    spec: RunSpec,
    logs_dir: Path,
    url: str,
    slot: int,
    *,
    base: Config,
    registry: Registry | RunRegistry,
    client: ChatClient,
    cancel: threading.Event,
    on_event: Hook | None = None,
    store: SlotStore | None = None,
) -> RunOutcome:
    """Run (or continue) one run on one slot: the messages of its task without a finished
    turn, one turn each, in its log ``<logs_dir>/<run id>.jsonl``.

    Args:
        spec: the run.
        logs_dir: where its log is.
        url: the server's base URL; slot: the slot every request carries (``id_slot``).
        base: the batch's config (the task's overrides and the run's settings go on top).
        registry: the tools (the task's ``tools`` choose which are offered), or a
            :data:`RunRegistry` that gives the run its own.
        client: streams completions from ``url``.
        cancel: set it to stop between turns and cancel the running one (each turn's cancel
            token: the loop never clears it, so a set before a turn starts is not lost).
        on_event: every turn event and record (``run_turn``'s hook).
        store: a fork's saved slots on ``url`` (the parent's slot saved at the fork's turn is
            restored into ``slot`` when the slot does not hold the parent's prefix);
            ``None``: none restored.

    Returns:
        The :class:`RunOutcome`, once the run's log is closed: every record of the attempt is
        then durable (the log is fsynced once, when it closes: ``Session(sync="close")``, not
        at each append), so a ``done`` line written after it never names records a crash of
        the machine could take back. A turn that ends on a limit or a full context is a
        finished turn (a full context ends the run, as a fork's ``diverged`` turn does); an
        inference error ends the attempt.

    Raises:
        ConfigError: the run's config is invalid (checked by :func:`run_batch` beforehand).
    """
    path = logs_dir / f"{spec.id}.jsonl"
    messages = spec.task.turns
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
        registry = tools_of(registry, spec)
        session = _open_log(path, spec, registry, state)
    except SessionError as exc:
        return RunOutcome("failed", reason=str(exc))
    result = RunOutcome("done")
    replay = start = None
    task = spec.task
    try:
        if isinstance(task, ForkTask):
            forked = session.forked
            if forked is not None and len(session.records) == forked.record:  # no own record
                start = _warm(session, client, slot, store, config)
            if task.replay != "off":
                replay = Replay.of(session, stop=task.replay == "stop")
    except SessionError as exc:
        session.close()
        return RunOutcome("failed", reason=str(exc))
    runtime = Runtime(config=config, client=client, registry=registry, replay=replay, warm=start)
    tokens = 0
    saver = None  # a local slot folder: the run's slot saved at its turn ends
    if store is not None and store.folder is not None and isinstance(client, Client):
        saver = store.saver(session, client, slot=slot)

    def hook(event: TurnEvent | Record) -> None:
        nonlocal tokens
        if isinstance(event, Usage):
            tokens += int(event.timings.get("predicted_n", 0))
        if saver is not None:
            saver(event)
        if on_event is not None:
            on_event(event)

    try:
        for message in messages[state.turns_done :]:
            if cancel.is_set():
                result = dataclasses.replace(result, state="cancelled")
                break
            try:
                run_turn(session, runtime, message, hook, cancel=cancel)
            except (TurnLimit, TurnNotAnswered):
                pass  # a finished turn (its TurnEnd says how): the run goes on
            except (SessionFull, ForkDiverged):
                break  # a finished turn, and nothing more fits (or the fork stops): run over
            except TurnCancelled:
                result = dataclasses.replace(result, state="cancelled")
                break
            except TurnInferError as exc:
                up = alive(url, api_key=config.client.api_key)
                state_ = "failed" if up else "server_down"
                result = dataclasses.replace(result, state=state_, reason=str(exc))
                break
    except SessionError as exc:
        result = dataclasses.replace(result, state="failed", reason=str(exc))
    finally:
        if start is not None:
            warm, detail = _measured(session, start)
            result = dataclasses.replace(result, warm=warm, warm_detail=detail)
        final = session_state(session)
        try:
            session.close()  # the attempt's one fsync
        except SessionError as exc:
            result = dataclasses.replace(result, state="failed", reason=str(exc))
    return dataclasses.replace(
        result, turns=final.turns_done, outcome=final.last_outcome, tokens=tokens
    )


def run_alone(
    spec: RunSpec,
    logs_dir: Path,
    url: str,
    slot: int,
    base: Config,
    registry: Registry | RunRegistry,
    store: SlotStore | None = None,
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
            store=store,
        )
