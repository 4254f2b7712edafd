"""The turn's client-side bounds (issue 23): whatever the server does, every turn ends.

A server that streams for ever (content, or reasoning past the thinking cap while it ignores
``thinking_budget_tokens`` and ``reasoning_end``), too many completions, a turn past its
deadline, thousands of tool calls or huge arguments in one completion: each ends the turn
with its own ``TurnLimit`` kind, a ``LimitHit`` and a ``TurnEnd`` of that outcome, and the
log stays well formed so the next turn goes on.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import SSE_HEAD, FakeLlama, Raw, Stall, running
from fakes import ScriptedClient, Step, answer, call, calls

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.errors import ConfigError, TurnLimit
from boxmaker.frames import limit_hits, turns
from boxmaker.records import Assistant, Baseline, LimitHit, ToolResult, TurnEnd, Usage
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import THINKING_GRACE, TOKEN_GRACE, Runtime, run_turn
from boxmaker.turn._bounds import TurnBounds


def weather(city: str) -> str:
    """Weather for a city."""
    return json.dumps({"city": city, "temperature": 12})


def registry() -> Registry:
    tools = Registry()
    tools.add(weather)
    return tools


def session_at(tmp_path: Path) -> Session:
    return Session.create(tmp_path, Baseline(system="sys", tools=registry().definitions()))


def chunk(delta: dict[str, Any]) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": None}], "id": "c-1"}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Endless(httpx.SyncByteStream):
    """A stream that never ends: ``first`` (llama.cpp's opening chunk, when given), then the
    same chunk for ever; counts the chunks read (not ``first``)."""

    def __init__(self, data: bytes, first: bytes = b"") -> None:
        self.data = data
        self.first = first
        self.sent = 0
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        if self.first:
            yield self.first
        while True:
            self.sent += 1
            yield self.data

    def close(self) -> None:
        self.closed = True


def endless_server(data: bytes, first: bytes = b"") -> tuple[Client, Endless, list[dict[str, Any]]]:
    """A client whose server streams ``first`` then ``data`` for ever and accepts every
    ``reasoning_end`` (``success: true``) without ending anything; also returns the control
    requests."""
    stream = Endless(data, first)
    controls: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(json.loads(request.content))
            return httpx.Response(200, json={"success": True})
        if request.url.path == "/props":  # the loop asks once per session: not a llama-server's
            return httpx.Response(404)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    config = ClientConfig(retry_attempts=0)
    return Client(config, transport=httpx.MockTransport(handler)), stream, controls


def ending(session: Session) -> tuple[list[LimitHit], TurnEnd]:
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    end = session.records[-1]
    assert isinstance(end, TurnEnd)
    return hits, end


def test_a_server_that_streams_for_ever_is_stopped_at_the_token_bound(tmp_path: Path) -> None:
    client, stream, _ = endless_server(chunk({"content": "x"}))
    session = session_at(tmp_path)
    config = Config(
        loop=LoopLimits(completion_tokens=500), sampling=SamplingConfig(max_tokens=None)
    )
    runtime = Runtime(config=config, client=client, registry=registry())
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "Hi")
    assert (info.value.kind, info.value.value, info.value.limit) == ("completion_tokens", 501, 500)
    assert stream.sent == 501 and stream.closed
    hits, end = ending(session)
    assert [h.kind for h in hits] == ["completion_tokens"]
    assert end.outcome == "completion_tokens"
    # the server ran it: what arrived is kept, its cost unknown (the last chunk never came)
    (assistant,) = [r for r in session.records if isinstance(r, Assistant)]
    (usage,) = [r for r in session.records if isinstance(r, Usage)]
    assert assistant.content == "x" * 501 and assistant.tool_calls == ()
    assert (usage.timings, usage.finish_reason, usage.prompt_tokens) == ({}, None, None)


def test_max_tokens_is_enforced_by_the_client_too(tmp_path: Path) -> None:
    client, stream, _ = endless_server(chunk({"content": "x"}))
    session = session_at(tmp_path)
    runtime = Runtime(
        config=Config(sampling=SamplingConfig(max_tokens=100)), client=client, registry=registry()
    )
    with pytest.raises(TurnLimit, match="max_tokens 100") as info:
        run_turn(session, runtime, "Hi")
    assert info.value.limit == 100 + TOKEN_GRACE
    assert stream.sent == 100 + TOKEN_GRACE + 1


def test_reasoning_past_the_thinking_cap_is_stopped(tmp_path: Path) -> None:
    """The issue's 74,030 chunks with a thinking cap of 64: the server ignores the budget and
    says yes to ``reasoning_end`` but reasons on."""
    opening = chunk({"role": "assistant", "content": None})  # llama.cpp's first chunk
    client, stream, controls = endless_server(chunk({"reasoning_content": "r"}), opening)
    session = session_at(tmp_path)
    loop = LoopLimits(thinking_tokens=64, completion_tokens=None)
    config = Config(loop=loop, sampling=SamplingConfig(max_tokens=None))
    runtime = Runtime(config=config, client=client, registry=registry())
    with pytest.raises(TurnLimit, match="ignoring thinking_budget_tokens") as info:
        run_turn(session, runtime, "Hi")
    assert (info.value.kind, info.value.limit) == ("completion_tokens", 64 + THINKING_GRACE)
    assert stream.sent == 64 + THINKING_GRACE + 1
    assert [c["action"] for c in controls] == ["reasoning_end"]  # the fallback was tried first
    assert ending(session)[1].outcome == "completion_tokens"


def test_completions_per_turn(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": f"c{i}"})) for i in range(10)]
    session = session_at(tmp_path)
    client = ScriptedClient(steps)
    loop = LoopLimits(tool_iterations=None, completions=3)
    runtime = Runtime(config=Config(loop=loop), client=client, registry=registry())
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "Hi")
    assert (info.value.kind, info.value.value, info.value.limit) == ("completions", 4, 3)
    assert len(client.bodies) == 3
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.not_run for r in results] == [None, None, None]  # each call of the 3 was run
    assert ending(session)[1].outcome == "completions"


def test_too_many_tool_calls_in_one_completion_run_none(tmp_path: Path) -> None:
    many = calls(*(call("weather", {"city": f"c{i}"}, f"id{i}") for i in range(5000)))
    session = session_at(tmp_path)
    client = ScriptedClient([many, answer("fine")])
    loop = LoopLimits(tool_calls_per_completion=64)
    runtime = Runtime(config=Config(loop=loop), client=client, registry=registry())
    ran: list[str] = []
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "Hi", on_event=lambda e: ran.append(type(e).__name__))
    assert (info.value.kind, info.value.value, info.value.limit) == ("tool_calls", 65, 64)
    assert "ToolCallStarted" not in ran
    # a refused completion is still a completion: its calls kept, each answered 'not run'
    (assistant,) = [r for r in session.records if isinstance(r, Assistant)]
    assert [c.id for c in assistant.tool_calls] == [f"id{i}" for i in range(65)]
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.tool_call_id for r in results] == [f"id{i}" for i in range(65)]
    assert {r.not_run for r in results} == {"tool_calls"}
    assert "more than 64 tool calls" in results[0].content
    assert ending(session)[1].outcome == "tool_calls"
    assert run_turn(session, runtime, "again").content == "fine"  # the next turn goes on


def test_huge_arguments_are_stopped_as_they_stream(tmp_path: Path) -> None:
    big = Step(tool_calls=[call("weather", {"city": "x" * 5000})])
    session = session_at(tmp_path)
    client = ScriptedClient([big])
    loop = LoopLimits(tool_argument_chars=1000)
    runtime = Runtime(config=Config(loop=loop), client=client, registry=registry())
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "Hi")
    assert (info.value.kind, info.value.limit) == ("tool_arguments", 1000)
    assert info.value.value > 5000
    assert ending(session)[1].outcome == "tool_arguments"


def test_the_call_bounds_hold_for_a_client_that_sends_no_deltas(tmp_path: Path) -> None:
    class Quiet(ScriptedClient):
        def chat_with_retry(self, body: dict[str, Any], on_event: Any, **kw: Any) -> Any:
            return super().chat_with_retry(body, lambda event: None, **kw)

    session = session_at(tmp_path)
    client = Quiet([calls(*(call("weather", {"city": f"c{i}"}, f"q{i}") for i in range(3)))])
    loop = LoopLimits(tool_calls_per_completion=2)
    runtime = Runtime(config=Config(loop=loop), client=client, registry=registry())
    with pytest.raises(TurnLimit, match="tool_calls"):
        run_turn(session, runtime, "Hi")


def test_a_turn_past_its_deadline_ends_as_turn_deadline(tmp_path: Path) -> None:
    """The server accepts the request and then says nothing (a real socket; the idle and
    silence timeouts are far away): the deadline closes the connection."""
    with running([Raw([SSE_HEAD, Stall()])]) as server:
        assert isinstance(server, FakeLlama)
        cfg = ClientConfig(url=server.url, retry_attempts=0, idle_timeout_s=60.0)
        with Client(cfg) as client:
            config = Config(client=cfg, loop=LoopLimits(turn_deadline_s=0.3))
            runtime = Runtime(config=config, client=client, registry=registry())
            session = session_at(tmp_path)
            with pytest.raises(TurnLimit) as info:
                run_turn(session, runtime, "Hi")
            server.release.set()
    assert info.value.kind == "turn_deadline"
    hits, end = ending(session)
    assert [h.kind for h in hits] == ["turn_deadline"]
    assert end.outcome == "turn_deadline" and "past its deadline of 0.3 s" in (end.detail or "")


def test_a_deadline_while_a_port_tool_waits(tmp_path: Path) -> None:
    """The deadline sets the cancel a waiting tool watches; its call and the rest are
    answered 'not run' with the reason ``turn_deadline``."""
    gate = threading.Event()

    def slow(city: str) -> str:
        """Waits for the test."""
        gate.wait(0.5)  # a local tool is not interrupted: the turn ends when it returns
        return "late"

    tools = Registry()
    tools.add(slow)
    session = Session.create(tmp_path, Baseline(tools=tools.definitions()))
    client = ScriptedClient(
        [calls(call("slow", {"city": "a"}, "a"), call("slow", {"city": "b"}, "b"))]
    )
    config = Config(loop=LoopLimits(turn_deadline_s=0.1))
    runtime = Runtime(config=config, client=client, registry=tools)
    with pytest.raises(TurnLimit, match="turn_deadline"):
        run_turn(session, runtime, "Hi")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [(r.tool_call_id, r.not_run) for r in results] == [("a", None), ("b", "turn_deadline")]


def test_the_frames_count_each_bound(tmp_path: Path) -> None:
    client, _, _ = endless_server(chunk({"content": "x"}))
    session = session_at(tmp_path)
    config = Config(loop=LoopLimits(completion_tokens=10))
    with pytest.raises(TurnLimit):
        run_turn(session, Runtime(config=config, client=client, registry=registry()), "Hi")
    hits = limit_hits(session)
    assert list(hits.kind) == ["completion_tokens"] and list(hits.ended_turn) == [True]
    assert list(turns(session).outcome) == ["completion_tokens"]


@pytest.mark.parametrize(
    "knob", ["completion_tokens", "completions", "tool_calls_per_completion", "tool_argument_chars"]
)
def test_bounds_are_knobs(knob: str) -> None:
    off: dict[str, Any] = {knob: -1}
    assert getattr(LoopLimits(**off), knob) is None
    with pytest.raises(ConfigError, match=f"loop.{knob} = 0 is out of range"):
        LoopLimits(**{knob: 0})  # type: ignore[arg-type]


def test_the_deadline_knob() -> None:
    assert LoopLimits().turn_deadline_s == 1800.0
    assert LoopLimits(turn_deadline_s=-1).turn_deadline_s is None
    for bad in (0, float("nan"), "5"):
        with pytest.raises(ConfigError, match="turn_deadline_s"):
            LoopLimits(turn_deadline_s=bad)  # type: ignore[arg-type]


def test_the_deadline_needs_no_thread() -> None:
    """Issue 38: a turn's deadline is a time the turn's cancel compares with the clock when
    asked (every waiter asks within PARENT_POLL_S), not a timer thread per turn."""
    now = [100.0]
    caller = threading.Event()
    before = threading.active_count()
    with TurnBounds(Config(loop=LoopLimits(turn_deadline_s=5.0)), caller, lambda: now[0]) as b:
        assert threading.active_count() == before
        assert not b.cancel.is_set() and not b.expired
        now[0] = 105.0
        assert b.cancel.is_set() and b.expired
        assert b.cancel.wait(0)  # set for good: a waiter sees it too
        limit = b.cancelled("x")
        assert isinstance(limit, TurnLimit) and limit.kind == "turn_deadline"
    assert not caller.is_set()  # the caller's token is never set by the deadline
    with TurnBounds(Config(loop=LoopLimits(turn_deadline_s=5.0)), caller, lambda: now[0]) as b:
        pass
    now[0] = 1000.0
    assert not b.cancel.is_set()  # the turn is over: its deadline no longer counts
