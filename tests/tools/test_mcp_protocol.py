"""A server that breaks the MCP protocol fails its call at once; a bad tool name is left out;
a server that will not stop is killed with its children (issue 23). The server is
``tests/mcp_raw_server.py``, a real process over stdio; the line reader of boxmaker's stdio
transport is also tested alone, on chunks of text."""

from __future__ import annotations

import itertools
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp.shared.message import SessionMessage

from boxmaker.config import McpServerConfig
from boxmaker.errors import ConfigError, ToolPortError
from boxmaker.tools import Registry, ToolFailed, ToolOk, ToolRequest
from boxmaker.tools._stdio import PartialLineError, _read_lines
from boxmaker.tools.mcp import McpPort

RAW = Path(__file__).resolve().parent.parent / "mcp_raw_server.py"
CALL = ToolRequest(session_id="s", call=1, tool="echo", arguments={})
GRACE_S = 1.0
"""The partial-line grace of the tests' servers (their call timeout is 60 s)."""


def port(fault: str, partial_line_s: float = 5.0) -> Iterator[McpPort]:
    server = McpServerConfig(
        name="raw",
        command=(sys.executable, str(RAW), fault),
        timeout_s=60,
        partial_line_s=partial_line_s,
    )
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


@pytest.fixture
def half_line() -> Iterator[McpPort]:
    yield from port("half_line", partial_line_s=GRACE_S)


def test_half_a_line_then_silence_fails_the_call_after_the_grace(half_line: McpPort) -> None:
    """The SDK's reader held the partial line unseen and the call waited out its 60 s."""
    start = time.monotonic()
    answer = half_line.request(CALL)
    elapsed = time.monotonic() - start
    assert isinstance(answer, ToolFailed) and answer.server == "raw"
    shown = re.escape('\'{"jsonrpc": "2.0", "id": ')
    assert re.fullmatch(
        r"raw broke the protocol \(PartialLineError: a line left unfinished, no byte for 1 s: "
        rf"{shown}\d+,?' \(2\d characters\)\); it is restarted",
        answer.message,
    ), answer.message
    assert GRACE_S <= elapsed < 15  # the grace, far from the 60 s timeout


def test_half_a_line_then_the_end_of_stdout_says_so() -> None:
    for opened in port("half_exit"):
        answer = opened.request(CALL)
        assert isinstance(answer, ToolFailed) and answer.server == "raw"
        assert answer.message.startswith(
            "raw broke the protocol (PartialLineError: stdout ended in the middle of a line: '{\""
        ), answer.message


def test_half_a_line_at_the_start_fails_the_start_after_the_grace() -> None:
    with pytest.raises(ToolPortError) as raised:
        for _ in port("half_start", partial_line_s=GRACE_S):
            pass
    assert str(raised.value) == (
        "MCP server 'raw' could not start: RuntimeError: broke the protocol (PartialLineError: "
        'a line left unfinished, no byte for 1 s: \'{"jsonrpc": "2.0", "id": \' '
        "(25 characters))"
    )


def test_a_long_answer_written_slowly_is_not_cut() -> None:
    """Byte after byte over longer than the grace: the clock starts again at each byte."""
    for opened in port("slow_steady", partial_line_s=GRACE_S):
        start = time.monotonic()
        answer = opened.request(CALL)
        assert isinstance(answer, ToolOk) and answer.content == "slow"
        assert time.monotonic() - start > 2 * GRACE_S  # it did outlast the grace


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie, dead and waiting for its parent to reap
    it, is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
def test_a_server_that_ignores_stdin_and_sigterm_is_killed_with_its_child() -> None:
    """Shutdown closes stdin, waits, sends SIGTERM to the server's process group, waits, and
    sends SIGKILL: the server and the child it started are gone."""
    for opened in port("stubborn"):
        pids = [int(n) for n in re.findall(r"\d+", opened.tools["echo"].description)]
        assert len(pids) == 2 and all(_running(pid) for pid in pids)
        answer = opened.request(CALL)
        assert isinstance(answer, ToolOk) and answer.content == "done"
    assert not any(_running(pid) for pid in pids)


# -- the line reader alone -----------------------------------------------------------------------


def _read(chunks: list[str], grace_s: float = 5.0) -> list[object]:
    """What :func:`_read_lines` sends for ``chunks`` (then the end of the stream): each
    message's JSON, or the exception."""

    async def run() -> list[object]:
        chunks_in, stdout = anyio.create_memory_object_stream[str](len(chunks))
        out_in, out = anyio.create_memory_object_stream[SessionMessage | Exception](100)
        async with chunks_in, stdout, out_in, out:
            for chunk in chunks:
                chunks_in.send_nowait(chunk)
            chunks_in.close()
            await _read_lines(stdout, out_in, grace_s)
            out_in.close()
            return [
                item if isinstance(item, Exception) else item.message.model_dump(by_alias=True)
                async for item in out
            ]

    return anyio.run(run)


MESSAGES = st.lists(
    st.builds(
        lambda mid, text: {"jsonrpc": "2.0", "id": mid, "result": {"text": text}},
        st.integers(0, 10**6),
        st.text(max_size=30),
    ),
    max_size=5,
)


@settings(max_examples=60, deadline=None)
@given(MESSAGES, st.lists(st.integers(0, 400), max_size=8))
def test_lines_come_whole_however_the_bytes_are_cut(
    messages: list[dict[str, object]], cuts: list[int]
) -> None:
    text = "".join(json.dumps(m, ensure_ascii=False) + "\n" for m in messages)
    bounds = sorted({0, len(text), *(c for c in cuts if c < len(text))})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert _read(chunks) == messages


def test_a_line_not_json_is_an_error_and_the_reading_goes_on() -> None:
    got = _read(["not json\n", '{"jsonrpc": "2.0", "id": 1, "result": {}}\n'])
    assert isinstance(got[0], ValueError) and "Invalid JSON" in str(got[0])
    assert got[1:] == [{"jsonrpc": "2.0", "id": 1, "result": {}}]


def test_a_partial_line_at_the_end_is_one_error_showing_its_start() -> None:
    tail = '{"jsonrpc": "2.0", "id": 7, "result": {"text": "' + "x" * 100
    got = _read(['{"jsonrpc": "2.0", "id": 1, "result": {}}\n', tail])
    assert got[0] == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert len(got) == 2 and isinstance(got[1], PartialLineError)
    assert str(got[1]) == (
        f"stdout ended in the middle of a line: {tail[:80]!r}... ({len(tail)} characters)"
    )
