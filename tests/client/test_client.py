"""Client, ChunkDecoder and errors against httpx.MockTransport with small literal SSE bodies."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.client import IGNORED_BUDGET_MARGIN, Client, Completion, is_context_full
from boxmaker.client._stream._decoder import ChunkDecoder
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import ConfigError, InferError, RequestCancelled, StreamCut
from boxmaker.events import (
    CapNotEnforced,
    ClientEvent,
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallDelta,
    Waiting,
)

URL = "http://llama.test"
CID = "chatcmpl-2yTU6c2GMxjgwiTqjmfQcm4ePgSiXDHa"
BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0}
TIMINGS = {"cache_n": 10, "prompt_n": 24, "prompt_ms": 3.5, "predicted_n": 3, "predicted_ms": 9.0}
USAGE = {"completion_tokens": 3, "prompt_tokens": 34, "total_tokens": 37}
CONTEXT_FULL_BODY = (
    '{"error":{"code":400,"message":"request (3021 tokens) exceeds the available context size '
    '(2048 tokens), try increasing it","type":"exceed_context_size_error",'
    '"n_prompt_tokens":3021,"n_ctx":2048}}'
)


# --- helpers --------------------------------------------------------------------------------


def chunk(
    delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A llama.cpp chat.completion.chunk with one choice."""
    obj: dict[str, Any] = {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta or {}}],
        "created": 1796021819,
        "id": CID,
        "model": "tiny.gguf",
        "object": "chat.completion.chunk",
    }
    obj.update(extra)
    return obj


def data(obj: dict[str, Any] | str) -> bytes:
    """One SSE ``data:`` event."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    return f"data: {text}\n\n".encode()


ROLE = {"role": "assistant", "content": None}
FINAL = {"choices": [], "id": CID, "usage": USAGE, "timings": TIMINGS}
DONE = b"data: [DONE]\n\n"


def stream_of(*contents: str, finish: str = "stop") -> list[bytes]:
    """A whole plain stream: role, one content delta per text, finish, final, [DONE]."""
    return [
        data(chunk(ROLE)),
        *(data(chunk({"content": c})) for c in contents),
        data(chunk({}, finish=finish)),
        data(FINAL),
        DONE,
    ]


class Chunks(httpx.SyncByteStream):
    """A response body delivered one element per read; records how far it was read."""

    def __init__(self, chunks: list[bytes], fail: Exception | None = None) -> None:
        self.chunks = chunks
        self.fail = fail
        self.sent = 0
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.chunks:
            self.sent += 1
            yield piece
        if self.fail is not None:
            raise self.fail

    def close(self) -> None:
        self.closed = True


Answer = httpx.Response | Exception | list[bytes] | Chunks


class Fake:
    """A llama-server stand-in: answers chat requests from a queue, records everything."""

    def __init__(self, *answers: Answer, control: httpx.Response | None = None) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.control_requests: list[httpx.Request] = []
        self.control = control or httpx.Response(200, json={"success": True})
        self.streams: list[Chunks] = []
        self.control_at: list[int] = []  # chunks of the open stream sent when control came

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions/control":
            self.control_requests.append(request)
            self.control_at.append(self.streams[-1].sent if self.streams else -1)
            return self.control
        assert request.url.path == "/v1/chat/completions"
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, list):
            answer = Chunks(answer)
        if isinstance(answer, Chunks):
            self.streams.append(answer)
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=answer)
        return answer

    def client(self, config: ClientConfig | None = None, **kwargs: Any) -> Client:
        return Client(
            config or ClientConfig(url=URL), transport=httpx.MockTransport(self.handler), **kwargs
        )

    def payload(self, n: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.requests[n].content)
        return result


def run(
    *answers: Answer, budget: int | None = None, **kwargs: Any
) -> tuple[Completion, list[ClientEvent], Fake]:
    fake = Fake(*answers, **kwargs)
    events: list[ClientEvent] = []
    with fake.client() as client:
        completion = client.chat(BODY, events.append, reasoning_budget=budget)
    return completion, events, fake


def fails(*answers: Answer, **kwargs: Any) -> InferError:
    fake = Fake(*answers, **kwargs)
    with fake.client() as client, pytest.raises(InferError) as info:
        client.chat(BODY, lambda e: None)
    return info.value


# --- a whole stream ---------------------------------------------------------------------------


def test_full_stream_events_in_order_and_completion() -> None:
    progress = [
        data(chunk(ROLE, prompt_progress={"total": 24, "cache": 10, "processed": p, "time_ms": t}))
        for p, t in ((0, 0), (16, 1.5), (24, 3.0))
    ]
    body = [
        *progress,
        data(chunk(ROLE)),
        data(chunk({"reasoning_content": "Th"})),
        data(chunk({"reasoning_content": "ink"})),
        data(chunk({"content": "Hel"})),
        data(chunk({"content": "lo"})),
        data(chunk({}, finish="stop")),
        data(FINAL),
        DONE,
    ]
    completion, events, _ = run(body)
    assert events == [
        Queued(),
        Progress(total=24, cache=10, processed=0, time_ms=0.0),
        Progress(total=24, cache=10, processed=16, time_ms=1.5),
        Progress(total=24, cache=10, processed=24, time_ms=3.0),
        Waiting(),
        Reasoning("Th"),
        Reasoning("ink"),
        Content("Hel"),
        Content("lo"),
    ]
    assert completion == Completion(
        id=CID,
        content="Hello",
        reasoning="Think",
        tool_calls=(),
        finish_reason="stop",
        timings=TIMINGS,
        usage=USAGE,
        reasoning_tokens=2,
        thinking_capped=False,
    )


def test_waiting_once_before_first_token_without_progress() -> None:
    _, events, _ = run(stream_of("a", "b"))
    assert events == [Queued(), Waiting(), Content("a"), Content("b")]


def test_waiting_once_when_progress_repeats_done() -> None:
    done = {"total": 24, "cache": 24, "processed": 24, "time_ms": 0.5}
    body = [data(chunk(ROLE, prompt_progress=done)), data(chunk(ROLE, prompt_progress=done))]
    _, events, _ = run([*body, *stream_of("a")])
    assert events.count(Waiting()) == 1
    assert events.index(Waiting()) == 2  # right after the first completed progress
    assert events[-1] == Content("a")


def test_no_content_gives_none() -> None:
    completion, _, _ = run(stream_of())
    assert completion.content is None
    assert completion.reasoning is None
    assert completion.tool_calls == ()


# --- tool calls -------------------------------------------------------------------------------


def call_delta(index: int, arguments: str, **fields: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if "name" in fields:
        function["name"] = fields.pop("name")
    return {"tool_calls": [{"index": index, **fields, "function": function}]}


def test_tool_call_fragments_joined_per_index_interleaved() -> None:
    body = [
        data(chunk(ROLE)),
        data(chunk(call_delta(1, '{"tz":', id="b" * 32, type="function", name="get_time"))),
        data(chunk(call_delta(0, '{"city"', id="a" * 32, type="function", name="get_weather"))),
        data(chunk(call_delta(1, ' "UTC"'))),
        data(chunk(call_delta(0, ':  "Par'))),
        data(chunk(call_delta(1, "}"))),
        data(chunk(call_delta(0, 'is"}'))),
        data(chunk({}, finish="tool_calls")),
        DONE,
    ]
    completion, events, _ = run(body)
    assert [(c.id, c.name, c.arguments) for c in completion.tool_calls] == [
        ("a" * 32, "get_weather", '{"city":  "Paris"}'),  # exact text, not re-serialised
        ("b" * 32, "get_time", '{"tz": "UTC"}'),
    ]
    assert completion.finish_reason == "tool_calls"
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert [d.index for d in deltas] == [1, 0, 1, 0, 1, 0]
    assert "".join(d.arguments for d in deltas if d.index == 0) == '{"city":  "Paris"}'


def test_tool_call_id_and_name_set_once_when_repeated() -> None:
    repeat = {"id": "x" * 32, "type": "function", "name": "get_weather"}
    body = [
        data(chunk(call_delta(0, "{", **repeat))),
        data(chunk(call_delta(0, '"a":1', **repeat))),
        data(chunk(call_delta(0, "}", id="", name=""))),
        data(chunk({}, finish="tool_calls")),
        DONE,
    ]
    completion, events, _ = run(body)
    assert completion.tool_calls[0].id == "x" * 32
    assert completion.tool_calls[0].name == "get_weather"
    assert completion.tool_calls[0].arguments == '{"a":1}'
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas == [
        ToolCallDelta(0, "x" * 32, "get_weather", "{"),
        ToolCallDelta(0, None, None, '"a":1'),
        ToolCallDelta(0, None, None, "}"),
    ]


def test_made_up_tool_call_id_is_deterministic() -> None:
    def body(cid: str) -> list[bytes]:
        return [
            data({**chunk(call_delta(0, "{}", name="f")), "id": cid}),
            data({**chunk(call_delta(1, "{}", name="g")), "id": cid}),
            data({**chunk({}, finish="tool_calls"), "id": cid}),
            DONE,
        ]

    first, _, _ = run(body(CID))
    again, _, _ = run(body(CID))
    other, _, _ = run(body("chatcmpl-other"))
    ids = [c.id for c in first.tool_calls]
    assert all(ids) and ids[0] != ids[1]
    assert ids == [c.id for c in again.tool_calls]
    assert ids[0] != other.tool_calls[0].id


# --- end of stream ----------------------------------------------------------------------------


def test_final_empty_choices_chunk_read_to_done() -> None:
    body = [
        data(chunk({"content": "x"})),
        data(chunk({}, finish="stop")),
        data(FINAL),
        DONE,
        data("this is not read: the stream ended at [DONE]"),
    ]
    completion, _, _ = run(body)
    assert completion.usage == USAGE
    assert completion.timings == TIMINGS
    assert completion.finish_reason == "stop"


def test_stream_ending_after_finish_reason_without_done_is_ok() -> None:
    body = [data(chunk({"content": "x"})), data(chunk({}, finish="length", timings=TIMINGS))]
    completion, _, _ = run(body)
    assert completion.finish_reason == "length"
    assert completion.content == "x"
    assert completion.timings == TIMINGS
    assert completion.usage == {}


def test_stream_cut_without_finish_reason_or_done() -> None:
    error = fails([data(chunk(ROLE)), data(chunk({"content": "x"}))])
    assert isinstance(error, StreamCut)
    assert "cut" in str(error)
    assert "2 chunks" in str(error)


def test_connection_broken_mid_stream_is_stream_cut() -> None:
    broken = Chunks([data(chunk({"content": "x"}))], fail=httpx.RemoteProtocolError("peer gone"))
    error = fails(broken)
    assert isinstance(error, StreamCut)
    assert "broke mid-stream" in str(error)


def test_comment_lines_ignored() -> None:
    plain, plain_events, _ = run(stream_of("a", "b"))
    pinged = stream_of("a", "b")
    pinged.insert(0, b": ping\n\n")
    pinged.insert(2, b": keepalive\n\n")
    pinged.insert(3, b": ping\n\n: ping\n\n")
    completion, events, _ = run(pinged)
    assert completion == plain
    assert events == plain_events


def test_crlf_stream_split_everywhere() -> None:
    body = b"".join(stream_of("é", "€")).replace(b"\n", b"\r\n")
    completion, _, _ = run([body[i : i + 3] for i in range(0, len(body), 3)])
    assert completion.content == "é€"
    assert completion.usage == USAGE


def test_a_compressed_stream_is_read_decompressed() -> None:
    # the client reads raw bytes when there is nothing to undo; a Content-Encoding is undone
    body = gzip.compress(b"".join(stream_of("é", "€")))
    headers = {"content-type": "text/event-stream", "content-encoding": "gzip"}
    answer = httpx.Response(200, headers=headers, stream=Chunks([body[:25], body[25:]]))
    completion, _, _ = run(answer)
    assert completion.content == "é€"
    assert completion.usage == USAGE


def test_a_stream_answered_as_one_read_body_is_read() -> None:
    # a transport may answer with the body already read (httpx.Response(content=...))
    answer = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=b"".join(stream_of("é"))
    )
    completion, _, _ = run(answer)
    assert completion.content == "é"
    assert completion.usage == USAGE


# --- errors -----------------------------------------------------------------------------------


def test_malformed_chunk() -> None:
    error = fails([data(chunk(ROLE)), b'data: {"choices": [\n\n', DONE])
    assert type(error) is InferError
    assert "malformed chunk" in str(error)
    assert error.body == '{"choices": ['


def test_chunk_that_is_not_an_object_is_malformed() -> None:
    error = fails([b"data: [1, 2]\n\n", DONE])
    assert "malformed chunk" in str(error)


def test_chunk_of_the_wrong_shape_is_malformed() -> None:
    error = fails([data({"id": CID, "choices": ["not a choice"]}), DONE])
    assert "malformed chunk" in str(error)


def test_error_object_inside_200_stream_as_data() -> None:
    err = {"code": 500, "message": "boom in the middle", "type": "server_error"}
    error = fails([data(chunk({"content": "x"})), data({"error": err}), DONE])
    assert type(error) is InferError
    assert error.status == 500
    assert error.error == err
    assert "boom in the middle" in str(error)
    assert "inside the stream" in str(error)


def test_error_line_inside_200_stream_older_form() -> None:
    err = {"code": 500, "message": "old style boom", "type": "server_error"}
    error = fails([data(chunk({"content": "x"})), f"error: {json.dumps(err)}\n\n".encode()])
    assert error.status == 500
    assert error.error == err
    assert "old style boom" in str(error)


def test_context_full_inside_stream() -> None:
    err = json.loads(CONTEXT_FULL_BODY)["error"]
    error = fails([data({"error": err})])
    assert is_context_full(error)
    assert error.status == 400


def test_context_full_as_http_400() -> None:
    error = fails(httpx.Response(400, text=CONTEXT_FULL_BODY))
    assert is_context_full(error)
    assert error.status == 400
    assert error.body == CONTEXT_FULL_BODY
    assert error.error is not None and error.error["n_ctx"] == 2048
    assert "exceeds the available context size" in str(error)


def test_http_500_is_not_context_full() -> None:
    body = (
        '{"error":{"code":500,"message":"Failed to parse tool call arguments",'
        '"type":"server_error"}}'
    )
    error = fails(httpx.Response(500, text=body))
    assert not is_context_full(error)
    assert error.status == 500
    assert "Failed to parse tool call arguments" in str(error)


def test_is_context_full_only_for_infer_errors() -> None:
    assert not is_context_full(ValueError("exceed_context_size_error"))
    assert not is_context_full(InferError("x", status=400, error={"type": "invalid_request"}))


def test_non_200_keeps_status_and_body() -> None:
    error = fails(httpx.Response(404, text="File Not Found"))
    assert error.status == 404
    assert error.body == "File Not Found"
    assert error.error is None
    assert "HTTP 404" in str(error)


def test_connection_refused() -> None:
    error = fails(httpx.ConnectError("[Errno 111] Connection refused"))
    assert error.status is None
    assert "cannot connect" in str(error)
    assert "Connection refused" in str(error)


def test_idle_timeout() -> None:
    silent = Chunks([data(chunk(ROLE))], fail=httpx.ReadTimeout("timed out"))
    fake = Fake(silent)
    with (
        fake.client(ClientConfig(url=URL, idle_timeout_s=7.0)) as client,
        pytest.raises(InferError) as info,
    ):
        client.chat(BODY, lambda e: None)
    assert type(info.value) is InferError
    assert info.value.status is None
    assert "idle timeout" in str(info.value)
    assert "7.0 s" in str(info.value)


def test_timeouts_configured() -> None:
    client = Client(ClientConfig(connect_timeout_s=2.5, idle_timeout_s=42.0))
    timeout = client._http.timeout
    assert (timeout.connect, timeout.read) == (2.5, 42.0)
    client.close()


# --- request ----------------------------------------------------------------------------------


def test_request_body_and_no_authorization_without_api_key() -> None:
    body = {**BODY, "tools": [{"type": "function"}], "temperature": 0.0, "stream": False}
    fake = Fake(stream_of("x"))
    with fake.client() as client:
        client.chat(body, lambda e: None)
    assert body["stream"] is False  # the caller's dict is not modified
    request = fake.requests[0]
    assert request.method == "POST"
    assert str(request.url) == f"{URL}/v1/chat/completions"
    assert "authorization" not in request.headers
    payload = fake.payload()
    assert payload["messages"] == BODY["messages"]
    assert payload["tools"] == [{"type": "function"}]
    assert payload["id_slot"] == 0
    assert payload["temperature"] == 0.0
    assert payload["stream"] is True
    assert payload["return_progress"] is True
    assert payload["cache_prompt"] is True
    assert payload["stream_options"] == {"include_usage": True}
    assert "reasoning_control" not in payload


def test_authorization_with_api_key() -> None:
    fake = Fake(stream_of("x"))
    with fake.client(ClientConfig(url=URL + "/", api_key="sekrit")) as client:
        assert client.url == URL
        client.chat(BODY, lambda e: None)
    assert fake.requests[0].headers["authorization"] == "Bearer sekrit"


def test_reasoning_control_only_with_budget() -> None:
    _, _, fake = run(stream_of("x"), budget=10)
    assert fake.payload()["reasoning_control"] is True
    assert fake.control_requests == []  # no reasoning came: nothing to cap


# --- retries ----------------------------------------------------------------------------------

LOADING = '{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
REFUSED = "[Errno 111] Connection refused"


def retry_run(
    *answers: Answer, config: ClientConfig | None = None
) -> tuple[Completion | InferError, list[ClientEvent], list[float], Fake]:
    fake = Fake(*answers)
    events: list[ClientEvent] = []
    sleeps: list[float] = []
    cfg = config or ClientConfig(url=URL, retry_base_delay_s=0.5, retry_max_delay_s=8.0)
    with fake.client(cfg, sleep=sleeps.append) as client:
        try:
            result: Completion | InferError = client.chat_with_retry(BODY, events.append)
        except InferError as exc:
            result = exc
    return result, events, sleeps, fake


def test_retry_on_503_then_200() -> None:
    result, events, sleeps, fake = retry_run(
        httpx.Response(503, text=LOADING), httpx.Response(503, text=LOADING), stream_of("ok")
    )
    assert isinstance(result, Completion) and result.content == "ok"
    assert sleeps == [0.5, 1.0]
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert [(e.attempt, e.delay_s) for e in retrying] == [(1, 0.5), (2, 1.0)]
    assert all("503" in e.reason and "Loading model" in e.reason for e in retrying)
    assert events[:3] == [*retrying, Queued()]
    assert len(fake.requests) == 3


def test_retry_on_connection_refused_then_200() -> None:
    result, events, sleeps, _ = retry_run(httpx.ConnectError(REFUSED), stream_of("ok"))
    assert isinstance(result, Completion) and result.content == "ok"
    assert sleeps == [0.5]
    assert isinstance(events[0], Retrying) and "Connection refused" in events[0].reason


def test_retry_gives_up_after_configured_attempts_with_capped_delays() -> None:
    cfg = ClientConfig(url=URL, retry_attempts=4, retry_base_delay_s=1.0, retry_max_delay_s=3.0)
    refusals = [httpx.ConnectError(REFUSED) for _ in range(5)]
    result, events, sleeps, fake = retry_run(*refusals, config=cfg)
    assert isinstance(result, InferError)
    assert result.status is None
    assert "gave up after 5 attempts" in str(result)
    assert "Connection refused" in str(result)
    assert sleeps == [1.0, 2.0, 3.0, 3.0]
    assert [e.delay_s for e in events if isinstance(e, Retrying)] == sleeps
    assert len(fake.requests) == 5


def test_retry_gives_up_on_503_keeps_status_and_body() -> None:
    cfg = ClientConfig(url=URL, retry_attempts=1)
    result, _, sleeps, _ = retry_run(
        httpx.Response(503, text=LOADING), httpx.Response(503, text=LOADING), config=cfg
    )
    assert isinstance(result, InferError)
    assert result.status == 503
    assert result.body == LOADING
    assert "gave up after 2 attempts" in str(result)
    assert sleeps == [0.5]


@pytest.mark.parametrize("status", [400, 500])
def test_no_retry_on_400_or_500(status: int) -> None:
    body = CONTEXT_FULL_BODY if status == 400 else '{"error":{"code":500,"message":"x"}}'
    result, events, sleeps, fake = retry_run(httpx.Response(status, text=body), stream_of("ok"))
    assert isinstance(result, InferError) and result.status == status
    assert "gave up" not in str(result)
    assert sleeps == []
    assert events == []
    assert len(fake.requests) == 1


def test_chat_itself_does_not_retry() -> None:
    error = fails(httpx.Response(503, text=LOADING), stream_of("ok"))
    assert error.status == 503
    assert "gave up" not in str(error)


def test_no_retry_on_error_inside_stream() -> None:
    err = {"code": 503, "message": "in-stream", "type": "unavailable_error"}
    result, _, sleeps, fake = retry_run([data(chunk(ROLE)), data({"error": err})], stream_of("x"))
    assert isinstance(result, InferError) and "in-stream" in str(result)
    assert sleeps == [] and len(fake.requests) == 1


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_closes_the_stream_and_raises() -> None:
    stream = Chunks(stream_of("a", "b", "c", "d"))
    fake = Fake(stream)
    cancel = threading.Event()
    events: list[ClientEvent] = []

    def on_event(event: ClientEvent) -> None:
        events.append(event)
        if event == Content("b"):
            cancel.set()

    with fake.client() as client, pytest.raises(RequestCancelled):
        client.chat(BODY, on_event, cancel=cancel)
    assert stream.closed
    assert stream.sent == 3  # role, a, b: nothing read after the cancel
    assert events[-1] == Content("b")


def test_cancel_before_request_sends_nothing() -> None:
    fake = Fake(stream_of("x"))
    cancel = threading.Event()
    cancel.set()
    with fake.client() as client, pytest.raises(RequestCancelled):
        client.chat_with_retry(BODY, lambda e: None, cancel=cancel)
    assert fake.requests == []


def test_cancel_during_retry_sleep() -> None:
    cancel = threading.Event()
    fake = Fake(httpx.ConnectError(REFUSED), stream_of("x"))
    with (
        fake.client(sleep=lambda s: cancel.set()) as client,
        pytest.raises(RequestCancelled, match="waiting to retry"),
    ):
        client.chat_with_retry(BODY, lambda e: None, cancel=cancel)
    assert len(fake.requests) == 1


def test_cancel_cuts_default_retry_wait() -> None:
    cancel = threading.Event()
    cfg = ClientConfig(url=URL, retry_base_delay_s=30.0)
    fake = Fake(httpx.ConnectError(REFUSED))
    timer = threading.Timer(0.05, cancel.set)
    timer.start()
    with fake.client(cfg) as client, pytest.raises(RequestCancelled):
        client.chat_with_retry(BODY, lambda e: None, cancel=cancel)
    timer.join()


# --- thinking cap -----------------------------------------------------------------------------


def reasoning_stream(n_reasoning: int, *contents: str) -> list[bytes]:
    return [
        data(chunk(ROLE)),
        *(data(chunk({"reasoning_content": f"r{i}"})) for i in range(n_reasoning)),
        *stream_of(*contents)[1:],
    ]


def test_thinking_cap_sends_reasoning_end_once_and_reads_on() -> None:
    # a server that ignores thinking_budget_tokens: 6 reasoning deltas for a budget of 2
    completion, events, fake = run(reasoning_stream(6, "answer"), budget=2)
    assert len(fake.control_requests) == 1
    control = fake.control_requests[0]
    assert str(control.url) == f"{URL}/v1/chat/completions/control"
    assert json.loads(control.content) == {"id": CID, "action": "reasoning_end"}
    # sent while the stream was open, once the count passed the budget by the margin:
    # right after the fourth reasoning chunk (role + 2 + IGNORED_BUDGET_MARGIN)
    assert IGNORED_BUDGET_MARGIN == 2
    assert fake.control_at == [5]
    capped = events.index(ThinkingCapped(reasoning_tokens=4))
    assert events[capped - 1] == Reasoning("r3")
    assert sum(isinstance(e, ThinkingCapped) for e in events) == 1
    assert completion.thinking_capped
    assert completion.reasoning_tokens == 6  # deltas still in flight are counted
    assert completion.content == "answer"
    payload = fake.payload()
    assert payload["reasoning_control"] is True
    assert payload["thinking_budget_tokens"] == 2


def test_thinking_budget_zero_caps_at_the_margin_when_ignored() -> None:
    completion, events, fake = run(reasoning_stream(3, "x"), budget=0)
    assert fake.control_at == [3]
    assert fake.payload()["thinking_budget_tokens"] == 0
    assert ThinkingCapped(reasoning_tokens=2) in events
    assert completion.thinking_capped


def test_thinking_budget_honoured_by_the_server_needs_no_control() -> None:
    # llama.cpp's sampler ends reasoning after budget - 1 deltas: the answer then starts
    completion, events, fake = run(reasoning_stream(4, "an", "swer"), budget=5)
    assert fake.control_requests == []
    assert fake.payload()["thinking_budget_tokens"] == 5
    capped = events.index(ThinkingCapped(reasoning_tokens=4))
    assert events[capped - 1] == Content("an")  # said when the answer starts
    assert sum(isinstance(e, ThinkingCapped) for e in events) == 1
    assert completion.thinking_capped and completion.reasoning_tokens == 4
    assert completion.content == "answer"


def test_thinking_budget_zero_honoured_leaves_no_reasoning_and_is_capped() -> None:
    completion, events, fake = run(reasoning_stream(0, "x"), budget=0)
    assert fake.control_requests == []
    assert ThinkingCapped(reasoning_tokens=0) in events
    assert completion.thinking_capped and completion.reasoning_tokens == 0


def test_no_budget_sends_no_budget_field() -> None:
    completion, _events, fake = run(reasoning_stream(3, "x"))
    assert "thinking_budget_tokens" not in fake.payload()
    assert "reasoning_control" not in fake.payload()
    assert not completion.thinking_capped


def test_without_the_budget_field_reasoning_end_goes_at_the_budget() -> None:
    fake = Fake(reasoning_stream(5, "x"))
    events: list[ClientEvent] = []
    with fake.client(ClientConfig(url=URL, send_thinking_budget=False)) as client:
        completion = client.chat(BODY, events.append, reasoning_budget=2)
    assert "thinking_budget_tokens" not in fake.payload()
    assert fake.payload()["reasoning_control"] is True
    assert fake.control_at == [3]  # right after the second reasoning chunk, as before
    assert ThinkingCapped(reasoning_tokens=2) in events
    assert completion.thinking_capped and completion.reasoning_tokens == 5


def test_thinking_budget_not_reached() -> None:
    # reasoning ended by itself before budget - 1 deltas: not capped
    completion, events, fake = run(reasoning_stream(3, "x"), budget=3 + 2)
    assert fake.control_requests == []
    assert not any(isinstance(e, ThinkingCapped) for e in events)
    assert not completion.thinking_capped
    assert completion.reasoning_tokens == 3


def test_reasoning_control_refused_warns_once_and_reads_on() -> None:
    refusal = httpx.Response(200, json={"success": False, "message": "no active completion"})
    stream = Chunks(reasoning_stream(5, "x"))
    fake = Fake(stream, control=refusal)
    events: list[ClientEvent] = []
    with fake.client() as client:
        completion = client.chat(BODY, events.append, reasoning_budget=1)
    warnings = [e for e in events if isinstance(e, CapNotEnforced)]
    assert len(warnings) == 1 and len(fake.control_requests) == 1
    assert warnings[0].reasoning_tokens == 3  # budget 1 + IGNORED_BUDGET_MARGIN
    assert "refused reasoning control" in warnings[0].detail
    assert "no active completion" in warnings[0].detail
    assert not any(isinstance(e, ThinkingCapped) for e in events)
    assert not completion.thinking_capped and completion.content == "x"
    assert completion.cap_warning == warnings[0].detail
    assert [h.detail[:14] for h in completion.limit_hits()] == ["not enforced: "]


def test_reasoning_control_http_error_warns() -> None:
    fake = Fake(reasoning_stream(4, "x"), control=httpx.Response(404, text="File Not Found"))
    events: list[ClientEvent] = []
    with fake.client() as client:
        completion = client.chat(BODY, events.append, reasoning_budget=1)
    (warning,) = [e for e in events if isinstance(e, CapNotEnforced)]
    assert "refused reasoning control" in warning.detail and "404" in warning.detail
    assert completion.cap_warning == warning.detail


def test_reasoning_end_returns_success_field() -> None:
    for answer, expected in ((True, True), (False, False)):
        fake = Fake(control=httpx.Response(200, json={"success": answer}))
        with fake.client() as client:
            assert client.reasoning_end("chatcmpl-1") is expected
        assert json.loads(fake.control_requests[0].content) == {
            "id": "chatcmpl-1",
            "action": "reasoning_end",
        }


# --- ChunkDecoder on its own ------------------------------------------------------------------


def test_chunk_decoder_finish_raises_stream_cut_until_ended() -> None:
    decoder = ChunkDecoder()
    decoder.feed(chunk({"content": "x"}))
    with pytest.raises(StreamCut):
        decoder.finish()
    decoder.mark_done()
    assert decoder.finished
    assert decoder.finish().content == "x"


def test_chunk_decoder_error_chunk_raises() -> None:
    decoder = ChunkDecoder()
    with pytest.raises(InferError) as info:
        decoder.feed({"error": {"code": 400, "type": "exceed_context_size_error", "message": "m"}})
    assert is_context_full(info.value)


# --- silence limit config ---------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 0.0, -2.0, float("nan"), float("inf")])
def test_silence_timeout_out_of_range_is_a_config_error(bad: float) -> None:
    with pytest.raises(ConfigError, match=r"client\.silence_timeout_s"):
        ClientConfig(silence_timeout_s=bad)


def test_silence_timeout_default_none_and_minus_one_from_toml(tmp_path: Path) -> None:
    assert ClientConfig().silence_timeout_s == 600.0  # allows llama.cpp's pinged prompt work
    assert ClientConfig(silence_timeout_s=None).silence_timeout_s is None
    path = tmp_path / "boxmaker.toml"
    path.write_text("[client]\nsilence_timeout_s = -1\n")
    assert Config.from_toml(path).client.silence_timeout_s is None
    path.write_text("[client]\nsilence_timeout_s = 30\n")
    assert Config.from_toml(path).client.silence_timeout_s == 30
