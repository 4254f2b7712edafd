"""Stream shapes of public reports about OpenAI-compatible servers and proxies (issue 35,
item 1), each read as the server meant it.

Every stream here is written as the report shows it (the chunk texts are modelled on the
report named at each one), decoded by :class:`StreamDecoder` with its reads cut in the worst
places (mid-line, mid-UTF-8 character, two events per read) and checked against a decoder that
parses every chunk (the usual-chunk shortcut and the parse agree); where the shape decides a
turn, it is also run through ``run_turn`` over ``httpx.MockTransport``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.client import Client, Completion, StreamDecoder
from boxmaker.client._stream._chunks import ChunkDecoder
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import InferError
from boxmaker.events import ClientEvent, Content, Reasoning, ToolCallDelta
from boxmaker.records import Assistant, Baseline, ToolResult, TurnEnd, Usage
from boxmaker.session import Session
from boxmaker.testing import assert_log_well_formed
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

DONE = "[DONE]"


def texts_of(*chunks: dict[str, Any] | str) -> list[str]:
    """The ``data:`` texts of a stream: chunks as compact JSON (a ``str`` as it is)."""
    return [c if isinstance(c, str) else json.dumps(c, separators=(",", ":")) for c in chunks]


def body_of(texts: list[str]) -> bytes:
    return "".join(f"data: {t}\n\n" for t in texts).encode()


class FullPath(ChunkDecoder):
    """A ChunkDecoder that parses every chunk (the reference for the usual-chunk shortcut)."""

    def feed_usual(self, text: str, on_event: Callable[[ClientEvent], None]) -> bool:
        return False


def decode(reads: list[bytes], *, usual: bool = True) -> tuple[list[ClientEvent], Completion]:
    """The events and the completion of a stream read in ``reads`` the client's way."""
    decoder = StreamDecoder()
    if not usual:
        decoder.chunks = FullPath()
    events: list[ClientEvent] = []
    for raw in reads:
        decoder.emit(decoder.sse.feed(raw), events.append)
    decoder.emit(decoder.sse.flush(), events.append)
    return events, decoder.chunks.finish()


def cut(body: bytes, points: list[int]) -> list[bytes]:
    edges = sorted({min(p, len(body)) for p in points} | {0, len(body)})
    return [body[a:b] for a, b in itertools.pairwise(edges)]


def worst_cuts(body: bytes) -> list[list[bytes]]:
    """The body read whole, byte by byte, cut inside each multi-byte UTF-8 character, and
    in reads of two events each."""
    inside = [i for i in range(1, len(body)) if body[i] & 0xC0 == 0x80]
    events = body.split(b"\n\n")
    pairs = [b"\n\n".join(events[i : i + 2]) + b"\n\n" for i in range(0, len(events) - 1, 2)]
    pairs = [p for p in pairs if p.strip()]
    return [[body], [body[i : i + 1] for i in range(len(body))], cut(body, inside), pairs]


def read(texts: list[str]) -> tuple[list[ClientEvent], Completion]:
    """Decode the stream every worst way, check each gives what the full parse of one read
    gives, and return that."""
    body = body_of(texts)
    reference = decode([body], usual=False)
    for reads in worst_cuts(body):
        assert decode(reads) == reference
        assert decode(reads, usual=False) == reference
    return reference


def calls_of(completion: Completion) -> list[tuple[str, str, str]]:
    return [(c.id, c.name, c.arguments) for c in completion.tool_calls]


# --- Mistral's relay, GLM, NVIDIA endpoints: delta.content as a list of typed parts ------------


def mistral(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    """A chunk as Mistral's API writes it (vercel/ai#4821, meilisearch#6327)."""
    return {
        "id": "cmpl-e5cc70bb28c444948073e77776eb30ef",
        "object": "chat.completion.chunk",
        "created": 1702256327,
        "model": "magistral-small-latest",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def test_content_as_a_list_of_text_parts_is_joined() -> None:
    texts = texts_of(
        mistral({"role": "assistant", "content": ""}),
        mistral({"content": [{"type": "text", "text": "The sky "}]}),
        mistral(
            {
                "content": [
                    {"type": "reference", "reference_ids": [1]},
                    {"type": "text", "text": "is blue"},
                    {"type": "text", "text": " é😀."},
                ]
            }
        ),
        mistral({"content": ""}, "stop"),
        DONE,
    )
    events, completion = read(texts)
    assert completion.content == "The sky is blue é😀."
    assert [e for e in events if isinstance(e, Content)] == [
        Content("The sky "),
        Content("is blue é😀."),
    ]


def test_thinking_parts_are_reasoning() -> None:
    """Magistral streams its reasoning as ``thinking`` parts of ``content``."""
    thinking = {"type": "thinking", "thinking": [{"type": "text", "text": "The user asks"}]}
    texts = texts_of(
        mistral({"role": "assistant", "content": ""}),
        mistral({"content": [thinking]}),
        mistral({"content": [{"type": "thinking", "thinking": [{"type": "text", "text": "."}]}]}),
        mistral({"content": [{"type": "text", "text": "Blue."}]}, "stop"),
        DONE,
    )
    events, completion = read(texts)
    assert (completion.reasoning, completion.content) == ("The user asks.", "Blue.")
    assert completion.reasoning_tokens == 2
    assert [e for e in events if isinstance(e, Reasoning | Content)] == [
        Reasoning("The user asks"),
        Reasoning("."),
        Content("Blue."),
    ]


@pytest.mark.parametrize(
    "content", [[{"type": "text", "text": 3}], [7], [{"type": "thinking", "thinking": 1}]]
)
def test_a_part_that_holds_no_text_where_text_belongs_is_a_malformed_chunk(content: Any) -> None:
    with pytest.raises(InferError, match="malformed chunk"):
        StreamDecoder().feed(body_of(texts_of(mistral({"content": content}))))


# --- a function name in two deltas (OpenAI and Mistral SDKs: "get_" then "weather") -----------


def call_chunk(calls: list[dict[str, Any]], cid: str = "chatcmpl-9") -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}],
    }


def finish(reason: str, cid: str = "chatcmpl-9") -> dict[str, Any]:
    return {"id": cid, "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


def test_a_name_in_two_fragments_is_one_name() -> None:
    texts = texts_of(
        call_chunk(
            [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_"}}]
        ),
        call_chunk([{"index": 0, "function": {"name": "weather", "arguments": '{"city":'}}]),
        call_chunk([{"index": 0, "function": {"arguments": ' "Oslo"}'}}]),
        finish("tool_calls"),
        DONE,
    )
    events, completion = read(texts)
    assert calls_of(completion) == [("call_1", "get_weather", '{"city": "Oslo"}')]
    names = [e.name for e in events if isinstance(e, ToolCallDelta)]
    assert names == ["get_", "get_weather", None]  # the name so far, when a delta changed it


def test_a_name_restated_in_each_delta_or_growing_stays_one_name() -> None:
    restated = texts_of(
        call_chunk([{"index": 0, "id": "c", "function": {"name": "get_weather", "arguments": ""}}]),
        call_chunk([{"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]),
        finish("tool_calls"),
        DONE,
    )
    growing = texts_of(
        call_chunk([{"index": 0, "id": "c", "function": {"name": "get"}}]),
        call_chunk([{"index": 0, "function": {"name": "get_weather", "arguments": "{}"}}]),
        finish("tool_calls"),
        DONE,
    )
    for texts in (restated, growing):
        assert calls_of(read(texts)[1]) == [("c", "get_weather", "{}")]


# --- Poolside: a new id with each delta after the first (poolsideai/pool#9) ---------------------


def poolside(calls: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "gen-poolside-1",
        "object": "chat.completion.chunk",
        "created": 1746700000,
        "model": "poolside/laguna",
        "choices": [{"index": 0, "delta": {"tool_calls": calls}, "finish_reason": None}],
    }


POOLSIDE = texts_of(
    poolside(
        [
            {
                "index": 0,
                "id": "call_a1b2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": ""},
            }
        ]
    ),
    poolside([{"index": 0, "id": "call_x9y8", "function": {"arguments": '{"city"'}}]),
    poolside([{"index": 0, "id": "call_q7r6", "function": {"arguments": ': "Oslo"}'}}]),
    finish("tool_calls", "gen-poolside-1"),
    DONE,
)


def test_a_call_is_one_call_whatever_ids_its_later_deltas_carry() -> None:
    events, completion = read(POOLSIDE)
    assert calls_of(completion) == [("call_a1b2", "get_weather", '{"city": "Oslo"}')]
    assert {e.index for e in events if isinstance(e, ToolCallDelta)} == {0}


# --- DeepSeek behind a gateway: a parallel call's head at the previous call's index ---------


def deepseek_gateway(second: str) -> list[str]:
    """Two calls, both streamed at index 0 by the gateway; the second named ``second``."""
    return texts_of(
        call_chunk(
            [
                {
                    "index": 0,
                    "id": "call_00_Wf3",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        ),
        call_chunk([{"index": 0, "function": {"arguments": '{"city": "Oslo"}'}}]),
        call_chunk(
            [
                {
                    "index": 0,
                    "id": "call_01_Kq8",
                    "type": "function",
                    "function": {"name": second, "arguments": ""},
                }
            ]
        ),
        call_chunk([{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]),
        finish("tool_calls"),
        DONE,
    )


@pytest.mark.parametrize("second", ["get_time", "get_weather"])
def test_a_head_at_a_taken_index_with_a_new_id_and_name_is_a_new_call(second: str) -> None:
    events, completion = read(deepseek_gateway(second))
    assert calls_of(completion) == [
        ("call_00_Wf3", "get_weather", '{"city": "Oslo"}'),
        ("call_01_Kq8", second, '{"city": "Paris"}'),
    ]
    assert [e.index for e in events if isinstance(e, ToolCallDelta)] == [0, 0, 1, 1]


# --- Foundry Local: "error": null, a new id and a role in every chunk ------------------------


def foundry(n: int, content: str, finish_reason: str | None = None) -> str:
    """A chunk as Foundry Local writes it (microsoft/foundry-local#144, #221)."""
    delta: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "name": None,
        "tool_call_id": None,
        "function_call": None,
        "tool_calls": [],
    }
    return json.dumps(
        {
            "model": None,
            "choices": [
                {
                    "delta": delta,
                    "message": delta,
                    "index": n,
                    "finish_reason": finish_reason,
                    "finish_details": None,
                    "logprobs": None,
                }
            ],
            "usage": None,
            "system_fingerprint": None,
            "service_tier": None,
            "created": 1749165718,
            "CreatedAt": "2025-06-05T23:21:58+00:00",
            "id": f"chat.id.{4114 + n}",
            "StreamEvent": None,
            "IsDelta": False,
            "Successful": True,
            "error": None,
            "HttpStatusCode": 0,
            "HeaderValues": None,
            "object": "chat.completion.chunk",
        },
        separators=(",", ":"),
    )


def test_error_null_in_every_chunk_is_no_error() -> None:
    texts = [
        foundry(0, "\n"),
        foundry(1, "Moon"),
        foundry(2, ", maybe"),
        foundry(3, "", "stop"),
        DONE,
    ]
    _, completion = read(texts)
    assert completion.content == "\nMoon, maybe"
    assert (completion.id, completion.finish_reason) == ("chat.id.4114", "stop")
    with pytest.raises(InferError, match="boom"):  # an error object is still an error
        StreamDecoder().feed(body_of([foundry(0, "x").replace('"error":null', '"error":"boom"')]))


# --- LiteLLM, ms-swift: a new id (and a role) with each chunk -------------------------------


def litellm(n: int, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
    """A chunk as LiteLLM writes it for a non-OpenAI backend: a fresh id in each chunk and
    ``"role": null`` after the first (BerriAI/litellm#1571, #16584; agno-agi/agno#8879)."""
    return {
        "id": f"chatcmpl-{n:04d}ae15-efa3-4f1f-b895",
        "choices": [{"finish_reason": finish_reason, "index": 0, "delta": delta}],
        "created": 1706042011,
        "model": "qwen3",
        "object": "chat.completion.chunk",
        "system_fingerprint": None,
        "usage": {},
    }


def per_chunk_ids(role: str | None) -> list[str]:
    """Reasoning then content, a new id in each chunk, each delta with ``role`` (``None``:
    LiteLLM's null; ``"assistant"``: ms-swift's)."""
    first = litellm(0, {"role": "assistant", "content": ""})
    thoughts = [litellm(i, {"reasoning_content": t, "role": role}) for i, t in enumerate("abc", 1)]
    answer = litellm(4, {"content": "Hi", "role": role})
    return texts_of(first, *thoughts, answer, litellm(5, {"role": role}, "stop"), DONE)


@pytest.mark.parametrize("role", [None, "assistant"])
def test_a_new_id_and_a_role_in_every_chunk_start_no_new_stream(role: str | None) -> None:
    _, completion = read(per_chunk_ids(role))
    assert (completion.reasoning, completion.content) == ("abc", "Hi")
    assert completion.reasoning_tokens == 3 and completion.proxy_text is None
    assert completion.id == "chatcmpl-0000ae15-efa3-4f1f-b895"  # the first one


def test_a_stream_without_a_first_role_keeps_its_reasoning_when_ids_vary() -> None:
    """ms-swift without a first role chunk: each reasoning chunk opens a stream under a new
    id, and none of it was a proxy's."""
    chunks = [litellm(i, {"reasoning_content": t, "role": "assistant"}) for i, t in enumerate("ab")]
    texts = texts_of(*chunks, litellm(2, {"content": "ok", "role": "assistant"}, "stop"), DONE)
    _, completion = read(texts)
    assert (completion.reasoning, completion.reasoning_tokens) == ("ab", 2)


# --- a surrogate pair cut between two arguments deltas (a gateway slicing UTF-16 units) --------


def sliced_utf16(text: str, every: int) -> list[str]:
    """``text`` cut every ``every`` UTF-16 code units, as a gateway that slices by JavaScript
    string length does: a cut between the halves of a pair leaves a lone half in each piece."""
    units = text.encode("utf-16-le")
    step = 2 * every
    return [
        units[i : i + step].decode("utf-16-le", "surrogatepass") for i in range(0, len(units), step)
    ]


def test_surrogate_halves_in_two_deltas_are_one_character() -> None:
    arguments = json.dumps({"text": "hi 😀 there 𝄞"}, ensure_ascii=False)
    pieces = sliced_utf16(arguments, 14)  # cuts the 😀 between its halves
    assert any(len(p) and "\ud800" <= p[-1] <= "\udbff" for p in pieces)
    head = {"index": 0, "id": "call_s", "type": "function", "function": {"name": "echo"}}
    texts = texts_of(
        call_chunk([head]),
        *(call_chunk([{"index": 0, "function": {"arguments": p}}]) for p in pieces),
        finish("tool_calls"),
        DONE,
    )
    _, completion = read(texts)
    assert calls_of(completion) == [("call_s", "echo", arguments)]
    assert json.loads(completion.tool_calls[0].arguments) == {"text": "hi 😀 there 𝄞"}


def test_content_sliced_between_surrogate_halves_is_whole_and_a_lone_half_is_replaced() -> None:
    pieces = sliced_utf16("ok 😀", 4)
    chunks = [litellm(0, {"content": p}) for p in pieces]
    lone = litellm(0, {"content": "\ud83d!"})
    _, completion = read(texts_of(*chunks, litellm(0, {}, "stop"), DONE))
    assert completion.content == "ok 😀"
    _, completion = read(texts_of(lone, litellm(0, {}, "stop"), DONE))
    assert completion.content == "\ufffd!"


# --- every shape above, cut anywhere, reads as the full parse reads it -------------------------

ALL_SHAPES = [
    POOLSIDE,
    deepseek_gateway("get_time"),
    per_chunk_ids(None),
    per_chunk_ids("assistant"),
    [foundry(0, "é"), foundry(1, "😀"), foundry(2, "", "stop"), DONE],
]


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(ALL_SHAPES), st.lists(st.integers(0, 3000), max_size=25))
def test_each_report_shape_cut_anywhere_reads_the_same(texts: list[str], points: list[int]) -> None:
    body = body_of(texts)
    reference = decode([body], usual=False)
    assert decode(cut(body, points)) == reference


# --- through the turn: the model is told what it called -------------------------------------

URL = "http://llama.test"


def echo_registry(seen: list[str]) -> Registry:
    registry = Registry()

    @registry.add
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        seen.append(city)
        return f"sunny in {city}"

    @registry.add
    def echo(text: str) -> str:
        """Say a text back.

        Args:
            text: the text.
        """
        seen.append(text)
        return text

    return registry


def run(tmp_path: Path, first: list[str], seen: list[str], said: str = "Done.") -> Session:
    """One turn: the first completion streams ``first``, the next answers "Done."; the turn's
    answer must be ``said``."""
    answer = texts_of(
        {"id": "chatcmpl-2", "choices": [{"index": 0, "delta": {"content": "Done."}}]},
        finish("stop", "chatcmpl-2"),
        DONE,
    )
    bodies = iter([body_of(first), body_of(answer)])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(404)
        return httpx.Response(
            200, content=next(bodies), headers={"content-type": "text/event-stream"}
        )

    registry = echo_registry(seen)
    session = Session.create(tmp_path, Baseline(system="sys", tools=registry.definitions()))
    client = Client(ClientConfig(url=URL, retry_attempts=0), transport=httpx.MockTransport(handler))
    runtime = Runtime(config=Config(), client=client, registry=registry)
    assert run_turn(session, runtime, "Go").content == said
    assert_log_well_formed(session)
    return session


def test_a_split_name_runs_the_tool_it_names(tmp_path: Path) -> None:
    texts = texts_of(
        call_chunk(
            [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_"}}]
        ),
        call_chunk(
            [{"index": 0, "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]
        ),
        finish("tool_calls"),
        DONE,
    )
    seen: list[str] = []
    session = run(tmp_path, texts, seen)
    (result,) = [r for r in session.records if isinstance(r, ToolResult)]
    assert (result.name, result.content, seen) == ("get_weather", "sunny in Oslo", ["Oslo"])


def test_poolside_and_deepseek_calls_run_once_each(tmp_path: Path) -> None:
    seen: list[str] = []
    run(tmp_path / "p", POOLSIDE, seen)
    run(tmp_path / "d", deepseek_gateway("get_weather"), seen)
    assert seen == ["Oslo", "Oslo", "Paris"]


def test_a_surrogate_pair_cut_between_deltas_reaches_the_tool_whole(tmp_path: Path) -> None:
    """The gateway's cut once gave the tool two broken characters and ended ``run_turn`` with a
    bare ``UnicodeEncodeError`` and no ``TurnEnd``."""
    arguments = json.dumps({"text": "hi 😀 there"}, ensure_ascii=False)
    head = {"index": 0, "id": "call_s", "type": "function", "function": {"name": "echo"}}
    texts = texts_of(
        call_chunk([head]),
        *(
            call_chunk([{"index": 0, "function": {"arguments": p}}])
            for p in sliced_utf16(arguments, 5)
        ),
        finish("tool_calls"),
        DONE,
    )
    seen: list[str] = []
    session = run(tmp_path, texts, seen)
    assert seen == ["hi 😀 there"]
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "answered"


def test_per_chunk_ids_keep_the_reasoning_count_in_the_log(tmp_path: Path) -> None:
    seen: list[str] = []
    texts = per_chunk_ids(None)
    session = run(tmp_path, texts, seen, said="Hi")
    assistant = next(r for r in session.records if isinstance(r, Assistant))
    usage = next(r for r in session.records if isinstance(r, Usage))
    assert (assistant.reasoning, usage.reasoning_tokens) == ("abc", 3)


def test_a_lone_surrogate_in_the_user_message_goes_out_escaped(tmp_path: Path) -> None:
    """No UTF-8 holds it: the body carries it as a ``\\u`` escape (the server judges it), and
    no bare ``UnicodeEncodeError`` leaves ``run_turn``."""
    sent: list[bytes] = []
    answer = body_of(texts_of(litellm(0, {"content": "ok"}, "stop"), DONE))

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(404)
        sent.append(request.read())
        return httpx.Response(200, content=answer, headers={"content-type": "text/event-stream"})

    session = Session.create(tmp_path, Baseline(system="sys"))
    client = Client(ClientConfig(url=URL, retry_attempts=0), transport=httpx.MockTransport(handler))
    runtime = Runtime(config=Config(), client=client, registry=Registry())
    assert run_turn(session, runtime, "cut \ud83d here").content == "ok"
    assert json.loads(sent[0])["messages"][-1]["content"] == "cut \ud83d here"
    assert b"\\ud83d" in sent[0]
    assert run_turn(session, runtime, "again").content == "ok"  # the slot's fingerprint too


# --- usage: what the server measured, or unknown (item 2) ---------------------------------------


def ollama(delta: dict[str, Any], finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    """A chunk of Ollama's OpenAI-compatible stream (a role in every delta)."""
    return {
        "id": "chatcmpl-531",
        "object": "chat.completion.chunk",
        "created": 1719640000,
        "model": "llama3",
        "system_fingerprint": "fp_ollama",
        "choices": [
            {"index": 0, "delta": {"role": "assistant", **delta}, "finish_reason": finish_reason}
        ],
        **extra,
    }


def test_ollamas_zero_prompt_tokens_for_a_cached_prompt_is_unknown_with_a_note() -> None:
    """ollama/ollama#5370: ``prompt_tokens: 0`` when the prompt was cached."""
    usage = {"prompt_tokens": 0, "completion_tokens": 2, "total_tokens": 2}
    texts = texts_of(
        ollama({"content": "Hi"}),
        ollama({"content": "!"}),
        ollama({"content": ""}, "stop", usage=usage),
        DONE,
    )
    _, completion = read(texts)
    record = completion.usage_record()
    assert (record.prompt_tokens, record.completion_tokens) == (None, 2)
    assert record.note is not None and "usage.prompt_tokens 0" in record.note


def test_impossible_and_odd_counts_are_unknown_and_named() -> None:
    def record(usage: dict[str, Any], content: str | None = "Hi") -> Usage:
        return Completion(
            id="x",
            content=content,
            reasoning=None,
            tool_calls=(),
            finish_reason="stop",
            usage=usage,
        ).usage_record()

    assert record({"prompt_tokens": 12, "completion_tokens": 0}).completion_tokens is None
    assert record({"prompt_tokens": 12, "completion_tokens": 0}, None).completion_tokens == 0
    odd = record({"prompt_tokens": -3, "completion_tokens": True})
    assert (odd.prompt_tokens, odd.completion_tokens) == (None, None)
    assert odd.note is not None and "prompt_tokens -3" in odd.note
    assert "completion_tokens True" in odd.note
    fine = record({"prompt_tokens": 12, "completion_tokens": 3})
    assert (fine.prompt_tokens, fine.completion_tokens, fine.note) == (12, 3, None)
    assert record({}).note is None  # absent is unknown without a word


def test_running_totals_on_every_chunk_keep_the_last() -> None:
    """vLLM's ``continuous_usage_stats`` sends the totals so far with each chunk; LiteLLM an
    empty ``usage`` with each chunk, which changes nothing."""
    texts = texts_of(
        litellm(0, {"role": "assistant", "content": ""}),
        {**litellm(0, {"content": "a"}), "usage": {"prompt_tokens": 9, "completion_tokens": 1}},
        {**litellm(0, {"content": "b"}), "usage": {"prompt_tokens": 9, "completion_tokens": 2}},
        {**litellm(0, {}, "stop"), "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        litellm(0, {}),  # "usage": {} after the totals
        DONE,
    )
    _, completion = read(texts)
    assert completion.usage == {"prompt_tokens": 9, "completion_tokens": 3}
    assert completion.usage_record().completion_tokens == 3


def whole_answer(reasoning: str | None, details: dict[str, Any] | None) -> Completion:
    usage: dict[str, Any] = {"prompt_tokens": 20, "completion_tokens": 63}
    if details is not None:
        usage["completion_tokens_details"] = details
    message = {"role": "assistant", "content": "Hi", "reasoning_content": reasoning}
    body = {
        "id": "chatcmpl-w",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": usage,
    }
    decoder = StreamDecoder()
    decoder.feed_completion(json.dumps(body))
    return decoder.chunks.finish()


def test_reasoning_that_came_whole_is_counted_by_the_server_or_unknown() -> None:
    """One ``chat.completion`` holds the reasoning in one piece: it is no count of tokens."""
    counted = whole_answer("Let me think.", {"reasoning_tokens": 46})
    assert (counted.whole, counted.reasoning_tokens) == (True, 46)
    assert counted.usage_record().reasoning_tokens == 46
    unknown = whole_answer("Let me think.", None)
    assert unknown.usage_record().reasoning_tokens is None
    assert whole_answer(None, None).usage_record().reasoning_tokens == 0  # none came: 0
    streamed = read(texts_of(litellm(0, {"reasoning_content": "r"}), litellm(0, {}, "stop")))[1]
    assert (streamed.whole, streamed.usage_record().reasoning_tokens) == (False, 1)


def test_a_stream_whose_server_counts_its_reasoning_is_logged_with_that_count() -> None:
    """Deltas are a count of tokens only where each is one (llama.cpp): a server that sends
    several a delta and reports ``completion_tokens_details.reasoning_tokens`` is taken at its
    word (the log said 2 for the server's 12); without a report, or with a 0 beside streamed
    reasoning (a placeholder), the deltas count."""
    said = {"prompt_tokens": 9, "completion_tokens": 15}
    counted = {**said, "completion_tokens_details": {"reasoning_tokens": 12}}
    placeholder = {**said, "completion_tokens_details": {"reasoning_tokens": 0}}  # sglang's
    for usage, logged in ((counted, 12), (said, 2), (placeholder, 2)):
        texts = texts_of(
            litellm(0, {"reasoning_content": "Let me think about "}),
            litellm(0, {"reasoning_content": "the weather in Oslo."}),
            {**litellm(0, {"content": "Sunny."}, "stop"), "usage": usage},
            DONE,
        )
        assert read(texts)[1].usage_record().reasoning_tokens == logged


def test_unknown_figures_are_null_in_the_log_and_read_back(tmp_path: Path) -> None:
    usage = {"prompt_tokens": 0, "completion_tokens": 2}
    texts = texts_of(ollama({"content": "Hi"}), ollama({"content": ""}, "stop", usage=usage), DONE)
    session = run(tmp_path, texts, [], said="Hi")
    session.close()
    line = next(
        json.loads(text)
        for text in (tmp_path / f"{session.id}.jsonl").read_text().splitlines()
        if '"usage"' in text
    )
    assert line["prompt_tokens"] is None and "prompt_tokens 0" in line["note"]
    (record,) = [
        r for r in Session.open(tmp_path / f"{session.id}.jsonl").records if isinstance(r, Usage)
    ]
    assert (record.prompt_tokens, record.completion_tokens) == (None, 2)
