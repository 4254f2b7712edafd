"""The client's pooled transport (issue 38): one pool of kept-alive connections per client,
each streamed body read in large blocks and de-chunked in one pass per read; httpx's own
transport where it is needed (https, an environment proxy, an open cassette).

The de-chunker is sans-I/O and checked with reads cut anywhere; the transport on real
sockets (the stand-in GPU-rate server of boxmaker.testing, and raw answers); the client's
fault tests (test_client_faults.py) run through it too.
"""

from __future__ import annotations

import itertools
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from unittest import mock

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.client import Client
from boxmaker.client._pool import ChunkedDecoder, PooledTransport, pooled
from boxmaker.config import ClientConfig
from boxmaker.events import ClientEvent
from boxmaker.testing import RateServer

BODY = {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0}


def chunked(datas: list[bytes], extension: bool = False, trailer: bool = False) -> bytes:
    """``datas`` as a chunked body, each one chunk (with an extension), then the last chunk
    (and a trailer field)."""
    ext = b";name=value" if extension else b""
    body = b"".join(b"%x%s\r\n%s\r\n" % (len(d), ext, d) for d in datas)
    return body + b"0\r\n" + (b"X-Checksum: 1\r\n" if trailer else b"") + b"\r\n"


def decode(reads: list[bytes]) -> tuple[list[bytes], ChunkedDecoder]:
    decoder = ChunkedDecoder()
    return [decoder.feed(read) for read in reads], decoder


def cut(data: bytes, points: list[int]) -> list[bytes]:
    """``data`` cut at ``points`` (offsets, any order, repeats allowed)."""
    edges = [0, *sorted({p % (len(data) + 1) for p in points}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=300, deadline=None)
@given(
    datas=st.lists(st.binary(min_size=1, max_size=40), max_size=6),
    points=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12),
    extension=st.booleans(),
    trailer=st.booleans(),
    after=st.sampled_from([b"", b"HTTP/1.1 200 OK\r\n"]),
)
def test_a_chunked_body_reads_the_same_wherever_the_reads_end(
    datas: list[bytes], points: list[int], extension: bool, trailer: bool, after: bytes
) -> None:
    """Cut mid size line, mid data, between CR and LF, in the trailer: the same bytes, the
    end found, and what follows it kept apart."""
    wire = chunked(datas, extension, trailer) + after
    out, decoder = decode(cut(wire, points))
    assert b"".join(out) == b"".join(datas)
    assert decoder.done and decoder.after == after


def test_one_read_of_many_chunks_gives_them_in_one_piece() -> None:
    """Not a step per chunk: the decoders above see one read."""
    events = [b'data: {"n":%d}\n\n' % i for i in range(50)]
    out, decoder = decode([chunked(events)])
    assert out == [b"".join(events)]
    assert decoder.done


@pytest.mark.parametrize(
    "wire",
    [b"zz\r\nabc\r\n", b"3\r\nabcX\r\n", b"-1\r\n", b"1" * 5000],
    ids=["not hex", "no CRLF after the data", "negative", "a size line that never ends"],
)
def test_a_malformed_chunked_body_is_refused(wire: bytes) -> None:
    with pytest.raises(ValueError):
        ChunkedDecoder().feed(wire)


# --- on sockets ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RateServer]:
    with RateServer(slots=2, prefill_s=0.0, tokens_per_s=50_000, answer_tokens=40) as running:
        yield running


def count_connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    made: list[tuple[str, int]] = []
    connect = PooledTransport._connect

    def counted(address: tuple[str, int], timeout: float | None, trace: Any) -> Any:
        made.append(address)
        return connect(address, timeout, trace)

    monkeypatch.setattr(PooledTransport, "_connect", staticmethod(counted))
    return made


def test_one_connection_serves_many_requests(
    server: RateServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer read to ``[DONE]`` (the client stops there; the last chunk follows at
    once): its connection is kept and the next request goes on it."""
    made = count_connects(monkeypatch)
    events: list[ClientEvent] = []
    with Client(ClientConfig(url=server.url)) as client:
        for _ in range(3):
            done = client.chat(BODY, events.append)
            assert done.content == " word" * 40 and done.finish_reason == "stop"
        assert client.capabilities() is not None  # a side request, on the same connection
    assert len(made) == 1


def test_a_connection_the_server_closed_is_not_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """The embedded server closes a connection after a streamed answer: the kept one reads
    end-of-file, so the next request opens another (and no request fails)."""
    made = count_connects(monkeypatch)
    with (
        RateServer(slots=1, prefill_s=0.0, tokens_per_s=50_000, close_after_stream=True) as srv,
        Client(ClientConfig(url=srv.url)) as client,
    ):
        for _ in range(3):
            assert client.chat(BODY, lambda e: None).finish_reason == "stop"
    assert len(made) == 3


@contextmanager
def raw_server(answer: bytes) -> Iterator[str]:
    """A server that reads one request per connection and sends ``answer``, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


@pytest.mark.parametrize(
    ("head", "body"),
    [
        (b"Content-Length: 11\r\n", b'{"a": true}'),
        (b"Connection: close\r\n", b'{"a": true}'),
        (b"Transfer-Encoding: chunked\r\n", chunked([b'{"a":', b" true}"], trailer=True)),
    ],
    ids=["counted", "up to end-of-file", "chunked"],
)
def test_bodies_of_every_framing(head: bytes, body: bytes) -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + head + b"\r\n" + body
    with raw_server(answer) as url, Client(ClientConfig(url=url)) as client:
        assert client.server_json("GET", "/props", timeout_s=5) == {"a": True}


def test_a_body_cut_short_is_a_protocol_error() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"
    with raw_server(answer) as url:
        transport = PooledTransport(httpx.HTTPTransport)
        with httpx.Client(transport=transport) as http, pytest.raises(httpx.RemoteProtocolError):
            http.get(url + "/props")


def test_an_open_cassette_gets_the_requests() -> None:
    """While httpx's transport is patched (a cassette records or replays it), the pooled
    transport hands every request to it."""
    seen: list[str] = []

    def patched(self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"total_slots": 1}, request=request)

    transport = PooledTransport(httpx.HTTPTransport)
    with (
        mock.patch.object(httpx.HTTPTransport, "handle_request", patched),
        httpx.Client(transport=transport) as http,
    ):
        assert http.get("http://127.0.0.1:9/props").json() == {"total_slots": 1}
    assert seen == ["http://127.0.0.1:9/props"]


def test_which_servers_are_pooled(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert pooled("http://127.0.0.1:8080")
    assert not pooled("https://example.org")
    assert Client(ClientConfig(url="https://example.org"))._pool is None
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert not pooled("http://127.0.0.1:8080")  # httpx's transport goes through the proxy
    assert Client(ClientConfig(url="http://127.0.0.1:8080"))._pool is None
