"""A completion refused client-side is still a completion (issue 35, item 6).

More calls than ``loop.tool_calls_per_completion``, arguments past ``loop.tool_argument_chars``,
a stream past its token bound: the server ran the completion, so its ``Assistant`` (with the
calls it held) and its ``Usage`` are logged, every call is answered ``not_run`` with the
reason, then the ``LimitHit`` and the ``TurnEnd``; the frames count it.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.errors import StreamStopped, TurnError, TurnLimit
from boxmaker.events import ClientEvent, ToolCallDelta
from boxmaker.frames import requests, summary
from boxmaker.records import Assistant, Baseline, LimitHit, ToolResult, TurnEnd, Usage
from boxmaker.session import Session
from boxmaker.testing import (
    LlamaScript,
    Reply,
    ScriptedClient,
    Step,
    assert_log_well_formed,
    call,
)
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn


def registry() -> Registry:
    tools = Registry()

    @tools.add
    def weather(city: str) -> str:
        """Weather for a city.

        Args:
            city: the city.
        """
        return f"sunny in {city}"

    return tools


def pairs(session: Session) -> list[tuple[Assistant, Usage]]:
    """Each Assistant with the record after it, which must be its Usage."""
    records = session.records
    out = []
    for i, record in enumerate(records):
        if isinstance(record, Assistant):
            usage = records[i + 1]
            assert isinstance(usage, Usage), f"Assistant at {i} followed by {usage!r}"
            out.append((record, usage))
    assert len(out) == sum(isinstance(r, Usage) for r in records)
    return out


# --- the real client: the stream is closed, what arrived is the completion ---------------------


def test_the_client_gives_a_stopped_stream_what_arrived() -> None:
    script = LlamaScript(
        [Reply(content="", tool_calls=[(f"c{i}", "weather", '{"city": "x"}') for i in range(5)])]
    )
    client = Client(ClientConfig(retry_attempts=0), transport=httpx.MockTransport(script.handler))

    def stop_at_the_third_call(event: ClientEvent) -> None:
        if isinstance(event, ToolCallDelta) and event.index == 2:
            raise StreamStopped("three calls are enough")

    with pytest.raises(StreamStopped) as info:
        client.chat({"messages": []}, stop_at_the_third_call)
    got = info.value.completion
    assert got is not None and got.finish_reason is None  # type: ignore[attr-defined]
    assert [c.id for c in got.tool_calls] == ["c0", "c1", "c2"]  # type: ignore[attr-defined]


def test_a_whole_json_answer_stopped_is_the_whole_answer() -> None:
    message = {"role": "assistant", "content": "Hi"}
    answer = {"id": "w", "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    client = Client(ClientConfig(retry_attempts=0), transport=transport)

    def stop(event: ClientEvent) -> None:
        raise StreamStopped("no")

    with pytest.raises(StreamStopped) as info:
        client.chat({"messages": []}, lambda e: stop(e) if type(e).__name__ == "Content" else None)
    assert info.value.completion.content == "Hi"  # type: ignore[attr-defined]


def test_a_refused_completion_is_logged_with_its_calls_through_the_client(tmp_path: Path) -> None:
    calls = [(f"c{i}", "weather", json.dumps({"city": f"city{i}"})) for i in range(4)]
    script = LlamaScript([Reply(content="", tool_calls=calls), Reply(content="fine")])
    client = Client(ClientConfig(retry_attempts=0), transport=httpx.MockTransport(script.handler))
    session = Session.create(tmp_path, Baseline(system="s", tools=registry().definitions()))
    config = Config(loop=LoopLimits(tool_calls_per_completion=2))
    runtime = Runtime(config=config, client=client, registry=registry())
    with pytest.raises(TurnLimit, match="tool_calls"):
        run_turn(session, runtime, "weather everywhere")
    ((assistant, usage),) = pairs(session)
    assert [c.id for c in assistant.tool_calls] == ["c0", "c1", "c2"]  # the third crossed it
    assert usage.finish_reason is None and usage.timings == {}
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [(r.tool_call_id, r.not_run) for r in results] == [
        ("c0", "tool_calls"),
        ("c1", "tool_calls"),
        ("c2", "tool_calls"),
    ]
    hit, end = session.records[-2:]
    assert isinstance(hit, LimitHit) and hit.kind == "tool_calls"
    assert isinstance(end, TurnEnd) and end.outcome == "tool_calls"
    assert_log_well_formed(session)
    assert run_turn(session, runtime, "and now?").content == "fine"  # the next turn goes on
    assert list(requests(session).finish_reason.isna()) == [True, False]
    assert int(summary(session).requests.iloc[0]) == 2  # the frames count it


# --- the property: no completion the server ran goes unlogged -----------------------------------


@st.composite
def steps(draw: st.DrawFn) -> Step:
    n_calls = draw(st.integers(0, 5))
    sizes = draw(st.lists(st.integers(1, 60), min_size=n_calls, max_size=n_calls))
    made = [call("weather", {"city": "c" * size}, f"id{i}") for i, size in enumerate(sizes)]
    content = draw(st.none() | st.text("ab", min_size=1, max_size=40))
    return Step(content=content, reasoning=draw(st.text("r", max_size=20)), tool_calls=made)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(steps(), min_size=1, max_size=6),
    calls_cap=st.none() | st.integers(1, 4),
    args_cap=st.none() | st.integers(10, 60),
    tokens_cap=st.none() | st.integers(3, 40),
    turns=st.integers(1, 3),
)
def test_no_completion_the_server_ran_is_missing_from_the_log(
    tmp_path_factory: pytest.TempPathFactory,
    script: list[Step],
    calls_cap: int | None,
    args_cap: int | None,
    tokens_cap: int | None,
    turns: int,
) -> None:
    """Random completions, random client-side bounds: each request the server answered has
    its Assistant and Usage, in that order, and the log stays well formed."""
    session = Session.create(
        tmp_path_factory.mktemp("s"), Baseline(system="s", tools=registry().definitions())
    )
    for k, step in enumerate(script):  # call ids unique in the session, as a server's are
        step.tool_calls = [
            call(c.name, c.arguments, f"s{k}c{i}") for i, c in enumerate(step.tool_calls)
        ]
    client = ScriptedClient(script)
    loop = LoopLimits(
        tool_calls_per_completion=calls_cap if calls_cap is not None else -1,
        tool_argument_chars=args_cap if args_cap is not None else -1,
        completion_tokens=tokens_cap if tokens_cap is not None else -1,
        repeat_detection=False,
    )
    config = Config(loop=loop, sampling=SamplingConfig(max_tokens=None))
    runtime = Runtime(config=config, client=client, registry=registry())
    for n in range(turns):
        with contextlib.suppress(TurnError):
            run_turn(session, runtime, f"turn {n}")
    assert len(pairs(session)) == len(client.bodies)
    assert_log_well_formed(session)


def test_the_property_sees_refusals() -> None:
    """The strategy above does make refused completions (not only answers)."""
    kinds: set[str] = set()

    @settings(max_examples=60, deadline=None)
    @given(script=st.lists(steps(), min_size=1, max_size=3), cap=st.integers(1, 2))
    def probe(script: list[Step], cap: int) -> None:
        with tempfile.TemporaryDirectory() as folder:
            session = Session.create(
                Path(folder), Baseline(system="s", tools=registry().definitions())
            )
            loop = LoopLimits(tool_calls_per_completion=cap, tool_argument_chars=40)
            runtime = Runtime(
                config=Config(loop=loop), client=ScriptedClient(script), registry=registry()
            )
            try:
                run_turn(session, runtime, "go")
            except TurnLimit as exc:
                kinds.add(exc.kind)
            session.close()

    probe()
    assert {"tool_calls", "tool_arguments"} <= kinds


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    script=st.lists(steps(), min_size=1, max_size=4),
    calls_cap=st.integers(1, 4),
    args_cap=st.integers(10, 60),
    tokens_cap=st.integers(3, 40),
)
def test_no_completion_is_missing_through_the_real_client(
    tmp_path_factory: pytest.TempPathFactory,
    script: list[Step],
    calls_cap: int,
    args_cap: int,
    tokens_cap: int,
) -> None:
    """The same property with the real client closing a real (mock) stream."""
    replies = [
        Reply(
            content=step.content or "",
            reasoning=step.reasoning or "",
            tool_calls=[(f"s{k}c{i}", c.name, c.arguments) for i, c in enumerate(step.tool_calls)],
            id=f"chatcmpl-{k}",
        )
        for k, step in enumerate(script)
    ]
    llama = LlamaScript([*replies, Reply(content="ok")])
    client = Client(ClientConfig(retry_attempts=0), transport=httpx.MockTransport(llama.handler))
    session = Session.create(
        tmp_path_factory.mktemp("s"), Baseline(system="s", tools=registry().definitions())
    )
    loop = LoopLimits(
        tool_calls_per_completion=calls_cap,
        tool_argument_chars=args_cap,
        completion_tokens=tokens_cap,
        repeat_detection=False,
    )
    config = Config(loop=loop, sampling=SamplingConfig(max_tokens=None))
    runtime = Runtime(config=config, client=client, registry=registry())
    with contextlib.suppress(TurnError):
        run_turn(session, runtime, "go")
    assert len(pairs(session)) == len(llama.bodies)
    assert_log_well_formed(session)
