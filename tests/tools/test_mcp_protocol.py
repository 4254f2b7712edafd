"""A server that breaks the MCP protocol fails its call at once; a bad tool name is left out
(issue 23). The server is ``tests/mcp_raw_server.py``, a real process over stdio."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxmaker.config import McpServerConfig
from boxmaker.errors import ConfigError
from boxmaker.tools import Registry, ToolFailed, ToolRequest
from boxmaker.tools.mcp import McpPort

RAW = Path(__file__).resolve().parent.parent / "mcp_raw_server.py"
CALL = ToolRequest(session_id="s", call=1, tool="echo", arguments={})


def port(fault: str) -> Iterator[McpPort]:
    server = McpServerConfig(name="raw", command=(sys.executable, str(RAW), fault), timeout_s=60)
    with McpPort([server]) as opened:
        yield opened


@pytest.fixture
def not_json() -> Iterator[McpPort]:
    yield from port("not_json")


def test_a_line_that_is_not_json_fails_the_call_at_once(not_json: McpPort) -> None:
    """It waited out the whole timeout (60 s here); now the answer says what broke."""
    answer = not_json.request(CALL)
    assert isinstance(answer, ToolFailed) and answer.server == "raw"
    assert (
        answer.message.startswith("raw broke the protocol (") and "Invalid JSON" in answer.message
    )
    assert not_json.restarts["raw"] == 0  # restarted on the next call, not before


def test_one_invalid_tool_name_leaves_the_rest_of_the_server(not_json: McpPort) -> None:
    registry = Registry()
    assert not_json.register(registry) == ("echo",)
    assert "echo" in registry and "bad name!" not in registry
    assert list(not_json.skipped) == ["bad name!"] and "'raw'" in not_json.skipped["bad name!"]
    with pytest.raises(ConfigError, match="MCP server 'raw'"):
        not_json.register(Registry(), only=["bad name!"])  # asked for by name: an error


@pytest.fixture
def wrong_id() -> Iterator[McpPort]:
    yield from port("wrong_id")


def test_an_answer_to_a_request_never_sent_fails_the_call_at_once(wrong_id: McpPort) -> None:
    """The SDK dropped it (at debug level) and the call waited out its timeout (60 s here)."""
    answer = wrong_id.request(CALL)
    assert isinstance(answer, ToolFailed) and answer.server == "raw"
    assert "an answer to a request never sent (id " in answer.message
    assert answer.message.startswith("raw broke the protocol (")
    again = wrong_id.request(CALL)  # the server was restarted: the listing still worked
    assert isinstance(again, ToolFailed) and "never sent" in again.message
    assert wrong_id.restarts["raw"] == 1
