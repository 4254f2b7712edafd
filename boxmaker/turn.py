"""``run_turn``: one user message in, an answer out, tool calls and limits in between.

It reads top to bottom like the spec's "One turn" (steps 1-7) and "Limits". Every limit that
fires appends a ``LimitHit``; a turn that ends early leaves the log well formed (each tool call
of the last ``Assistant`` gets a ``ToolResult`` saying it was not run and why). Every appended
record is also passed to ``on_event``. The loop knows nothing of widgets, cassettes or frames.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .cache import cache_outcome
from .config import Config
from .errors import (
    InferError,
    RequestCancelled,
    SessionError,
    SessionFull,
    TurnCancelled,
    TurnError,
    TurnInferError,
    TurnLimit,
)
from .events import ClientEvent, ToolCallDelta, ToolCallStarted, TurnEvent
from .records import (
    Assistant,
    CacheLoss,
    LimitHit,
    Record,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from .session import Session
from .stream import is_context_full
from .tools import Registry, ToolPort, canonical_arguments, cap_result, dispatch

if TYPE_CHECKING:
    from .client import ChatClient
    from .stream import Completion

__all__ = ["Runtime", "TurnOutcome", "run_turn"]

log = logging.getLogger("boxmaker.turn")

OnEvent = Callable[[TurnEvent], None]

ALREADY_MADE = (
    "This call was already made with these arguments in this turn, so it was not run again. "
    "Use the earlier result."
)


@dataclass(kw_only=True)
class Runtime:
    """What a turn runs with: knobs, client, tools, and a cancel switch.

    Attributes:
        config: every limit and knob (:class:`boxmaker.config.Config`).
        client: streams completions (:class:`boxmaker.client.Client` or a fake).
        registry: the tools the loop can dispatch.
        port: where port tools go (``None``: port tools answer that no port is connected).
        cancel: set it (from any thread) to stop the running turn between events; the turn
            clears it when it starts.
    """

    config: Config
    client: ChatClient
    registry: Registry
    port: ToolPort | None = None
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, kw_only=True)
class TurnOutcome:
    """A turn that answered: ``content`` is the final answer text ("" if the model sent none),
    ``usage`` the :class:`Usage` of the turn's last completion."""

    content: str
    usage: Usage


@dataclass
class _TurnState:
    iterations: int = 0
    reasoning_tokens: int = 0
    seen: dict[tuple[str, str], int] = field(default_factory=dict)


def run_turn(
    session: Session, runtime: Runtime, content: str, on_event: OnEvent | None = None
) -> TurnOutcome:
    """Run one turn of the agent loop on ``session`` for the user message ``content``.

    Args:
        session: the log to extend; its baseline gives the system prompt and the tools.
        runtime: config, client, tool registry and port, cancel event.
        content: the user's message.
        on_event: called with every client event (but ``ToolCallDelta``), every
            ``ToolCallStarted`` and every appended record, in order, on the calling thread.
            An exception inside it is logged and does not stop the turn.

    Returns:
        The answer and the last completion's usage.

    Raises:
        TurnLimit: more tool iterations than ``config.loop.tool_iterations``, or a third
            identical call in the turn (``kind`` says which).
        SessionFull: llama.cpp answered ``exceed_context_size_error``.
        TurnCancelled: ``runtime.cancel`` was set.
        TurnInferError: the completion failed otherwise (``cause`` keeps status and body).
        SessionError: the log could not be written.
    """
    emit = _safe(on_event)
    runtime.cancel.clear()
    state = _TurnState()
    _append(session, User(content=content), emit)
    while True:
        completion, earlier = _complete(session, runtime, state, emit)
        calls, usage = _record_completion(session, completion, earlier, emit)
        if not calls:
            return TurnOutcome(content=completion.content or "", usage=usage)
        state.iterations += 1
        cap = runtime.config.loop.tool_iterations
        if cap is not None and state.iterations > cap:
            why = f"{state.iterations} completions with tool calls in this turn, the cap is {cap}"
            _end_turn(
                session, calls, TurnLimit("tool_iterations", state.iterations, cap, why), emit
            )
        try:
            _run_calls(session, runtime, state, calls, emit)
        except (TurnError, SessionError):
            raise
        except BaseException as exc:  # KeyboardInterrupt in a tool or hook: answer the rest
            _end_turn(session, calls, TurnCancelled(f"interrupted: {exc!r}"), emit, exc)


def _complete(
    session: Session, runtime: Runtime, state: _TurnState, emit: OnEvent
) -> tuple[Completion, Usage | None]:
    """Steps 2 and 3: build the request and stream one completion."""
    cfg = runtime.config
    earlier = session.last_usage()
    body: dict[str, Any] = {"messages": session.messages(), "id_slot": cfg.slots.main}
    if session.baseline.tools:
        body["tools"] = [dict(t) for t in session.baseline.tools]
    body["chat_template_kwargs"] = {"enable_thinking": cfg.thinking.enabled}
    body["temperature"] = cfg.sampling.temperature
    if cfg.sampling.max_tokens is not None:
        body["max_tokens"] = cfg.sampling.max_tokens
    if cfg.sampling.seed is not None:
        body["seed"] = cfg.sampling.seed
    budget = None
    if cfg.loop.thinking_tokens is not None:
        budget = max(0, cfg.loop.thinking_tokens - state.reasoning_tokens)

    def relay(event: ClientEvent) -> None:
        if not isinstance(event, ToolCallDelta):
            emit(event)

    try:
        completion = runtime.client.chat_with_retry(
            body, relay, reasoning_budget=budget, cancel=runtime.cancel
        )
    except RequestCancelled as exc:
        raise TurnCancelled("the turn was cancelled during a completion") from exc
    except InferError as exc:
        if is_context_full(exc):
            _append(session, LimitHit(kind="context_full", detail=str(exc)), emit)
            raise SessionFull(f"the session no longer fits the context: {exc}", cause=exc) from exc
        raise TurnInferError(f"the completion failed: {exc}", cause=exc) from exc
    state.reasoning_tokens += completion.reasoning_tokens
    return completion, earlier


def _record_completion(
    session: Session, completion: Completion, earlier: Usage | None, emit: OnEvent
) -> tuple[tuple[ToolCall, ...], Usage]:
    """Step 4: append Assistant and Usage, then CacheLoss and the thinking cap's LimitHit."""
    _append(
        session,
        Assistant(
            content=completion.content,
            reasoning=completion.reasoning,
            tool_calls=completion.tool_calls,
        ),
        emit,
    )
    usage = completion.usage_record()
    _append(session, usage, emit)
    outcome = cache_outcome(earlier.timings, usage.timings) if earlier else None
    if outcome is not None and not outcome.hit:
        _append(session, CacheLoss(expected=outcome.expected, reused=outcome.reused), emit)
    if completion.thinking_capped:
        detail = f"reasoning ended after {completion.reasoning_tokens} tokens of this completion"
        _append(session, LimitHit(kind="thinking_cap", detail=detail), emit)
    return completion.tool_calls, usage


def _run_calls(
    session: Session,
    runtime: Runtime,
    state: _TurnState,
    calls: Sequence[ToolCall],
    emit: OnEvent,
) -> None:
    """Step 6: handle each tool call in order; may end the turn."""
    loop = runtime.config.loop
    for call in calls:
        if runtime.cancel.is_set():
            _end_turn(session, calls, TurnCancelled("the turn was cancelled"), emit)
        number = session.next_call()
        emit(ToolCallStarted(name=call.name, call=number, arguments=call.arguments))
        key = (call.name, canonical_arguments(call.arguments))
        seen = state.seen.get(key, 0) + 1 if loop.repeat_detection else 1
        state.seen[key] = seen
        if (ends := loop.repeat_ends_turn_at) is not None and seen >= ends:
            why = f"{call.name} was called {seen} times with the same arguments in this turn"
            _end_turn(session, calls, TurnLimit("repeated_call", seen, ends - 1, why), emit)
        if (answered := loop.repeat_answered_at) is not None and seen >= answered:
            text, data_class, untrusted = ALREADY_MADE, "public", False
        else:
            result = dispatch(
                runtime.registry,
                call.name,
                call.arguments,
                port=runtime.port,
                session_id=session.id,
                call=number,
            )
            text, data_class, untrusted = result.content, result.data_class, result.untrusted
        capped, truncated = cap_result(text, loop.tool_result_cap)
        _append(
            session,
            ToolResult(
                call=number,
                tool_call_id=call.id,
                name=call.name,
                content=capped,
                data_class=data_class,
                untrusted=untrusted,
                truncated=truncated,
            ),
            emit,
        )
        if truncated:
            detail = f"{call.name} result of {len(text)} characters cut to {len(capped)}"
            _append(session, LimitHit(kind="tool_result_cap", detail=detail), emit)


def _end_turn(
    session: Session,
    calls: Sequence[ToolCall],
    error: TurnError,
    emit: OnEvent,
    cause: BaseException | None = None,
) -> None:
    """Leave the log well formed, then raise ``error`` (or ``cause``): a 'not run' result for
    each call of ``calls`` not answered yet, and a LimitHit when a :class:`TurnLimit` ended it."""
    answered = set()
    for record in reversed(session.records):
        if isinstance(record, Assistant):
            break
        if isinstance(record, ToolResult):
            answered.add(record.tool_call_id)
    for call in calls:
        if call.id not in answered:
            text = f"This call was not run: the turn ended ({error})."
            number = session.next_call()
            result = ToolResult(call=number, tool_call_id=call.id, name=call.name, content=text)
            _append(session, result, emit)
    if isinstance(error, TurnLimit):
        _append(session, LimitHit(kind=error.kind, detail=error.detail), emit)
    raise cause or error


def _append(session: Session, record: Record, emit: OnEvent) -> None:
    session.append(record)
    emit(record)


def _safe(on_event: OnEvent | None) -> OnEvent:
    if on_event is None:
        return lambda event: None

    def emit(event: TurnEvent) -> None:
        try:
            on_event(event)
        except Exception:  # a hook's bug must not leave the log half written
            log.exception("on_event hook raised on %s", type(event).__name__)

    return emit
