"""MCP servers as the tool port: real servers (the SDK's server API, tests/mcp_servers.py) over
stdio (a subprocess) and streamable HTTP (a subprocess on 127.0.0.1, a free port)."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp_servers import start_http, stdio_command

from boxmaker.cli import main
from boxmaker.client import Client
from boxmaker.config import (
    ApprovalPolicy,
    ClientConfig,
    Config,
    LoopLimits,
    McpServerConfig,
    SamplingConfig,
    load_config,
)
from boxmaker.demo import get_time, get_weather
from boxmaker.errors import ConfigError, ToolPortError
from boxmaker.records import Approval, Baseline, ToolResult
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer, call, calls
from boxmaker.tools import InProcessPort, Registry, ToolHints, ToolOk, ToolRequest, dispatch
from boxmaker.tools.approval import ApprovalPort, PendingCall
from boxmaker.tools.mcp import McpPort
from boxmaker.turn import Runtime, run_turn

OSLO = '{"city": "Oslo"}'


@pytest.fixture(scope="module")
def stdio_port() -> Iterator[McpPort]:
    server = McpServerConfig(name="local", command=stdio_command(), timeout_s=20)
    with McpPort([server]) as port:
        yield port


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    process, url = start_http()
    try:
        yield url
    finally:
        process.kill()
        process.wait()


def _of_type(session: Session, kind: type) -> list[Any]:
    return [r for r in session.records if isinstance(r, kind)]


def _registry(port: McpPort) -> Registry:
    registry = Registry()
    port.register(registry)
    return registry


def test_stdio_server_tools_join_the_registry_with_their_schemas(stdio_port: McpPort) -> None:
    registry = _registry(stdio_port)
    assert registry.names == ("get_weather", "get_time", "forget_city", "fail", "crash", "hang")
    weather = registry.get("get_weather")
    assert weather is not None and weather.function is None  # a port tool
    assert weather.description.startswith("Get the current weather in a city.")
    assert weather.parameters["properties"]["city"]["type"] == "string"
    assert weather.parameters["required"] == ["city"]
    assert stdio_port.hints("get_weather") == ToolHints(
        read_only=True, destructive=True, idempotent=False, open_world=False
    )
    assert stdio_port.hints("get_time") == ToolHints()  # no annotations: the MCP defaults
    assert stdio_port.hints("forget_city") == ToolHints(destructive=True, open_world=False)
    assert stdio_port.hints("nope") is None


def test_stdio_call_maps_text_and_names_the_server(stdio_port: McpPort) -> None:
    registry = _registry(stdio_port)
    out = dispatch(registry, "get_weather", OSLO, port=stdio_port, call=1)
    assert out.content == get_weather("Oslo")
    assert (out.server, out.untrusted, out.data_class, out.not_run) == (
        "local",
        False,
        "public",
        None,
    )
    # get_time has no openWorldHint: open world by the MCP default, so untrusted
    out = dispatch(registry, "get_time", OSLO, port=stdio_port, call=2)
    assert (out.content, out.untrusted) == (get_time("Oslo"), True)


def test_is_error_is_a_failure_naming_the_server(stdio_port: McpPort) -> None:
    out = dispatch(_registry(stdio_port), "fail", OSLO, port=stdio_port, call=1)
    assert out.content == "The tool failed: Error executing tool fail"
    assert out.server == "local"


def test_a_server_that_dies_mid_call_fails_and_is_restarted(stdio_port: McpPort) -> None:
    registry = _registry(stdio_port)
    before = stdio_port.restarts["local"]
    out = dispatch(registry, "crash", OSLO, port=stdio_port, call=1)
    assert out.content.startswith("The tool failed: local failed during the call: ")
    assert "(the server said: crashing on Oslo)" in out.content
    assert out.server == "local"
    again = dispatch(registry, "get_weather", OSLO, port=stdio_port, call=2)
    assert again.content == get_weather("Oslo")
    assert stdio_port.restarts["local"] == before + 1


def test_a_hung_server_is_left_on_cancel_and_restarted(stdio_port: McpPort) -> None:
    registry = _registry(stdio_port)
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    out = dispatch(registry, "hang", OSLO, port=stdio_port, call=1, cancel=cancel)
    waited = time.monotonic() - started
    assert out.content == (
        "The tool failed: local: the call was cancelled; the server is restarted for the next call"
    )
    assert waited < 5  # the server would hang for an hour; the cancel is seen within ~0.3 s
    again = dispatch(registry, "get_time", OSLO, port=stdio_port, call=2)
    assert again.content == get_time("Oslo")


def test_http_server_answers_and_a_hung_call_times_out(http_url: str) -> None:
    server = McpServerConfig(name="remote", url=http_url, timeout_s=0.5, data_class="internal")
    with McpPort([server]) as port:
        registry = _registry(port)
        out = dispatch(registry, "get_weather", '{"city": "Lima"}', port=port, call=1)
        assert (out.content, out.server, out.data_class) == (
            get_weather("Lima"),
            "remote",
            "internal",
        )
        hung = dispatch(registry, "hang", OSLO, port=port, call=2)
        assert hung.content == (
            "The tool failed: remote: no answer within 0.5 s; the server is restarted for the "
            "next call"
        )
        again = dispatch(registry, "get_time", '{"city": "Lima"}', port=port, call=3)
        assert again.content == get_time("Lima")
        assert port.restarts["remote"] == 1


def test_two_servers_with_one_tool_name_are_refused_or_prefixed(http_url: str) -> None:
    a = McpServerConfig(name="a", url=http_url)
    b = McpServerConfig(name="b", url=http_url)
    with pytest.raises(ConfigError, match="'get_weather' is offered by MCP servers 'a' and 'b'"):
        McpPort([a, b])
    b = McpServerConfig(name="b", url=http_url, prefix="b_")
    with McpPort([a, b]) as port:
        registry = _registry(port)
        assert "get_weather" in registry and "b_get_weather" in registry
        out = dispatch(registry, "b_get_weather", OSLO, port=port, call=1)
        assert (out.content, out.server) == (get_weather("Oslo"), "b")
        with pytest.raises(ConfigError, match="offers nope"):
            port.register(Registry(), only=("get_time", "nope"))
        taken = Registry()
        taken.add(get_weather)
        with pytest.raises(ConfigError, match="'get_weather' of MCP server 'a' is registered"):
            port.register(taken)


def test_a_server_that_cannot_start_is_a_tool_port_error(tmp_path: Path) -> None:
    missing = McpServerConfig(name="gone", command=(str(tmp_path / "no-such-server"),))
    with pytest.raises(ToolPortError, match="MCP server 'gone' could not start"):
        McpPort([missing])


def test_a_server_that_never_answers_the_handshake_is_given_up(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    code = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    silent = McpServerConfig(name="mute", command=(sys.executable, "-c", code), start_timeout_s=2)
    with pytest.raises(ToolPortError, match="'mute' could not start: mute: not ready within 2 s"):
        McpPort([silent])
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the port ended the process it gave up on
        os.kill(pid, 0)


def test_config_file_names_servers_and_approval(tmp_path: Path) -> None:
    path = tmp_path / "boxmaker.toml"
    path.write_text(
        '[[mcp.servers]]\nname = "weather"\ncommand = ["python", "server.py"]\ntimeout_s = 5\n'
        "partial_line_s = 0.5\n"
        '[[mcp.servers]]\nname = "web"\nurl = "http://127.0.0.1:9/mcp"\nprefix = "web_"\n'
        '[approval]\ntools = ["forget_city"]\ndestructive = true\ntimeout_s = -1\n'
    )
    config = load_config(path)
    weather, web = config.mcp.servers
    assert (weather.name, weather.command, weather.url, weather.timeout_s) == (
        "weather",
        ("python", "server.py"),
        None,
        5.0,
    )
    assert (web.url, web.prefix, web.command) == ("http://127.0.0.1:9/mcp", "web_", ())
    assert (weather.partial_line_s, web.partial_line_s) == (0.5, 5.0)
    assert config.approval.tools == ("forget_city",)
    assert config.approval.destructive and config.approval.timeout_s is None
    assert Config().mcp.servers == () and Config().approval.timeout_s == 120.0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('[[mcp.servers]]\nname = "x"\n', "give either command"),
        ('[[mcp.servers]]\nname = "x"\ncommand = ["a"]\nurl = "http://h/"\n', "not both"),
        ('[[mcp.servers]]\ncommand = ["a"]\n', "name"),
        ('[[mcp.servers]]\nname = "x"\nurl = "ftp://h/"\n', "not an http"),
        ('[[mcp.servers]]\nname = "x"\ncommand = "a b"\n', "is not a list"),
        ('[[mcp.servers]]\nname = "x"\ncommand = ["a"]\nbogus = 1\n', "unknown key 'bogus'"),
        ('[[mcp.servers]]\nname = "x"\ncommand = ["a"]\ntimeout_s = 0\n', "out of range"),
        ('[[mcp.servers]]\nname = "x"\ncommand = ["a"]\npartial_line_s = 0\n', "partial_line_s"),
        ("[mcp]\nservers = [1]\n", "must be a table"),
        ('[approval]\ntools = "x"\n', "is not a list"),
        ("[approval]\ntimeout_s = 0\n", "out of range"),
        (
            '[[mcp.servers]]\nname = "x"\ncommand = ["a"]\n[[mcp.servers]]\nname = "x"\n'
            'command = ["b"]\n',
            "two servers are named 'x'",
        ),
    ],
)
def test_config_errors_name_what_is_wrong(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_a_turn_through_mcp_logs_the_server_and_replays_without_it(
    stdio_port: McpPort, tmp_path: Path
) -> None:
    registry = _registry(stdio_port)
    steps = [
        calls(call("get_weather", {"city": "Oslo"}), call("fail", {"city": "Oslo"})),
        answer("Cloudy."),
    ]
    baseline = Baseline(tools=registry.definitions())
    session = Session.create(tmp_path / "live", baseline)
    client = ScriptedClient(list(steps))
    runtime = Runtime(config=Config(), client=client, registry=registry, port=stdio_port)
    run_turn(session, runtime, "Weather in Oslo?")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [(r.name, r.server, r.content) for r in results] == [
        ("get_weather", "local", get_weather("Oslo")),
        ("fail", "local", "The tool failed: Error executing tool fail"),
    ]
    session.close()
    reopened = Session.open(session.path)
    assert [r.server for r in reopened.records if isinstance(r, ToolResult)] == ["local"] * 2
    assert reopened.messages() == session.messages()

    # the replay: no server, a port answering from the recorded results gives the same requests
    recorded = {(r.name, r.call): r for r in results}

    def from_log(request: ToolRequest) -> ToolOk:
        return ToolOk(content=recorded[(request.tool, request.call)].content)

    again = Session.create(tmp_path / "replay", baseline)
    replay_client = ScriptedClient(list(steps))
    port = InProcessPort({"get_weather": from_log, "fail": from_log})
    replay = Runtime(config=Config(), client=replay_client, registry=registry, port=port)
    run_turn(again, replay, "Weather in Oslo?")
    assert replay_client.bodies == client.bodies
    assert json.loads(client.bodies[1]["messages"][-2]["content"]) == json.loads(
        get_weather("Oslo")
    )


def test_approval_by_the_servers_destructive_hint(stdio_port: McpPort) -> None:
    registry = _registry(stdio_port)
    asked: list[str] = []

    def ask(pending: PendingCall) -> bool:
        asked.append(pending.tool)
        return pending.tool == "get_time"

    port = ApprovalPort(stdio_port, ApprovalPolicy(destructive=True), ask)
    weather = dispatch(registry, "get_weather", OSLO, port=port, call=1)  # read-only: not asked
    forget = dispatch(registry, "forget_city", OSLO, port=port, call=2)  # destructive: denied
    clock = dispatch(registry, "get_time", OSLO, port=port, call=3)  # no hints: destructive
    assert asked == ["forget_city", "get_time"]
    assert (weather.content, weather.approvals) == (get_weather("Oslo"), ())
    assert forget.content == "The call was denied: denied by callback"
    assert (forget.not_run, forget.approvals[0].decision) == ("denied", "denied")
    assert (clock.content, clock.server) == (get_time("Oslo"), "local")
    assert [(a.call, a.name, a.decision, a.by) for a in clock.approvals] == [
        (3, "get_time", "approved", "callback")
    ]


@pytest.mark.live
def test_live_turn_of_the_shipped_model_through_mcp(stdio_port: McpPort, tmp_path: Path) -> None:
    registry = Registry()
    assert stdio_port.register(registry, only=("get_weather", "get_time")) == (
        "get_weather",
        "get_time",
    )
    config = Config(
        client=ClientConfig(retry_attempts=0),
        loop=LoopLimits(tool_iterations=2),
        sampling=SamplingConfig(max_tokens=200),
    )
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    with EmbeddedServer(None, n_ctx=4096, n_threads=1) as server:
        config = dataclasses.replace(config, client=ClientConfig(url=server.url, retry_attempts=0))
        with Client(config.client) as client:
            runtime = Runtime(config=config, client=client, registry=registry, port=stdio_port)
            outcome = run_turn(session, runtime, "What is the weather in Paris?")
    (result,) = _of_type(session, ToolResult)
    assert (result.name, result.server, result.not_run) == ("get_weather", "local", None)
    assert result.content == get_weather("Paris")
    assert json.loads(result.content)["sky"] in outcome.content  # the model read the result


@pytest.mark.live
def test_chat_command_with_an_mcp_server_asks_on_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "boxmaker.toml"
    command = ", ".join(json.dumps(part) for part in stdio_command(faults=False))
    config.write_text(
        f'[[mcp.servers]]\nname = "demo"\ncommand = [{command}]\n'
        "[approval]\nevery_call = true\n[sampling]\nmax_tokens = 200\n[loop]\ntool_iterations = 2\n"
    )
    with EmbeddedServer(None, n_ctx=4096, n_threads=1) as server:
        typed = "What is the weather in Paris?\ny\n/quit\n"
        monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
        args = ["chat", "--url", server.url, "--config", str(config), "--dir", str(tmp_path)]
        assert main(args) == 0
    out = capsys.readouterr().out
    assert "(tools: get_weather, get_time; Ctrl-D ends; Ctrl-C stops a turn)" in out
    assert 'approve call #1 get_weather{"city": "Paris"}? (the policy asks for approval' in out
    assert "[approved by console]" in out
    session = Session.open(next(tmp_path.glob("*.jsonl")), read_only=True)
    (approval,) = _of_type(session, Approval)
    assert (approval.decision, approval.by) == ("approved", "console")
    result = _of_type(session, ToolResult)[0]
    assert (result.server, result.content) == ("demo", get_weather("Paris"))
