"""A stdio MCP server's line is capped (issue 36: a 500 MB line was held whole, 1.3 GB): a line
longer than ``max_line_chars`` fails the server's calls at once, showing its start, and is
read no further; lines up to the cap come whole."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp.shared.message import SessionMessage

from boxmaker.config import McpServerConfig
from boxmaker.errors import ConfigError
from boxmaker.tools import ToolFailed, ToolOk, ToolRequest
from boxmaker.tools._stdio import LineTooLongError, _read_lines
from boxmaker.tools.mcp import McpPort

RAW = Path(__file__).resolve().parent.parent / "mcp_raw_server.py"
CALL = ToolRequest(session_id="s", call=1, tool="echo", arguments={})
ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {}}


def _read(chunks: list[str], cap: int) -> tuple[list[object], int]:
    """What the reader sends for ``chunks`` under ``cap``, and how many chunks it took."""

    async def run() -> tuple[list[object], int]:
        chunks_in, stdout = anyio.create_memory_object_stream[str](len(chunks))
        out_in, out = anyio.create_memory_object_stream[SessionMessage | Exception](100)
        async with chunks_in, stdout, out_in, out:
            for chunk in chunks:
                chunks_in.send_nowait(chunk)
            chunks_in.close()
            await _read_lines(stdout, out_in, 5.0, cap)
            left = stdout.statistics().current_buffer_used
            out_in.close()
            got: list[object] = [
                item if isinstance(item, Exception) else item.message.model_dump(by_alias=True)
                async for item in out
            ]
            return got, len(chunks) - left

    return anyio.run(run)


def test_a_line_past_the_cap_is_one_error_and_the_rest_is_not_read() -> None:
    line = '{"jsonrpc": "2.0", "id": 7, "result": {"text": "' + "x" * 9_000 + '"}}\n'
    pieces = [json.dumps(ANSWER) + "\n"] + [line[i : i + 100] for i in range(0, len(line), 100)]
    got, taken = _read([*pieces, json.dumps(ANSWER) + "\n"], cap=1000)
    assert got[0] == ANSWER and len(got) == 2 and isinstance(got[1], LineTooLongError)
    assert str(got[1]) == (
        "a line longer than 1000 characters (max_line_chars), not read further: "
        f"{line[:80]!r}... (1100 characters so far)"
    )
    assert taken == 12  # the first answer, then 11 pieces of the long line: no more


def test_a_whole_line_in_one_read_past_the_cap_is_refused_and_one_at_the_cap_passes() -> None:
    at_cap = json.dumps({**ANSWER, "result": {"text": "y" * 100}})
    got, _ = _read([at_cap + "\n"], cap=len(at_cap))
    assert got == [{**ANSWER, "result": {"text": "y" * 100}}]
    got, _ = _read([at_cap + "\n" + at_cap + "\n"], cap=len(at_cap) - 1)
    assert len(got) == 1 and isinstance(got[0], LineTooLongError)


def test_a_server_writing_a_huge_line_fails_the_call_at_once() -> None:
    server = McpServerConfig(
        name="raw",
        command=(sys.executable, str(RAW), "huge_line"),
        timeout_s=60,
        max_line_chars=1 << 20,
    )
    with McpPort([server]) as port:
        started = time.monotonic()
        answer = port.request(CALL)
        elapsed = time.monotonic() - started
    assert isinstance(answer, ToolFailed) and answer.server == "raw"
    assert answer.message.startswith(
        "raw broke the protocol (LineTooLongError: a line longer than 1048576 characters "
        '(max_line_chars), not read further: \'{"jsonrpc": "2.0", "id": '
    ), answer.message
    assert elapsed < 30  # at once, far from the call's 60 s


def test_the_default_cap_takes_the_huge_line_under_it() -> None:
    """The default (16 Mi characters) is far above any real message; a 64 MB line is past
    it, a short answer is not."""
    assert McpServerConfig(name="x", command=("a",)).max_line_chars == 16 * 1024 * 1024
    with pytest.raises(ConfigError, match="max_line_chars"):
        McpServerConfig(name="x", command=("a",), max_line_chars=0)
    server = McpServerConfig(name="raw", command=(sys.executable, str(RAW), "slow_steady"))
    with McpPort([server]) as port:
        answer = port.request(CALL)
    assert isinstance(answer, ToolOk) and answer.content == "slow"
