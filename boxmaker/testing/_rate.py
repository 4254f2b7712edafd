"""A stand-in GPU-rate llama-server on a real socket, in a process of its own:
:class:`RateServer` (``benchmarks/gpu_rate.py`` measures clients against it)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import orjson

from ._llama_script import NOT_FOUND, SSE_HEAD, chunk, sse

__all__ = ["RateServer"]


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
        # the folder holding the boxmaker package (this file: boxmaker/testing/_rate.py)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        code = "import sys; from boxmaker.testing._rate import serve_rate; serve_rate(sys.argv[1])"
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


def serve_rate(spec: str) -> None:
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
