"""The fast stream path (orjson, the SSE shortcut, the events built without __init__) decodes
exactly as the plain one: json.loads of each chunk fed to a ChunkDecoder.

orjson reads integers beyond 64 bits as floats and refuses NaN and lone surrogate escapes;
json.loads does neither, and the stream must give json.loads' values wherever a value is kept.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.client import Client, Completion, StreamDecoder
from boxmaker.client._stream._decoder import ChunkDecoder, SSEDecoder
from boxmaker.config import ClientConfig
from boxmaker.errors import InferError
from boxmaker.events import ClientEvent, Content, Reasoning, ToolCallDelta

CID = "chatcmpl-exact"
BIG = 2**80 + 7  # orjson would read it as 1.2089258196146292e+24


def chunk(delta: dict[str, Any], finish: Any = None, **extra: Any) -> dict[str, Any]:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": CID}
    obj.update(extra)
    return obj


def reference(texts: list[str]) -> tuple[Completion, list[ClientEvent]]:
    """The plain path: json.loads of each chunk, fed to a ChunkDecoder."""
    decoder = ChunkDecoder()
    events: list[ClientEvent] = []
    for text in texts:
        events += decoder.feed(json.loads(text))
    events += decoder.mark_done()
    return decoder.finish(), events


def fast(texts: list[str], *, one_read: bool) -> tuple[Completion, list[ClientEvent]]:
    decoder = StreamDecoder()
    body = [f"data: {t}\n\n".encode() for t in texts] + [b"data: [DONE]\n\n"]
    events: list[ClientEvent] = []
    for raw in [b"".join(body)] if one_read else body:
        events += decoder.feed(raw)
    return decoder.chunks.finish(), events


def same_both_ways(texts: list[str]) -> Completion:
    expected = reference(texts)
    assert fast(texts, one_read=True) == expected
    assert fast(texts, one_read=False) == expected
    return expected[0]


def test_integers_beyond_64_bits_keep_their_exact_value_everywhere_a_value_is_kept() -> None:
    texts = [
        json.dumps(chunk({}, prompt_progress={"total": BIG, "cache": 0, "processed": BIG})),
        json.dumps(chunk({"reasoning_content": "hm"})),
        json.dumps(chunk({"content": "ok"})),
        json.dumps(
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "c1",
                            "function": {"name": "f", "arguments": {"id": BIG, "n": -BIG}},
                        }
                    ]
                }
            )
        ),
        json.dumps(chunk({}, "tool_calls", timings={"prompt_n": BIG}, usage={"total": -BIG})),
    ]
    completion = same_both_ways(texts)
    assert json.loads(completion.tool_calls[0].arguments) == {"id": BIG, "n": -BIG}
    assert completion.timings == {"prompt_n": BIG}
    assert completion.usage == {"total": -BIG}


def test_odd_values_where_a_string_belongs_are_json_loads_ones() -> None:
    texts = [
        json.dumps(chunk({"tool_calls": [{"index": BIG, "id": "c", "function": {"name": BIG}}]})),
        json.dumps(chunk({"tool_calls": [{"index": BIG, "function": {"arguments": "{}"}}]})),
        json.dumps(chunk({}, BIG)),
    ]
    completion = same_both_ways(texts)
    odd: object = completion.finish_reason  # a wrong type the server sent, kept exactly
    assert odd == BIG
    name: object = completion.tool_calls[0].name
    assert name == BIG


def test_nan_and_lone_surrogates_are_read_as_json_loads_reads_them() -> None:
    """A lone surrogate escape reads as json.loads reads it (the Content event holds it);
    the joined text, which the log and the next request hold, has U+FFFD in its place (no
    UTF-8 encodes a lone surrogate)."""
    texts = [
        '{"choices":[{"index":0,"delta":{"content":"a\\ud800b"}}],"id":"x"}',
        '{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}],"timings":{"t":NaN}}',
    ]
    completion, events = fast(texts, one_read=True)
    assert [e for e in events if isinstance(e, Content)] == [Content("a\ud800b")]
    assert completion.content == "a\ufffdb"
    assert completion.timings["t"] != completion.timings["t"]  # NaN


def test_an_error_chunk_keeps_its_exact_code() -> None:
    decoder = StreamDecoder()
    error = {"code": BIG, "message": "boom"}
    with pytest.raises(InferError) as caught:
        decoder.feed(f"data: {json.dumps({'error': error})}\n\n".encode())
    assert caught.value.error == error
    assert caught.value.body == json.dumps({"error": error}, ensure_ascii=False)


def test_events_built_without_init_equal_the_dataclasses() -> None:
    texts = [
        json.dumps(chunk({"reasoning_content": "r"})),
        json.dumps(chunk({"content": "c"})),
        json.dumps(chunk({"tool_calls": [{"index": 0, "id": "i", "function": {"name": "n"}}]})),
        json.dumps(chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})),
    ]
    _, events = fast(texts, one_read=True)
    assert events[1:] == [
        Reasoning("r"),
        Content("c"),
        ToolCallDelta(0, "i", "n", ""),
        ToolCallDelta(0, None, None, "{}"),
    ]
    assert [hash(e) for e in events[1:]] == [hash(e) for e in events[1:]]
    assert repr(events[-1]) == "ToolCallDelta(index=0, id=None, name=None, arguments='{}')"


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**100), max_value=2**100)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


@settings(max_examples=60, deadline=None)
@given(arguments=_json, timings=st.dictionaries(st.text(max_size=5), _json, max_size=4))
def test_any_json_values_decode_as_json_loads_decodes_them(
    arguments: Any, timings: dict[str, Any]
) -> None:
    call = {"index": 0, "id": "c", "function": {"name": "f", "arguments": arguments}}
    texts = [
        json.dumps(chunk({"tool_calls": [call]})),
        json.dumps(chunk({}, "tool_calls", timings=timings, usage=timings)),
    ]
    same_both_ways(texts)


# --- the SSE shortcut for reads of one-line data events ------------------------------------------


def lines_one_by_one(body: bytes) -> list[tuple[str, str]]:
    """The events fed a byte at a time (never the shortcut)."""
    decoder = SSEDecoder()
    out: list[tuple[str, str]] = []
    for b in body:
        out += decoder.feed(bytes([b]))
    return out + decoder.flush()


@pytest.mark.parametrize(
    "body",
    [
        b"data: a\n\ndata: b\n\n",
        b"data: a\n\ndata: \n\ndata: b\n\n",  # an empty data event is dropped
        b"data: a\n\n\ndata: b\n\n",  # a stray blank line
        b"data: a\ndata: b\n\n",  # two lines of one event
        b"data: a\n\ndata: b\n\ndata: c\n",  # the last event not ended yet
        b"data:  x\n\ndata: data: y\n\n",
        b"data: a\n\n: ping\n\ndata: b\n\n",
    ],
)
def test_one_read_of_data_events_gives_what_byte_by_byte_reads_give(body: bytes) -> None:
    decoder = SSEDecoder()
    assert decoder.feed(body) + decoder.flush() == lines_one_by_one(body)


def test_the_shortcut_waits_for_a_pending_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.feed(b"data: b\n\ndata: c\n\n") == [("data", "a\nb"), ("data", "c")]


# --- the client's loop: StreamDecoder.emit, and tool_call_deltas=False ---------------------------


def shaped_stream() -> list[str]:
    return [
        json.dumps(chunk({}, prompt_progress={"total": 4, "cache": 0, "processed": 4})),
        json.dumps(chunk({"reasoning_content": "think"})),
        json.dumps(chunk({"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f"}}]})),
        json.dumps(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]})),
        json.dumps(chunk({"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]})),
        json.dumps(chunk({}, "tool_calls", timings={"prompt_n": 4})),
    ]


def test_emit_gives_the_events_of_feed_and_calls_between_after_each_data_event() -> None:
    texts = shaped_stream()
    body = "".join(f"data: {t}\n\n" for t in texts).encode() + b": ping\n\ndata: [DONE]\n\n"
    expected = StreamDecoder().feed(body)
    decoder = StreamDecoder()
    seen: list[Any] = []
    decoder.emit(decoder.sse.feed(body), seen.append, lambda: seen.append("|"))
    assert [e for e in seen if e != "|"] == expected
    assert seen.count("|") == len(texts) + 1  # each chunk and [DONE], not the comment
    assert seen[-1] == "|" and decoder.done


def test_without_tool_call_deltas_the_same_completion_and_no_delta_events() -> None:
    texts = shaped_stream()
    body = "".join(f"data: {t}\n\n" for t in texts).encode() + b"data: [DONE]\n\n"
    full, lean = StreamDecoder(), StreamDecoder(tool_call_deltas=False)
    all_events, lean_events = full.feed(body), lean.feed(body)
    assert lean.chunks.finish() == full.chunks.finish()
    assert lean.chunks.finish().tool_calls[0].arguments == '{"a":1}'
    assert lean_events == [e for e in all_events if not isinstance(e, ToolCallDelta)]
    assert len(all_events) - len(lean_events) == 3


def test_client_chat_without_tool_call_deltas() -> None:
    body = "".join(f"data: {t}\n\n" for t in shaped_stream()).encode() + b"data: [DONE]\n\n"

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    runs = []
    for flag in (True, False):
        events: list[ClientEvent] = []
        config = ClientConfig(url="http://llama.test")
        with Client(config, transport=httpx.MockTransport(handler)) as client:
            done = client.chat_with_retry({"messages": []}, events.append, tool_call_deltas=flag)
        runs.append((done, events))
    (done, events), (lean_done, lean_events) = runs
    assert lean_done == done and done.tool_calls[0].name == "f"
    assert sum(isinstance(e, ToolCallDelta) for e in events) == 3
    assert lean_events == [e for e in events if not isinstance(e, ToolCallDelta)]
