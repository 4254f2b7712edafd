"""A scripted stand-in for boxmaker.client.Client, for turn-loop unit tests (no sockets)."""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from boxmaker.client import Completion
from boxmaker.errors import InferError, RequestCancelled
from boxmaker.events import ClientEvent, Content, Reasoning, ThinkingCapped, ToolCallDelta
from boxmaker.records import ToolCall


def call(name: str, arguments: Any, call_id: str | None = None) -> ToolCall:
    """A tool call; without ``call_id`` the id is derived from name and arguments (sha256:
    the same in every run, unlike the per-process salted ``hash()``)."""
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    digest = hashlib.sha256(f"{name}/{text}".encode()).hexdigest()[:8]
    return ToolCall(id=call_id or f"id-{name}-{digest}", name=name, arguments=text)


def timings(cache_n: int, prompt_n: int, predicted_n: int = 5) -> dict[str, float]:
    return {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "predicted_n": predicted_n,
        "prompt_ms": 1.5 * prompt_n,
        "predicted_ms": 10.0 * predicted_n,
    }


@dataclass
class Step:
    """One scripted completion: what the fake streams and returns, or the error it raises."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: Sequence[ToolCall] = ()
    timings: dict[str, float] = field(default_factory=dict)
    error: BaseException | None = None


def answer(text: str, **kw: Any) -> Step:
    return Step(content=text, **kw)


def calls(*tool_calls: ToolCall, **kw: Any) -> Step:
    return Step(tool_calls=tool_calls, **kw)


def context_full() -> Step:
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
    """Plays a list of steps; records each request body and reasoning budget.

    A reasoning step emits one ``Reasoning`` event per character and honours the budget the
    way the real client does: at the budget, ``ThinkingCapped`` and the rest of the reasoning
    is dropped (the server would have ended it).
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
        used = 0
        for ch in reasoning:
            if reasoning_budget is not None and used >= reasoning_budget:
                capped = True
                on_event(ThinkingCapped(reasoning_tokens=used))
                break
            on_event(Reasoning(ch))
            used += 1
        for i, c in enumerate(step.tool_calls):
            on_event(ToolCallDelta(index=i, id=c.id, name=c.name, arguments=c.arguments))
        if step.content:
            on_event(Content(step.content))
        return Completion(
            id=f"chatcmpl-{len(self.bodies)}",
            content=step.content,
            reasoning=reasoning[:used] or None,
            tool_calls=tuple(step.tool_calls),
            finish_reason="tool_calls" if step.tool_calls else "stop",
            timings=dict(step.timings),
            usage={"prompt_tokens": 10, "completion_tokens": 5},
            reasoning_tokens=used,
            thinking_capped=capped,
        )
