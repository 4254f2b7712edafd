"""The Responses API through the tap: requests as the chat body llama-server renders, answers
whole and streamed (llama.cpp's events, OpenAI's), the stream cut in the worst places, and a
hand-made Codex-shaped exchange through the tap on a socket (the fake llama-server upstream)."""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import Raw, running
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.records import Assistant, ToolResult, TurnEnd, Usage, User
from boxmaker.session import Session
from boxmaker.tap import ResponsesDecoder, Tap, read_reply, responses_body
from boxmaker.testing import assert_log_well_formed

TIMINGS = {"cache_n": 0, "prompt_n": 50, "prompt_ms": 9.5, "predicted_n": 12, "predicted_ms": 6.0}


def _event(data: dict[str, Any]) -> bytes:
    """One SSE event as llama-server writes it (``event:`` line, ``data:`` line)."""
    return f"event: {data['type']}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def llama_stream(
    *,
    reasoning: str = "",
    text: str = "",
    calls: tuple[tuple[str, str, str], ...] = (),
    usage: dict[str, Any] | None = None,
    timings: dict[str, Any] | None = None,
    end: bool = True,
) -> bytes:
    """A streamed ``/v1/responses`` answer in llama-server's shapes (llama.cpp
    ``server-task.cpp``, ``to_json_oaicompat_resp`` and ``..._resp_stream``): one delta event a
    character, the items whole at the end, ``response.completed`` with ``usage`` and, at the
    event's top level, ``timings``. ``calls``: ``(id, name, arguments)``."""
    rid, rs, msg = "resp_R1", "rs_S1", "msg_M1"
    head = {"id": rid, "object": "response", "status": "in_progress"}
    out = [
        _event({"type": "response.created", "response": head}),
        _event({"type": "response.in_progress", "response": head}),
    ]
    if reasoning:
        added = {
            "id": rs,
            "summary": [],
            "type": "reasoning",
            "content": [],
            "encrypted_content": "",
            "status": "in_progress",
        }
        out.append(_event({"type": "response.output_item.added", "item": added}))
        out += [
            _event({"type": "response.reasoning_text.delta", "delta": c, "item_id": rs})
            for c in reasoning
        ]
    if text:
        added = {
            "content": [],
            "id": msg,
            "role": "assistant",
            "status": "in_progress",
            "type": "message",
        }
        out.append(_event({"type": "response.output_item.added", "item": added}))
        part = {"type": "output_text", "text": ""}
        out.append(_event({"type": "response.content_part.added", "item_id": msg, "part": part}))
        out += [
            _event({"type": "response.output_text.delta", "item_id": msg, "delta": c}) for c in text
        ]
    for cid, name, arguments in calls:
        added = {
            "id": f"fc_{cid}",
            "arguments": "",
            "call_id": f"call_{cid}",
            "name": name,
            "type": "function_call",
            "status": "in_progress",
        }
        out.append(_event({"type": "response.output_item.added", "item": added}))
        out += [
            _event(
                {
                    "type": "response.function_call_arguments.delta",
                    "delta": c,
                    "item_id": f"fc_{cid}",
                }
            )
            for c in arguments
        ]
    if not end:
        return b"".join(out)
    output = _output(reasoning, text, calls, rs=rs, msg=msg)
    out += [_event({"type": "response.output_item.done", "item": item}) for item in output]
    done: dict[str, Any] = {
        "type": "response.completed",
        "response": {
            "id": rid,
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": "tiny",
            "output": output,
            "usage": usage or {},
        },
    }
    if timings is not None:
        done["timings"] = timings
    out.append(_event(done))
    return b"".join(out)


def _output(
    reasoning: str, text: str, calls: tuple[tuple[str, str, str], ...], *, rs: str, msg: str
) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append(
            {
                "id": rs,
                "summary": [],
                "type": "reasoning",
                "content": [{"text": reasoning, "type": "reasoning_text"}],
                "encrypted_content": "",
            }
        )
    if text:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
        output.append(
            {
                "type": "message",
                "status": "completed",
                "id": msg,
                "content": [part],
                "role": "assistant",
            }
        )
    for cid, name, arguments in calls:
        output.append(
            {
                "id": f"fc_{cid}",
                "type": "function_call",
                "status": "completed",
                "arguments": arguments,
                "call_id": f"call_{cid}",
                "name": name,
            }
        )
    return output


def llama_whole(
    *,
    reasoning: str = "",
    text: str = "",
    calls: tuple[tuple[str, str, str], ...] = (),
    usage: dict[str, Any] | None = None,
) -> bytes:
    """A whole (non-streamed) ``/v1/responses`` answer in llama-server's shape (no
    ``timings``)."""
    answer = {
        "completed_at": 1,
        "created_at": 1,
        "id": "resp_W1",
        "model": "tiny",
        "object": "response",
        "output": _output(reasoning, text, calls, rs="rs_1", msg="msg_1"),
        "status": "completed",
        "usage": usage or {},
    }
    return json.dumps(answer).encode()


USAGE = {
    "input_tokens": 50,
    "output_tokens": 12,
    "total_tokens": 62,
    "input_tokens_details": {"cached_tokens": 0},
}
STREAM = llama_stream(
    reasoning="São Paulo? 🌦",
    calls=(("A1", "get_weather", '{"city": "São Paulo"}'),),
    usage=USAGE,
    timings=TIMINGS,
)


def _reply(body: bytes, *, streamed: bool = True) -> Any:
    return read_reply(body, status=200, api="responses", streamed=streamed, error=None)


# -- the request ------------------------------------------------------------------------------

SDK_TOOL = {
    "name": "get_weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    "strict": True,
    "type": "function",
    "description": "Get the current weather in a city.",
}


def test_the_agents_sdk_request_is_the_chat_body_llama_server_renders() -> None:
    # as the OpenAI Agents SDK sends its second request (seen through the tap, live)
    body = {
        "model": "tiny",
        "include": [],
        "instructions": "You answer about weather.",
        "input": [
            {"content": "What is the weather in Lisbon?", "role": "user"},
            {
                "id": "rs_1",
                "summary": [],
                "type": "reasoning",
                "encrypted_content": "",
                "content": [{"text": "I will call get_weather.", "type": "reasoning_text"}],
            },
            {
                "arguments": '{"city": "Lisbon"}',
                "call_id": "call_1",
                "name": "get_weather",
                "type": "function_call",
                "id": "fc_1",
                "status": "completed",
            },
            {"call_id": "call_1", "output": '{"sky": "clear"}', "type": "function_call_output"},
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": "Clear.", "annotations": []}],
            },
        ],
        "temperature": 0.0,
        "tools": [SDK_TOOL],
    }
    chat = responses_body(body)
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Lisbon"}'},
    }
    assert chat["messages"] == [
        {"role": "system", "content": "You answer about weather."},
        {"role": "user", "content": [{"type": "text", "text": "What is the weather in Lisbon?"}]},
        {
            "role": "assistant",
            "content": [],
            "reasoning_content": "I will call get_weather.",
            "tool_calls": [call],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'},
        {"role": "assistant", "content": [{"type": "text", "text": "Clear."}]},
    ]
    function = {k: v for k, v in SDK_TOOL.items() if k != "type"}
    assert chat["tools"] == [{"type": "function", "function": function}]


def test_codex_items_are_read_as_llama_server_reads_them() -> None:
    body = {
        "instructions": "You are Codex.",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Sandbox: read-only."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "List the files."}],
            },
            # Codex sends a reasoning item back without its reasoning_text content
            {"type": "reasoning", "summary": [], "encrypted_content": ""},
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
                "call_id": "call_9",
            },
            {
                "type": "function_call_output",
                "call_id": "call_9",
                "output": [{"type": "input_text", "text": "README.md"}],
            },
        ],
        "tools": [
            {
                "type": "function",
                "name": "shell",
                "description": "Run a command.",
                "strict": False,
                "parameters": {"type": "object"},
            },
            {"type": "web_search"},
        ],
        "chat_template_kwargs": {"enable_thinking": True},
    }
    chat = responses_body(body)
    assert [m["role"] for m in chat["messages"]] == [
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
    ]
    assistant, tool = chat["messages"][3:]
    assert "reasoning_content" not in assistant and assistant["tool_calls"][0]["id"] == "call_9"
    assert tool["content"] == [{"type": "text", "text": "README.md"}]
    # the web_search tool is dropped (no chat equivalent, as the server drops it); strict kept
    assert [t["function"]["name"] for t in chat["tools"]] == ["shell"]
    assert chat["tools"][0]["function"]["strict"] is False
    assert chat["chat_template_kwargs"] == {"enable_thinking": True}


def test_a_string_input_is_one_user_message() -> None:
    assert responses_body({"input": "Hi"}) == {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item_reference"),
        ({"input": [{"type": "custom_tool_call", "call_id": "c", "input": ""}]}, "custom_tool"),
        ({"input": 3}, "neither a string nor a list"),
        ({"input": ["Hi"]}, "not an object"),
    ],
)
def test_what_the_tap_cannot_read_is_named(body: dict[str, Any], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        responses_body(body)


# -- the answer -------------------------------------------------------------------------------


def test_a_llama_server_stream_is_read_as_the_chat_answer_it_was() -> None:
    got = _reply(STREAM)
    assert got.error is None and got.status == 200
    assert isinstance(got.assistant, Assistant)
    assert got.assistant.reasoning == "São Paulo? 🌦"
    assert got.assistant.content is None
    assert [(c.id, c.name, c.arguments) for c in got.assistant.tool_calls] == [
        ("call_A1", "get_weather", '{"city": "São Paulo"}')
    ]
    usage = got.usage
    assert isinstance(usage, Usage)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.finish_reason) == (
        50,
        12,
        "tool_calls",
    )
    assert dict(usage.timings) == TIMINGS and usage.note is None
    # one reasoning_text delta a token, as llama.cpp streams them (one per character here)
    assert usage.reasoning_tokens == len("São Paulo? 🌦")


def _decoded(reads: list[bytes]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    decoder = ResponsesDecoder()
    events = [e for read in reads for e in decoder.feed(read)] + decoder.flush()
    return events, decoder.output(), decoder.reasoning_deltas


WHOLE = _decoded([STREAM])


def test_every_single_cut_reads_the_same() -> None:
    # a read may end anywhere: mid-line, mid-UTF-8 character (São, 🌦), between events
    for cut in range(1, len(STREAM)):
        assert _decoded([STREAM[:cut], STREAM[cut:]]) == WHOLE, cut


def test_byte_by_byte_and_crlf_read_the_same() -> None:
    assert _decoded([STREAM[i : i + 1] for i in range(len(STREAM))]) == WHOLE
    crlf = STREAM.replace(b"\n", b"\r\n")
    cuts = [crlf[i : i + 7] for i in range(0, len(crlf), 7)]  # some between \r and \n
    assert _decoded(cuts) == WHOLE


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_cuts_read_the_same(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(STREAM)]
    assert _decoded([STREAM[a:b] for a, b in itertools.pairwise(bounds)]) == WHOLE


def test_a_stream_cut_short_keeps_what_arrived_and_says_why() -> None:
    cut = llama_stream(text="Sunny and warm.", end=False)
    got = _reply(cut[: len(cut) - 30])  # mid-event: the last delta (".") is cut
    assert got.error == "the stream ended without response.completed"
    assert isinstance(got.assistant, Assistant) and got.assistant.content == "Sunny and warm"
    assert isinstance(got.usage, Usage) and got.usage.finish_reason is None
    assert got.usage.prompt_tokens is None and dict(got.usage.timings) == {}


def test_openai_shaped_events_summaries_and_incomplete_read_right() -> None:
    # OpenAI's own stream: output_index and sequence_number, a reasoning summary (no
    # reasoning_text), the reasoning tokens counted by the server, cut at max_output_tokens
    events: list[dict[str, Any]] = [
        {
            "type": "response.created",
            "sequence_number": 0,
            "response": {"id": "resp_O", "status": "in_progress"},
        },
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "sequence_number": 1,
            "item": {"id": "rs_O", "type": "reasoning", "summary": []},
        },
        {
            "type": "response.reasoning_summary_text.delta",
            "output_index": 0,
            "item_id": "rs_O",
            "summary_index": 0,
            "delta": "Thinking briefly.",
        },
        {
            "type": "response.output_item.added",
            "output_index": 1,
            "item": {"id": "msg_O", "type": "message", "role": "assistant", "content": []},
        },
        {
            "type": "response.output_text.delta",
            "output_index": 1,
            "content_index": 0,
            "delta": "Partly",
        },
        {
            "type": "response.output_text.delta",
            "output_index": 1,
            "content_index": 0,
            "delta": " cloudy",
        },
        {
            "type": "response.incomplete",
            "response": {
                "id": "resp_O",
                "status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"},
                "usage": {
                    "input_tokens": 20,
                    "output_tokens": 16,
                    "total_tokens": 36,
                    "output_tokens_details": {"reasoning_tokens": 9},
                    "input_tokens_details": {"cached_tokens": 0},
                },
            },
        },
    ]
    body = b"".join(_event(e) for e in events)
    got = _reply(body)
    assert got.error is None and isinstance(got.assistant, Assistant)
    assert (got.assistant.content, got.assistant.reasoning) == (
        "Partly cloudy",
        "Thinking briefly.",
    )
    usage = got.usage
    assert isinstance(usage, Usage)
    assert (usage.finish_reason, usage.reasoning_tokens, usage.prompt_tokens) == ("length", 9, 20)
    # no timings: the cache figure the usage gave is said in the note, not made a timing
    assert dict(usage.timings) == {} and "cached_tokens 0" in str(usage.note)


def test_errors_in_a_stream_and_a_failed_response_are_errors() -> None:
    llama_error = b'data: {"error": {"code": 500, "message": "boom", "type": "server_error"}}\n\n'
    got = _reply(llama_stream(end=False) + llama_error)
    assert got.assistant is None and got.error == "the server sent an error: boom (500)"
    error = {"code": "server_error", "message": "gone"}
    failed = {
        "type": "response.failed",
        "response": {"id": "r", "status": "failed", "error": error},
    }
    got = _reply(_event(failed))
    assert got.assistant is None and "gone (server_error)" in str(got.error)
    openai_error = {"type": "error", "code": "rate_limit", "message": "slow down"}
    assert "slow down" in str(_reply(_event(openai_error)).error)


def test_a_whole_answer_counts_what_the_server_counted() -> None:
    calls = (("B2", "get_weather", '{"city": "Oslo"}'),)
    got = _reply(llama_whole(reasoning="I should look.", calls=calls, usage=USAGE), streamed=False)
    assert got.error is None and isinstance(got.assistant, Assistant)
    assert got.assistant.reasoning == "I should look."
    usage = got.usage
    assert isinstance(usage, Usage)
    # the reasoning came in one piece and llama.cpp counts no reasoning tokens: unknown,
    # not the 1 a count of deltas would give
    assert usage.reasoning_tokens is None
    assert (usage.prompt_tokens, usage.completion_tokens, usage.finish_reason) == (
        50,
        12,
        "tool_calls",
    )
    counted = {**USAGE, "output_tokens_details": {"reasoning_tokens": 7}}
    got = _reply(llama_whole(reasoning="I should look.", usage=counted), streamed=False)
    assert isinstance(got.usage, Usage) and got.usage.reasoning_tokens == 7
    assert got.usage.finish_reason == "stop"
    got = _reply(llama_whole(text="Sunny.", usage=USAGE), streamed=False)
    assert isinstance(got.usage, Usage) and got.usage.reasoning_tokens == 0
    got = _reply(b'{"error": {"message": "bad", "code": 400}}', streamed=False)
    assert got.assistant is None and "bad" in str(got.error)


# -- Codex through the tap ----------------------------------------------------------------------

SSE_JSON_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"


def _json_answer(body: bytes) -> Raw:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return Raw([head % len(body), body], hold=False)


@contextlib.contextmanager
def tapped(script: list[Any], tmp_path: Path) -> Iterator[Tap]:
    with running(script) as up, Tap(up.url, directory=tmp_path / "logs") as tap:
        yield tap


def _only(tap: Tap) -> Session:
    assert tap.log is not None
    assert tap.log.problems == [] and tap.log.notes == []
    (path,) = tap.log.sessions
    with Session.open(path, read_only=True) as session:
        assert_log_well_formed(session)
        return session


CODEX_TOOLS = [
    {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command.",
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string"}}},
            "required": ["command"],
            "additionalProperties": False,
        },
    },
    {"type": "local_shell"},
]
ENVIRONMENT = "<environment_context>~/project</environment_context>"
CODEX_START = [
    {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "<permissions>read-only</permissions>"}],
    },
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ENVIRONMENT}]},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "List the files here."}],
    },
]


def _codex(input_items: list[dict[str, Any]]) -> dict[str, Any]:
    """A request as Codex CLI sends it (codex-rs ``ResponsesApiRequest``)."""
    return {
        "model": "tiny",
        "instructions": "You are Codex, a coding agent.",
        "input": input_items,
        "tools": CODEX_TOOLS,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": True,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a1b2-6f3e-7c1d-9a2b-5e4f3d2c1b0a",
    }


def test_a_codex_shaped_exchange_is_one_session_with_a_row_per_response(
    tmp_path: Path,
) -> None:
    from boxmaker import frames

    first = llama_stream(
        reasoning="I list them.",
        calls=(("K1", "shell", '{"command":["ls"]}'),),
        usage=USAGE,
        timings=TIMINGS,
    )
    later = {"cache_n": 50, "prompt_n": 30, "prompt_ms": 5.0, "predicted_n": 9, "predicted_ms": 4.0}
    usage = {**USAGE, "input_tokens": 80}
    second = llama_stream(text="README.md and src.", usage=usage, timings=later)
    script = [Raw([SSE_JSON_HEAD, first], hold=False), Raw([SSE_JSON_HEAD, second], hold=False)]
    with tapped(script, tmp_path) as tap:
        url = tap.url + "/v1/responses"
        r = httpx.post(url, json=_codex(CODEX_START), timeout=10)
        assert r.status_code == 200 and r.content == first  # forwarded as it came
        follow: list[dict[str, Any]] = [
            *CODEX_START,
            # Codex sends the reasoning item back without its text, and the call without id
            {"type": "reasoning", "summary": [], "encrypted_content": ""},
            {
                "type": "function_call",
                "name": "shell",
                "arguments": '{"command":["ls"]}',
                "call_id": "call_K1",
            },
            {"type": "function_call_output", "call_id": "call_K1", "output": "README.md\nsrc\n"},
        ]
        assert httpx.post(url, json=_codex(follow), timeout=10).status_code == 200
    session = _only(tap)
    assert session.baseline.system == "You are Codex, a coding agent."
    assert [dict(t)["function"]["name"] for t in session.baseline.tools] == ["shell"]
    kinds = [type(r).__name__ for r in session.records]
    assert kinds == ["User", "Assistant", "Usage", "ToolResult", "Assistant", "Usage", "TurnEnd"]
    user, call, _, result, answer, usage_2, end = session.records
    # the environment context and the prompt: one turn's input, one User
    assert isinstance(user, User)
    assert (
        user.content
        == "<environment_context>~/project</environment_context>\n\nList the files here."
    )
    assert isinstance(call, Assistant) and call.reasoning == "I list them."
    assert [(c.id, c.name) for c in call.tool_calls] == [("call_K1", "shell")]
    assert isinstance(result, ToolResult) and (result.name, result.content) == (
        "shell",
        "README.md\nsrc\n",
    )
    assert isinstance(answer, Assistant) and answer.content == "README.md and src."
    assert isinstance(usage_2, Usage) and usage_2.prompt_tokens == 80
    assert isinstance(end, TurnEnd) and end.outcome == "answered"
    requests = frames.requests(tmp_path / "logs")
    assert len(requests) == 2 and list(requests["cached_tokens"]) == [0, 50]


def test_the_agents_sdk_whole_answers_are_one_session(tmp_path: Path) -> None:
    calls = (("W1", "get_weather", '{"city": "Lisbon"}'),)
    first = llama_whole(reasoning="Call it.", calls=calls, usage=USAGE)
    second = llama_whole(text="Clear in Lisbon.", usage={**USAGE, "input_tokens": 70})
    ask = {"content": "What is the weather in Lisbon?", "role": "user"}
    body = {
        "model": "tiny",
        "include": [],
        "instructions": "Weather.",
        "input": [ask],
        "temperature": 0.0,
        "tools": [SDK_TOOL],
    }
    with tapped([_json_answer(first), _json_answer(second)], tmp_path) as tap:
        url = tap.url + "/v1/responses"
        output = httpx.post(url, json=body, timeout=10).json()["output"]
        result = {"call_id": "call_W1", "output": "clear", "type": "function_call_output"}
        body["input"] = [ask, *output, result]  # the SDK sends the output items back
        assert httpx.post(url, json=body, timeout=10).status_code == 200
    session = _only(tap)
    usages = [r for r in session.records if isinstance(r, Usage)]
    assert [u.prompt_tokens for u in usages] == [50, 70]
    assert [u.reasoning_tokens for u in usages] == [None, 0]
    assert [r.outcome for r in session.records if isinstance(r, TurnEnd)] == ["answered"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
KEYS = st.sampled_from(
    ["type", "item", "item_id", "output_index", "delta", "response", "error", "timings",
     "output", "usage", "status", "content", "summary", "arguments", "call_id", "name", "id"]
)  # fmt: skip
TYPES = st.sampled_from(
    ["response.created", "response.output_item.added", "response.output_item.done",
     "response.output_text.delta", "response.function_call_arguments.delta",
     "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
     "response.completed", "response.incomplete", "response.failed", "error", None]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(TYPES, st.dictionaries(KEYS, JSON, max_size=5)), max_size=6))
def test_any_event_shape_is_read_without_a_traceback(
    events: list[tuple[Any, dict[str, Any]]],
) -> None:
    stream = b"".join(
        b"data: " + json.dumps({**fields, "type": kind}).encode() + b"\n\n"
        for kind, fields in events
    )
    for streamed, body in (
        (True, stream),
        (False, json.dumps({"object": "response", **(events[-1][1] if events else {})}).encode()),
    ):
        got = _reply(body, streamed=streamed)
        assert got.assistant is not None or got.error is not None
    for kind, fields in events:
        with contextlib.suppress(ValueError):
            responses_body({"input": [{**fields, "type": kind}], "tools": [fields]})
