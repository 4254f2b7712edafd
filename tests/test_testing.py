"""boxmaker.testing: the fakes work as documented (the project's tests and researchers' own)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config
from boxmaker.demo import demo_registry
from boxmaker.errors import SessionFull
from boxmaker.events import Content
from boxmaker.records import Assistant, Baseline, ToolCall, TurnEnd, User
from boxmaker.session import Session
from boxmaker.testing import (
    LlamaScript,
    Reply,
    ScriptedClient,
    answer,
    assert_log_well_formed,
    call,
    calls,
    context_full_reply,
)
from boxmaker.turn import Runtime, run_turn

OSLO = '{"city": "Oslo"}'


def _session(tmp_path: Path) -> Session:
    return Session.create(tmp_path, Baseline(system="sys", tools=demo_registry().definitions()))


def test_the_module_docstring_example_runs(tmp_path: Path) -> None:
    session = _session(tmp_path)
    client = ScriptedClient([calls(call("get_weather", {"city": "Oslo"})), answer("Sunny.")])
    runtime = Runtime(config=Config(), client=client, registry=demo_registry())
    assert run_turn(session, runtime, "Weather in Oslo?").content == "Sunny."
    assert_log_well_formed(session)
    assert len(client.bodies) == 2 and client.bodies[1]["messages"][-1]["role"] == "tool"


def test_the_mock_transport_handler_drives_the_real_client_through_a_turn(tmp_path: Path) -> None:
    script = LlamaScript([Reply(content="", tool_calls=[("c1", "get_weather", OSLO)]), Reply()])
    session = _session(tmp_path)
    with Client(ClientConfig(), transport=httpx.MockTransport(script.handler)) as client:
        runtime = Runtime(config=Config(), client=client, registry=demo_registry())
        events: list[object] = []
        assert run_turn(session, runtime, "Weather?", events.append).content == "ok"
    assert [b["messages"][-1]["role"] for b in script.bodies] == ["user", "tool"]
    assert [e.text for e in events if isinstance(e, Content)] == ["o", "k"]  # a chunk a char
    assert_log_well_formed(session)


def test_the_context_full_reply_ends_the_turn_as_llama_cpp_would(tmp_path: Path) -> None:
    script = LlamaScript([context_full_reply()])
    session = _session(tmp_path)
    with Client(ClientConfig(), transport=httpx.MockTransport(script.handler)) as client:
        runtime = Runtime(config=Config(), client=client, registry=demo_registry())
        with pytest.raises(SessionFull):
            run_turn(session, runtime, "hi")
    assert_log_well_formed(session)


def test_a_call_without_a_result_is_not_well_formed(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(system="sys"))
    calls_made = (ToolCall(id="c1", name="get_weather", arguments=OSLO),)
    session.extend([User(content="hi"), Assistant(content=None, tool_calls=calls_made)])
    with pytest.raises(AssertionError, match="call c1 has 0 results, not 1"):
        assert_log_well_formed(session)


def test_a_turn_without_its_end_is_not_well_formed(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(system="sys"))
    session.extend([User(content="hi"), Assistant(content="hello")])
    with pytest.raises(AssertionError, match="last record is Assistant, not TurnEnd"):
        assert_log_well_formed(session)
    session.append(TurnEnd(outcome="answered"))
    assert_log_well_formed(session)
