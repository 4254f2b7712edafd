"""Benchmark: a llama.cpp stream read directly and through ``boxmaker tap``.

The stream is the shared recording ``benchmarks/data/stream-1009.sse`` (a copy of the team's
``perf/stream-1009.sse``; ``--stream PATH`` for another): 1,009 SSE events of a real
llama.cpp answer. A stand-in upstream (a socket server on 127.0.0.1, a thread per
connection, kept alive as llama-server keeps it) answers each ``POST /v1/chat/completions``
with it as llama-server does: a chunked ``text/event-stream``, one event per chunk and
write, ``--pace-us`` between events (0: as fast as the socket takes them) after
``--first-ms`` before the first (the prompt's processing). The agent is an ``httpx.Client``
reading raw bytes; an event counts as arrived when its closing blank line has.

Both paths run ``--repeat`` times, interleaved in ABBA order (direct-tap, tap-direct, ...:
load changes on the shared machine hit both alike, and each path follows itself as often as
the other, so the tap's writer thread, busy with the previous exchange, lands on both paths'
runs), over connections kept alive and warmed first on both paths (the tap's pool to the
stand-in included); the stand-in and the tap (``boxmaker tap``) each in a process of its own,
as in use. The medians are compared (the quartiles are printed too), in wall-clock time (a
proxy is about latency):

- first event: from sending the request to the first whole event, in ms;
- events/s: events over the time from sending the request to the last event.

The tap runs with its log on (a temporary directory; each exchange parsed and written on
the writer thread, as in use), forensics off (the stand-in serves no template); with
``--cassette`` it also records every exchange into a cassette (``boxmaker tap --cassette``).

The last line printed is::

    first_event_ratio X.XX events_per_s_ratio Y.YY

through the tap over direct (first event: lower is better, goal <= 1.10; events/s: higher
is better, goal >= 0.90), for the pacing given. The default, 2 ms per event after 20 ms, is
the embedded server's own rate on the shipped tiny model on the team's machine (about 500
tokens/s, llama.cpp's ``predicted_per_second``; real models stream slower). ``--pace-us 0
--first-ms 0`` gives the raw worst case, every event as fast as the sockets go: there the
extra hop's socket writes and reads per event (one event per chunk, none coalesced) are what
one measures.

Run: ``PYTHONPATH=. python benchmarks/tap.py [--repeat 20] [--pace-us 2000] [--first-ms 20]
[--cassette]``
(from the repo root, so that this checkout's ``boxmaker`` is imported).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

DEFAULT_STREAM = Path(__file__).resolve().parent / "data" / "stream-1009.sse"
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
BODY = (
    b'{"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "stream": true}'
)


class Upstream:
    """The stand-in llama-server: the stream, one event per chunk, paced."""

    def __init__(self, events: list[bytes], first_s: float, pace_s: float) -> None:
        self.events, self.first_s, self.pace_s = events, first_s, pace_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        """Answer requests on one connection, kept alive as llama-server keeps it."""
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b""
            while True:
                # ack each request's head at once, as llama-server's reads do: else the
                # client's Nagle holds its body back for a delayed ACK (40 ms)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
                while b"\r\n\r\n" not in data:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    data += piece
                head, _, data = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                if head.startswith(b"GET"):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                    continue
                conn.sendall(HEAD)
                if self.first_s:
                    time.sleep(self.first_s)
                for event in self.events:
                    conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                    if self.pace_s:
                        time.sleep(self.pace_s)
                conn.sendall(b"0\r\n\r\n")

    def close(self) -> None:
        self.listener.close()


def serve(events: list[bytes], first_s: float, pace_s: float, port: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    """The stand-in upstream in a process of its own (no GIL shared with the reader)."""
    upstream = Upstream(events, first_s, pace_s)
    port.put(upstream.url)
    threading.Event().wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(url: str) -> None:
    for _ in range(200):
        try:
            httpx.get(url + "/health", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.05)
    sys.exit(f"benchmarks/tap.py: {url} did not come up")


def read(client: httpx.Client, url: str, n_events: int) -> tuple[float, float]:
    """(seconds to the first whole event, events per second) of one streamed request."""
    start = time.perf_counter()
    first = 0.0
    seen, tail = 0, b""
    with client.stream("POST", url + "/v1/chat/completions", content=BODY) as r:
        for raw in r.iter_raw():
            text = tail + raw
            seen += text.count(b"\n\n")
            tail = text[-1:]  # a blank line split across two reads
            if seen and not first:
                first = time.perf_counter() - start
    total = time.perf_counter() - start
    if seen < n_events:
        sys.exit(f"benchmarks/tap.py: {seen} of {n_events} events arrived")
    return first, n_events / total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stream", type=Path, default=DEFAULT_STREAM)
    parser.add_argument("--repeat", type=int, default=20, help="runs of each path")
    parser.add_argument("--pace-us", type=float, default=2000.0, help="between events (µs)")
    parser.add_argument("--first-ms", type=float, default=20.0, help="before the first (ms)")
    parser.add_argument("--cassette", action="store_true", help="the tap also writes a cassette")
    args = parser.parse_args()
    body = args.stream.read_bytes()
    events = [part + b"\n\n" for part in body.split(b"\n\n") if part.strip()]
    urls: multiprocessing.Queue[str] = multiprocessing.Queue()
    stand_in = multiprocessing.Process(
        target=serve, args=(events, args.first_ms / 1000, args.pace_us / 1e6, urls), daemon=True
    )
    stand_in.start()
    upstream = urls.get(timeout=30)
    results: dict[str, list[tuple[float, float]]] = {"direct": [], "tap": []}
    with tempfile.TemporaryDirectory() as logs, httpx.Client(timeout=60) as client:
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "boxmaker.cli",
            "tap",
            "--upstream",
            upstream,
            "--port",
            str(port),
            "--dir",
            logs,
            "--no-forensics",
        ]
        if args.cassette:
            command += ["--cassette", str(Path(logs) / "tapped.yaml")]
        tap = subprocess.Popen(command, stdout=subprocess.DEVNULL, env=os.environ.copy())
        try:
            tap_url = f"http://127.0.0.1:{port}"
            wait_up(tap_url)
            for _ in range(2):  # warm both paths (the tap's imports and pool)
                read(client, upstream, len(events))
                read(client, tap_url, len(events))
            for n in range(args.repeat):
                order = [("direct", upstream), ("tap", tap_url)]
                for name, url in order if n % 2 == 0 else order[::-1]:
                    results[name].append(read(client, url, len(events)))
        finally:
            tap.terminate()  # SIGTERM: uvicorn stops, the tap writes and closes its logs
            tap.wait(timeout=30)
        logged = len(list(Path(logs).glob("*.jsonl")))
    stand_in.terminate()
    stand_in.join()
    medians = {
        name: (statistics.median(f for f, _ in runs), statistics.median(r for _, r in runs))
        for name, runs in results.items()
    }
    print(
        f"{len(events)} events, pace {args.pace_us:.0f} µs, first after {args.first_ms:.0f} ms, "
        f"{args.repeat} runs each; {logged} session logs written by the tap"
        + (", and a cassette" if args.cassette else "")
    )
    for name, (first, rate) in medians.items():
        q1, _, q3 = statistics.quantiles([f * 1000 for f, _ in results[name]], n=4)
        print(
            f"  {name:6}: first event {first * 1000:8.2f} ms (quartiles {q1:.2f}-{q3:.2f}), "
            f"{rate:10.0f} events/s"
        )
    first_ratio = medians["tap"][0] / medians["direct"][0]
    rate_ratio = medians["tap"][1] / medians["direct"][1]
    print(f"first_event_ratio {first_ratio:.2f} events_per_s_ratio {rate_ratio:.2f}")


if __name__ == "__main__":
    main()
