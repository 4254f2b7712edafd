"""Benchmark: time to the first streamed event while recording a cassette vs not recording.

Starts the embedded llama.cpp server (xllamacpp, the shipped model, ``n_threads=1``) and runs
the same streamed chat completion (``max_tokens`` tokens, temperature 0) in three ways,
interleaved (the order rotating each round), ``--repeat`` times each:

(a) plain: :meth:`boxmaker.client.Client.chat`, no cassette;
(b) recording: the same inside :func:`boxmaker.cassettes.use_cassette` in record mode ``all``
    (boxmaker's streaming tee: the stream is passed on as it arrives);
(c) vcrpy's own httpx stub, recording (``vcr.VCR().use_cassette``), for reference: it reads
    the whole response before handing it over.

Each request runs on a new client (a new connection), outside the timed part, with Python's
garbage collector off while it is timed (as ``timeit`` does: a collection of the garbage that
writing the previous cassette left would otherwise land in a random request). For each way it
reports the time from sending the request to the first client event (the ``Queued`` event the
client emits when the response headers arrive), best and median, and the medians to the first
token event (``Reasoning`` or ``Content``) and to the whole completion. The last line printed
is ``slowdown X.XX``: the median first-event time recording (b) divided by not recording (a).

Run: ``python benchmarks/recording.py`` (``--repeat N``, ``--max-tokens N``).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import vcr

from boxmaker.cassettes import use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.errors import InferError
from boxmaker.events import ClientEvent, Content, Reasoning
from boxmaker.server import EmbeddedServer

PROMPT = "What is the weather in Lisbon?"


def _one(
    url: str, body: dict[str, Any], context: AbstractContextManager[Any]
) -> tuple[float, float, float]:
    """(first event, first token, whole completion) in seconds, for one request on a new
    client (a new connection each time, so no way profits from a warm pooled one)."""
    marks: list[float] = []
    token: list[float] = []

    def on_event(event: ClientEvent) -> None:
        now = time.perf_counter()
        if not marks:
            marks.append(now)
        if not token and isinstance(event, Reasoning | Content):
            token.append(now)

    gc.collect()  # like timeit: no collection of earlier garbage inside the timed part
    gc.disable()
    try:
        with Client(ClientConfig(url=url, retry_attempts=0)) as client, context:
            start = time.perf_counter()
            client.chat(body, on_event)
            end = time.perf_counter()
    finally:
        gc.enable()
    first = marks[0] if marks else end
    return first - start, (token[0] if token else end) - start, end - start


def main() -> None:
    """Run the benchmark and print one line per way, then ``slowdown X.XX``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=25, help="requests per way (median)")
    parser.add_argument("--max-tokens", type=int, default=96, help="tokens per completion")
    args = parser.parse_args()
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "id_slot": 0,
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": args.max_tokens,
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedServer(n_ctx=2048, n_threads=1) as server,
    ):
        folder = Path(tmp)
        counter = iter(range(1_000_000))

        def plain() -> AbstractContextManager[Any]:
            return nullcontext()

        def recording() -> AbstractContextManager[Any]:
            return use_cassette(folder / f"b{next(counter)}.yaml", "all")

        def vcrpy_stub() -> AbstractContextManager[Any]:
            stub: AbstractContextManager[Any] = vcr.VCR(record_mode="all").use_cassette(
                str(folder / f"v{next(counter)}.yaml")
            )
            return stub

        ways: dict[str, Callable[[], AbstractContextManager[Any]]] = {
            "plain": plain,
            "recording": recording,
            "vcrpy stub": vcrpy_stub,
        }
        _one(server.url, body, nullcontext())  # warm up: load, prompt cache
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in ways}
        names = list(ways)
        for round_ in range(args.repeat):
            for name in names[round_ % 3 :] + names[: round_ % 3]:  # rotate: no order effect
                try:
                    results[name].append(_one(server.url, body, ways[name]()))
                except InferError as exc:  # a pooled keep-alive connection the server dropped
                    print(f"{name}: {exc}; measured again", file=sys.stderr)
                    results[name].append(_one(server.url, body, ways[name]()))

    def best(name: str, i: int) -> float:
        return min(r[i] for r in results[name])

    def median(name: str, i: int) -> float:
        return statistics.median(r[i] for r in results[name])

    for name in ways:
        print(
            f"{name:>11}: first event best {best(name, 0) * 1000:7.2f} ms, median "
            f"{median(name, 0) * 1000:7.2f} ms; first token median {median(name, 1) * 1000:7.2f} "
            f"ms; whole completion median {median(name, 2) * 1000:7.2f} ms"
        )
    print(
        f"best first event, recording / plain: {best('recording', 0) / best('plain', 0):.2f}; "
        f"vcrpy's own httpx stub / plain (median): "
        f"{median('vcrpy stub', 0) / median('plain', 0):.1f}"
    )
    print(f"slowdown {median('recording', 0) / median('plain', 0):.2f}")


if __name__ == "__main__":
    main()
