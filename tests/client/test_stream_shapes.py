"""Stream shapes that OpenAI-compatible servers other than (or older than) llama.cpp send.

Issue 9 item 5: arguments as a JSON object, parallel calls at one index or without index,
context overflow reported as HTTP 500 or inside the stream, ``delta.reasoning``, and a
``</think>`` in content with no opening tag. Each decoded through :class:`StreamDecoder`
(what the client and the cassette reader both use) or a :class:`Client` over
``httpx.MockTransport``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.client import Client, Completion, StreamDecoder, is_context_full
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import InferError, SessionFull, TurnInferError
from boxmaker.events import (
    CapNotEnforced,
    ClientEvent,
    Content,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallDelta,
)
from boxmaker.records import Baseline, LimitHit, ToolCall, TurnEnd
from boxmaker.session import Session
from boxmaker.tools import Registry, canonical_arguments
from boxmaker.turn import Runtime, run_turn

URL = "http://llama.test"
CID = "chatcmpl-shapes"
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}]}


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": CID}


def sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def decode(*deltas: dict[str, Any], finish: str = "stop") -> tuple[Completion, list[ClientEvent]]:
    """Decode a stream of the given deltas, then the finish chunk and [DONE]."""
    decoder = StreamDecoder()
    events: list[ClientEvent] = []
    for d in deltas:
        events += decoder.feed(sse(chunk(d)))
    events += decoder.feed(sse(chunk({}, finish)) + b"data: [DONE]\n\n")
    return decoder.chunks.finish(), events


def calls_of(completion: Completion) -> list[tuple[str, str, str]]:
    return [(c.id, c.name, c.arguments) for c in completion.tool_calls]


def tc(**fields: Any) -> dict[str, Any]:
    """A delta with one tool-call fragment: ``index``/``id`` as given, ``name``/``arguments``
    under ``function``."""
    call: dict[str, Any] = {k: v for k, v in fields.items() if k in ("index", "id")}
    function = {k: v for k, v in fields.items() if k in ("name", "arguments")}
    if function:
        call["function"] = function
    return {"tool_calls": [call]}


def mock_client(handler: Any) -> Client:
    return Client(ClientConfig(url=URL, retry_attempts=0), transport=httpx.MockTransport(handler))


# --- 5a: arguments as a JSON object --------------------------------------------------------------


def test_arguments_sent_as_an_object_become_canonical_json_text() -> None:
    arguments = {"unit": "C", "city": "Zürich", "days": [1, 2]}
    completion, events = decode(
        tc(index=0, id="c1", name="weather", arguments=arguments), finish="tool_calls"
    )
    expected = canonical_arguments(json.dumps(arguments))
    assert expected == '{"city":"Z\\u00fcrich","days":[1,2],"unit":"C"}'
    assert calls_of(completion) == [("c1", "weather", expected)]
    assert json.loads(completion.tool_calls[0].arguments) == arguments
    assert [e for e in events if isinstance(e, ToolCallDelta)] == [
        ToolCallDelta(0, "c1", "weather", expected)
    ]


def test_arguments_sent_as_an_empty_object_are_braces() -> None:
    completion, _ = decode(tc(index=0, id="c1", name="now", arguments={}), finish="tool_calls")
    assert calls_of(completion) == [("c1", "now", "{}")]


def test_arguments_as_an_object_through_the_client() -> None:
    body = sse(chunk(tc(index=0, id="c1", name="f", arguments={"b": 2, "a": 1}), "tool_calls"))

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=body + b"data: [DONE]\n\n")

    with mock_client(handler) as client:
        completion = client.chat(BODY, lambda e: None)
    assert completion.tool_calls == (ToolCall(id="c1", name="f", arguments='{"a":1,"b":2}'),)


# --- 5b: parallel calls at one index, deltas without index ------------------------------------


def test_parallel_calls_at_the_same_index_with_new_ids_stay_apart() -> None:
    completion, events = decode(
        tc(index=0, id="A", name="weather", arguments='{"city":'),
        tc(index=0, arguments=' "Oslo"}'),
        tc(index=0, id="B", name="time", arguments='{"tz":'),
        tc(index=0, arguments=' "UTC"}'),
        finish="tool_calls",
    )
    assert calls_of(completion) == [
        ("A", "weather", '{"city": "Oslo"}'),
        ("B", "time", '{"tz": "UTC"}'),
    ]
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [(d.index, d.id, d.name) for d in deltas] == [
        (0, "A", "weather"),
        (0, None, None),
        (1, "B", "time"),
        (1, None, None),
    ]
    # well-formed indexes keep their numbers and order; calls sharing an id stay apart
    completion, events = decode(
        tc(index=1, id="B", name="g", arguments="{}"),
        tc(index=0, id="A", name="f", arguments="{}"),
        tc(index=2, id="A", name="h", arguments="{}"),
        finish="tool_calls",
    )
    assert calls_of(completion) == [("A", "f", "{}"), ("B", "g", "{}"), ("A", "h", "{}")]
    assert [e.index for e in events if isinstance(e, ToolCallDelta)] == [1, 0, 2]


def test_deltas_without_index_new_id_starts_a_call_arguments_continue_the_last() -> None:
    completion, events = decode(
        tc(id="A", name="weather", arguments='{"city"'),
        tc(arguments=': "Oslo"}'),
        tc(id="B", name="time"),
        tc(arguments='{"tz": "UTC"}'),
        tc(id="B", arguments=""),  # the same id again: still the same call
        finish="tool_calls",
    )
    assert calls_of(completion) == [
        ("A", "weather", '{"city": "Oslo"}'),
        ("B", "time", '{"tz": "UTC"}'),
    ]
    assert [e.index for e in events if isinstance(e, ToolCallDelta)] == [0, 0, 1, 1, 1]


_CALL = st.tuples(
    st.text("abcdefgh_", min_size=1, max_size=8),
    st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=3),
)


@given(
    calls=st.lists(_CALL, min_size=1, max_size=4),
    form=st.sampled_from(["indexed", "same_index", "no_index"]),
    data=st.data(),
)
def test_any_fragmentation_and_index_form_gives_the_same_calls(
    calls: list[tuple[str, dict[str, Any]]], form: str, data: st.DataObject
) -> None:
    deltas: list[dict[str, Any]] = []
    expected = []
    for n, (name, arguments) in enumerate(calls):
        text = json.dumps(arguments)
        cuts = sorted(data.draw(st.sets(st.integers(1, max(len(text) - 1, 1)), max_size=5)))
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        index = {"indexed": n, "same_index": 0, "no_index": None}[form]
        where = {} if index is None else {"index": index}
        deltas.append(tc(**where, id=f"id{n}", name=name, arguments=pieces[0]))
        deltas += [tc(**where, arguments=p) for p in pieces[1:] if p]
        expected.append((f"id{n}", name, text))
    completion, events = decode(*deltas, finish="tool_calls")
    assert calls_of(completion) == expected
    numbers = [e.index for e in events if isinstance(e, ToolCallDelta)]
    assert sorted(set(numbers)) == list(range(len(calls)))


# --- 5d: context overflow reported other ways -----------------------------------------------


OVERFLOW_500 = (
    '{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}'
)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, '{"error":{"message":"request exceeds the available context size"}}'),
        (
            400,
            '{"error":{"message":"This model\'s maximum context length is 4096 tokens",'
            '"type":"invalid_request_error","code":"context_length_exceeded"}}',
        ),
    ],
)
def test_context_overflow_as_other_http_answers(status: int, body: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, text=body)

    with mock_client(handler) as client, pytest.raises(InferError) as info:
        client.chat_with_retry(BODY, lambda e: None)
    assert is_context_full(info.value)
    assert info.value.context_full
    assert info.value.status == status


def test_a_full_kv_pool_inside_a_200_stream_is_no_full_context() -> None:
    """llama.cpp's "Context size has been exceeded." comes when the KV cache filled while the
    prompt fit its slot (issue 35: a pool shared by several slots): ``pool_full``, not
    ``context_full``; other server errors are neither."""
    decoder = StreamDecoder()
    decoder.feed(sse(chunk({"content": "a"})))
    with pytest.raises(InferError) as info:
        decoder.feed(f"data: {OVERFLOW_500}\n\n".encode())
    assert info.value.pool_full and not is_context_full(info.value)
    assert info.value.status == 500 and "-np N" in str(info.value)
    for other in (  # other server errors are not a full context
        '{"error":{"code":500,"message":"Failed to parse tool call arguments"}}',
        '{"error":{"code":500,"message":"the context of this tool is unknown"}}',
        '"Internal Server Error"',
    ):
        with pytest.raises(InferError) as info:
            StreamDecoder().feed(f"data: {other}\n\n".encode())
        assert not is_context_full(info.value) and not info.value.pool_full


def test_a_full_kv_pool_as_an_error_line_of_older_builds() -> None:
    decoder = StreamDecoder()
    with pytest.raises(InferError) as info:
        decoder.feed(b'error: {"code":500,"message":"Context size has been exceeded."}\n\n')
    assert info.value.pool_full and not is_context_full(info.value)


def test_a_full_kv_pool_is_retried_then_ends_the_turn_naming_the_pool(tmp_path: Path) -> None:
    """Never ``SessionFull`` for a prompt that fits: the turn waits (``Retrying`` saying why),
    and when the pool stays full it ends with an inference error naming the pool and the
    fix."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(404)
        return httpx.Response(500, text=OVERFLOW_500)

    session = Session.create(tmp_path, Baseline(system="sys"))
    client = Client(
        ClientConfig(url=URL, retry_attempts=2),
        transport=httpx.MockTransport(handler),
        sleep=lambda s: None,
    )
    runtime = Runtime(config=Config(), client=client, registry=Registry())
    events: list[Any] = []
    with pytest.raises(TurnInferError) as info:
        run_turn(session, runtime, "hello", on_event=events.append)
    message = str(info.value)
    assert "KV cache was full" in message and "-np N" in message and "3 attempts" in message
    retries = [e for e in events if isinstance(e, Retrying)]
    assert [r.attempt for r in retries] == [1, 2]
    assert all("KV pool is full" in r.reason for r in retries)
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "infer_error"
    assert not any(isinstance(r, LimitHit) and r.kind == "context_full" for r in session.records)
    session.close()


def test_a_prompt_past_the_slot_still_ends_the_turn_with_session_full(tmp_path: Path) -> None:
    body = (
        '{"error":{"code":400,"message":"request (3021 tokens) exceeds the available context '
        'size (2048 tokens), try increasing it","type":"exceed_context_size_error",'
        '"n_prompt_tokens":3021,"n_ctx":2048}}'
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, text=body)

    session = Session.create(tmp_path, Baseline(system="sys"))
    runtime = Runtime(config=Config(), client=mock_client(handler), registry=Registry())
    with pytest.raises(SessionFull):
        run_turn(session, runtime, "hello")
    hit, end = session.records[-2:]
    assert isinstance(hit, LimitHit) and hit.kind == "context_full"
    assert isinstance(end, TurnEnd) and end.outcome == "session_full"
    session.close()


# --- 5e: delta.reasoning ----------------------------------------------------------------------


def test_reasoning_field_is_read_like_reasoning_content() -> None:
    completion, events = decode(
        {"reasoning": "Let"},
        {"reasoning": " me"},
        {"reasoning_content": " think"},
        {"content": "Hi"},
    )
    assert completion.reasoning == "Let me think"
    assert completion.reasoning_tokens == 3
    assert completion.content == "Hi"
    assert events[1:] == [Reasoning("Let"), Reasoning(" me"), Reasoning(" think"), Content("Hi")]
    both, _ = decode({"reasoning_content": "x", "reasoning": "x"})  # counted once
    assert (both.reasoning, both.reasoning_tokens) == ("x", 1)
    other, _ = decode({"reasoning": {"summary": "x"}, "content": "Hi"})  # not text: ignored
    assert (other.reasoning, other.content) == (None, "Hi")


def test_thinking_cap_counts_the_reasoning_field() -> None:
    controls: list[dict[str, Any]] = []
    body = b"".join(
        [
            sse(chunk({"role": "assistant", "content": None})),  # the stream opens
            *(sse(chunk({"reasoning": f"r{i}"})) for i in range(4)),
            sse(chunk({"content": "ok"}, "stop")),
            b"data: [DONE]\n\n",
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(json.loads(request.content))
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, content=body)

    events: list[ClientEvent] = []
    with mock_client(handler) as client:
        completion = client.chat(BODY, events.append, reasoning_budget=2)
    assert controls == [{"id": CID, "action": "reasoning_end"}]
    # the fallback: the count passed the budget sent by IGNORED_BUDGET_MARGIN (2)
    assert ThinkingCapped(reasoning_tokens=4) in events
    assert completion.thinking_capped and completion.reasoning_tokens == 4


# --- 5f: </think> in content with no opening tag ----------------------------------------------


def test_closing_think_tag_in_content_splits_reasoning_from_content() -> None:
    completion, events = decode(
        {"content": "The user"}, {"content": " asks"}, {"content": ".</think>"}, {"content": "Hi"}
    )
    assert completion.reasoning == "The user asks."
    assert completion.content == "Hi"
    assert completion.reasoning_tokens == 3
    texts = [e for e in events if isinstance(e, Content | Reasoning)]
    assert texts == [Content("The user"), Content(" asks"), Reasoning("."), Content("Hi")]


def test_closing_think_tag_split_across_deltas() -> None:
    completion, events = decode(
        {"content": "hmm"}, {"content": "</th"}, {"content": "ink>\n\nAnswer"}
    )
    assert (completion.reasoning, completion.content) == ("hmm", "\n\nAnswer")
    assert completion.reasoning_tokens == 1
    assert all("<" not in e.text for e in events if isinstance(e, Content | Reasoning))


def test_second_closing_tag_stays_content() -> None:
    completion, _ = decode({"content": "r</think>a</think>b"})
    assert (completion.reasoning, completion.content) == ("r", "a</think>b")
    # only when no reasoning channel was used
    completion, _ = decode({"reasoning_content": "r"}, {"content": "a</think>b"})
    assert (completion.reasoning, completion.content) == ("r", "a</think>b")
    assert completion.reasoning_tokens == 1
    # a <think> opening the content is reasoning (--reasoning-format none); later, content
    completion, _ = decode({"content": "<think>hmm</think>"}, {"content": "Hi"})
    assert (completion.reasoning, completion.content) == ("hmm", "Hi")
    completion, _ = decode({"content": "Hi <think>hmm</think>"}, {"content": "!"})
    assert (completion.reasoning, completion.content) == (None, "Hi <think>hmm</think>!")


def test_held_back_partial_tag_that_is_no_tag_is_content() -> None:
    completion, events = decode({"content": "a </th"}, {"content": "ing"}, {"content": "</think>"})
    assert (completion.reasoning, completion.content) == ("a </thing", None)
    shown = [e for e in events if isinstance(e, Content | Reasoning)]
    assert shown == [Content("a "), Content("</thing")]
    completion, events = decode({"content": "x <"})  # held to the end of the stream
    assert completion.content == "x <"
    assert "".join(e.text for e in events if isinstance(e, Content)) == "x <"


def test_reasoning_found_by_the_tag_does_not_trigger_the_thinking_cap() -> None:
    controls: list[httpx.Request] = []
    body = b"".join(
        [
            *(sse(chunk({"content": f"r{i}"})) for i in range(3)),
            sse(chunk({"content": "</think>ok"}, "stop")),
            b"data: [DONE]\n\n",
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(request)
            return httpx.Response(200, json={"success": False})
        return httpx.Response(200, content=body)

    with mock_client(handler) as client:
        completion = client.chat(BODY, lambda e: None, reasoning_budget=1)
    assert controls == []
    assert (completion.reasoning, completion.content) == ("r0r1r2", "ok")
    assert completion.reasoning_tokens == 3 and not completion.thinking_capped


_NO_TAGS = st.text(alphabet=st.sampled_from("ab<>/thinkTHé\n "), max_size=30).filter(
    lambda t: "<think>" not in t and "</think>" not in t
)


def _split(text: str, data: st.DataObject) -> list[str]:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return [p for p in pieces if p]


@given(reasoning=_NO_TAGS, answer=st.text(max_size=20), tag=st.booleans(), data=st.data())
def test_any_split_gives_the_same_completion(
    reasoning: str, answer: str, tag: bool, data: st.DataObject
) -> None:
    """Reasoning closed by ``</think>`` then an answer, or tagless content, cut anywhere."""
    whole = f"{reasoning}</think>{answer}" if tag else reasoning
    completion, events = decode(*({"content": p} for p in _split(whole, data)))
    if tag:
        assert completion.reasoning == (reasoning or None)
        assert completion.content == (answer or None)
    else:
        assert completion.reasoning is None
        assert completion.content == (reasoning or None)
        assert not any(isinstance(e, Reasoning) for e in events)
    shown = "".join(e.text for e in events if isinstance(e, Content | Reasoning))
    assert shown == reasoning + (answer if tag else "")  # every character once, never the tag


def test_a_chunk_nested_too_deeply_is_a_malformed_chunk_not_a_recursion_error() -> None:
    decoder = StreamDecoder()
    deep = '{"choices":[{"delta":{"content":' + "[" * 5000 + "]" * 5000 + "}}]}"
    with pytest.raises(InferError, match="malformed chunk"):
        decoder.feed(f"data: {deep}\n\n".encode())


# --- reasoning in content with both tags (llama-server --reasoning-format none) ---------------


def test_opening_and_closing_tags_in_content_are_reasoning() -> None:
    completion, events = decode(
        {"content": "<think>"},
        {"content": "The"},
        {"content": " user"},
        {"content": "</think>"},
        {"content": "\n\nHi"},
    )
    assert (completion.reasoning, completion.content) == ("The user", "\n\nHi")
    assert completion.reasoning_tokens == 2
    texts = [e for e in events if isinstance(e, Content | Reasoning)]
    assert texts == [Reasoning("The"), Reasoning(" user"), Content("\n\nHi")]


@given(st.lists(st.integers(min_value=1, max_value=40), max_size=6))
def test_tags_in_content_split_anywhere_give_the_same_completion(cuts: list[int]) -> None:
    text = "\n<think>\nThe user wants x.\n</think>\n\nIt is <b>sunny</b>."
    points = sorted({c % len(text) for c in cuts} - {0})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    completion, events = decode(*({"content": p} for p in pieces))
    assert completion.reasoning == "\nThe user wants x.\n"
    assert completion.content == "\n\nIt is <b>sunny</b>."
    shown = "".join(e.text for e in events if isinstance(e, Reasoning))
    assert shown == completion.reasoning
    assert "".join(e.text for e in events if isinstance(e, Content)) == completion.content
    assert 1 <= completion.reasoning_tokens <= len(pieces)


def test_unclosed_think_in_content_stays_reasoning() -> None:
    completion, _ = decode({"content": "<think>hmm"}, {"content": " </th"}, finish="length")
    assert (completion.reasoning, completion.content) == ("hmm </th", None)


def _capped_stream(*deltas: dict[str, Any]) -> bytes:
    return b"".join([*(sse(chunk(d)) for d in deltas), sse(chunk({}, "stop")), b"data: [DONE]\n\n"])


def _run_capped(body: bytes, budget: int, control: bool = True) -> tuple[Any, list[Any], list[Any]]:
    controls: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(json.loads(request.content))
            return httpx.Response(200, json={"success": control})
        return httpx.Response(200, content=body)

    events: list[ClientEvent] = []
    with mock_client(handler) as client:
        completion = client.chat(BODY, events.append, reasoning_budget=budget)
    return completion, events, controls


def test_thinking_cap_counts_reasoning_inside_think_tags_live_in_the_stream() -> None:
    # a server that ignores thinking_budget_tokens: reasoning_end goes mid-reasoning
    deltas = [{"content": "<thi"}, {"content": "nk>"}]
    deltas += [{"content": f"r{i}"} for i in range(6)]
    deltas += [{"content": "</think>ok"}]
    completion, events, controls = _run_capped(_capped_stream(*deltas), budget=2)
    assert controls == [{"id": CID, "action": "reasoning_end"}]
    assert ThinkingCapped(reasoning_tokens=4) in events
    assert completion.thinking_capped and completion.reasoning_tokens == 6
    assert (completion.reasoning, completion.content) == ("r0r1r2r3r4r5", "ok")


def test_thinking_budget_honoured_with_tags_in_content_is_capped() -> None:
    deltas = [{"content": "<think>"}, {"content": "a"}, {"content": "b"}]
    deltas += [{"content": "</think>"}, {"content": "ok"}]
    completion, events, controls = _run_capped(_capped_stream(*deltas), budget=3)
    assert controls == []
    assert ThinkingCapped(reasoning_tokens=2) in events
    assert completion.thinking_capped and completion.cap_warning is None
    assert not any(isinstance(e, CapNotEnforced) for e in events)


def test_refused_control_with_tags_in_content_warns_once() -> None:
    deltas = [{"content": "<think>"}, *({"content": f"r{i}"} for i in range(8))]
    deltas += [{"content": "</think>ok"}]
    completion, events, controls = _run_capped(_capped_stream(*deltas), budget=1, control=False)
    assert len(controls) == 1
    warnings = [e for e in events if isinstance(e, CapNotEnforced)]
    assert len(warnings) == 1 and warnings[0].reasoning_tokens == 3
    assert "refused reasoning control" in warnings[0].detail
    assert not completion.thinking_capped and completion.content == "ok"
    (hit,) = completion.limit_hits()
    assert hit.kind == "thinking_cap" and hit.detail.startswith("not enforced: ")


def test_no_reasoning_seen_warns_once_per_client() -> None:
    body = _capped_stream({"content": "Hi"}, {"content": " there"})
    events: list[ClientEvent] = []
    with mock_client(lambda request: httpx.Response(200, content=body)) as client:
        first = client.chat(BODY, events.append, reasoning_budget=10)
        second = client.chat(BODY, events.append, reasoning_budget=10)
    warnings = [e for e in events if isinstance(e, CapNotEnforced)]
    assert len(warnings) == 1 and "no reasoning seen" in warnings[0].detail
    assert first.cap_warning == warnings[0].detail and second.cap_warning is None
    assert first.content == "Hi there" and not first.thinking_capped


def test_no_reasoning_after_a_completion_with_reasoning_is_the_model_s_choice() -> None:
    """A client that saw reasoning knows the server shows it: a later completion without
    reasoning (an answer after a tool result) is no sign of a cap it cannot enforce."""
    thought = _capped_stream({"reasoning_content": "hm"}, {"content": "call"})
    plain = _capped_stream({"content": "Hi"})
    bodies = iter([thought, plain])
    events: list[ClientEvent] = []
    with mock_client(lambda request: httpx.Response(200, content=next(bodies))) as client:
        client.chat(BODY, events.append, reasoning_budget=10)
        after = client.chat(BODY, events.append, reasoning_budget=10)
    assert not any(isinstance(e, CapNotEnforced) for e in events)
    assert after.cap_warning is None and after.limit_hits() == []


def test_reasoning_past_the_budget_closed_by_a_lone_tag_warns() -> None:
    deltas = [{"content": f"r{i}"} for i in range(5)] + [{"content": "</think>ok"}]
    completion, events, controls = _run_capped(_capped_stream(*deltas), budget=2)
    assert controls == []  # counted only once it had ended: nothing left to stop
    (warning,) = [e for e in events if isinstance(e, CapNotEnforced)]
    assert warning.reasoning_tokens == 5 and "counted only once it had ended" in warning.detail
    assert completion.cap_warning == warning.detail and not completion.thinking_capped


def test_a_stream_without_id_cannot_be_ended_and_says_so() -> None:
    def no_id(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    body = b"".join(
        [
            *(sse(no_id({"reasoning_content": f"r{i}"})) for i in range(5)),
            sse(no_id({"content": "ok"}, "stop")),
            b"data: [DONE]\n\n",
        ]
    )
    completion, events, controls = _run_capped(body, budget=1)
    assert controls == []
    (warning,) = [e for e in events if isinstance(e, CapNotEnforced)]
    assert warning.reasoning_tokens == 3 and "no completion id" in warning.detail
    assert completion.reasoning_tokens == 5 and not completion.thinking_capped
