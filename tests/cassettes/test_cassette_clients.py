"""Cassettes serve any httpx client, sync and async (issue 14): plain ``httpx.Client`` and
``httpx.AsyncClient`` record with the stream live and replay; the live tests do the same
with boxmaker's client, plain httpx and the openai SDK (``stream=True``) against the embedded
server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import MODEL

from boxmaker.cassettes import load_interactions, use_cassette
from boxmaker.errors import CassetteError

URL = "http://127.0.0.1:9/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8, "stream": True}
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":" there"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


def _sync_answer(made: list[int]) -> httpx.MockTransport:
    def parts() -> Iterator[bytes]:
        for i, event in enumerate(EVENTS):
            made.append(i)
            yield event

    return httpx.MockTransport(
        lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=parts()
        )
    )


def _async_answer(made: list[int]) -> httpx.MockTransport:
    async def parts() -> AsyncIterator[bytes]:
        for i, event in enumerate(EVENTS):
            made.append(i)
            yield event

    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=parts())

    return httpx.MockTransport(handler)


def test_sync_httpx_records_live_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "sync.yaml"
    made: list[int] = []
    with use_cassette(path, "once") as cassette:
        with (
            httpx.Client(transport=_sync_answer(made)) as client,
            client.stream("POST", URL, json=BODY) as response,
        ):
            seen = []
            for chunk in response.iter_bytes():
                seen.append((chunk, list(made), len(cassette.data)))
        assert seen[0] == (EVENTS[0], [0], 0)  # passed on before the rest was made or saved
        assert len(cassette.data) == 1
    # no transport given: a real one, replayed
    with (
        use_cassette(path),
        httpx.Client() as client,
        client.stream("POST", URL, json=BODY) as response,
    ):
        assert list(response.iter_bytes()) == EVENTS


def test_async_httpx_records_live_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "async.yaml"
    made: list[int] = []

    async def record() -> list[tuple[bytes, list[int], int]]:
        seen = []
        with use_cassette(path, "once") as cassette:
            async with (
                httpx.AsyncClient(transport=_async_answer(made)) as client,
                client.stream("POST", URL, json=BODY) as response,
            ):
                async for chunk in response.aiter_bytes():
                    seen.append((chunk, list(made), len(cassette.data)))
            assert len(cassette.data) == 1
        return seen

    async def replay() -> list[bytes]:
        with use_cassette(path):
            async with (
                httpx.AsyncClient() as client,
                client.stream("POST", URL, json=BODY) as response,
            ):
                return [chunk async for chunk in response.aiter_bytes()]

    seen = asyncio.run(record())
    assert seen[0] == (EVENTS[0], [0], 0)
    assert b"".join(chunk for chunk, _, _ in seen) == b"".join(EVENTS)
    assert load_interactions(path)[0]["response"]["body"]["string"].count(b"data:") == 3
    assert asyncio.run(replay()) == EVENTS


def test_async_httpx_unrecorded_request_fails_in_replay(tmp_path: Path) -> None:
    path = tmp_path / "async.yaml"

    async def record() -> None:
        with use_cassette(path, "once"):
            async with httpx.AsyncClient(transport=_async_answer([])) as client:
                (await client.post(URL, json=BODY)).raise_for_status()

    async def other() -> None:
        with use_cassette(path, strict=False):
            async with httpx.AsyncClient() as client:
                await client.post(URL, json={**BODY, "max_tokens": 9})

    asyncio.run(record())
    with pytest.raises(CassetteError, match=r"request 1 .*max_tokens \(recorded 8, sent 9\)"):
        asyncio.run(other())


QUESTION = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    from boxmaker.server import EmbeddedServer

    with EmbeddedServer(MODEL, n_ctx=1024, n_threads=1) as server:
        yield server.url


def _piece(delta: Any) -> str:
    """A delta's text: its content or, while the model reasons, ``reasoning_content``."""
    return str(delta.content or getattr(delta, "reasoning_content", None) or "")


def _live_then_replay(tmp_path: Path, run: Any) -> None:
    """``run(cassette)`` against the server, recording, then in replay (mode none): the same
    text both times, and the first piece reached the caller before the interaction was saved."""
    path = tmp_path / "live.yaml"
    with use_cassette(path, "once") as cassette:
        recorded, saved_at_first = run(cassette)
    assert saved_at_first == 0
    assert recorded
    with use_cassette(path) as cassette:
        replayed, _ = run(cassette)
    assert replayed == recorded


@pytest.mark.live
def test_live_plain_httpx_sync_and_async(server_url: str, tmp_path: Path) -> None:
    body = {"messages": QUESTION, "max_tokens": 6, "stream": True, "seed": 0, "temperature": 0}

    def sync(cassette: Any) -> tuple[str, int | None]:
        first = None
        parts = []
        with (
            httpx.Client() as client,
            client.stream("POST", f"{server_url}/v1/chat/completions", json=body) as response,
        ):
            for line in response.iter_lines():
                first = len(cassette.data) if first is None else first
                parts.append(line)
        return "\n".join(p for p in parts if p.startswith("data:") and "content" in p), first

    async def arun(cassette: Any) -> tuple[str, int | None]:
        first = None
        parts = []
        async with (
            httpx.AsyncClient() as client,
            client.stream("POST", f"{server_url}/v1/chat/completions", json=body) as response,
        ):
            async for line in response.aiter_lines():
                first = len(cassette.data) if first is None else first
                parts.append(line)
        return "\n".join(p for p in parts if p.startswith("data:") and "content" in p), first

    _live_then_replay(tmp_path / "sync", sync)
    _live_then_replay(tmp_path / "async", lambda cassette: asyncio.run(arun(cassette)))


@pytest.mark.live
def test_live_openai_sdk_sync_and_async(server_url: str, tmp_path: Path) -> None:
    import openai  # the dev extra installs it

    kwargs: dict[str, Any] = {
        "model": "local",
        "messages": QUESTION,
        "max_tokens": 6,
        "stream": True,
        "seed": 0,
        "temperature": 0,
    }

    def sync(cassette: Any) -> tuple[str, int | None]:
        first = None
        text = []
        with openai.OpenAI(base_url=f"{server_url}/v1", api_key="sk-test", max_retries=0) as client:
            for chunk in client.chat.completions.create(**kwargs):
                first = len(cassette.data) if first is None else first
                if chunk.choices:
                    text.append(_piece(chunk.choices[0].delta))
        return "".join(text), first

    async def arun(cassette: Any) -> tuple[str, int | None]:
        first = None
        text = []
        async with openai.AsyncOpenAI(
            base_url=f"{server_url}/v1", api_key="sk-test", max_retries=0
        ) as client:
            async for chunk in await client.chat.completions.create(**kwargs):
                first = len(cassette.data) if first is None else first
                if chunk.choices:
                    text.append(_piece(chunk.choices[0].delta))
        return "".join(text), first

    _live_then_replay(tmp_path / "sync", sync)
    _live_then_replay(tmp_path / "async", lambda cassette: asyncio.run(arun(cassette)))
    assert "sk-test" not in (tmp_path / "sync" / "live.yaml").read_text()
