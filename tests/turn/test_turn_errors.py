"""Bad input through the real client and loop (the fake llama-server behind
httpx.MockTransport, no sockets): each failure is a TurnInferError whose cause says what
happened, and the log keeps the User record and a TurnEnd(infer_error)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config
from boxmaker.demo import demo_registry
from boxmaker.errors import StreamCut, TurnInferError
from boxmaker.records import Baseline, TurnEnd, User
from boxmaker.session import Session
from boxmaker.testing import LlamaScript, Reply
from boxmaker.turn import Runtime, run_turn

CHUNK = {
    "id": "chatcmpl-x",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}],
}

STREAM_ERROR = {"error": {"code": 500, "message": "boom", "type": "server_error"}}


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def fake(reply: Reply) -> Callable[[httpx.Request], httpx.Response]:
    return LlamaScript([reply]).handler


CASES: dict[str, tuple[Callable[[httpx.Request], httpx.Response], str]] = {
    "server down": (refuse, "connect"),
    "stream cut": (fake(Reply(data=[json.dumps(CHUNK)])), "stream cut"),
    "malformed chunk": (fake(Reply(data=[json.dumps(CHUNK), '{"choices": ['])), "malformed"),
    "error in stream": (fake(Reply(data=[json.dumps(STREAM_ERROR)])), "boom"),
    "http 500": (
        fake(Reply(status=500, error={"error": {"code": 500, "message": "template failed"}})),
        "template failed",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_failure_is_an_infer_error_and_the_log_keeps_the_user_and_the_turn_end(
    case: str, tmp_path: Path
) -> None:
    handler, words = CASES[case]
    config = Config(client=ClientConfig(url="http://llama.test", retry_attempts=0))
    client = Client(config.client, transport=httpx.MockTransport(handler))
    session = Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))
    runtime = Runtime(config=config, client=client, registry=demo_registry())
    with pytest.raises(TurnInferError) as info:
        run_turn(session, runtime, "What is the weather in Oslo?")
    assert words in str(info.value).lower()
    user, end = session.records
    assert user == User(content="What is the weather in Oslo?", time=user.time)
    assert isinstance(end, TurnEnd) and end.outcome == "infer_error"
    assert end.status == info.value.cause.status and words in end.detail.lower()
    session.close()
    assert Session.open(session.path).records == session.records
    if case == "stream cut":
        assert isinstance(info.value.cause, StreamCut)
    if case == "http 500":
        assert info.value.cause.status == 500 and "template failed" in info.value.cause.body
