"""Benchmark: boxmaker's stream parsing against a bare httpx + json loop.

Builds, in memory, a realistic llama-server stream of about 20,000 chunks (prompt progress,
reasoning, content, tool-call argument fragments, the finish chunk, the trailing
``"choices": []`` usage/timings chunk and ``[DONE]``), delivered one SSE event per read as a
real server flushes them, through :class:`httpx.MockTransport` (no sockets). Times, best of 5:

(a) bare: ``response.iter_lines()`` + ``json.loads`` of each ``data:`` line, nothing else;
(b) boxmaker: :meth:`boxmaker.client.Client.chat` over the same bytes (events built and passed
    to a no-op hook, tool-call arguments joined, the :class:`Completion` built).

The last line printed is ``ratio X.XX`` (boxmaker time / bare time).

Run: ``python benchmarks/sse.py`` (``--chunks N``, ``--repeat R`` to change the size).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator

import httpx

from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.events import ClientEvent
from boxmaker.stream import Completion

URL = "http://llama.test"
ID = "chatcmpl-2yTU6c2GMxjgwiTqjmfQcm4ePgSiXDHa"
MODEL = "/models/tiny-agent.gguf"


def _chunk(choices: list[dict[str, object]], **extra: object) -> bytes:
    obj: dict[str, object] = {
        "choices": choices,
        "created": 1796021819,
        "id": ID,
        "model": MODEL,
        "system_fingerprint": "b7000-abcdef",
        "object": "chat.completion.chunk",
    }
    obj.update(extra)
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


def _delta(delta: dict[str, object], finish: str | None = None) -> bytes:
    return _chunk([{"finish_reason": finish, "index": 0, "delta": delta}])


def build_stream(n_chunks: int = 20_000) -> list[bytes]:
    """One SSE event per element, about ``n_chunks`` of them, shaped like llama.cpp's."""
    role: dict[str, object] = {"role": "assistant", "content": None}
    out = []
    total = 2048
    for processed in range(0, total + 1, 512):
        progress = {"total": total, "cache": 0, "processed": processed, "time_ms": processed / 8}
        out.append(
            _chunk([{"finish_reason": None, "index": 0, "delta": role}], prompt_progress=progress)
        )
    out.append(_delta(role))
    n_body = n_chunks - len(out) - 3
    n_reasoning = n_body * 2 // 5
    n_content = n_body * 2 // 5
    n_tool = n_body - n_reasoning - n_content
    words = ["The", " user", " asks", " about", " the", " weather", " in", " Paris", ",", " é"]
    for i in range(n_reasoning):
        out.append(_delta({"reasoning_content": words[i % len(words)]}))
    for i in range(n_content):
        out.append(_delta({"content": words[(i + 3) % len(words)]}))
    per_call = max(n_tool // 2, 1)
    for call in range(2):
        name = ("get_weather", "get_time")[call]
        first = {
            "index": call,
            "id": f"{call:032d}",
            "type": "function",
            "function": {"name": name, "arguments": '{"city": "'},
        }
        out.append(_delta({"tool_calls": [first]}))
        for i in range(per_call - 1):
            frag = {"index": call, "function": {"arguments": "ab"[i % 2]}}
            out.append(_delta({"tool_calls": [frag]}))
        out.append(_delta({"tool_calls": [{"index": call, "function": {"arguments": '"}'}}]}))
    out.append(_delta({}, finish="tool_calls"))
    timings = {
        "cache_n": 0,
        "prompt_n": total,
        "prompt_ms": 256.0,
        "prompt_per_token_ms": 0.125,
        "prompt_per_second": 8000.0,
        "predicted_n": n_body,
        "predicted_ms": 20000.0,
        "predicted_per_token_ms": 1.0,
        "predicted_per_second": 1000.0,
    }
    usage = {
        "completion_tokens": n_body,
        "prompt_tokens": total,
        "total_tokens": total + n_body,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    out.append(_chunk([], usage=usage, timings=timings))
    out.append(b"data: [DONE]\n\n")
    return out


class _Chunks(httpx.SyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._chunks)


def transport(chunks: list[bytes]) -> httpx.MockTransport:
    """A transport answering every request with the stream, one event per read."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Chunks(chunks)
        )

    return httpx.MockTransport(handler)


BODY = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "id_slot": 0}


def run_bare(http: httpx.Client) -> int:
    """The baseline: iter_lines + json.loads of each data line, stop at [DONE]."""
    n = 0
    loads = json.loads
    with http.stream("POST", f"{URL}/v1/chat/completions", json=BODY) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                if data == "[DONE]":
                    break
                loads(data)
                n += 1
    return n


def run_boxmaker(client: Client) -> Completion:
    """boxmaker's full path with a no-op event hook."""

    def on_event(event: ClientEvent) -> None:
        pass

    return client.chat(BODY, on_event)


def best_of(repeat: int, fn: Callable[[], object]) -> float:
    """Fastest of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    """Build the stream, time both loops, print the times and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chunks", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    chunks = build_stream(args.chunks)
    mock = transport(chunks)
    with (
        httpx.Client(transport=mock) as http,
        Client(ClientConfig(url=URL), transport=mock) as client,
    ):
        n = run_bare(http)
        completion = run_boxmaker(client)
        assert completion.finish_reason == "tool_calls", completion.finish_reason
        assert len(completion.tool_calls) == 2
        json.loads(completion.tool_calls[0].arguments)
        assert completion.timings["prompt_n"] == 2048
        bare = best_of(args.repeat, lambda: run_bare(http))
        boxed = best_of(args.repeat, lambda: run_boxmaker(client))
    size = sum(map(len, chunks))
    print(f"stream: {len(chunks)} SSE events, {n} JSON chunks, {size / 1e6:.1f} MB")
    print(
        f"bare httpx iter_lines + json.loads: {bare * 1e3:8.1f} ms ({bare / n * 1e6:.2f} us/chunk)"
    )
    print(
        f"boxmaker Client.chat:               {boxed * 1e3:8.1f} ms "
        f"({boxed / n * 1e6:.2f} us/chunk)"
    )
    print(f"ratio {boxed / bare:.2f}")


if __name__ == "__main__":
    main()
