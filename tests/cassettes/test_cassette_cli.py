"""``boxmaker cassette show`` (a transcript) and ``boxmaker cassette check`` (each chat request
extends the previous one) on hand-made and recorded cassettes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from boxmaker.cassettes import prefix_problems, read_stream, serializer
from boxmaker.cli import main

ROOT = Path(__file__).resolve().parents[2]
HAND_MADE = ROOT / "tests" / "data" / "cassettes"
CHAT = "http://127.0.0.1:8080/v1/chat/completions"


def interaction(uri: str, body: dict[str, Any], answer: bytes, ctype: str) -> dict[str, Any]:
    return {
        "request": {
            "method": "POST",
            "uri": uri,
            "headers": {},
            "body": json.dumps(body).encode(),
        },
        "response": {
            "status": {"code": 200, "message": "OK"},
            "headers": {"content-type": [ctype]},
            "body": {"string": answer},
        },
    }


STREAM = (
    b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"Think"}}],"id":"c1"}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1",'
    b'"type":"function","function":{"name":"get_time","arguments":"{\\"city\\""}}]}}],'
    b'"id":"c1"}\n\n'
    b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,'
    b'"function":{"arguments":": \\"Oslo\\"}"}}]}}],"id":"c1"}\n\n'
    b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"id":"c1"}\n\n'
    b'data: {"choices":[],"id":"c1","timings":{"cache_n":3,"prompt_n":7,"predicted_n":9}}\n\n'
    b"data: [DONE]\n\n"
)


def write(path: Path, *messages_lists: list[dict[str, Any]]) -> Path:
    items = [
        interaction(CHAT, {"messages": m, "tools": []}, STREAM, "text/event-stream")
        for m in messages_lists
    ]
    items.insert(
        1,
        interaction(
            CHAT + "/control",
            {"id": "c1", "action": "reasoning_end"},
            b'{"success":true}',
            "application/json",
        ),
    )
    path.write_text(serializer.serialize({"version": 1, "interactions": items}))
    return path


U1 = {"role": "user", "content": "Time in Oslo?"}
A1 = {
    "role": "assistant",
    "content": None,
    "reasoning_content": "Think",
    "tool_calls": [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_time", "arguments": '{"city": "Oslo"}'},
        }
    ],
}
T1 = {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}


def test_show_prints_new_messages_stream_and_timings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "c.yaml", [U1], [U1, A1, T1])
    assert main(["cassette", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "[1] POST /v1/chat/completions -> 200" in out
    assert "  + user: Time in Oslo?" in out
    assert "  = reasoning (1 tokens): Think" in out
    assert '  = tool call get_time {"city": "Oslo"} [call_1]' in out
    assert "  = finish: tool_calls" in out
    assert "  = timings: cache_n 3, prompt_n 7, predicted_n 9" in out
    assert "[2] POST /v1/chat/completions/control -> 200" in out
    # the third interaction adds only the assistant turn and the tool result
    third = out.split("[3]", 1)[1]
    assert "+ user" not in third
    assert "  + assistant reasoning: Think" in third
    assert "  + tool [call_1]: 12:00" in third


def test_show_lists_a_reasoning_end_right_after_the_completion_it_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # as recorded: the control request returns while its stream runs, so it comes first
    second = STREAM.replace(b'"id":"c1"', b'"id":"c2"')
    items = [
        interaction(CHAT, {"messages": [U1], "tools": []}, STREAM, "text/event-stream"),
        interaction(
            CHAT + "/control",
            {"id": "c2", "action": "reasoning_end"},
            b'{"success":true}',
            "application/json",
        ),
        interaction(CHAT, {"messages": [U1, A1, T1], "tools": []}, second, "text/event-stream"),
    ]
    path = tmp_path / "c.yaml"
    path.write_text(serializer.serialize({"version": 1, "interactions": items}))
    assert main(["cassette", "show", str(path)]) == 0
    out = capsys.readouterr().out
    heads = [line for line in out.splitlines() if line.startswith("[")]
    assert heads == [
        "[1] POST /v1/chat/completions -> 200",
        "[3] POST /v1/chat/completions -> 200",
        "[2] POST /v1/chat/completions/control -> 200",
    ]
    assert '  request: {"id":"c2","action":"reasoning_end"}' in out.split("[2]", 1)[1]


def test_show_a_cut_stream_keeps_what_arrived(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cassette", "show", str(HAND_MADE / "cut-stream.yaml")]) == 0
    out = capsys.readouterr().out
    assert "  = content: Hel" in out
    assert "! the stream ended without finish_reason or [DONE]" in out
    assert "! transport error after the recorded bytes: RemoteProtocolError" in out


def test_check_passes_when_each_request_extends_the_previous(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "ok.yaml", [U1], [U1, A1, T1])
    assert main(["cassette", "check", str(path)]) == 0
    assert (
        capsys.readouterr().out == f"{path}: ok, 2 chat requests, each extends the previous one\n"
    )


def test_check_says_where_a_request_breaks_the_prefix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = {**A1, "reasoning_content": None}  # reasoning dropped: the prompt re-renders
    u2 = {"role": "user", "content": "And in Lima?"}
    path = write(tmp_path / "bad.yaml", [U1], [U1, A1, T1], [U1, changed, T1, u2], [U1])
    assert main(["cassette", "check", str(path), str(HAND_MADE / "retry-503.yaml")]) == 1
    assert capsys.readouterr().out.splitlines() == [
        f"{path}: FAIL, 2 of 4 chat requests break the prefix",
        "  interaction 4 does not extend interaction 3: messages[1].reasoning_content "
        "(recorded 'Think', sent null)",
        "  interaction 5 does not extend interaction 4: it has 1 messages, the earlier one 4",
        f"{HAND_MADE / 'retry-503.yaml'}: ok, 2 chat requests, each extends the previous one",
    ]


def test_key_order_counts_for_the_prompt_cache(tmp_path: Path) -> None:
    reordered = {"content": "Time in Oslo?", "role": "user"}
    path = write(tmp_path / "order.yaml", [U1], [reordered, A1])
    assert prefix_problems(path) == [
        "interaction 3 does not extend interaction 1: messages[0] has its keys in another order"
    ]


@pytest.mark.parametrize("path", sorted((ROOT / "cassettes").glob("*.yaml")), ids=lambda p: p.name)
def test_recorded_cassettes_pass_the_check_and_read_to_the_end(path: Path) -> None:
    assert prefix_problems(path) == []
    from boxmaker.cassettes import CHAT_PATH, load_interactions

    for item in load_interactions(path):
        if item["request"]["uri"].endswith(CHAT_PATH):
            assert read_stream(item["response"]["body"]["string"]).problem is None


@pytest.mark.parametrize("text", ["", "name: foo\n", "- a\n- b\n"])
def test_files_that_are_not_cassettes_are_refused(
    text: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    for action in ("show", "check"):
        assert main(["cassette", action, str(path)]) == 1
        assert "not a cassette" in capsys.readouterr().err


def test_read_stream_reads_a_whole_json_completion() -> None:
    """A non-streamed answer (a tapped agent's ``stream: false``) is a completion, not a cut
    stream (``cassette show`` said "ended without finish_reason or [DONE]")."""
    body = (
        b'{"object": "chat.completion", "id": "chatcmpl-1", "choices": [{"index": 0,'
        b' "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "Hm.",'
        b' "reasoning_content": "look it up", "tool_calls": [{"id": "c1", "type": "function",'
        b' "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}}]}}],'
        b' "timings": {"cache_n": 3, "prompt_n": 40, "predicted_n": 9}}'
    )
    reading = read_stream(body)
    assert reading.problem is None
    assert (reading.content, reading.reasoning) == ("Hm.", "look it up")
    assert reading.reasoning_tokens == 0  # one message: no token count to give (it said 1)
    assert reading.tool_calls == [("c1", "get_weather", '{"city": "Oslo"}')]
    assert reading.finish_reason == "tool_calls" and reading.timings["prompt_n"] == 40
