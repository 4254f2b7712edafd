"""Context errors classified by what they say (issue 35, item 3).

- vLLM's "maximum context length ... (N in the messages, M in the completion)" when it is the
  completion's share (``max_tokens``) that does not fit: a request error naming
  ``sampling.max_tokens``, never ``SessionFull`` (vllm-project/vllm#3851, #33418, #40076);
- llama.cpp's "Context size has been exceeded." for a prompt that fits its slot (a unified KV
  pool shared by several slots was full, ggml-org/llama.cpp#15827, #23652): transient, retried
  with a ``Retrying`` event that says why; when it persists, an error naming the pool and
  the fix, never ``SessionFull``;
- ``SessionFull`` only when this session's own prompt does not fit its slot.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.client import Client, is_context_full
from boxmaker.client._errors import context_error
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.errors import InferError, SessionFull, TurnInferError
from boxmaker.events import Content, Retrying
from boxmaker.records import Assistant, Baseline, LimitHit, TurnEnd
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

URL = "http://llama.test"

VLLM_SHARE = {
    "object": "error",
    "message": "This model's maximum context length is 4096 tokens. However, you requested "
    "4726 tokens (3726 in the messages, 1000 in the completion). Please reduce the length of "
    "the messages or completion.",
    "type": "BadRequestError",
    "param": None,
    "code": 400,
}
VLLM_TOO_LARGE = {
    "error": {
        "message": "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's "
        "maximum context length is 4096 tokens and your request has 3726 input tokens "
        "(1000 > 4096 - 3726). None",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}
VLLM_MESSAGES = dict(
    VLLM_SHARE,
    message="This model's maximum context length is 4096 tokens. However, you requested 5060 "
    "tokens (5000 in the messages, 60 in the completion). Please reduce the length of the "
    "messages or completion.",
)
POOL_500 = {
    "error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}
}


def classify(body: dict[str, Any]) -> str | None:
    error = body.get("error") if isinstance(body.get("error"), dict) else body
    return context_error(error, json.dumps(body))


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (VLLM_SHARE, "max_tokens"),
        (VLLM_TOO_LARGE, "max_tokens"),
        (VLLM_MESSAGES, "full"),
        (POOL_500, "pool"),
        (
            {
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "message": "request (3021 tokens) exceeds the available context size",
                    "n_prompt_tokens": 3021,
                    "n_ctx": 2048,
                }
            },
            "full",
        ),
        (  # the numbers say the prompt fits: the pool behind the slot did not
            {
                "error": {
                    "code": 400,
                    "type": "exceed_context_size_error",
                    "message": "request (1030 tokens) exceeds the available context size",
                    "n_prompt_tokens": 1030,
                    "n_ctx": 4096,
                }
            },
            "pool",
        ),
        ({"error": {"code": "context_length_exceeded", "message": "too long"}}, "full"),
        ({"error": {"code": 500, "message": "Failed to parse tool call arguments"}}, None),
    ],
)
def test_what_a_context_error_says(body: dict[str, Any], kind: str | None) -> None:
    assert classify(body) == kind


def client(handler: Any, attempts: int = 0) -> Client:
    return Client(
        ClientConfig(url=URL, retry_attempts=attempts),
        transport=httpx.MockTransport(handler),
        sleep=lambda s: None,
    )


def serve(*answers: httpx.Response) -> Any:
    """A handler answering the chat requests in order (then the last one again); ``/props``
    404 (the loop asks once)."""
    queue = list(answers)
    sent: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(404)
        sent.append(1)
        return queue.pop(0) if len(queue) > 1 else queue[0]

    handler.sent = sent  # type: ignore[attr-defined]
    return handler


@pytest.mark.parametrize("body", [VLLM_SHARE, VLLM_TOO_LARGE])
def test_max_tokens_that_do_not_fit_are_a_request_error_naming_it(
    tmp_path: Path, body: dict[str, Any]
) -> None:
    handler = serve(httpx.Response(400, json=body))
    session = Session.create(tmp_path, Baseline(system="sys"))
    config = Config(sampling=SamplingConfig(max_tokens=1000))
    runtime = Runtime(config=config, client=client(handler, 3), registry=Registry())
    with pytest.raises(TurnInferError) as info:
        run_turn(session, runtime, "hello")
    assert "sampling.max_tokens" in str(info.value)
    assert not is_context_full(info.value.cause) and not info.value.cause.pool_full
    assert len(handler.sent) == 1  # a request error: not retried
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "infer_error"
    assert not any(isinstance(r, LimitHit) for r in session.records)


def test_vllm_messages_past_the_context_are_session_full(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(system="sys"))
    runtime = Runtime(
        config=Config(),
        client=client(serve(httpx.Response(400, json=VLLM_MESSAGES))),
        registry=Registry(),
    )
    with pytest.raises(SessionFull):
        run_turn(session, runtime, "hello")


def sse(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(
        f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n".encode() for c in chunks
    )


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-p", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_a_pool_full_mid_stream_is_retried_and_the_turn_answers(tmp_path: Path) -> None:
    """llama.cpp fails every running task when the shared pool fills: the stream had begun;
    the client waits, says why, and streams the completion anew."""
    failed = sse(
        chunk({"role": "assistant", "content": None}),
        *(chunk({"content": c}) for c in "abcdefgh"),
        POOL_500,
    )
    answered = sse(chunk({"content": "Sunny."}), chunk({}, "stop"), "[DONE]")
    headers = {"content-type": "text/event-stream"}
    handler = serve(
        httpx.Response(200, content=failed, headers=headers),
        httpx.Response(200, content=answered, headers=headers),
    )
    session = Session.create(tmp_path, Baseline(system="sys"))
    # a token bound the two attempts together would pass: each attempt is counted anew
    config = Config(loop=LoopLimits(completion_tokens=8), sampling=SamplingConfig(max_tokens=None))
    runtime = Runtime(config=config, client=client(handler, 2), registry=Registry())
    events: list[Any] = []
    assert run_turn(session, runtime, "weather?", on_event=events.append).content == "Sunny."
    shown = [e for e in events if isinstance(e, Content | Retrying)]
    assert [type(e).__name__ for e in shown] == ["Content"] * 8 + ["Retrying", "Content"]
    retry = next(e for e in shown if isinstance(e, Retrying))
    assert "KV pool is full" in retry.reason and "Context size has been exceeded" in retry.reason
    (assistant,) = [r for r in session.records if isinstance(r, Assistant)]
    assert assistant.content == "Sunny."  # nothing of the failed attempt


def test_a_pool_full_http_error_is_no_context_full_for_the_client() -> None:
    handler = serve(httpx.Response(500, json=POOL_500))
    with pytest.raises(InferError) as info:
        client(handler, 1).chat_with_retry({"messages": []}, lambda e: None)
    assert info.value.pool_full and not info.value.context_full
    assert "2 attempts" in str(info.value) and "-np N" in str(info.value)
    assert len(handler.sent) == 2
