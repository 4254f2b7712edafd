"""Fakes for testing code built on boxmaker, without a model or a socket (public).

The project's own tests use them, and so can a researcher's: a scripted stand-in for the
client, a fake llama-server for :class:`httpx.MockTransport`, and a check that a session log is
well formed. Like httpx's ``MockTransport`` and pydantic-ai's ``TestModel``, they ship in the
package so that code using boxmaker can be tested the way boxmaker is.

- :class:`ScriptedClient` plays a list of :class:`Step` (built with :func:`answer`,
  :func:`calls`, :func:`call`, :func:`timings`, :func:`context_full`) where a
  :class:`~boxmaker.client.Client` goes: ``Runtime(config, client=ScriptedClient([...]), ...)``.
  It records each request body and reasoning budget, and honours ``cancel``.
- :class:`LlamaScript` plays a list of :class:`Reply` behind
  ``httpx.MockTransport(script.handler)``: llama-server's SSE stream (its README's
  ``/v1/chat/completions``: the role event, ``reasoning_content`` and ``content`` one chunk
  per character, ``tool_calls``, ``finish_reason``, ``timings``, ``data: [DONE]``),
  HTTP errors such as the context-full 400 (:func:`context_full_reply`), and stalls; so a real
  :class:`~boxmaker.client.Client` runs end to end without a socket.
- :func:`assert_log_well_formed`: every tool call answered exactly once, the last turn ended.

Example::

    from boxmaker.testing import ScriptedClient, answer, assert_log_well_formed, call, calls

    client = ScriptedClient([calls(call("get_weather", {"city": "Oslo"})), answer("Sunny.")])
    runtime = Runtime(config=Config(), client=client, registry=demo_registry())
    assert run_turn(session, runtime, "Weather in Oslo?").content == "Sunny."
    assert_log_well_formed(session)
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from .client import Completion
from .errors import InferError, RequestCancelled, StreamStopped
from .events import ClientEvent, Content, Reasoning, ThinkingCapped, ToolCallDelta
from .records import ToolCall, TurnEnd
from .session import Session

__all__ = [
    "CONTEXT_FULL",
    "NOT_FOUND",
    "NOT_SERVED",
    "SSE_HEAD",
    "LlamaScript",
    "Reply",
    "ScriptedClient",
    "Stall",
    "Step",
    "answer",
    "assert_log_well_formed",
    "call",
    "calls",
    "chunk",
    "context_full",
    "context_full_reply",
    "sse",
    "timings",
]

# -- a scripted client (no HTTP at all) ---------------------------------------------------------


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


# -- a fake llama-server behind httpx.MockTransport ----------------------------------------------

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)
"""The head of a chunked ``200`` SSE answer, as llama-server sends it."""

CONTEXT_FULL = {
    "error": {
        "code": 400,
        "message": "request (3021 tokens) exceeds the available context size (2048 tokens), "
        "try increasing it",
        "type": "exceed_context_size_error",
        "n_prompt_tokens": 3021,
        "n_ctx": 2048,
    }
}
"""llama.cpp's answer to a prompt longer than the context (HTTP 400)."""


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk of a ``Transfer-Encoding: chunked`` body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj: str) -> bytes:
    """One SSE ``data:`` event (``obj`` is the JSON text) as one HTTP chunk."""
    return chunk(f"data: {obj}\n\n".encode())


@dataclass(frozen=True)
class Stall:
    """A pause in a reply's stream: set the script's ``chunks_sent``, then wait for its
    ``release`` (:class:`LlamaScript`)."""


@dataclass(frozen=True)
class Reply:
    """One scripted llama.cpp chat answer.

    Attributes:
        content: the answer text, one chunk per item (a ``str``: one character per chunk).
        reasoning: ``reasoning_content`` before the content, one chunk per item as above.
        tool_calls: ``(id, name, arguments JSON)`` of each call, one event each; the finish
            reason is then ``tool_calls``.
        stall_after: after this many content chunks, wait for :attr:`LlamaScript.release`
            before sending the rest (``None``: no stall).
        status: an HTTP error status to answer with instead of a stream (body: ``error``).
        error: the JSON body of an error answer.
        id: the completion id of every event.
        data: when given, the stream is these ``data:`` texts as they are (a cut stream, a
            malformed chunk, an error event), nothing else, not even ``[DONE]``.
    """

    content: Sequence[str] = "ok"
    reasoning: Sequence[str] = ""
    tool_calls: Sequence[tuple[str, str, str]] = field(default=())
    stall_after: int | None = None
    status: int | None = None
    error: dict[str, Any] | None = None
    id: str = "chatcmpl-fake"
    data: Sequence[str] | None = None

    def events(self) -> list[bytes | Stall]:
        """The SSE events of the stream (``data: ...\\n\\n`` each), a :class:`Stall` where
        the reply stalls."""

        def event(delta: dict[str, Any], **extra: Any) -> bytes:
            obj = {"id": self.id, "choices": [{"index": 0, "delta": delta}], **extra}
            return f"data: {json.dumps(obj)}\n\n".encode()

        if self.data is not None:
            return [f"data: {text}\n\n".encode() for text in self.data]
        out: list[bytes | Stall] = [event({"role": "assistant", "content": None})]
        out += [event({"reasoning_content": ch}) for ch in self.reasoning]
        for i, ch in enumerate(self.content):
            if i == self.stall_after:
                out.append(Stall())
            out.append(event({"content": ch}))
        for i, (cid, name, arguments) in enumerate(self.tool_calls):
            fn = {"name": name, "arguments": arguments}
            out.append(event({"tool_calls": [{"index": i, "id": cid, "function": fn}]}))
        finish = "tool_calls" if self.tool_calls else "stop"
        out.append(event({}, choices=[{"index": 0, "delta": {}, "finish_reason": finish}]))
        timings: dict[str, float] = {"cache_n": 0, "prompt_n": 10}
        timings |= {"predicted_n": len(self.content), "prompt_ms": 1.0, "predicted_ms": 2.0}
        out.append(event({}, choices=[], timings=timings))
        out.append(b"data: [DONE]\n\n")
        return out

    def steps(self) -> list[bytes | Stall]:
        """The reply as raw HTTP/1.1 bytes for a socket server (a chunked SSE answer with
        ``Connection: close``, or the error answer), a :class:`Stall` where it stalls."""
        if self.status is not None:
            body = json.dumps(self.error or {}).encode()
            error_head = (
                f"HTTP/1.1 {self.status} Error\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            return [error_head.encode() + body]
        steps: list[bytes | Stall] = [
            SSE_HEAD.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        ]
        steps += [e if isinstance(e, Stall) else chunk(e) for e in self.events()]
        return [*steps, b"0\r\n\r\n"]


def context_full_reply() -> Reply:
    """llama.cpp's HTTP 400 ``exceed_context_size_error``."""
    return Reply(status=400, error=CONTEXT_FULL)


NOT_SERVED = frozenset({"/apply-template", "/tokenize"})
"""Paths the fake answers 404 without taking an item of the script."""

NOT_FOUND = {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}}
"""llama.cpp's 404 body."""


class LlamaScript:
    """A fake llama-server: a script of :class:`Reply` played behind
    :class:`httpx.MockTransport` (pass :meth:`handler`), no socket.

    Each chat request takes the next reply; the last one repeats. A ``GET`` (``/health``) is
    answered ``{"status": "ok"}`` and a ``POST`` to :data:`NOT_SERVED` 404, neither taking a
    reply. Example: ``Client(ClientConfig(), transport=httpx.MockTransport(script.handler))``.

    Args:
        script: the replies, in order (a subclass serving a socket may hold other items).

    Attributes:
        bodies: the JSON bodies of the chat requests received, in order.
        chunks_sent: set once a stalling reply has sent its chunks and is waiting.
        release: set it to let a stalling reply go on.
    """

    def __init__(self, script: Sequence[object]) -> None:
        self.script = list(script)
        self.bodies: list[dict[str, Any]] = []
        self.chunks_sent = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def next_item(self, body: bytes) -> object:
        """Record a chat request's ``body`` and take the next item of the script."""
        with self._lock:
            # not JSON: played as any other request, not kept in bodies
            with contextlib.suppress(ValueError):
                if body:
                    self.bodies.append(json.loads(body))
            return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def handler(self, request: httpx.Request) -> httpx.Response:
        """The script behind :class:`httpx.MockTransport` (raises ``TypeError`` on an item that
        is not a :class:`Reply`: socket-level steps need a socket)."""
        if request.method == "GET":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path in NOT_SERVED:
            return httpx.Response(404, json=NOT_FOUND)
        item = self.next_item(request.read())
        if not isinstance(item, Reply):
            raise TypeError(f"{type(item).__name__} items are played on a socket only")
        if item.status is not None:
            return httpx.Response(item.status, json=item.error or {})
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=self._stream(item))

    def _stream(self, reply: Reply) -> Iterator[bytes]:
        for event in reply.events():
            if isinstance(event, Stall):
                self.chunks_sent.set()
                self.release.wait()
            else:
                yield event


# -- the log ----------------------------------------------------------------------------------


def assert_log_well_formed(session: Session) -> None:
    """Check the property the loop keeps whatever ends a turn (SPEC "Limits").

    Every tool call of every assistant message has exactly one tool message after it (matched
    by ``tool_call_id``), and the session's last record is a ``TurnEnd`` (a turn that was not
    cut by a killed process). An empty session (no turn yet) passes.

    Raises:
        AssertionError: naming the call answered 0 or 2+ times, or the last record's type.
    """
    msgs = session.messages()
    for i, m in enumerate(msgs):
        for c in m.get("tool_calls", []):
            answered = [x for x in msgs[i + 1 :] if x.get("tool_call_id") == c["id"]]
            if len(answered) != 1:
                raise AssertionError(f"call {c['id']} has {len(answered)} results, not 1")
    if session.records and not isinstance(session.records[-1], TurnEnd):
        raise AssertionError(
            f"the last record is {type(session.records[-1]).__name__}, not TurnEnd"
        )
