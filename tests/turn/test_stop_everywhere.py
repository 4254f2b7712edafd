"""Stop acts promptly everywhere (issue 35, item 7): the turn's first ``GET /props``, slot
discovery and cache forensics' side requests, against a server that answers them with a body
of ``: ping`` comments that never ends (it took 19 s; the stream itself stops in 0.1 s).

A real socket (the watch shuts it down), the fake llama-server of ``tests/fake_llama.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fake_llama import SSE_HEAD, Every, FakeLlama, Raw, Reply, chunk, running

from boxmaker.client import Client, SlotLeases
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import RequestCancelled, TurnCancelled
from boxmaker.records import Baseline, CacheLoss
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

PINGS = Raw([SSE_HEAD, Every(chunk(b": ping\n\n"), 0.05, 30.0)])
"""A 200 answer whose body is ``: ping`` comments for 30 s."""

STOP_AFTER_S = 0.3
PROMPT_S = 1.5  # Stop is prompt when the call returns this soon after it (the stream: 0.1 s)


def stop_after(event: threading.Event, seconds: float = STOP_AFTER_S) -> None:
    threading.Timer(seconds, event.set).start()


def test_stop_during_the_turns_first_props(tmp_path: Path) -> None:
    with running([Reply(content="ok")]) as server:
        assert isinstance(server, FakeLlama)
        server.paths["/props"] = PINGS
        client = Client(ClientConfig(url=server.url, retry_attempts=0))
        session = Session.create(tmp_path, Baseline(system="sys"))
        runtime = Runtime(config=Config(), client=client, registry=Registry())
        stop_after(runtime.cancel)
        started = time.monotonic()
        with pytest.raises(TurnCancelled):
            run_turn(session, runtime, "hello")
        assert time.monotonic() - started < STOP_AFTER_S + PROMPT_S
        assert not server.bodies  # no chat request went out after Stop
        del server.paths["/props"]  # a cancelled read is not kept: the next turn asks again
        assert run_turn(session, runtime, "again", cancel=threading.Event()).content == "ok"
        client.close()


def test_stop_during_slot_discovery(tmp_path: Path) -> None:
    """An unpinned request whose slot is taken asks the server how many slots it has."""
    with running([Reply(content="ok")]) as server:
        assert isinstance(server, FakeLlama)
        server.paths["/props"] = PINGS
        leases = SlotLeases(tmp_path)
        client = Client(ClientConfig(url=server.url, retry_attempts=0), leases=leases)
        cancel = threading.Event()
        with leases.lease(client.url, 0, [], count=lambda: None, on_wait=lambda slot: None):
            stop_after(cancel)
            started = time.monotonic()
            with pytest.raises(RequestCancelled):
                client.chat({"messages": [{"role": "user", "content": "hi"}]}, print, cancel=cancel)
            assert time.monotonic() - started < STOP_AFTER_S + PROMPT_S
        client.close()


def test_stop_during_cache_forensics(tmp_path: Path) -> None:
    """The second completion reuses less than the first made cacheable (the fake's timings):
    forensics asks the server for its template, which pings for ever; Stop cuts it."""
    with running([Reply(content="ok")]) as server:
        assert isinstance(server, FakeLlama)
        client = Client(ClientConfig(url=server.url, retry_attempts=0))
        session = Session.create(tmp_path, Baseline(system="sys"))
        runtime = Runtime(config=Config(), client=client, registry=Registry())
        assert run_turn(session, runtime, "hello").content == "ok"
        server.paths["/apply-template"] = PINGS
        server.paths["/tokenize"] = PINGS
        cancel = threading.Event()
        stop_after(cancel, 0.5)
        started = time.monotonic()
        run_turn(session, runtime, "again", cancel=cancel)  # its completion had ended: answered
        assert time.monotonic() - started < 0.5 + PROMPT_S
        (loss,) = [r for r in session.records if isinstance(r, CacheLoss)]
        assert loss.detail is not None and "cancelled" in loss.detail
        client.close()
