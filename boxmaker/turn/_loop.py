"""``run_turn``: one user message in, an answer out, tool calls and limits in between.

It reads top to bottom like the spec's "One turn" (steps 1-7) and "Limits". A limit that fires
appends a ``LimitHit``; a turn ended early leaves the log well formed (a ``not_run`` result for
each call of the last ``Assistant``); each turn ends with a ``TurnEnd``; each record appended
goes to ``on_event`` too. The loop knows nothing of widgets, cassettes or frames.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..client import Completion, is_context_full
from ..errors import (
    ForkDiverged,
    InferError,
    RequestCancelled,
    SessionError,
    SessionFull,
    TurnCancelled,
    TurnError,
    TurnInferError,
    TurnLimit,
)
from ..events import Hook, ToolCallStarted, guarded
from ..records import Assistant, LimitHit, Record, ToolCall, Usage, User
from ..session import Session
from ..tools import Dispatched, cap_result, dispatch
from ._bounds import BoundHit, TurnBounds
from ._caps import read_capabilities, refuse_unsupported_tools, side_requests_cancelled
from ._finish import ending
from ._fork import open_calls, replayed, warmth
from ._guard import AnswerAfterLimit, LoopGuard, after_limit, dead_turn, ended, not_run_results
from ._keys import api_keys
from ._runtime import Runtime, TurnOutcome

__all__ = ["Runtime", "TurnOutcome", "run_turn"]

log = logging.getLogger("boxmaker.turn")


@dataclass
class _TurnState:
    guard: LoopGuard
    bounds: TurnBounds
    reasoning_tokens: int = 0
    capped: bool = False  # the thinking cap fired (or was said not enforced) in this turn
    earlier: Usage | None = None  # the session's last usage before the running completion
    body: dict[str, Any] = field(default_factory=dict)  # the running completion's request


def run_turn(
    session: Session,
    runtime: Runtime,
    content: str | None,
    on_event: Hook | None = None,
    *,
    cancel: threading.Event | None = None,
) -> TurnOutcome:
    """Run one turn of the agent loop on ``session`` for the user message ``content``.

    Args:
        session: the log to extend; its baseline gives the system prompt and the tools.
        runtime: config, client, tool registry and port, cancel event.
        content: the user's message; ``None`` goes on with the log's open turn (a fork made
            at an edited tool result: its other calls, then the next completion).
        on_event: called with every client event (but ``ToolCallDelta``), every
            ``ToolCallStarted`` and every appended record, in order, on the calling thread.
            An exception inside it is logged and does not stop the turn.
        cancel: this turn's ``CancelToken`` (or any ``threading.Event``; default
            ``runtime.cancel``), never cleared: set before the start, it ends the turn.

    Returns:
        The answer and the last completion's usage.

    Raises:
        TurnLimit: tool iterations, a repeated call, the loop guard or a client-side bound
            (``TurnBounds``: tokens, completions, deadline, calls, argument size); ``kind``
            says which. ``loop.on_limit = "answer"`` ends the first three with one last
            completion without tools instead (outcome ``answered_after_limit``).
        SessionFull: this session's prompt does not fit its slot (llama.cpp's
            ``exceed_context_size_error``); a full KV pool is retried, then a TurnInferError.
        TurnCancelled: the cancel token (``cancel``, else ``runtime.cancel``) was set.
        TurnInferError: the completion failed otherwise (``cause`` keeps status and body).
        TurnNotAnswered: no answer: a ``finish_reason`` such as vLLM's ``abort``, or a tool
            call left in content by the server's parser (``outcome`` says which).
        SessionError: the log could not be written; ``content`` is ``None`` and no turn is open.
        ToolsNotSupported: the session has tools and the server's template cannot take them
            (``GET /props``; before anything is sent; ``client.unsupported_tools``).
    """
    emit = guarded(on_event, log)
    token = runtime.cancel if cancel is None else cancel
    with (
        session.turn(),
        TurnBounds(runtime.config, token) as bounds,
        side_requests_cancelled(runtime.client, bounds.cancel),  # /props, forensics: Stop cuts
    ):
        session.hide(*api_keys(runtime.config, runtime.client))  # an echoed key: <API_KEY>
        pending = open_calls(session) if content is None else None  # a fork's open turn
        _append(session, emit, *(dead_turn(session) if content is not None else ()))
        _append(session, emit, *read_capabilities(session, runtime.client))  # GET /props, once
        refuse_unsupported_tools(session, runtime.config)  # never a silent answer without tools
        state = _TurnState(guard=LoopGuard(runtime.config.loop), bounds=bounds)
        _append(session, emit, *([User(content=content)] if content is not None else ()))
        last: TurnLimit | None = None  # on_limit="answer": the limit, before the last completion
        while True:
            if pending:  # the calls of the fork's open turn after its edited result
                calls, pending = pending, None
            else:
                completion = _complete(session, runtime, state, emit, last is not None)
                calls, usage = _record_completion(session, runtime, state, completion, emit, last)
                if not calls or last is not None:
                    return TurnOutcome(content=completion.content or "", usage=usage)
            try:
                if (stop := state.guard.completion()) is not None:
                    _end_turn(session, stop, emit, answer=state.guard)
                _run_calls(session, runtime, state, calls, emit)
            except AnswerAfterLimit as exc:
                last = exc.limit
            except (TurnError, SessionError):
                raise
            except BaseException as exc:  # KeyboardInterrupt in a tool or hook: answer the rest
                cut = TurnCancelled(f"interrupted: {exc!r}")
                _end_turn(session, cut, emit, exc, reraise=True)


def _complete(
    session: Session, runtime: Runtime, state: _TurnState, emit: Hook, last: bool = False
) -> Completion:
    """Steps 2 and 3: build the request and stream one completion (``last``: the answer after
    a limit, ``tool_choice: "none"`` with the tools kept so the prompt cache holds)."""
    cfg = runtime.config
    state.earlier = session.last_usage()
    body: dict[str, Any] = {"messages": session.messages(), "id_slot": cfg.slots.main}
    state.body = body  # id_slot None: the client leases a free slot (boxmaker.client)
    if session.baseline.tools:
        body["tools"] = [dict(t) for t in session.baseline.tools]
        body.update({"tool_choice": "none"} if last else {})
    body["chat_template_kwargs"] = cfg.template_kwargs()
    body.update(cfg.sampling.request_fields())
    cap = cfg.loop.thinking_tokens
    budget = None if cap is None else max(0, cap - state.reasoning_tokens)
    if (stop := state.bounds.before_completion()) is not None:
        _end_turn(session, stop, emit)
    relay = state.bounds.relay(emit, budget)  # counts the stream, drops ToolCallDelta
    try:
        completion = runtime.client.chat_with_retry(
            body, relay, reasoning_budget=budget, cancel=state.bounds.cancel
        )
    except BoundHit as exc:  # the stream went past a bound and was closed: refused
        _refuse(session, runtime, state, exc.completion, exc.limit, emit)
    except RequestCancelled as exc:
        _end_turn(session, state.bounds.cancelled(f"the turn was cancelled ({exc})"), emit, exc)
    except InferError as exc:
        if is_context_full(exc):
            full = SessionFull(f"the session no longer fits the context: {exc}", cause=exc)
            _end_turn(session, full, emit, exc)
        _end_turn(session, TurnInferError(f"the completion failed: {exc}", cause=exc), emit, exc)
    if (stop := state.bounds.after_completion(completion)) is not None:
        _refuse(session, runtime, state, completion, stop, emit)
    state.reasoning_tokens += completion.reasoning_tokens
    return completion


def _refuse(
    session: Session, runtime: Runtime, state: _TurnState, got: object, limit: TurnLimit, emit: Hook
) -> NoReturn:
    """A completion refused client-side (a bound) is still a completion the server ran: its
    ``Assistant`` (the calls it held) and ``Usage`` go in the log, then the turn ends with
    ``limit`` (each call answered 'not run' with the reason, the ``LimitHit``, the ``TurnEnd``).
    ``got`` is what arrived (a ``Completion``; ``None`` from a client that could not say)."""
    if isinstance(got, Completion):
        _record_completion(session, runtime, state, got, emit, refused=True)
    _end_turn(session, limit, emit)


def _record_completion(
    session: Session,
    runtime: Runtime,
    state: _TurnState,
    completion: Completion,
    emit: Hook,
    limit: TurnLimit | None = None,
    *,
    refused: bool = False,
) -> tuple[tuple[ToolCall, ...], Usage]:
    """Step 4 (and 5): Assistant, Usage, CacheLoss (+ forensics), a fork's Warmed (its first
    completion's reuse of the parent's prefix), thinking-cap LimitHit, the
    TurnEnd of a completion that ends the turn (:func:`ending`: no calls to run; raises if no
    answer). After ``limit`` (on_limit="answer"): answered_after_limit, calls 'not run'.
    ``refused``: the completion and its cost only (the caller ends the turn)."""
    calls, usage = completion.tool_calls, completion.usage_record()
    records: list[Record] = [
        Assistant(content=completion.content, reasoning=completion.reasoning, tool_calls=calls),
        usage,
    ]
    records += runtime.forensics.losses(session, runtime, state.body, state.earlier, usage)
    records += warmth(session, runtime.warm, usage, records)  # a fork's first: reuse measured
    records += [] if state.capped else completion.limit_hits()  # the cap's LimitHit: once a turn
    state.capped = state.capped or completion.thinking_capped or bool(completion.cap_warning)
    end = None if limit or refused else ending(completion, session.next_call())
    records += after_limit(calls, session.next_call(), limit) if limit else []
    _append(session, emit, *records, *(end.records if end else ()))
    if end is not None and end.error is not None:
        raise end.error
    return (calls if end is None else ()), usage


def _run_calls(
    session: Session,
    runtime: Runtime,
    state: _TurnState,
    calls: Sequence[ToolCall],
    emit: Hook,
) -> None:
    """Step 6: handle each tool call in order; may end the turn."""
    loop = runtime.config.loop
    for call in calls:
        if state.bounds.cancel.is_set():
            _end_turn(session, state.bounds.cancelled("the turn was cancelled"), emit)
        number = session.next_call()
        emit(ToolCallStarted(name=call.name, call=number, arguments=call.arguments))
        verdict = state.guard.check(call)
        if verdict.limit is not None:
            _end_turn(session, verdict.limit, emit, answer=state.guard)
        if verdict.action == "answer":
            result = Dispatched(content=verdict.content, not_run=verdict.not_run)
        else:
            try:  # a fork's replay answers from its parent's log while the calls match
                result = replayed(runtime.replay, call) or dispatch(
                    runtime.registry,
                    call.name,
                    call.arguments,
                    port=runtime.port,
                    session_id=session.id,
                    call=number,
                    cancel=state.bounds.cancel,
                )
            except ForkDiverged as exc:
                _end_turn(session, exc, emit)
            state.guard.ran(call, result.content)
        cap = loop.tool_result_cap if result.not_run is None else None  # the loop's own words
        capped, truncated = cap_result(result.content, cap)
        # a decision on the call goes before its result
        records: list[Record] = [*result.approvals, result.record(call, number, capped, truncated)]
        if truncated:
            detail = f"{call.name} result of {len(result.content)} characters cut to {len(capped)}"
            records.append(LimitHit(kind="tool_result_cap", detail=detail))
        _append(session, emit, *records)


def _end_turn(
    session: Session,
    error: TurnError,
    emit: Hook,
    cause: BaseException | None = None,
    *,
    reraise: bool = False,
    answer: LoopGuard | None = None,
) -> NoReturn:
    """Leave the log well formed, then raise ``error`` chained from ``cause`` (or ``cause``
    itself when ``reraise``, e.g. a KeyboardInterrupt inside a tool). One write: a 'not run'
    result for each call of the last assistant not answered yet, the ``LimitHit`` of a limit
    that ended the turn, and the ``TurnEnd`` (not when ``answer`` says one more completion
    answers: then ``AnswerAfterLimit``)."""
    outcome = error.kind if isinstance(error, TurnLimit) else _OUTCOMES[type(error)]
    status = error.cause.status if isinstance(error, TurnInferError) else None
    after = answer.answers(error) if answer else None
    why = f"the turn ended ({error}){LoopGuard.ANSWER_NOW if after else ''}"
    calls, first = session.unanswered_calls(), session.next_call()
    records: list[Record] = [*not_run_results(calls, first, why, outcome)]
    if isinstance(error, TurnLimit):
        records.append(LimitHit(kind=error.kind, detail=error.detail))
    elif isinstance(error, SessionFull):
        records.append(LimitHit(kind="context_full", detail=str(error.cause)))
    if after is None:
        records.append(ended(outcome, str(error), status))
    _append(session, emit, *records)
    if after is not None:
        raise AnswerAfterLimit(after)
    if reraise and cause is not None:
        raise cause
    raise error from cause


_OUTCOMES = {TurnCancelled: "cancelled", SessionFull: "session_full", TurnInferError: "infer_error"}
_OUTCOMES[ForkDiverged] = "diverged"


def _append(session: Session, emit: Hook, *records: Record) -> None:
    """Append records that belong together as one write (one fsync), then emit each."""
    session.extend(records)
    for record in records:
        emit(record)
