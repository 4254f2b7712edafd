"""Every stream shape a real server or proxy sends (issue 22, section 2), each fed through the
real :class:`Client` over ``httpx.MockTransport`` and, where it decides a turn, ``run_turn``.

Literal payloads where public reports give them: vLLM's ``finish_reason: "abort"`` then
``[DONE]`` (vllm-project/vllm#57082), Ollama's and SGLang's ``finish_reason: ""`` on every chunk
(ollama/ollama#4357, sgl-project/sglang#3912), llama-swap's loading notes (``proxy/process.go``
``sendData``: ``{"choices":[{"delta":{"reasoning_content":"..."}}]}``, no id).
"""

from __future__ import annotations

import itertools
import json
import tempfile
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.batch import Task
from boxmaker.batch._run import run_one
from boxmaker.batch._tasks import RunSpec
from boxmaker.client import IGNORED_BUDGET_MARGIN, Client
from boxmaker.client._retry import retry_after_s
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import InferError, TurnNotAnswered
from boxmaker.events import ClientEvent, Reasoning, Retrying, ThinkingCapped
from boxmaker.frames import summary
from boxmaker.records import Baseline, ToolResult, TurnEnd, Usage
from boxmaker.session import Session
from boxmaker.tools import Registry, find_text_tool_call
from boxmaker.turn import Runtime, run_turn

URL = "http://llama.test"
CID = "chatcmpl-shapes"
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}]}
DONE = b"data: [DONE]\n\n"
TIMINGS = {"cache_n": 0, "prompt_n": 12, "prompt_ms": 3.5, "predicted_n": 4, "predicted_ms": 9.0}


def chunk(delta: dict[str, Any], finish: str | None = None, cid: str = CID) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": cid}


def sse(obj: dict[str, Any] | str) -> bytes:
    return f"data: {obj if isinstance(obj, str) else json.dumps(obj)}\n\n".encode()


def stream(*deltas: dict[str, Any], finish: str = "stop") -> bytes:
    final = {**chunk({}, finish), "timings": TIMINGS}
    return b"".join([*(sse(chunk(d)) for d in deltas), sse(final), DONE])


def client(
    handler: Callable[[httpx.Request], httpx.Response],
    sleeps: list[float] | None = None,
    **config: Any,
) -> Client:
    settings_ = {"url": URL, "retry_attempts": 0, **config}
    sleep = None if sleeps is None else sleeps.append
    return Client(ClientConfig(**settings_), transport=httpx.MockTransport(handler), sleep=sleep)


def replies(*responses: httpx.Response) -> Callable[[httpx.Request], httpx.Response]:
    """A handler answering the chat requests in order (the last one again when they run out)
    and recording their bodies in ``handler.bodies``."""
    queue: Iterator[httpx.Response] = iter(responses)
    bodies: list[dict[str, Any]] = []
    last = responses[-1]

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return next(queue, last)

    handler.bodies = bodies  # type: ignore[attr-defined]
    return handler


def weather_registry(ran: list[str]) -> Registry:
    registry = Registry()

    @registry.add
    def get_weather(city: str) -> str:
        """The weather in a city.

        Args:
            city: the city's name.
        """
        ran.append(city)
        return f"sunny in {city}"

    return registry


def turn(
    tmp: Path, handler: Callable[[httpx.Request], httpx.Response], registry: Registry | None = None
) -> tuple[Session, TurnNotAnswered | None]:
    """A session whose one turn ran on ``handler``, and the error it ended with, if any."""
    registry = registry or Registry()
    session = Session.create(tmp, Baseline(system="sys", tools=registry.definitions()))
    runtime = Runtime(config=Config(), client=client(handler), registry=registry)
    try:
        run_turn(session, runtime, "What is the weather in Paris?")
    except TurnNotAnswered as exc:
        return session, exc
    return session, None


def ends(session: Session) -> list[TurnEnd]:
    return [r for r in session.records if isinstance(r, TurnEnd)]


# --- a finish_reason that is no answer (vLLM's abort, error) --------------------------------------

# vllm-project/vllm#57082: an engine abort ends the stream with HTTP 200, a terminal chunk whose
# finish_reason is "abort", then an unconditional data: [DONE].
VLLM_ABORT = b"".join(
    [
        sse(
            '{"id":"chatcmpl-8b2b","object":"chat.completion.chunk","created":1772423572,'
            '"model":"qwen3_8b","choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}'
        ),
        sse(
            '{"id":"chatcmpl-8b2b","object":"chat.completion.chunk","created":1772423572,'
            '"model":"qwen3_8b","choices":[{"index":0,"delta":{"content":"The weather in"},'
            '"logprobs":null,"finish_reason":null}]}'
        ),
        sse(
            '{"id":"chatcmpl-8b2b","object":"chat.completion.chunk","created":1772423572,'
            '"model":"qwen3_8b","choices":[{"index":0,"delta":{"content":""},'
            '"logprobs":null,"finish_reason":"abort"}]}'
        ),
        DONE,
    ]
)


@pytest.mark.parametrize("reason", ["abort", "error", "content_filter"])
def test_a_finish_reason_that_is_no_answer_ends_the_turn_naming_it(
    tmp_path: Path, reason: str
) -> None:
    body = VLLM_ABORT.replace(b'"abort"', f'"{reason}"'.encode())
    session, error = turn(tmp_path, replies(httpx.Response(200, content=body)))
    assert isinstance(error, TurnNotAnswered) and error.outcome == "server_stopped"
    (end,) = ends(session)
    assert end.outcome == "server_stopped" and f'finish_reason "{reason}"' in end.detail
    usage = next(r for r in session.records if isinstance(r, Usage))
    assert usage.finish_reason == reason  # the log keeps what came, the partial text too
    assert session.records[-3].content == "The weather in"  # type: ignore[union-attr]
    session.close()


def test_an_aborted_completion_runs_none_of_its_calls(tmp_path: Path) -> None:
    ran: list[str] = []
    call = {"index": 0, "id": "c1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    body = stream({"tool_calls": [call]}, finish="abort")
    session, _ = turn(tmp_path, replies(httpx.Response(200, content=body)), weather_registry(ran))
    assert ran == []
    (result,) = [r for r in session.records if isinstance(r, ToolResult)]
    assert result.not_run == "server_stopped" and '"abort"' in result.content
    assert ends(session)[0].outcome == "server_stopped"
    session.close()


# --- finish_reason "" on every chunk (SGLang, Ollama) ---------------------------------------------


def ollama_chunk(delta: dict[str, Any], finish: str = "") -> bytes:
    """Ollama's chunk as ollama/ollama#4357 quotes it (``"finish_reason": ""`` until the end)."""
    return sse(
        {
            "id": "chatcmpl-693",
            "object": "chat.completion.chunk",
            "created": 1715427619,
            "model": "mistral:latest",
            "system_fingerprint": "fp_ollama",
            "choices": [
                {"index": 0, "delta": {"role": "assistant", **delta}, "finish_reason": finish}
            ],
        }
    )


def test_empty_finish_reason_is_not_finished_for_the_think_splitter() -> None:
    deltas = [{"content": "Let me"}, {"content": " see</th"}, {"content": "ink> Hello"}]
    body = b"".join([*(ollama_chunk(d) for d in deltas), ollama_chunk({}, "stop"), DONE])
    with client(replies(httpx.Response(200, content=body))) as c:
        completion = c.chat(BODY, lambda e: None)
    assert completion.reasoning == "Let me see" and completion.content == " Hello"
    assert completion.reasoning_tokens == 2 and completion.finish_reason == "stop"


def test_empty_finish_reason_is_not_finished_for_the_thinking_cap() -> None:
    # a server that ignores thinking_budget_tokens: the fallback must still send reasoning_end
    budget = 2
    n = budget + IGNORED_BUDGET_MARGIN + 2
    deltas = [{"reasoning_content": f"r{i}"} for i in range(n)] + [{"content": "ok"}]
    body = b"".join([*(ollama_chunk(d) for d in deltas), ollama_chunk({}, "stop"), DONE])
    controls: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(json.loads(request.content))
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, content=body)

    events: list[ClientEvent] = []
    with client(handler) as c:
        completion = c.chat(BODY, events.append, reasoning_budget=budget)
    assert controls == [{"id": "chatcmpl-693", "action": "reasoning_end"}]
    assert completion.thinking_capped and any(isinstance(e, ThinkingCapped) for e in events)


def test_empty_finish_reason_chunks_are_still_read_the_usual_way() -> None:
    """SGLang's chunks (sgl-project/sglang#3912) carry ``"finish_reason": ""``: read like
    ``null``, the same completion as the parsed path gives."""
    head = '{"id":"b294","object":"chat.completion.chunk","created":1740634121,"model":"r1",'
    tail = '},"logprobs":null,"finish_reason":"","matched_stop":null}],"usage":null}'
    texts = [f'{head}"choices":[{{"index":0,"delta":{{"content":"{t}"' + tail for t in "abcdef"]
    last = f'{head}"choices":[{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":"stop"}}]}}'
    body = b"".join([*(sse(t) for t in texts), sse(last), DONE])
    with client(replies(httpx.Response(200, content=body))) as c:
        completion = c.chat(BODY, lambda e: None)
    assert completion.content == "abcdef" and completion.finish_reason == "stop"


# --- a proxy's own chunks before the model's (llama-swap) -----------------------------------------


def swap_note(text: str) -> bytes:
    """llama-swap's loading note, as ``proxy/process.go`` ``sendData`` writes it."""
    return sse(
        json.dumps({"choices": [{"delta": {"reasoning_content": text}}]}, separators=(",", ":"))
    )


SWAP_NOTES = [
    "━━━━━━━━━━━━━━━━━━━━━━━━━\n",
    "llama-swap loading model: qwen3\n",
    *(["."] * 30),
    "\nDone! (4.12s)\n",
]


def _swap_stream(model_reasoning: int, notes_cid: str | None = None) -> bytes:
    """llama-swap's notes (without id, or under ``notes_cid``), then the model's stream."""
    notes = [
        swap_note(n) if notes_cid is None else sse(chunk({"reasoning_content": n}, cid=notes_cid))
        for n in SWAP_NOTES
    ]
    first = {**chunk({"role": "assistant", "content": None})}
    first["prompt_progress"] = {"total": 5, "cache": 0, "processed": 5, "time_ms": 1}
    model = [sse(chunk({"reasoning_content": f"m{i}"})) for i in range(model_reasoning)]
    return b"".join([*notes, sse(first), *model, stream({"content": "Sunny."})])


def test_a_proxys_notes_are_not_reasoning_nor_counted_by_the_cap() -> None:
    controls: list[dict[str, Any]] = []
    budget = 3
    n = budget + IGNORED_BUDGET_MARGIN + 1
    body = _swap_stream(model_reasoning=n)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(json.loads(request.content))
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, content=body)

    events: list[ClientEvent] = []
    with client(handler) as c:
        completion = c.chat(BODY, events.append, reasoning_budget=budget)
    model = "".join(f"m{i}" for i in range(n))
    assert completion.id == CID and completion.proxy_text == "".join(SWAP_NOTES)
    assert completion.content == "Sunny." and completion.reasoning == model
    assert completion.reasoning_tokens == n
    # the cap counted the model's deltas only, and ended the model's completion
    assert controls == [{"id": CID, "action": "reasoning_end"}]
    capped = [e for e in events if isinstance(e, ThinkingCapped)]
    assert capped == [ThinkingCapped(reasoning_tokens=n - 1)]
    assert "".join(e.text for e in events if isinstance(e, Reasoning)) == model


def test_a_proxys_notes_under_its_own_id_are_moved_out_when_the_model_starts() -> None:
    body = _swap_stream(model_reasoning=2, notes_cid="swap-loading")
    with client(replies(httpx.Response(200, content=body))) as c:
        completion = c.chat(BODY, lambda e: None)
    assert completion.id == CID and completion.proxy_text == "".join(SWAP_NOTES)
    assert (completion.reasoning, completion.reasoning_tokens) == ("m0m1", 2)


def test_reasoning_before_a_new_id_that_opens_no_stream_stays_reasoning() -> None:
    """Only a chunk that opens a stream (role, prompt progress) under a new id moves the
    reasoning before it: a server that varies its chunk ids keeps its reasoning."""
    deltas = [
        chunk({"reasoning_content": "a"}, cid="x1"),
        chunk({"reasoning_content": "b"}, cid="x2"),
    ]
    body = b"".join(
        [*(sse(d) for d in deltas), sse(chunk({"content": "c"}, "stop", cid="x3")), DONE]
    )
    with client(replies(httpx.Response(200, content=body))) as c:
        completion = c.chat(BODY, lambda e: None)
    assert (completion.id, completion.reasoning, completion.proxy_text) == ("x1", "ab", None)


def test_a_proxys_notes_do_not_reach_the_log_as_reasoning(tmp_path: Path) -> None:
    session, _ = turn(tmp_path, replies(httpx.Response(200, content=_swap_stream(2))))
    assistant = session.records[1]
    assert assistant.reasoning == "m0m1" and assistant.content == "Sunny."  # type: ignore[union-attr]
    assert ends(session)[0].outcome == "answered"
    session.close()


# --- 429, 502, 504 retried like 503; Retry-After honoured ---------------------------------------


def _error(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"error": {"code": status, "message": f"upstream says {status}"}}
    return httpx.Response(status, json=body, headers=headers or {})


def test_429_502_504_are_retried_with_the_wait_retry_after_asks(tmp_path: Path) -> None:
    soon = format_datetime(datetime.now(UTC) + timedelta(hours=1), usegmt=True)
    handler = replies(
        _error(429, {"Retry-After": "3"}),
        _error(502),
        _error(504, {"Retry-After": soon}),
        _error(503, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
        httpx.Response(200, content=stream({"content": "Sunny."})),
    )
    sleeps: list[float] = []
    config = {"retry_attempts": 4, "retry_base_delay_s": 0.5, "retry_max_delay_s": 8.0}
    events: list[ClientEvent] = []
    with client(handler, sleeps, **config) as c:
        completion = c.chat_with_retry(BODY, events.append)
    assert completion.content == "Sunny." and len(handler.bodies) == 5  # type: ignore[attr-defined]
    retries = [e for e in events if isinstance(e, Retrying)]
    assert [(r.attempt, r.delay_s) for r in retries] == [(1, 3.0), (2, 1.0), (3, 8.0), (4, 0.0)]
    assert sleeps == [3.0, 1.0, 8.0, 0.0]  # Retry-After, backoff, capped date, past date
    assert retries[0].reason == "HTTP 429: upstream says 429 (Retry-After: 3)"
    assert retries[1].reason == "HTTP 502: upstream says 502"
    assert f"(Retry-After: {soon})" in retries[2].reason


def test_retries_of_a_proxy_stay_within_the_budget() -> None:
    handler = replies(_error(429, {"Retry-After": "1"}))
    sleeps: list[float] = []
    with client(handler, sleeps, retry_attempts=2) as c, pytest.raises(InferError) as caught:
        c.chat_with_retry(BODY, lambda e: None)
    assert caught.value.status == 429 and "gave up after 3 attempts" in str(caught.value)
    assert sleeps == [1.0, 1.0] and len(handler.bodies) == 3  # type: ignore[attr-defined]


def test_a_retrying_event_reaches_the_turn(tmp_path: Path) -> None:
    handler = replies(_error(502), httpx.Response(200, content=stream({"content": "Sunny."})))
    session = Session.create(tmp_path, Baseline(system="sys"))
    c = client(handler, [], retry_attempts=1, retry_base_delay_s=0.25)
    seen: list[Any] = []
    outcome = run_turn(
        session, Runtime(config=Config(), client=c, registry=Registry()), "Hi", seen.append
    )
    assert outcome.content == "Sunny."
    assert [e for e in seen if isinstance(e, Retrying)] == [
        Retrying(attempt=1, delay_s=0.25, reason="HTTP 502: upstream says 502")
    ]
    session.close()


# --- tool-call arguments cut by finish_reason "length" --------------------------------------------


def test_tool_call_arguments_cut_by_length_are_not_run_and_end_the_turn(tmp_path: Path) -> None:
    ran: list[str] = []
    call = {"index": 0, "id": "c1", "type": "function"}
    call["function"] = {"name": "get_weather", "arguments": '{"city": "Par'}
    body = stream({"tool_calls": [call]}, finish="length")
    handler = replies(httpx.Response(200, content=body))
    session, error = turn(tmp_path, handler, weather_registry(ran))
    assert ran == [] and error is None
    assert len(handler.bodies) == 1  # type: ignore[attr-defined]  # not asked again and again
    (result,) = [r for r in session.records if isinstance(r, ToolResult)]
    assert result.not_run == "length" and "max_tokens" in result.content
    assert "not valid JSON" not in result.content  # the model is told why, not "invalid JSON"
    (end,) = ends(session)
    assert end.outcome == "length"
    assert "get_weather (arguments cut after 13 characters, not valid JSON)" in end.detail
    session.close()


# --- a 200 application/json answer to a streamed request ------------------------------------------

# llama.cpp's non-streamed answer (tools/server README, "OAI-compatible chat completions"), which
# a proxy that drops "stream" passes on.
WHOLE = {
    "choices": [
        {
            "finish_reason": "tool_calls",
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "reasoning_content": "The user wants Paris.",
                "tool_calls": [
                    {
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                        "id": "call_whole_1",
                    }
                ],
            },
        }
    ],
    "created": 1796021819,
    "model": "tiny.gguf",
    "object": "chat.completion",
    "usage": {"completion_tokens": 4, "prompt_tokens": 12, "total_tokens": 16},
    "id": "chatcmpl-whole",
    "timings": TIMINGS,
}


def test_a_whole_json_completion_is_read_as_one_completion(tmp_path: Path) -> None:
    answer = {**WHOLE, "choices": [{"finish_reason": "stop", "index": 0, "message": {
        "role": "assistant", "content": "Sunny in Paris."}}]}  # fmt: skip
    handler = replies(httpx.Response(200, json=WHOLE), httpx.Response(200, json=answer))
    ran: list[str] = []
    registry = weather_registry(ran)
    session = Session.create(tmp_path, Baseline(system="sys", tools=registry.definitions()))
    events: list[Any] = []
    runtime = Runtime(config=Config(), client=client(handler), registry=registry)
    outcome = run_turn(session, runtime, "What is the weather in Paris?", events.append)
    assert outcome.content == "Sunny in Paris." and ran == ["Paris"]
    assistant, usage = session.records[1], session.records[2]
    assert assistant.reasoning == "The user wants Paris."  # type: ignore[union-attr]
    assert assistant.tool_calls[0].id == "call_whole_1"  # type: ignore[union-attr]
    assert isinstance(usage, Usage) and usage.timings["prompt_n"] == 12
    assert (usage.prompt_tokens, usage.completion_tokens) == (12, 4)
    assert usage.finish_reason == "tool_calls"
    assert Reasoning("The user wants Paris.") in events
    session.close()


@pytest.mark.parametrize(
    "text",
    ['{"object": "list", "data": []}', "[1, 2]", '{"choices": [{"text": "hi"}]}', "<html>"],
)
def test_a_json_answer_that_is_no_completion_is_one_clear_error(text: str) -> None:
    response = httpx.Response(200, text=text, headers={"Content-Type": "application/json"})
    with client(replies(response)) as c, pytest.raises(InferError) as caught:
        c.chat(BODY, lambda e: None)
    assert "not a chat.completion" in str(caught.value) and text[:6] in str(caught.value)
    assert caught.value.body == text


def test_an_error_object_as_json_keeps_its_code() -> None:
    error = {"error": {"code": 500, "message": "model crashed", "type": "server_error"}}
    with client(replies(httpx.Response(200, json=error))) as c, pytest.raises(InferError) as caught:
        c.chat(BODY, lambda e: None)
    assert caught.value.status == 500 and "model crashed" in str(caught.value)


# --- a tool call written into the content ---------------------------------------------------------

TEXT_CALLS = {
    "harmony": (
        "<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Paris"}<|call|>'
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "llama3": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
}


def _cuts(text: str, cuts: list[int]) -> list[str]:
    points = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in itertools.pairwise(points) if text[a:b]]


@settings(max_examples=25, deadline=None)
@given(key=st.sampled_from(sorted(TEXT_CALLS)), cuts=st.lists(st.integers(0, 200), max_size=8))
def test_a_tool_call_in_content_split_anywhere_is_flagged_not_answered(
    key: str, cuts: list[int]
) -> None:
    pieces = _cuts(TEXT_CALLS[key], cuts)
    body = stream(*({"content": p} for p in pieces))
    ran: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        handler = replies(httpx.Response(200, content=body))
        session, error = turn(Path(tmp), handler, weather_registry(ran))
        assert isinstance(error, TurnNotAnswered) and error.outcome == "tool_call_in_content"
        (end,) = ends(session)
        assert end.outcome == "tool_call_in_content" and "get_weather" in end.detail
        assert "--jinja" in end.detail and ran == []
        found = find_text_tool_call(TEXT_CALLS[key])
        assert found is not None and found.format == key and found.label in end.detail
        assert session.records[1].content == TEXT_CALLS[key]  # type: ignore[union-attr]
        session.close()
        frame = summary(Path(tmp))
        assert frame["tool_call_in_content_turns"].tolist() == [1]
        assert frame["answered_turns"].tolist() == [0]


@pytest.mark.parametrize(
    "content",
    [
        "Use the <tool_call> tag to call a tool.",
        "Functions look like <function> in C.",
        "The <|channel|> token starts a harmony message.",
        "Sunny in Paris.",
        'The call looks like {"name": "get_weather", "parameters": {}}.',
    ],
)
def test_prose_that_mentions_a_tag_is_an_answer(tmp_path: Path, content: str) -> None:
    session, error = turn(
        tmp_path, replies(httpx.Response(200, content=stream({"content": content})))
    )
    assert error is None and ends(session)[0].outcome == "answered"
    session.close()


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 1.5 ", 1.5),
        ("-3", 0.0),
        ("Tue, 01 Dec 2026 12:00:30 GMT", 30.0),
        ("Tue, 01 Dec 2026 11:00:00 GMT", 0.0),
        ("soon", None),
        ("nan", None),
        (None, None),
    ],
)
def test_retry_after_reads_seconds_and_http_dates(value: str | None, seconds: float | None) -> None:
    now = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
    assert retry_after_s(value, now) == seconds


def test_a_turn_that_is_no_answer_does_not_end_a_batch_run(tmp_path: Path) -> None:
    """A batch run goes on after a turn ended ``server_stopped`` (its TurnEnd says so), as it
    does after a limit."""
    handler = replies(
        httpx.Response(200, content=VLLM_ABORT),
        httpx.Response(200, content=stream({"content": "ok"})),
    )
    spec = RunSpec(id="t1", task=Task(id="t1", messages=("one", "two")), settings={})
    with client(handler) as c:
        outcome = run_one(
            spec, tmp_path, URL, 0, base=Config(), registry=Registry(), client=c,
            cancel=threading.Event(),
        )  # fmt: skip
    assert (outcome.state, outcome.turns, outcome.outcome) == ("done", 2, "answered")
    assert len(handler.bodies) == 2  # type: ignore[attr-defined]
