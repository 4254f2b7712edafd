"""Client against the real llama.cpp server (embedded, xllamacpp) and the shipped tiny model."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live_server import SERVER_API_KEY, GivenServer, embedded_only, live_server

from boxmaker.client import Client, is_context_full
from boxmaker.config import ClientConfig
from boxmaker.errors import InferError, RequestCancelled
from boxmaker.events import ClientEvent, Content, Progress, Queued, Retrying, Waiting
from boxmaker.server import EmbeddedServer

pytestmark = pytest.mark.live

N_CTX = 4096


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer | GivenServer]:
    with live_server(n_ctx=N_CTX) as running:
        yield running


@pytest.fixture
def client(server: EmbeddedServer) -> Iterator[Client]:
    with Client(ClientConfig(url=server.url, retry_attempts=0, api_key=SERVER_API_KEY)) as live:
        yield live


def request(*messages: dict[str, str], max_tokens: int = 8) -> dict[str, Any]:
    return {"messages": list(messages), "id_slot": 0, "temperature": 0.0, "max_tokens": max_tokens}


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


@pytest.mark.needs("shipped_model", "cold_cache")  # one token per character, not cached
def test_progress_rises_to_total_then_waiting(client: Client) -> None:
    # a char-level model: ~1 token per character; more than one 2048-token batch
    prompt = "Repeat: " + "abcdefgh " * 330
    events: list[ClientEvent] = []
    completion = client.chat(request(user(prompt)), events.append)

    assert events[0] == Queued()
    progress = [e for e in events if isinstance(e, Progress)]
    processed = [p.processed for p in progress]
    assert len(progress) >= 3
    assert processed == sorted(processed)
    assert processed[0] < processed[-1] == progress[-1].total
    assert progress[-1].total > 2048
    assert events.count(Waiting()) == 1
    assert events.index(Waiting()) > events.index(progress[-1])
    assert completion.id.startswith("chatcmpl-")
    assert completion.finish_reason in {"stop", "length"}
    assert completion.timings["prompt_n"] + completion.timings["cache_n"] == progress[-1].total
    assert completion.usage["prompt_tokens"] == progress[-1].total


def test_extending_request_reuses_the_cache(client: Client) -> None:
    first_messages = [user("What is the weather in Paris today? " * 4)]
    first = client.chat(request(*first_messages), lambda e: None)
    extended = [
        *first_messages,
        {"role": "assistant", "content": first.content or ""},
        user("And tomorrow?"),
    ]
    second = client.chat(request(*extended), lambda e: None)
    assert second.timings["cache_n"] > 0
    assert second.usage["prompt_tokens_details"]["cached_tokens"] == second.timings["cache_n"]


@pytest.mark.needs("shipped_model")  # one token per character
def test_prompt_longer_than_context_is_context_full(client: Client) -> None:
    embedded_only(f"n_ctx={N_CTX}")
    with pytest.raises(InferError) as info:
        client.chat(request(user("x" * (N_CTX + 500))), lambda e: None)
    assert is_context_full(info.value)
    assert info.value.status == 400
    assert info.value.error is not None and info.value.error["n_ctx"] == N_CTX
    assert "exceeds the available context size" in str(info.value)


def test_connection_refused_is_retried_then_fails_clearly() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago and is now closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = ClientConfig(url=f"http://127.0.0.1:{port}", retry_attempts=2, retry_base_delay_s=0.01)
    events: list[ClientEvent] = []
    with Client(config) as client, pytest.raises(InferError) as info:
        client.chat_with_retry(request(user("hi")), events.append)
    assert info.value.status is None
    assert "cannot connect" in str(info.value)
    assert "gave up after 3 attempts" in str(info.value)
    assert [(e.attempt, e.delay_s) for e in events if isinstance(e, Retrying)] == [
        (1, 0.01),
        (2, 0.02),
    ]


def test_cancel_closes_the_stream_and_the_server_stops(
    server: EmbeddedServer | GivenServer,
) -> None:
    cancel = threading.Event()
    contents: list[Content] = []

    def on_event(event: ClientEvent) -> None:
        if isinstance(event, Content):
            contents.append(event)
            if len(contents) == 5:
                cancel.set()

    config = ClientConfig(url=server.url, api_key=SERVER_API_KEY)
    with Client(config) as client, pytest.raises(RequestCancelled):
        # 3000 tokens would take seconds; the slot must be free long before
        client.chat(request(user("hi"), max_tokens=3000), on_event, cancel=cancel)
    assert len(contents) == 5
    deadline = time.monotonic() + 2.0
    while True:
        slots = httpx.get(f"{server.url}/slots").json()
        if not any(slot["is_processing"] for slot in slots):
            break
        assert time.monotonic() < deadline, f"llama.cpp still generating: {slots}"
        time.sleep(0.02)


def test_reasoning_end_for_unknown_completion_is_false(client: Client) -> None:
    assert client.reasoning_end("chatcmpl-no-such-completion") is False
