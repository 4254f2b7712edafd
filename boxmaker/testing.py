"""Fakes for testing code built on boxmaker, without a model (public).

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
- :class:`RateServer`: a stand-in for llama-server on a GPU, on a real socket in a process of
  its own: N slots, a prefill time, a fixed token rate per slot, llama.cpp's chunk format, tool
  calls and the final ``timings``; for measuring a client against a server's rate
  (``benchmarks/gpu_rate.py``).
- :func:`assert_log_well_formed`: every tool call answered exactly once, the last turn ended.

Example::

    from boxmaker.testing import ScriptedClient, answer, assert_log_well_formed, call, calls

    client = ScriptedClient([calls(call("get_weather", {"city": "Oslo"})), answer("Sunny.")])
    runtime = Runtime(config=Config(), client=client, registry=demo_registry())
    assert run_turn(session, runtime, "Weather in Oslo?").content == "Sunny."
    assert_log_well_formed(session)
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

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
    "RateServer",
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


# -- a stand-in GPU-rate llama-server on a socket -----------------------------------------------


class RateServer:
    """A stand-in for llama-server on a GPU: ``slots`` slots that each stream at a fixed token
    rate, on a real socket (127.0.0.1, a free port), in a process of its own (started with
    this interpreter, so it shares no GIL with the client measured against it).

    What a client sees is llama.cpp's (LLAMA_CPP.md): ``GET /health``, ``GET /props``
    (``total_slots``, ``chat_template_caps.supports_tools``), ``GET /slots`` (one object per
    slot with ``id`` and ``is_processing``); a ``POST /v1/chat/completions`` answered with a
    chunked SSE stream, one HTTP chunk per event as cpp-httplib writes it: the role event with
    ``prompt_progress``, progress complete after ``prefill_s``, then one event per token every
    ``1 / tokens_per_s`` seconds, then the ``finish_reason`` event, the ``"choices": []`` event
    with ``usage`` and ``timings``, and ``data: [DONE]``. A request whose last message is the
    user's and which offers tools gets a tool call of its first tool (the id, name and
    ``{`` first, then one argument fragment per token); any other gets ``answer_tokens``
    content tokens (after ``reasoning_tokens`` of ``reasoning_content``). ``timings`` say
    ``prompt_ms`` = ``prefill_s`` and ``predicted_ms`` = tokens / ``tokens_per_s``, so the
    ideal time of a completion is their sum; ``cache_n`` is what the slot held when the
    prompt extends it (the slot's last request's messages lead this one's, and this prompt is
    longer than that one plus its answer).

    Slots: a request with ``id_slot`` runs on that slot, busy or not (llama.cpp does not
    queue a pinned request); one without takes the idle slot whose last request shares the
    most leading messages with it (llama.cpp's pick by the longest common prefix), else the
    idle slot used least recently, else waits for an idle slot. A stream writes the events
    due at most every ``tick_s`` seconds, in one write (a GPU server decodes every slot in
    one step and writes each slot's token at once; the tick bounds the stand-in's own CPU at
    many slots, where a write per token would take a core), and its last events at their
    time, so a completion ends when its ideal time says. Connections are kept alive unless
    ``close_after_stream`` (the embedded server closes one right after a streamed answer).

    Use as a context manager, or :meth:`start` and :meth:`close`. ``benchmarks/gpu_rate.py``
    measures the batch runner against it.

    Args:
        slots: the server's slots (``-np``).
        tokens_per_s: each slot's token rate.
        prefill_s: seconds before the first token.
        answer_tokens: content tokens of an answer.
        reasoning_tokens: reasoning tokens before an answer's content.
        tick_s: the shortest time between two writes of one stream, seconds.
        close_after_stream: close the connection after each streamed answer.
    """

    def __init__(
        self,
        *,
        slots: int = 4,
        tokens_per_s: float = 1000.0,
        prefill_s: float = 0.010,
        answer_tokens: int = 32,
        reasoning_tokens: int = 0,
        tick_s: float = 0.005,
        close_after_stream: bool = False,
    ) -> None:
        self.spec: dict[str, Any] = {
            "slots": slots,
            "tokens_per_s": tokens_per_s,
            "prefill_s": prefill_s,
            "answer_tokens": answer_tokens,
            "reasoning_tokens": reasoning_tokens,
            "tick_s": tick_s,
            "close_after_stream": close_after_stream,
        }
        self._process: subprocess.Popen[bytes] | None = None
        self._url = ""

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` once started.

        Raises:
            RuntimeError: not started.
        """
        if self._process is None:
            raise RuntimeError("the RateServer is not started")
        return self._url

    @property
    def pid(self) -> int:
        """The server process's id once started (to read its CPU time, say).

        Raises:
            RuntimeError: not started.
        """
        if self._process is None:
            raise RuntimeError("the RateServer is not started")
        return self._process.pid

    def start(self) -> RateServer:
        """Start the server's process; returns once it listens.

        Raises:
            RuntimeError: started already, or the process did not come up.
        """
        if self._process is not None:
            raise RuntimeError("the RateServer is started already")
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        code = "import sys; from boxmaker.testing import _serve_rate; _serve_rate(sys.argv[1])"
        process = subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(self.spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.strip().isdigit():
            process.kill()
            process.wait()
            raise RuntimeError(f"the stand-in server did not start: {line!r}")
        self._url = f"http://127.0.0.1:{int(line)}"
        self._process = process
        return self

    def close(self) -> None:
        """Stop the server's process (idempotent)."""
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        process.stdin.close()  # the server reads end-of-file and stops
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()

    def __enter__(self) -> RateServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve_rate(spec: str) -> None:
    """The stand-in's process: print the port, serve until stdin ends."""
    asyncio.run(_RateLoop(json.loads(spec)).run())


class _RateLoop:
    """The stand-in's event-loop side: its slots, and a connection per client connection."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.busy = [0] * int(spec["slots"])  # streams running on each slot
        self.held = [0] * int(spec["slots"])  # tokens each slot holds (its last prompt + answer)
        self.keys: list[list[int]] = [[] for _ in self.busy]  # each slot's last messages, hashed
        self.used = [0] * len(self.busy)  # when each slot last started a completion (a count)
        self.idle: list[asyncio.Future[int]] = []  # requests waiting for an idle slot
        self.count = 0  # completions so far (their ids)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _RateConnection(self), "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.buffer.read)
        server.close()

    def start(self, conn: _RateConnection, body: dict[str, Any]) -> None:
        """Start a completion on its slot, or queue it until a slot is idle."""
        pin = body.get("id_slot")
        if isinstance(pin, int) and not isinstance(pin, bool) and 0 <= pin < len(self.busy):
            slot: int | None = pin
        else:  # as llama.cpp: the idle slot sharing the longest prefix, else the least recent
            idle = [i for i, n in enumerate(self.busy) if n == 0]
            keys = body[_KEYS]
            shared = {i: _shared(self.keys[i], keys) for i in idle}
            best = max(idle, key=lambda i: (shared[i], -self.used[i]), default=None)
            if best is not None and shared[best] == 0:
                best = min(idle, key=self.used.__getitem__)
            slot = best
        if slot is None:
            waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            waiter.add_done_callback(lambda done: self.stream(conn, body, done.result()))
            self.idle.append(waiter)
            return
        self.busy[slot] += 1
        self.stream(conn, body, slot)

    def stream(self, conn: _RateConnection, body: dict[str, Any], slot: int) -> None:
        self.count += 1
        self.used[slot] = self.count
        _RateStream(self, conn, body, slot).write()

    def release(self, slot: int) -> None:
        """A stream on ``slot`` ended: give the slot to the first request waiting."""
        self.busy[slot] -= 1
        if self.idle and self.busy[slot] == 0:
            self.busy[slot] += 1
            self.idle.pop(0).set_result(slot)

    def props(self) -> dict[str, Any]:
        return {
            "total_slots": len(self.busy),
            "model_path": "stand-in.gguf",
            "chat_template_caps": {"supports_tools": True, "supports_tool_calls": True},
            "default_generation_settings": {"n_ctx": 65536},
        }


class _RateConnection(asyncio.Protocol):
    """One client connection of the stand-in (HTTP/1.1, keep-alive, one request at a time)."""

    def __init__(self, loop: _RateLoop) -> None:
        self.loop = loop
        self.buf = b""
        self.transport: asyncio.WriteTransport | None = None
        self.streaming = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        self.transport = transport

    def connection_lost(self, exc: BaseException | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.serve()

    def serve(self) -> None:
        """Answer the whole requests in the buffer, unless a stream is running."""
        while not self.streaming and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body, self.buf = self.buf[end + 4 : end + 4 + length], self.buf[end + 4 + length :]
            method, _, rest = lines[0].partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            if method == "POST" and path == "/v1/chat/completions":
                self.streaming = True
                parsed = orjson.loads(body)
                parsed[_BYTES], parsed[_KEYS] = len(body), _message_keys(parsed)
                self.loop.start(self, parsed)
            elif path == "/health":
                self.answer("200 OK", {"status": "ok"})
            elif path == "/props":
                self.answer("200 OK", self.loop.props())
            elif path == "/slots":
                slots = [{"id": i, "is_processing": n > 0} for i, n in enumerate(self.loop.busy)]
                self.answer("200 OK", slots)
            else:
                self.answer("404 Not Found", NOT_FOUND)

    def answer(self, status: str, obj: Any) -> None:
        data = json.dumps(obj).encode()
        head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(data)}\r\n\r\n"
        assert self.transport is not None
        self.transport.write(head.encode() + data)

    def stream_over(self) -> None:
        self.streaming = False
        if self.loop.spec["close_after_stream"]:
            if self.transport is not None:
                self.transport.close()
            return
        self.serve()


_SSE_OK = SSE_HEAD  # the head of every streamed answer
_BYTES = "\x00bytes"  # the request's size in its parsed body (a key no request has)
_KEYS = "\x00keys"  # its messages' hashes (_message_keys), made once per request


def _message_keys(body: dict[str, Any]) -> list[int]:
    """A hash per message of a request (its compact JSON), to compare prompts by content."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return []
    return [hash(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)) for m in messages]


def _shared(a: list[int], b: list[int]) -> int:
    """How many leading messages two requests share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class _RateStream:
    """One streamed answer of the stand-in: its events, and when each is due."""

    def __init__(
        self, owner: _RateLoop, conn: _RateConnection, body: dict[str, Any], slot: int
    ) -> None:
        spec = owner.spec
        self.loop = asyncio.get_running_loop()
        self.owner, self.conn, self.slot = owner, conn, slot
        self.gap = float(spec["tick_s"])
        rate, prefill = float(spec["tokens_per_s"]), float(spec["prefill_s"])
        cid = f"chatcmpl-{owner.count:08d}"
        prompt = body[_BYTES] // 4 + 1  # about 4 bytes of the request a token
        keys = body[_KEYS]
        extends = _shared(owner.keys[slot], keys) == len(owner.keys[slot])  # its last messages
        cache = owner.held[slot] if prompt > owner.held[slot] and extends else 0
        owner.keys[slot] = keys
        tail = f',"created":1,"id":"{cid}","model":"stand-in","object":"chat.completion.chunk"'

        def event(delta: str, extra: str = "", finish: str = "null") -> bytes:
            choice = f'{{"finish_reason":{finish},"index":0,"delta":{delta}}}'
            return chunk(f'data: {{"choices":[{choice}]{tail}{extra}}}\n\n'.encode())

        def progress(processed: int, ms: int) -> str:
            numbers = f'"total":{prompt},"cache":{cache},"processed":{processed},"time_ms":{ms}'
            return f',"prompt_progress":{{{numbers}}}'

        role = '{"role":"assistant","content":null}'
        tokens = [event(role, progress(prompt, round(prefill * 1000)))]
        messages = body.get("messages") or [{}]
        tools = body.get("tools") or []
        if tools and messages[-1].get("role") == "user":
            name = tools[0].get("function", {}).get("name", "tool")
            head = {"index": 0, "id": hashlib.sha256(cid.encode()).hexdigest()[:32]}
            head |= {"type": "function", "function": {"name": name, "arguments": "{"}}
            tokens.append(event(_compact({"tool_calls": [head]})))
            for piece in ('"', "city", '":', ' "', "Lis", "bon", '"}'):
                fragment = {"index": 0, "function": {"arguments": piece}}
                tokens.append(event(_compact({"tool_calls": [fragment]})))
            finish = '"tool_calls"'
        else:
            tokens += [event('{"reasoning_content":"Th"}')] * int(spec["reasoning_tokens"])
            tokens += [event('{"content":" word"}')] * int(spec["answer_tokens"])
            finish = '"stop"'
        n = len(tokens) - 1  # tokens generated (the first event is the prefill's end)
        timings = {
            "cache_n": cache, "prompt_n": prompt - cache, "prompt_ms": prefill * 1000,
            "predicted_n": n, "predicted_ms": n / rate * 1000,
            "prompt_per_second": (prompt - cache) / prefill if prefill else 0.0,
            "predicted_per_second": rate,
        }  # fmt: skip
        usage = {"completion_tokens": n, "prompt_tokens": prompt, "total_tokens": prompt + n}
        last = _compact({"choices": [], "usage": usage, "timings": timings, "id": cid})
        ending = event("{}", finish=finish) + sse(last) + sse("[DONE]") + b"0\r\n\r\n"
        owner.held[slot] = prompt + n
        # the head and the role event at once, the prefill's end after prefill_s, a token
        # every 1/rate s, the ending with the last token
        now = self.loop.time()
        self.items = [_SSE_OK + event(role, progress(0, 0)), *tokens, ending]
        self.due = [now, now + prefill] + [now + prefill + (i + 1) / rate for i in range(n)]
        self.due.append(self.due[-1])
        self.sent = 0

    def write(self) -> None:
        """Write the events due now in one write; then wait for the next ones (at least
        ``tick_s``, at most until the stream's last event is due), or end the stream."""
        due, start = self.due, self.sent
        now = self.loop.time()
        end = start
        while end < len(due) and due[end] <= now:
            end += 1
        transport = self.conn.transport
        if transport is not None and end > start:
            transport.write(b"".join(self.items[start:end]))
            self.sent = end
        if transport is None or end == len(due):  # over, or the client went away
            self.owner.release(self.slot)
            self.conn.stream_over()
            return
        self.loop.call_at(min(max(due[end], now + self.gap), due[-1]), self.write)


def _compact(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


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
