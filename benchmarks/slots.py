"""Benchmark: N concurrent sessions on one llama.cpp server; do answers cross, and does a
session keep its prompt cache?

Starts the embedded llama.cpp server (xllamacpp, the shipped model, ``--slots`` slots,
``n_threads=1``) and runs ``--sessions`` sessions at once, one thread each, every one with
its own city and the default slot choice (``SlotsConfig.main = None``: the client leases a
free slot, the one holding the session's cache when free). Each session runs ``--turns``
turns about its city (weather, then time, ...). A turn is *crossed* when its assistant
records name another city, or none (llama.cpp runs a request pinned to a busy slot next to
the running one, and the answers cross; the leases exist to prevent it).

Reuse is the prompt cache of session 0, a single session among the others: over its
completions after its first, the share of prompt tokens llama.cpp took from the slot
(``cache_n / (cache_n + prompt_n)``); a session that kept its slot reuses all but its newest
messages. The same share is printed for the session run alone, first, for comparison.

The last line printed is ``crossed C of N reuse X.XX`` (C crossed turns of N, X session 0's
reuse among the others).

Run: ``python benchmarks/slots.py`` (``--sessions N``, ``--slots N``, ``--turns N``).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import threading
from pathlib import Path

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import TurnLimit
from boxmaker.records import Assistant, Baseline, Usage, User
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

CITIES = ("Paris", "Lima", "Oslo", "Tokyo", "Cairo", "Berlin", "Madrid", "Rome")
QUESTIONS = ("What is the weather in {}?", "What time is it in {}?", "Is it raining in {}?")


def run_session(url: str, folder: Path, city: str, turns: int) -> Session:
    """One session about ``city``: ``turns`` turns, through the default slot choice."""
    config = Config(
        client=ClientConfig(url=url, retry_attempts=0),
        loop=LoopLimits(tool_iterations=2),
        sampling=SamplingConfig(max_tokens=160),
    )
    session = Session.create(folder, Baseline(tools=demo_registry().definitions()))
    with session, Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        for turn in range(turns):
            with contextlib.suppress(TurnLimit):
                run_turn(session, runtime, QUESTIONS[turn % len(QUESTIONS)].format(city))
    return session


def crossed_turns(session: Session, city: str) -> tuple[int, int]:
    """(turns whose answers name another city or none, turns)."""
    named: list[set[str]] = []
    for record in session.records:
        if isinstance(record, User):
            named.append(set())
        elif isinstance(record, Assistant) and named:
            texts = [c.arguments for c in record.tool_calls] + [record.content or ""]
            named[-1] |= {c for t in texts for c in CITIES if c in t}
    return sum(found != {city} for found in named), len(named)


def reuse(session: Session) -> float:
    """Share of prompt tokens served from the slot's cache over the completions after the
    first."""
    usages = [r for r in session.records if isinstance(r, Usage)][1:]
    cached = sum(int(u.timings.get("cache_n", 0)) for u in usages)
    total = cached + sum(int(u.timings.get("prompt_n", 0)) for u in usages)
    return cached / total if total else 0.0


def main() -> None:
    """Parse the flags, run the sessions, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedServer(n_threads=1, n_parallel=args.slots, n_ctx=4096 * args.slots) as server,
    ):
        alone = run_session(server.url, Path(tmp), CITIES[0], args.turns)
        print(f"session 0 alone: reuse {reuse(alone):.2f}")
        sessions: dict[int, Session] = {}
        start = threading.Barrier(args.sessions)

        def work(i: int) -> None:
            start.wait()
            sessions[i] = run_session(server.url, Path(tmp), CITIES[i % len(CITIES)], args.turns)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(args.sessions)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        crossed = total = 0
        for i, session in sorted(sessions.items()):
            c, n = crossed_turns(session, CITIES[i % len(CITIES)])
            crossed, total = crossed + c, total + n
            print(
                f"session {i} ({CITIES[i % len(CITIES)]}): {c} of {n} turns crossed, "
                f"reuse {reuse(session):.2f}"
            )
        print(f"crossed {crossed} of {total} reuse {reuse(sessions[0]):.2f}")


if __name__ == "__main__":
    main()
