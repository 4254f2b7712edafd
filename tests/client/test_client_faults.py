"""The client against a real socket server that misbehaves: cancel and the silence limit.

Each test runs :class:`fake_llama.FakeLlama` on 127.0.0.1 with socket-level steps
(:class:`fake_llama.Raw`) and a real :class:`Client` (httpx over TCP). Bounds on elapsed
time are generous behaviour checks (a cancel that waits for the idle timeout takes 5 s here,
one that works takes about 0.1 s), not benchmarks.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fake_llama import SSE_HEAD, Every, FakeLlama, Raw, chunk, sse

from boxmaker.client import Client
from boxmaker.client._cancel import CancelWatch
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import InferError, RequestCancelled, StreamCut, TurnCancelled
from boxmaker.events import ClientEvent, Content, Progress, Queued
from boxmaker.records import Baseline
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0}
CID = "chatcmpl-faults"
PING = chunk(b": ping\n\n")


def delta(d: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    obj = {"choices": [{"index": 0, "delta": d, "finish_reason": finish}], "id": CID, **extra}
    return sse(json.dumps(obj))


def config(url: str, **kw: Any) -> ClientConfig:
    # an idle timeout of 5 s: a cancel that is not seen fails with InferError after 5 s
    return ClientConfig(**{"url": url, "idle_timeout_s": 5.0, "retry_attempts": 0, **kw})


def cancelled_after(
    server: FakeLlama, delay_s: float = 0.3, **kw: Any
) -> tuple[float, list[ClientEvent]]:
    """Run one chat with a cancel set after ``delay_s``; return the seconds it took and the
    events; the chat must raise RequestCancelled."""
    cancel = threading.Event()
    events: list[ClientEvent] = []
    timer = threading.Timer(delay_s, cancel.set)
    with Client(config(server.url, **kw)) as client:
        start = time.monotonic()
        timer.start()
        try:
            with pytest.raises(RequestCancelled):
                client.chat_with_retry(BODY, events.append, cancel=cancel)
        finally:
            timer.cancel()
        return time.monotonic() - start, events


def test_cancel_while_the_server_says_nothing_after_the_request() -> None:
    with FakeLlama([Raw([])]) as server:
        elapsed, events = cancelled_after(server)
        assert elapsed < 2.0
        assert events == []
        assert server.disconnected.wait(2.0)  # the server saw the connection go
        assert len(server.requests) == 1


def test_cancel_while_the_stream_is_stalled_mid_stream() -> None:
    script = [SSE_HEAD, delta({"role": "assistant", "content": None}), delta({"content": "a"})]
    with FakeLlama([Raw(script)]) as server:
        elapsed, events = cancelled_after(server)
        assert elapsed < 2.0
        assert Content("a") in events
        assert server.disconnected.wait(2.0)


def test_cancel_while_the_server_only_pings() -> None:
    with FakeLlama([Raw([SSE_HEAD, Every(PING, 0.1, for_s=6.0)])]) as server:
        elapsed, events = cancelled_after(server)
        assert [e for e in events if not isinstance(e, Queued)] == []
        assert elapsed < 2.0
        assert server.disconnected.wait(2.0)


def test_cancel_of_a_retry_when_the_server_goes_silent() -> None:
    """A fully read answer (here a 503) leaves its connection kept for the retry, which is
    sent on it; the server then stays silent, and the cancel still reaches the kept socket
    before any byte of the answer (the pool names it when it takes it)."""
    loading = b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
    answer = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    answer += b"Content-Length: %d\r\n\r\n%s" % (len(loading), loading)
    with (
        FakeLlama([Raw([answer]), Raw([])]) as server,
        Client(config(server.url, retry_attempts=1, retry_base_delay_s=0.0)) as client,
    ):
        cancel = threading.Event()
        timer = threading.Timer(0.3, cancel.set)
        start = time.monotonic()
        timer.start()
        with pytest.raises(RequestCancelled):
            client.chat_with_retry(BODY, lambda e: None, cancel=cancel)
        assert time.monotonic() - start < 2.0
        assert server.connections == 1  # the retry went on the kept connection
        assert server.disconnected.wait(2.0)


def test_client_is_usable_after_a_cancelled_request() -> None:
    answer = [
        SSE_HEAD,
        delta({"content": "ok"}),
        delta({}, finish="stop"),
        chunk(b"data: [DONE]\n\n"),
        b"0\r\n\r\n",
    ]
    with FakeLlama([Raw([])]) as silent, FakeLlama([Raw(answer, hold=False)]) as good:
        cancel = threading.Event()
        threading.Timer(0.2, cancel.set).start()
        with Client(config(silent.url)) as client, pytest.raises(RequestCancelled):
            client.chat(BODY, lambda e: None, cancel=cancel)
        with Client(config(good.url)) as client:
            completion = client.chat(BODY, lambda e: None, cancel=threading.Event())
        assert completion.content == "ok"


def test_only_pings_for_longer_than_the_silence_limit_is_a_clear_error() -> None:
    with FakeLlama([Raw([SSE_HEAD, Every(PING, 0.1, for_s=6.0)])]) as server:
        client = Client(config(server.url, silence_timeout_s=0.5))
        start = time.monotonic()
        with client, pytest.raises(InferError) as info:
            client.chat(BODY, lambda e: None)
        elapsed = time.monotonic() - start
    assert type(info.value) is InferError
    assert not isinstance(info.value, StreamCut | RequestCancelled)
    assert "silence timeout" in str(info.value)
    assert "silence_timeout_s" in str(info.value)
    assert info.value.status is None
    assert 0.5 <= elapsed < 3.0


def test_progress_events_count_as_life_for_the_silence_limit() -> None:
    progress = [
        delta({}, prompt_progress={"total": 20, "cache": 0, "processed": i, "time_ms": i})
        for i in range(10)
    ]
    script: list[bytes | float | Every] = [SSE_HEAD]
    for event in progress:  # 10 progress events 0.1 s apart, pings between: 1 s in all
        script += [event, PING, 0.1]
    script += [delta({"content": "ok"}), delta({}, finish="stop"), chunk(b"data: [DONE]\n\n")]
    script.append(b"0\r\n\r\n")
    events: list[ClientEvent] = []
    with FakeLlama([Raw(script, hold=False)]) as server:
        client = Client(config(server.url, silence_timeout_s=0.7))
        with client:
            completion = client.chat(BODY, events.append)
    assert completion.content == "ok"
    assert sum(isinstance(e, Progress) for e in events) == 10


def test_cancel_of_a_turn_waiting_on_a_silent_server_is_turn_cancelled(tmp_path: Path) -> None:
    with FakeLlama([Raw([SSE_HEAD, Every(PING, 0.1, for_s=6.0)])]) as server:
        session = Session.create(tmp_path, Baseline(system="sys"))
        runtime = Runtime(config=Config(), client=Client(config(server.url)), registry=Registry())
        timer = threading.Timer(0.3, runtime.cancel.set)
        start = time.monotonic()
        timer.start()
        with pytest.raises(TurnCancelled):
            run_turn(session, runtime, "hello")
        assert time.monotonic() - start < 2.0
        session.close()


def test_one_thread_watches_every_request_in_flight() -> None:
    """Issue 38: a request's cancel watch costs no thread of its own (64 requests in flight
    woke 64 threads every 20 ms): one daemon thread looks at them all, and shuts a socket
    within about 0.1 s of its cancel."""
    cancels = [threading.Event() for _ in range(20)]
    watches = [CancelWatch(cancel) for cancel in cancels]
    names = [t.name for t in threading.enumerate()]
    assert names.count("boxmaker-cancel") == 1
    left, right = socket.socketpair()
    try:

        class Stream:
            def get_extra_info(self, name: str) -> object:
                return left if name == "socket" else None

        watches[7].add(Stream())
        cancels[7].set()
        right.settimeout(2)
        start = time.monotonic()
        left.settimeout(2)
        assert left.recv(1) == b""  # shut down: the blocked read ends
        assert time.monotonic() - start < 1.0
    finally:
        for watch in watches:
            watch.stop()
        left.close()
        right.close()
