"""A scripted stand-in for :class:`~boxmaker.client.Client` (no HTTP at all):
:class:`ScriptedClient` plays a list of :class:`Step`."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client import Completion
from ..errors import InferError, RequestCancelled, StreamStopped
from ..events import ClientEvent, Content, Reasoning, ThinkingCapped, ToolCallDelta
from ..records import ToolCall

__all__ = ["ScriptedClient", "Step", "answer", "call", "calls", "context_full", "timings"]


def call(name: str, arguments: Any, call_id: str | None = None) -> ToolCall:
    """A tool call the model makes: ``arguments`` a JSON text or a value (serialised with
    ``json.dumps``); without ``call_id`` the id is derived from name and arguments (sha256:
    the same in every run, unlike the per-process salted ``hash()``)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    digest = hashlib.sha256(f"{name}/{text}".encode()).hexdigest()[:8]
    return ToolCall(id=call_id or f"id-{name}-{digest}", name=name, arguments=text)


def timings(cache_n: int, prompt_n: int, predicted_n: int = 5) -> dict[str, float]:
    """llama.cpp's ``timings`` of one completion: ``cache_n`` prompt tokens reused,
    ``prompt_n`` processed, ``predicted_n`` generated (tokens), and made-up ``prompt_ms`` and
    ``predicted_ms`` (1.5 ms and 10 ms a token)."""
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "predicted_n": predicted_n,
        "prompt_ms": 1.5 * prompt_n,
        "predicted_ms": 10.0 * predicted_n,
    }


@dataclass
class Step:
    """One scripted completion of :class:`ScriptedClient`: what it streams and returns, or the
    error it raises.

    Attributes:
        content: the answer text (one ``Content`` event), ``None``: none.
        reasoning: the reasoning text (one ``Reasoning`` event per character, a token each).
        tool_calls: the calls of the completion (one ``ToolCallDelta`` each).
        timings: llama.cpp's ``timings`` of the completion (:func:`timings`).
        error: raised instead of answering (e.g. an ``InferError``, :func:`context_full`).
    """

    content: str | None = None
    reasoning: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    timings: dict[str, float] = field(default_factory=dict)
    error: BaseException | None = None


def answer(text: str, **kw: Any) -> Step:
    """A completion answering ``text`` (``kw``: the other :class:`Step` fields)."""
    return Step(content=text, **kw)


def calls(*tool_calls: ToolCall, **kw: Any) -> Step:
    """A completion making ``tool_calls`` (:func:`call`; ``kw``: the other :class:`Step`
    fields)."""
    return Step(tool_calls=tool_calls, **kw)


def context_full() -> Step:
    """A completion refused as llama.cpp refuses a prompt longer than the context: the
    ``InferError`` of its HTTP 400 ``exceed_context_size_error`` (the loop ends the turn with
    ``SessionFull``)."""
    body = {
        "error": {
            "code": 400,
            "message": "request (3021 tokens) exceeds the available context size (2048 tokens)",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 3021,
            "n_ctx": 2048,
        }
    }
    return Step(
        error=InferError("HTTP 400", status=400, body=json.dumps(body), error=body["error"])
    )


class ScriptedClient:
    """A stand-in for :class:`~boxmaker.client.Client` (the ``ChatClient`` protocol) that plays
    a list of :class:`Step`, one per completion, then ``default`` (``answer("ok")``).

    A reasoning step emits one ``Reasoning`` event per character and honours the budget the
    way the real client does: at the budget, ``ThinkingCapped`` and the rest of the reasoning
    is dropped (the server would have ended it). A set ``cancel`` raises ``RequestCancelled``.

    Args:
        steps: the completions, in order.
        default: what every completion after them answers.
        copy_bodies: keep a deep copy of each body (``False``: the body as sent, for
            benchmarks).

    Attributes:
        bodies: the request bodies received, in order; budgets: each request's
            ``reasoning_budget`` (tokens, ``None``: no cap); before_each: called with the
            request's number (1, 2, ...) before it is answered.
    """

    def __init__(
        self, steps: Sequence[Step], default: Step | None = None, *, copy_bodies: bool = True
    ) -> None:
        self.copy_bodies = copy_bodies  # False: keep the bodies as sent (benchmarks)
        self.steps = list(steps)
        self.default = default or answer("ok")
        self.bodies: list[dict[str, Any]] = []
        self.budgets: list[int | None] = []
        self.before_each: Callable[[int], None] | None = None

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """One scripted completion, as :meth:`boxmaker.client.Client.chat_with_retry` gives it.

        Raises:
            RequestCancelled: ``cancel`` was set. The step's ``error``, when it has one.
            StreamStopped: raised by ``on_event`` (a bound of the turn): it goes on with
                ``completion`` set to what was sent before it, as the real client does.
        """
        self.bodies.append(copy.deepcopy(body) if self.copy_bodies else body)
        self.budgets.append(reasoning_budget)
        if self.before_each:
            self.before_each(len(self.bodies))
        step = self.steps.pop(0) if self.steps else self.default
        if cancel is not None and cancel.is_set():
            raise RequestCancelled("cancelled")
        if step.error is not None:
            raise step.error
        reasoning = step.reasoning or ""
        capped = False
        used = 0  # reasoning characters sent
        calls: list[ToolCall] = []  # calls sent
        content: str | None = None  # content sent
        cid = f"chatcmpl-{len(self.bodies)}"
        try:
            for ch in reasoning:
                if reasoning_budget is not None and used >= reasoning_budget:
                    capped = True
                    on_event(ThinkingCapped(reasoning_tokens=used))
                    break
                used += 1
                on_event(Reasoning(ch))
            for i, c in enumerate(step.tool_calls):
                calls.append(c)
                on_event(ToolCallDelta(index=i, id=c.id, name=c.name, arguments=c.arguments))
            if step.content:
                content = step.content
                on_event(Content(step.content))
        except StreamStopped as stop:  # the hook closed the stream: what was sent goes with it
            reasoned = reasoning[:used] or None
            stop.completion = Completion(
                id=cid, content=content, reasoning=reasoned, tool_calls=tuple(calls),
                finish_reason=None, reasoning_tokens=used, thinking_capped=capped,
            )  # fmt: skip
            raise
        return Completion(
            id=cid,
            content=step.content,
            reasoning=reasoning[:used] or None,
            tool_calls=tuple(step.tool_calls),
            finish_reason="tool_calls" if step.tool_calls else "stop",
            timings=dict(step.timings),
            usage={"prompt_tokens": 10, "completion_tokens": 5},
            reasoning_tokens=used,
            thinking_capped=capped,
        )
