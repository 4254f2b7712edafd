"""Issue 24, item 1: what the server can do is read from ``GET /props``, not assumed.

The real client runs behind :class:`httpx.MockTransport` with the fake llama-server's script;
``/props`` answers are literal shapes of llama.cpp's (the 2026-10 build: SmolLM2-135M-Instruct's
template takes no tools and renders no reasoning; the shipped tiny model's takes both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import Reply, Script

from boxmaker.client import Client
from boxmaker.client._caps import capabilities_of
from boxmaker.config import ClientConfig, Config, LoopLimits
from boxmaker.errors import ConfigError, ToolsNotSupported
from boxmaker.events import CapNotEnforced
from boxmaker.records import (
    Baseline,
    Capabilities,
    LimitHit,
    record_from_json,
    record_to_json,
)
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

SMOLLM2_PROPS: dict[str, Any] = {
    "default_generation_settings": {"n_ctx": 4096, "params": {"chat_format": "Content-only"}},
    "total_slots": 4,
    "model_alias": "SmolLM2-135M-Instruct.Q4_1",
    "model_path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
    "chat_template": "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}",
    "chat_template_caps": {
        "supports_object_arguments": False,
        "supports_parallel_tool_calls": False,
        "supports_preserve_reasoning": False,
        "supports_reasoning_effort": False,
        "supports_string_content": True,
        "supports_system_role": True,
        "supports_tool_calls": False,
        "supports_tools": False,
        "supports_typed_content": False,
    },
}

TINY_PROPS: dict[str, Any] = {
    **SMOLLM2_PROPS,
    "total_slots": 1,
    "model_alias": "tiny-agent",
    "chat_template": "{% if message.reasoning_content %}<think>{% endif %}",
    "chat_template_caps": {
        **SMOLLM2_PROPS["chat_template_caps"],
        "supports_tools": True,
        "supports_tool_calls": True,
        "supports_parallel_tool_calls": True,
        "supports_preserve_reasoning": True,
    },
}


def weather(city: str) -> str:
    """Weather for a city."""
    return json.dumps({"city": city})


class Server:
    """The fake's script behind MockTransport, with a ``/props`` answer and a request log."""

    def __init__(self, props: Any, replies: list[Reply], status: int = 200) -> None:
        self.script = Script(replies)
        self.props, self.status = props, status
        self.paths: list[str] = []

    def handler(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(f"{request.method} {request.url.path}")
        if request.url.path == "/props":
            return httpx.Response(self.status, json=self.props)
        return self.script.handler(request)


def _run(
    tmp_path: Path, server: Server, *, tools: bool = True, **client: Any
) -> tuple[Session, Runtime]:
    registry = Registry()
    registry.add(weather)
    baseline = Baseline(system="sys", tools=registry.definitions() if tools else ())
    session = Session.create(tmp_path, baseline)
    config = Config(client=ClientConfig(url="http://llama", **client))
    http = Client(config.client, transport=httpx.MockTransport(server.handler))
    return session, Runtime(config=config, client=http, registry=registry)


def test_props_of_a_template_without_tools_read_as_they_are() -> None:
    caps = capabilities_of(SMOLLM2_PROPS)
    assert caps is not None
    assert (caps.supports_tools, caps.supports_tool_calls, caps.supports_parallel_tool_calls) == (
        False,
        False,
        False,
    )
    assert (caps.supports_system_role, caps.supports_preserve_reasoning, caps.reasoning) == (
        True,
        False,
        False,
    )
    assert (caps.slots, caps.n_ctx, caps.model) == (4, 4096, "SmolLM2-135M-Instruct.Q4_1")
    assert (caps.kv_unified, caps.n_swa, caps.cache_ram_mib) == (None, None, None)
    assert caps.detail == "/props does not say: kv_unified, n_swa, cache_ram_mib"


def test_props_fields_a_newer_build_exposes_are_read() -> None:
    props = {**TINY_PROPS, "kv_unified": True, "n_swa": 512}
    props["default_generation_settings"] = {"n_ctx": 4096, "cache_ram_mib": 8192}
    caps = capabilities_of(props)
    assert caps is not None
    assert (caps.kv_unified, caps.n_swa, caps.cache_ram_mib, caps.reasoning) == (
        True,
        512,
        8192,
        True,
    )
    assert caps.detail == ""


@pytest.mark.parametrize("answer", [{"status": "ok"}, [], "props", None])
def test_an_answer_that_states_nothing_gives_no_capabilities(answer: Any) -> None:
    assert capabilities_of(answer) is None


def test_capabilities_record_round_trips_through_the_log_json() -> None:
    caps = capabilities_of(SMOLLM2_PROPS)
    assert caps is not None
    data = json.loads(json.dumps(record_to_json(caps)))
    assert data["type"] == "capabilities"
    assert record_from_json(data) == caps
    with pytest.raises(ValueError, match="supports_tools = 'yes' is not bool or null"):
        record_from_json({**data, "supports_tools": "yes"})


def test_tools_offered_to_a_template_without_them_is_an_error_before_anything_is_sent(
    tmp_path: Path,
) -> None:
    """Before: the server dropped the tools silently and the turn was logged ``answered``."""
    server = Server(SMOLLM2_PROPS, [Reply(content="The weather in Oslo is warm")])
    session, runtime = _run(tmp_path, server)
    with pytest.raises(ToolsNotSupported) as info:
        run_turn(session, runtime, "weather in Oslo?")
    assert "SmolLM2-135M-Instruct.Q4_1" in str(info.value)
    assert "drops the 1 tool(s) from the prompt" in str(info.value)
    assert 'client.unsupported_tools = "warn"' in str(info.value)
    assert server.paths == ["GET /props"]  # no chat request
    [caps] = Session.open(session.path, read_only=True).records
    assert isinstance(caps, Capabilities) and caps.supports_tools is False
    assert caps.warning is not None and "cannot take tools" in caps.warning
    with pytest.raises(ToolsNotSupported):  # the next turn reads it from the log
        run_turn(session, runtime, "again")
    assert server.paths == ["GET /props"]


def test_with_warn_the_turn_runs_and_the_warning_is_recorded(tmp_path: Path) -> None:
    server = Server(SMOLLM2_PROPS, [Reply(content="warm")])
    session, runtime = _run(tmp_path, server, unsupported_tools="warn")
    assert run_turn(session, runtime, "weather?").content == "warm"
    run_turn(session, runtime, "again")
    kinds = [type(r).__name__ for r in session.records]
    assert kinds[:2] == ["Capabilities", "User"]
    assert kinds.count("Capabilities") == 1  # read once per session
    assert server.paths.count("GET /props") == 1


def test_a_session_without_tools_runs_on_a_template_without_them(tmp_path: Path) -> None:
    server = Server(SMOLLM2_PROPS, [Reply(content="hi")])
    session, runtime = _run(tmp_path, server, tools=False)
    assert run_turn(session, runtime, "hello").content == "hi"
    caps = session.records[0]
    assert isinstance(caps, Capabilities) and caps.warning is None


@pytest.mark.parametrize(("props", "status"), [({"status": "ok"}, 200), ({}, 404)])
def test_a_server_that_does_not_say_gets_no_record_and_no_refusal(
    tmp_path: Path, props: Any, status: int
) -> None:
    server = Server(props, [Reply(content="hi")], status=status)
    session, runtime = _run(tmp_path, server)
    assert run_turn(session, runtime, "hello").content == "hi"
    assert not any(isinstance(r, Capabilities) for r in session.records)


def test_unsupported_tools_knob_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"client\.unsupported_tools = 'ignore' is not one of"):
        ClientConfig(unsupported_tools="ignore")


def test_the_thinking_cap_on_a_model_without_reasoning_says_so_and_is_no_limit_hit(
    tmp_path: Path,
) -> None:
    """Before: "start llama-server with --jinja; --reasoning-format ..." and a LimitHit."""
    server = Server(SMOLLM2_PROPS, [Reply(content="hello there")])
    session, runtime = _run(tmp_path, server, tools=False)
    runtime.config = Config(client=runtime.config.client, loop=LoopLimits(thinking_tokens=50))
    events: list[object] = []
    run_turn(session, runtime, "hi", events.append)
    [warned] = [e for e in events if isinstance(e, CapNotEnforced)]
    assert warned.detail.startswith("the model does not reason: its chat template renders no")
    assert "--jinja" not in warned.detail
    assert not any(isinstance(r, LimitHit) for r in session.records)


def test_the_thinking_cap_without_capabilities_still_names_the_server_flags(
    tmp_path: Path,
) -> None:
    server = Server({"status": "ok"}, [Reply(content="hello there")])
    session, runtime = _run(tmp_path, server, tools=False)
    runtime.config = Config(client=runtime.config.client, loop=LoopLimits(thinking_tokens=50))
    run_turn(session, runtime, "hi")
    [hit] = [r for r in session.records if isinstance(r, LimitHit)]
    assert "no reasoning seen" in hit.detail


def test_no_turn_scans_the_log_for_its_capabilities(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38, item 3: a log without a ``Capabilities`` record (a client that cannot say)
    is not read through at each turn: the session keeps its first such record."""
    session = Session.create(tmp_path, Baseline())
    runtime = Runtime(config=Config(), client=ScriptedClient([answer("a")]), registry=Registry())
    run_turn(session, runtime, "one")

    def refused(self: Session) -> tuple[Any, ...]:
        raise AssertionError("the turn read every record")

    monkeypatch.setattr(Session, "records", property(refused))
    runtime = Runtime(config=Config(), client=ScriptedClient([answer("b")]), registry=Registry())
    assert run_turn(session, runtime, "two").content == "b"
    monkeypatch.undo()
    caps = Capabilities(supports_tools=True)
    session.append(caps)
    session.append(Capabilities(supports_tools=False))
    assert session.capabilities() == caps  # the first one counts
