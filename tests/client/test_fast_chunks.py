"""The usual chunk read from its text (FastChunks.feed_usual) gives exactly what parsing it
gives: the same events, the same Completion, the same error, wherever the reads are cut.

The reference is the same StreamDecoder whose ChunkDecoder never takes the shortcut (every
chunk parsed and fed). Streams are generated from llama.cpp's and OpenAI's chunk layouts with
text that needs escapes, ``<think>`` tags, new tool calls among fragments, the odd chunks
(progress, finish, usage), and texts built to fool a reader that only compares the text
around the delta: unescaped quotes, control characters, bad escapes, duplicate keys.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from live_server import SERVER_API_KEY, live_server, unmet

from boxmaker.client import Completion, StreamDecoder
from boxmaker.client._stream._chunks import ChunkDecoder
from boxmaker.demo import demo_registry
from boxmaker.errors import InferError
from boxmaker.events import ClientEvent, Content, Reasoning, ToolCallDelta

# (text before the delta's member, text after it), "@T" the "created" second to fill in
LAYOUTS = [
    (  # llama.cpp
        '{"choices":[{"finish_reason":null,"index":0,"delta":{',
        '}}],"created":@T,"id":"chatcmpl-1","model":"m","object":"chat.completion.chunk"}',
    ),
    (  # OpenAI, vLLM
        '{"id":"chatcmpl-2","object":"chat.completion.chunk","created":@T,"model":"m",'
        '"choices":[{"index":0,"delta":{',
        '},"logprobs":null,"finish_reason":null}]}',
    ),
    (  # an "error": null in every chunk (Foundry Local): no error, read the usual way
        '{"choices":[{"index":0,"delta":{',
        '},"finish_reason":null}],"error":null,"created":@T,"id":"chatcmpl-4"}',
    ),
    (  # spaces after the separators: never usual, always parsed
        '{"choices": [{"finish_reason": null, "index": 0, "delta": {',
        '}}], "created": @T, "id": "chatcmpl-3"}',
    ),
]
# Texts after the member that must never be taken as a usual chunk's: each changes what the
# delta or the chunk is (a second member, a duplicate key, a finish, timings, an error); the
# last ones change the id, which only the first chunk's counts.
HOSTILE_TAILS = [
    ',"content":"dup"}}],"created":@T,"id":"chatcmpl-1"}',
    '},"delta":{"content":"dup"}}],"created":@T,"id":"chatcmpl-1"}',
    '},"finish_reason":"stop"}],"created":@T,"id":"chatcmpl-1"}',
    '}}],"created":@T,"id":"chatcmpl-1","choices":[{"delta":{"content":"dup"}}]}',
    '}}],"created":@T,"id":"chatcmpl-1","timings":{"prompt_n":1}}',
    '}}],"created":@T,"id":"chatcmpl-1","usage":{"prompt_tokens":2}}',
    '}}],"created":@T,"id":"chatcmpl-1","prompt_progress":{"total":3,"processed":3}}',
    '}}],"created":@T,"id":"chatcmpl-1","error":{"message":"boom"}}',
    '}}],"created":@T,"id":"other-id"}',
    '}}],"created":@T}',
]
# Members whose text is not what a plain reading of its parts suggests, or no JSON at all.
HOSTILE_MEMBERS = [
    '"content":"a"b"',
    '"content":"a\\"',
    '"content":"\x01"',
    '"content":"\\x"',
    '"content":"\\u12"',
    '"content":"\\ud800"',
    '"content":"x","content":"y"',
    '"content":"x","reasoning_content":"y"',
    '"content":1',
    '"content":null',
    '"reasoning_content":"a"}',
    '"tool_calls":[{"index":01,"function":{"arguments":"x"}}]',
    '"tool_calls":[{"index":0,"function":{"arguments":"x","name":"g"}}]',
    '"tool_calls":[{"index":0,"function":{"arguments":"x"}},{"index":1}]',
    '"tool_calls":[{"index":0,"function":{"arguments":"x\\"}}]',
    '"tool_calls":[{"index":-1,"function":{"arguments":"x"}}]',
    '"tool_calls":[{"index":0,"function":{"arguments":"\\n\\u00e9"}}]',
    '"role":"assistant","content":null',
    '"content":[{"type":"text","text":"x"}]',  # Mistral's parts: parsed, joined
    '"role":null,"reasoning_content":"y"',  # LiteLLM's role null in every chunk
    '"content":"x","tool_calls":[]',  # Foundry Local's empty tool_calls
    '"reasoning_content":"',  # the tail's first quote would close it
    '"tool_calls":[{"index":0,"function":{"arguments":"}}]',
]
FIRST = '{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,"id":"chatcmpl-1","prompt_progress":{"total":5,"cache":0,"processed":5,"time_ms":1}}'  # noqa: E501
FINISH = '{"choices":[{"finish_reason":"tool_calls","index":0,"delta":{}}],"created":9,"id":"chatcmpl-1","timings":{"prompt_n":5,"predicted_n":7}}'  # noqa: E501
USAGE = (
    '{"choices":[],"created":9,"id":"chatcmpl-1","usage":{"prompt_tokens":5,"completion_tokens":7}}'
)

texts = st.lists(
    st.one_of(
        st.sampled_from(["<think>", "</think>", "<", "</th", "ink>", '"', "\\", "\n", " ", "é"]),
        st.characters(codec="utf-8", exclude_categories=["Cs"]),
    ),
    max_size=6,
).map("".join)


@st.composite
def members(draw: st.DrawFn) -> str:
    """One delta member, as a server would write it (or a hostile one)."""
    kind = draw(st.sampled_from(["text", "text", "fragment", "fragment", "call", "hostile"]))
    ascii_only = draw(st.booleans())
    if kind == "text":
        key = draw(st.sampled_from(["reasoning_content", "content", "reasoning"]))
        return f'"{key}":{json.dumps(draw(texts), ensure_ascii=ascii_only)}'
    index = draw(st.integers(0, 3))
    if kind == "fragment":
        arguments = json.dumps(draw(texts), ensure_ascii=ascii_only)
        return f'"tool_calls":[{{"index":{index},"function":{{"arguments":{arguments}}}}}]'
    if kind == "call":
        call_id = draw(st.sampled_from(["call_a", "call_b", ""]))
        head = f'"index":{index},' + (f'"id":"{call_id}",' if call_id else "")
        return (
            f'"tool_calls":[{{{head}"type":"function","function":{{"name":"f","arguments":""}}}}]'
        )
    return draw(st.sampled_from(HOSTILE_MEMBERS))


@st.composite
def streams(draw: st.DrawFn) -> list[str]:
    """The JSON texts of one stream's chunks (the last may be cut short)."""
    layout = draw(st.sampled_from(LAYOUTS))
    chunks = [FIRST] if draw(st.booleans()) else []
    second = 1
    for _ in range(draw(st.integers(1, 40))):
        head, tail = layout
        roll = draw(st.integers(0, 19))
        if roll == 0:
            second += draw(st.sampled_from([1, 95]))  # "created" moves on (to more digits)
        elif roll == 1:
            tail = draw(st.sampled_from(HOSTILE_TAILS))
        elif roll == 2:
            head, tail = draw(st.sampled_from(LAYOUTS))  # one chunk
        elif roll == 4:
            head, tail = layout = draw(st.sampled_from(LAYOUTS))  # from now on
        elif roll == 3:
            chunks.append(draw(st.sampled_from([FIRST, FINISH, USAGE])))
            continue
        created = str(second)
        chunks.append(head.replace("@T", created) + draw(members()) + tail.replace("@T", created))
    if draw(st.booleans()):
        chunks += [FINISH, USAGE, "[DONE]"]
    return chunks


class FullPath(ChunkDecoder):
    """A ChunkDecoder that parses every chunk (the reference)."""

    def feed_usual(self, text: str, on_event: Callable[[ClientEvent], None]) -> bool:
        return False


def decode(
    reads: list[bytes], *, usual: bool, tool_call_deltas: bool, emit: bool
) -> tuple[list[ClientEvent], Completion, str]:
    """Events, the completion so far, and the error (``""`` if none) of a stream read in
    ``reads``, by ``StreamDecoder.emit`` (the client's way) or ``StreamDecoder.feed``."""
    decoder = StreamDecoder(tool_call_deltas=tool_call_deltas)
    if not usual:
        decoder.chunks = FullPath(tool_call_deltas=tool_call_deltas)
    events: list[ClientEvent] = []
    error = ""
    try:
        for raw in reads:
            if emit:
                decoder.emit(decoder.sse.feed(raw), events.append)
            else:
                events += decoder.feed(raw)
        if emit:
            decoder.emit(decoder.sse.flush(), events.append)
        else:
            events += decoder.flush()
    except InferError as exc:
        error = f"{exc} {exc.status} {exc.body!r}"
    return events, decoder.chunks.partial(), error


def cut(body: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({min(p, len(body)) for p in points} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=400, deadline=None)
@given(streams(), st.lists(st.integers(0, 4000), max_size=30), st.booleans())
def test_the_usual_path_reads_every_stream_as_parsing_does(
    chunks: list[str], points: list[int], deltas: bool
) -> None:
    body = "".join(f"data: {c}\n\n" for c in chunks).encode()
    for reads in (cut(body, points), [body]):
        for emit in (True, False):
            assert decode(reads, usual=True, tool_call_deltas=deltas, emit=emit) == decode(
                reads, usual=False, tool_call_deltas=deltas, emit=emit
            )


class Counting(ChunkDecoder):
    """A ChunkDecoder that counts the chunks it parsed."""

    def __init__(self) -> None:
        super().__init__()
        self.parsed = 0

    def feed(self, obj: dict[str, Any], text: str | None = None) -> list[ClientEvent]:
        self.parsed += 1
        return super().feed(obj, text)


@pytest.mark.parametrize("hostile", HOSTILE_MEMBERS)
@pytest.mark.parametrize("layout", LAYOUTS[:2])
def test_a_hostile_member_after_fragments_of_a_known_call_is_read_as_parsing_does(
    hostile: str, layout: tuple[str, str]
) -> None:
    head, tail = (part.replace("@T", "1") for part in layout)
    call = '"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f"}}]'
    fragment = '"tool_calls":[{"index":0,"function":{"arguments":"x"}}]'
    chunks = [FIRST] + [head + member + tail for member in [call, fragment, fragment, hostile]]
    body = "".join(f"data: {c}\n\n" for c in [*chunks, FINISH]).encode()
    for emit in (True, False):
        assert decode([body], usual=True, tool_call_deltas=True, emit=emit) == decode(
            [body], usual=False, tool_call_deltas=True, emit=emit
        )


@pytest.mark.parametrize("switch", [(0, 1), (1, 0)])
def test_fragments_of_one_call_read_across_a_change_of_layout(switch: tuple[int, int]) -> None:
    (head_a, tail_a), (head_b, tail_b) = (
        tuple(part.replace("@T", "1") for part in LAYOUTS[i]) for i in switch
    )
    call = '"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f"}}]'
    fragments = [f'"tool_calls":[{{"index":0,"function":{{"arguments":"{t}"}}}}]' for t in "abc"]
    chunks = [FIRST, head_a + call + tail_a]
    chunks += [head_a + f + tail_a for f in fragments] + [head_b + f + tail_b for f in fragments]
    read, events = usual_count([*chunks, FINISH])
    assert read == 4  # b and c in each layout: the first fragment in each is parsed, learnt
    assert [e.arguments for e in events if isinstance(e, ToolCallDelta)] == ["", *"abcabc"]


def usual_count(chunks: list[str]) -> tuple[int, list[ClientEvent]]:
    """How many of ``chunks`` the usual path read, and the events."""
    decoder = StreamDecoder()
    decoder.chunks = counting = Counting()
    events: list[ClientEvent] = []
    body = "".join(f"data: {c}\n\n" for c in chunks).encode()
    decoder.emit(decoder.sse.feed(body), events.append)
    return len(chunks) - counting.parsed, events


def test_after_one_parsed_chunk_the_usual_ones_are_read_without_parsing() -> None:
    head, tail = LAYOUTS[0]
    tail = tail.replace("@T", "1")
    call = '"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":""}}]'  # noqa: E501
    chunks = [FIRST]
    chunks += [head + f'"reasoning_content":{json.dumps(t)}' + tail for t in ["a", "\n", '"', "é"]]
    chunks += [head + call + tail]
    chunks += [
        head + f'"tool_calls":[{{"index":0,"function":{{"arguments":"{t}"}}}}]' + tail for t in "{}"
    ]
    chunks += [head + '"content":"ok"' + tail, FINISH]
    read, events = usual_count(chunks)
    # parsed: FIRST, the first reasoning chunk (learnt from), the new call, the finish
    assert read == len(chunks) - 4
    assert events[2:] == [  # after Progress and Waiting
        Reasoning("a"),
        Reasoning("\n"),
        Reasoning('"'),
        Reasoning("é"),
        ToolCallDelta(index=0, id="call_a", name="f", arguments=""),
        ToolCallDelta(index=0, id=None, name=None, arguments="{"),
        ToolCallDelta(index=0, id=None, name=None, arguments="}"),
        Content("ok"),
    ]


def test_a_text_that_changes_around_every_delta_stops_being_learnt() -> None:
    probes = 0

    class Probing(ChunkDecoder):
        def _probe(self, head: str, tail: str) -> bool:
            nonlocal probes
            probes += 1
            return super()._probe(head, tail)

    head = LAYOUTS[1][0].replace("@T", "1")
    chunks = [head + f'"content":"{i}"}}}}],"obfuscation":"{i:x}"}}' for i in range(200)]
    decoder = StreamDecoder()
    decoder.chunks = Probing()
    events: list[ClientEvent] = []
    decoder.emit(
        decoder.sse.feed("".join(f"data: {c}\n\n" for c in chunks).encode()), events.append
    )
    assert probes <= 4
    assert [e.text for e in events if isinstance(e, Content)] == [str(i) for i in range(200)]


@pytest.mark.parametrize("hostile", HOSTILE_TAILS[:7])
def test_a_text_after_the_delta_that_changes_the_chunk_is_never_learnt(hostile: str) -> None:
    head = LAYOUTS[0][0]
    chunks = [head + '"content":"a"' + hostile.replace("@T", "1")] * 3
    read, _ = usual_count(chunks)
    assert read == 0


@pytest.mark.live
def test_a_real_llama_cpp_stream_is_read_the_usual_way_as_parsing_reads_it() -> None:
    # the shipped model asked about the weather with the demo tools: reasoning, content and
    # tool-call fragments as llama.cpp writes them, read both ways from the recorded bytes
    body = {
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": demo_registry().definitions(),
        "max_tokens": 200,
        "temperature": 0.0,
        "stream": True,
        "return_progress": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {SERVER_API_KEY}"} if SERVER_API_KEY else {}
    with live_server(n_ctx=4096) as server:
        response = httpx.post(
            f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=120
        )
        shipped = not unmet(server, "shipped_model")
    assert response.status_code == 200
    raw = response.content
    cuts = cut(raw, list(range(0, len(raw), 97)))
    for emit in (True, False):
        usual = decode(cuts, usual=True, tool_call_deltas=True, emit=emit)
        assert usual == decode([raw], usual=False, tool_call_deltas=True, emit=emit)
        assert usual[2] == ""  # no error
        assert usual[1].finish_reason is not None
    chunks = [p[6:] for p in raw.decode().split("\n\n") if p.startswith("data: {")]
    read, _ = usual_count(chunks)
    if shipped:  # the usual path's share: the shipped model's chunk layouts
        assert read >= len(chunks) - 10  # all but the first, progress, new calls and the end


def test_an_error_null_in_every_chunk_is_read_the_usual_way() -> None:
    """``"error": null`` is no error, for the usual path as for the parse (one rule,
    ``carries_error``): after the first text chunk is parsed and learnt, the rest is read."""
    head, tail = (part.replace("@T", "1") for part in LAYOUTS[2])
    chunks = [head + f'"content":"{t}"' + tail for t in "abcd"]
    read, events = usual_count([FIRST, *chunks, FINISH])
    assert read == 3
    assert [e.text for e in events if isinstance(e, Content)] == list("abcd")
