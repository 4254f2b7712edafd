"""Benchmark: ``Client.chat`` against naive httpx + json / orjson loops on a real stream.

The stream is the shared recording ``../shared/perf/stream-1009.sse`` (relative to the repo
root; ``--stream PATH`` to use another): 1,009 SSE events of a real llama.cpp stream with
prompt progress, reasoning, a long run of tool-call argument fragments and the finish chunk
with ``timings``. It is served through :class:`httpx.MockTransport` (no sockets) in two read
modes:

- whole body: the whole stream in one read;
- one event per read: one SSE event per read, as a server flushes them.

Three contenders, each over the same bytes and the same kind of ``httpx.Client``:

(a) naive json: ``response.iter_lines()``, ``json.loads`` of each ``data:`` line, then
    ``delta.get("content")``, ``delta.get("reasoning_content")``, ``delta.get("tool_calls")``
    of each choice; stop at ``[DONE]``. Nothing is kept.
(b) naive orjson: the same loop with ``orjson.loads``.
(c) boxmaker: :meth:`boxmaker.client.Client.chat` doing all its work: every client event
    built and passed to a (no-op) hook, tool-call arguments joined, timings kept, the
    :class:`~boxmaker.client.Completion` built;
(d) the same with ``tool_call_deltas=False``: no :class:`~boxmaker.events.ToolCallDelta`
    events (the turn loop drops them), everything else as (c).

Each contender's time is CPU time (:func:`time.process_time`; the machine is shared) of
``--inner`` runs, best of ``--repeat`` rounds; rounds alternate the contenders so that load
changes hit all of them alike. Rates are SSE events per second.

The last line printed is::

    vs_json X.XX vs_orjson Y.YY (whole-body: vs_json .. vs_orjson ..; one-event-per-read: ...)

where ``vs_json`` / ``vs_orjson`` are boxmaker's (c) events/s divided by the naive loop's;
the first two numbers are the lower (worse) of the two read modes, the parenthesis gives
both, and (d)'s ratio to the naive orjson loop ("without ToolCallDelta").
Goal: ``vs_orjson >= 1.00``.

Run: ``PYTHONPATH=. python benchmarks/sse.py [--stream PATH] [--repeat 30] [--inner 5]``
(from the repo root, so that this checkout's ``boxmaker`` is imported).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import orjson

from boxmaker.client import Client, Completion
from boxmaker.config import ClientConfig
from boxmaker.events import ClientEvent

URL = "http://llama.test"
BODY = {"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "id_slot": 0}
DEFAULT_STREAM = Path(__file__).resolve().parents[2] / "shared" / "perf" / "stream-1009.sse"


class _Reads(httpx.SyncByteStream):
    def __init__(self, reads: list[bytes]) -> None:
        self._reads = reads

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._reads)


def transport(reads: list[bytes]) -> httpx.MockTransport:
    """A transport answering every request with ``reads``, one element per read."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Reads(reads)
        )

    return httpx.MockTransport(handler)


def naive(http: httpx.Client, loads: Callable[[str], object]) -> int:
    """The naive loop: iter_lines, ``loads`` of each data line, the three ``delta.get``s.
    Returns the number of data events read (``[DONE]`` included)."""
    n = 0
    with http.stream("POST", f"{URL}/v1/chat/completions", json=BODY) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                n += 1
                data = line[6:]
                if data == "[DONE]":
                    break
                obj: dict[str, list[dict[str, dict[str, object]]]] = loads(data)  # type: ignore[assignment]
                for choice in obj["choices"]:
                    delta = choice["delta"]
                    delta.get("content")
                    delta.get("reasoning_content")
                    delta.get("tool_calls")
    return n


def boxmaker_chat(client: Client, *, tool_call_deltas: bool = True) -> Completion:
    """boxmaker's whole path, every event passed to a no-op hook."""

    def on_event(event: ClientEvent) -> None:
        pass

    return client.chat(BODY, on_event, tool_call_deltas=tool_call_deltas)


def cpu(fn: Callable[[], object], inner: int) -> float:
    """CPU seconds of ``inner`` calls of ``fn``."""
    start = time.process_time()
    for _ in range(inner):
        fn()
    return time.process_time() - start


def load_stream(path: Path) -> tuple[bytes, list[bytes]]:
    """The stream's bytes, and the same cut into one SSE event per element."""
    if not path.is_file():
        sys.exit(
            f"benchmarks/sse.py: stream file not found: {path}\n"
            "(expected the shared recording ../shared/perf/stream-1009.sse next to the repo, "
            "or give one with --stream PATH)"
        )
    body = path.read_bytes()
    events = [part + b"\n\n" for part in body.split(b"\n\n") if part.strip()]
    assert b"".join(events).strip() == body.strip(), "stream is not \\n\\n-separated SSE"
    return body, events


def main() -> None:
    """Time the three contenders in both read modes; print the rates and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stream", type=Path, default=DEFAULT_STREAM)
    parser.add_argument("--repeat", type=int, default=30, help="rounds; the best is kept")
    parser.add_argument("--inner", type=int, default=5, help="runs timed together per round")
    args = parser.parse_args()

    body, events = load_stream(args.stream)
    modes = {"whole-body": [body], "one-event-per-read": events}
    ratios: dict[str, tuple[float, float]] = {}
    print(f"stream: {args.stream.name}, {len(events)} SSE events, {len(body) / 1e3:.0f} kB")
    for mode, reads in modes.items():
        mock = transport(reads)
        with (
            httpx.Client(transport=mock) as http,
            Client(ClientConfig(url=URL), transport=mock) as client,
        ):
            n = naive(http, json.loads)
            assert naive(http, orjson.loads) == n
            done = boxmaker_chat(client)
            assert done.finish_reason is not None and done.timings, "no finish chunk"
            contenders: dict[str, Callable[[], object]] = {
                "naive json": lambda: naive(http, json.loads),
                "naive orjson": lambda: naive(http, orjson.loads),
                "boxmaker Client.chat": lambda: boxmaker_chat(client),
                "  tool_call_deltas=False": lambda: boxmaker_chat(client, tool_call_deltas=False),
            }
            best = dict.fromkeys(contenders, float("inf"))
            names = list(contenders)
            for r in range(args.repeat):
                for name in names[r % 4 :] + names[: r % 4]:  # rotate the order
                    best[name] = min(best[name], cpu(contenders[name], args.inner) / args.inner)
        print(f"{mode}: {len(reads)} reads")
        rate = {name: n / seconds for name, seconds in best.items()}
        for name, seconds in best.items():
            print(f"  {name:22} {seconds * 1e3:7.2f} ms CPU  {rate[name] / 1e3:7.1f}k events/s")
        box = rate["boxmaker Client.chat"]
        lean = rate["  tool_call_deltas=False"]
        ratios[mode] = (
            box / rate["naive json"],
            box / rate["naive orjson"],
            lean / rate["naive orjson"],
        )
    vs_json = min(r[0] for r in ratios.values())
    vs_orjson = min(r[1] for r in ratios.values())
    both = "; ".join(
        f"{m}: vs_json {j:.2f} vs_orjson {o:.2f}, without ToolCallDelta {lean:.2f}"
        for m, (j, o, lean) in ratios.items()
    )
    print(f"vs_json {vs_json:.2f} vs_orjson {vs_orjson:.2f} ({both})")


if __name__ == "__main__":
    main()
