"""The client's own bounds on what a server sends (issue 23): one SSE event's size."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.errors import InferError

BODY: dict[str, Any] = {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0}


def endless_line() -> Iterator[bytes]:
    """A stream whose first line never ends: 64 KiB reads of ``x`` for ever."""
    yield b"data: "
    piece = b"x" * 65536
    while True:
        yield piece


def client_for(stream: Iterator[bytes], **kw: Any) -> Client:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=_Body(stream)
        )

    config = ClientConfig(retry_attempts=0, **kw)
    return Client(config, transport=httpx.MockTransport(handler))


class _Body(httpx.SyncByteStream):
    def __init__(self, reads: Iterator[bytes]) -> None:
        self.reads = reads

    def __iter__(self) -> Iterator[bytes]:
        return self.reads


def test_a_line_that_never_ends_fails_at_the_cap() -> None:
    cap = pytest.raises(InferError, match=r"past the cap of 1,048,576 \(ClientConfig")
    with client_for(endless_line(), max_event_bytes=1 << 20) as client, cap:
        client.chat(BODY, lambda event: None)


def test_the_cap_is_a_config_knob() -> None:
    assert ClientConfig().max_event_bytes == 16 * 1024 * 1024
    assert ClientConfig(max_event_bytes=-1).max_event_bytes is None
