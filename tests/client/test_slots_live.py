"""Slots live: threads and a second process run turns at once on a one-slot embedded server
(the shipped model); every answer names the city its own request asked for (issue 22).

llama.cpp runs a request pinned to a busy slot next to the running one and the answers cross;
the client's leases (:mod:`boxmaker.client._slots`) keep one request per slot in flight.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import embedded_only

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import TurnLimit
from boxmaker.events import SlotWait
from boxmaker.records import Assistant, Baseline
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
CITIES = ("Paris", "Lima", "Oslo", "Tokyo", "Cairo", "Berlin")


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(n_threads=1, n_parallel=1, reasoning_preserve=False) as running:
        yield running


def cities_named(session: Session) -> list[str]:
    """The cities of every tool call and answer of the session, in order."""
    out = []
    for record in session.records:
        if isinstance(record, Assistant):
            texts = [c.arguments for c in record.tool_calls] + [record.content or ""]
            out += [c for t in texts for c in CITIES if c in t]
    return out


def run_city(url: str, folder: Path, city: str) -> tuple[list[str], int]:
    """One session, one turn asking for ``city``'s weather: the cities named, and the
    SlotWait events seen."""
    config = Config(
        client=ClientConfig(url=url, retry_attempts=0),
        loop=LoopLimits(tool_iterations=1),
        # room for the reasoning and the whole call: a call cut by max_tokens is not run
        sampling=SamplingConfig(max_tokens=240),
    )
    waits: list[SlotWait] = []
    session = Session.create(folder, Baseline(tools=demo_registry().definitions()))
    with session, Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        with contextlib.suppress(TurnLimit):
            run_turn(
                session,
                runtime,
                f"What is the weather in {city}?",
                lambda e: waits.append(e) if isinstance(e, SlotWait) else None,
            )
    return cities_named(session), len(waits)


_OTHER_PROCESS = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from test_slots_live import run_city
    for city in sys.argv[4:]:
        print(json.dumps([city, *run_city(sys.argv[1], Path(sys.argv[2]), city)]), flush=True)
    """
)


def test_threads_and_a_second_process_never_cross_answers_on_one_slot_live(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    embedded_only("one slot")
    here = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    other = subprocess.Popen(
        [sys.executable, "-c", _OTHER_PROCESS, server.url, str(tmp_path), str(here), *CITIES[3:]],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    results: dict[str, tuple[list[str], int]] = {}
    start = threading.Barrier(3)

    def work(city: str) -> None:
        start.wait()
        for _ in range(2):
            named, waits = run_city(server.url, tmp_path, city)
            results[f"{city}{_}"] = (named, waits)

    threads = [threading.Thread(target=work, args=(c,)) for c in CITIES[:3]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    out, _ = other.communicate(timeout=300)
    assert other.returncode == 0
    for line in out.splitlines():
        city, named, waits = json.loads(line)
        results[city] = (named, waits)
    assert len(results) == 9
    for key, (named, _waits) in results.items():
        city = key.rstrip("01")
        assert named and set(named) == {city}, (key, named)  # its own city, no other one
