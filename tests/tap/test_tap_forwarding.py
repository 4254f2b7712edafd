"""What the tap's forwarding adds to a request and an answer: nothing of its own. Real
sockets: the fake llama-server (tests/fake_llama.py) upstream, its raw bytes read back."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_llama import FakeLlama, Raw, running

from boxmaker.errors import BoxmakerError
from boxmaker.records import Assistant, TurnEnd, Usage
from boxmaker.session import Session
from boxmaker.tap import Exchange, Tap
from boxmaker.tap._proxy import broke_name

ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nServer: llama.cpp\r\n"
    b"Date: Sat, 05 Dec 2026 10:00:00 GMT\r\nSet-Cookie: session=upstream-cookie\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)


@contextlib.contextmanager
def _tapped(tmp_path: Path, target: str, answer: bytes) -> Iterator[tuple[FakeLlama, Tap]]:
    """The fake upstream answering ``target`` with the raw ``answer``, a tap in front."""
    with running([]) as up:
        up.paths[target] = Raw([answer], hold=False)
        with Tap(up.url, directory=tmp_path / "logs") as tap:
            yield up, tap


def _head(raw: bytes) -> list[tuple[str, str]]:
    """The header lines of a raw request, names in lower case, in order."""
    lines = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in lines)]


def test_the_tap_adds_no_header_and_keeps_no_cookie(tmp_path: Path) -> None:
    """A request without User-Agent, Accept, Accept-Encoding or Content-Type reaches the
    upstream without them (the tap's client would add its own), ``Host`` names the upstream,
    the agent's own headers pass in order; an upstream's cookie is not sent back with a later
    request; the answer's ``Server`` and ``Date`` are the upstream's alone."""
    with _tapped(tmp_path, "/x?a=%2F", ANSWER) as (up, tap):
        port = int(tap.url.rsplit(":", 1)[1])
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.putrequest("POST", "/x?a=%2F", skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", f"127.0.0.1:{port}")
            conn.putheader("X-Agent", "one")
            conn.putheader("X-Agent", "two")
            conn.putheader("Content-Length", "3")
            conn.endheaders(b"abc")
            answer = conn.getresponse()
            assert answer.status == 200 and answer.read() == b"{}"
            headers = [(n.lower(), v) for n, v in answer.getheaders()]
            conn.close()
            assert [v for n, v in headers if n == "server"] == ["llama.cpp"]
            assert [v for n, v in headers if n == "date"] == ["Sat, 05 Dec 2026 10:00:00 GMT"]
    assert len(up.requests) == 2
    upstream_port = up.url.rsplit(":", 1)[1]
    for raw in up.requests:
        assert raw.split(b"\r\n", 1)[0] == b"POST /x?a=%2F HTTP/1.1"  # the target as it came
        head = _head(raw)
        names = [n for n, _ in head]
        assert not {"user-agent", "accept", "accept-encoding", "content-type", "cookie"} & set(
            names
        ), head
        assert dict(head)["host"] == f"127.0.0.1:{upstream_port}"
        assert [v for n, v in head if n == "x-agent"] == ["one", "two"]
        assert dict(head)["content-length"] == "3" and raw.endswith(b"\r\n\r\nabc")


@pytest.mark.parametrize(
    ("error", "name"),
    [
        ("ClientPayloadError", "RemoteProtocolError"),
        ("ServerDisconnectedError", "RemoteProtocolError"),
        ("TimeoutError", "ReadTimeout"),
        ("ClientOSError", "ReadError"),
    ],
)
def test_an_answer_broken_off_is_named_as_httpx_names_it(error: str, name: str) -> None:
    """The cassette's ``error`` names an httpx error (what boxmaker.cassettes replays); a
    body cut by a reset of the connection is a ``ReadError``, as httpx says it."""
    import aiohttp

    kind = getattr(aiohttp, error, None) or TimeoutError
    got = broke_name(kind("it broke"))
    assert got.partition(": ")[0] == name
    assert "it broke" in got
    if error == "ClientPayloadError":
        cut = aiohttp.ClientPayloadError("cut")
        cut.__cause__ = ValueError("transfer length")
        cut.__cause__.__cause__ = ConnectionResetError(104, "reset by peer")
        assert broke_name(cut) == "ReadError: cut"


def _raw_agent(tap: Tap, request: bytes, *, wait_s: float = 5.0) -> bytes:
    """Send ``request`` (``{host}`` replaced by the tap's) on a socket; what came back until
    the tap closed the connection or ``wait_s`` passed."""
    host = tap.url.removeprefix("http://")
    port = int(host.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as conn:
        conn.sendall(request.replace(b"{host}", host.encode()))
        got = b""
        try:
            while piece := conn.recv(65536):
                got += piece
        except TimeoutError:
            pass
    return got


def test_expect_100_continue_is_answered_by_the_tap_not_forwarded(tmp_path: Path) -> None:
    """uvicorn answers the agent's ``Expect: 100-continue``; the header does not go upstream
    (forwarded, it made the tap's client wait for a 100 from an upstream that sends none:
    the request hung)."""
    body = b'{"messages": []}'
    with _tapped(tmp_path, "/x", ANSWER) as (up, tap):
        got = _raw_agent(
            tap,
            b"POST /x HTTP/1.1\r\nHost: {host}\r\nExpect: 100-continue\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        )
    assert got.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert got.endswith(b"\r\n\r\n{}")
    (raw,) = up.requests
    assert "expect" not in dict(_head(raw)) and raw.endswith(b"\r\n\r\n" + body)


def test_an_agent_gone_before_the_answer_began_closes_the_upstream_connection(
    tmp_path: Path,
) -> None:
    """llama-server sends nothing of a completion that is not streamed until it ends: an
    agent that leaves before then closes the tap's upstream connection (the generation stops),
    and the tap stops at once."""
    import time

    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    with running([Raw([], hold=True)]) as up, Tap(up.url, directory=tmp_path / "logs") as tap:
        got = _raw_agent(
            tap,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body),
            wait_s=0.5,
        )
        assert got == b""  # nothing came: the agent gave up
        assert up.disconnected.wait(5)  # the tap closed its upstream connection
        started = time.monotonic()
    assert time.monotonic() - started < 5  # no answer in flight held the stop
    assert tap.log is not None and tap.log.problems == []


def test_header_values_pass_as_bytes_or_are_refused(tmp_path: Path) -> None:
    """A UTF-8 header value reaches the upstream byte for byte; one that is not UTF-8 (the
    tap's client sends text as UTF-8: it would arrive changed) is answered 400 and never
    forwarded. Headers a ``Connection`` header names, and ``Proxy-Connection``, are the
    connection's own (RFC 9110 7.6.1): dropped both ways."""
    answer = ANSWER.replace(
        b"Content-Length: 2", b"Connection: keep-alive, X-Hop\r\nX-Hop: up\r\nContent-Length: 2"
    )
    with _tapped(tmp_path, "/x", answer) as (up, tap):
        good = _raw_agent(
            tap,
            b"GET /x HTTP/1.1\r\nHost: {host}\r\nX-Title: caf\xc3\xa9\r\n"
            b"Connection: close, X-Secret-Hop\r\nX-Secret-Hop: s3cret\r\n"
            b"Proxy-Connection: keep-alive\r\n\r\n",
        )
        bad = _raw_agent(tap, b"GET /x HTTP/1.1\r\nHost: {host}\r\nX-Latin: \xe9t\xe9\r\n\r\n")
    assert good.startswith(b"HTTP/1.1 200 ") and b"x-hop" not in good.lower()
    assert bad.startswith(b"HTTP/1.1 400 ") and b"not UTF-8" in bad
    (raw,) = up.requests  # the refused one never went up
    head = dict(_head(raw))
    assert "x-title: caf\xc3\xa9".encode("latin-1") in raw.lower()
    assert not {"x-secret-hop", "proxy-connection", "connection"} & set(head), head


def test_an_upstream_url_with_credentials_is_refused_without_showing_them() -> None:
    """The tap sends no credentials of its own (aiohttp would turn ``user:password@`` into
    Basic auth, and refuse every agent that sends its own key)."""
    with pytest.raises(BoxmakerError) as caught:
        Tap("http://tapuser:TAPPASS@127.0.0.1:8080")
    assert "credentials" in str(caught.value) and "TAPPASS" not in str(caught.value)


def test_an_answer_head_the_tap_cannot_read_is_a_502_that_says_so(tmp_path: Path) -> None:
    """An upstream that answers, but not in HTTP/1.1, is told apart from one not reached."""
    broken = Raw([b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"])
    with running([broken]) as up, Tap(up.url, directory=tmp_path / "logs") as tap:
        got = _raw_agent(
            tap,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n"
            b"Content-Length: 2\r\n\r\n{}",
        )
    assert got.startswith(b"HTTP/1.1 502 ")
    assert b"tap_upstream_unreadable" in got and b"could not read the answer" in got


def test_an_answer_the_upstream_broke_off_reaches_the_agent_cut_and_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The agent gets what came and a connection closed without the last chunk (a cut, not
    an end); the tap says so on ``boxmaker.tap`` in its own words, not as uvicorn's error
    ``ASGI callable returned without completing response.`` (printed by ``boxmaker tap``
    as if the tap had failed)."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    cut = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n%x\r\n%s\r\n" % (len(event), event)
    )
    body = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}'
    with caplog.at_level("DEBUG"), _tapped(tmp_path, "/v1/chat/completions", cut) as (_, tap):
        got = _raw_agent(
            tap,
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
        )
        garbled = _raw_agent(tap, b"NOT HTTP\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and event in got
    assert not got.endswith(b"0\r\n\r\n")  # no last chunk: the agent sees the answer cut
    said = [r for r in caplog.records if "broke off" in r.getMessage()]
    assert [(r.name, r.levelname) for r in said] == [("boxmaker.tap", "WARNING")]
    message = said[0].getMessage()
    assert message.startswith("POST /v1/chat/completions for 127.0.0.1:")
    assert ": the upstream's answer broke off: " in message
    assert not [r for r in caplog.records if "without completing" in r.getMessage()]
    # uvicorn's other words on the tap's connections still come, under the tap's name
    assert garbled.startswith(b"HTTP/1.1 400 ")
    invalid = [r for r in caplog.records if r.getMessage() == "Invalid HTTP request received."]
    assert [(r.name, r.levelname) for r in invalid] == [("boxmaker.tap.http", "WARNING")]


def test_only_the_answer_the_tap_cut_leaves_uvicorns_words_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The filter on ``boxmaker.tap.http`` drops uvicorn's "returned without completing
    response" only where the tap cut the answer itself (``CUT`` set in the request's
    context): any other answer left unfinished is still said, as an error."""
    import contextvars

    from boxmaker.tap._guard import _INCOMPLETE, CUT, HTTP_LOGGER

    def cut() -> None:
        CUT.set(True)
        HTTP_LOGGER.error(_INCOMPLETE)

    with caplog.at_level("DEBUG"):
        contextvars.copy_context().run(cut)
        HTTP_LOGGER.error(_INCOMPLETE)  # a context where the tap cut nothing
    said = [r for r in caplog.records if r.getMessage() == _INCOMPLETE]
    assert [(r.name, r.levelname) for r in said] == [("boxmaker.tap.http", "ERROR")]


def test_a_compressed_answer_reaches_the_agent_as_it_came_and_is_logged_decoded(
    tmp_path: Path,
) -> None:
    """A proxy in front of llama-server (nginx, LiteLLM) gzips its answers for an agent that
    takes gzip: the agent gets the bytes as they came; the log read them compressed and said
    ``infer_error``, the usage lost."""
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Hi hi"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 15, "completion_tokens": 3, "total_tokens": 18},
        "timings": {"cache_n": 0, "prompt_n": 15, "predicted_n": 3},
    }
    packed = gzip.compress(json.dumps(answer).encode())
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: " + str(len(packed)).encode() + b"\r\n\r\n"
    )
    with _tapped(tmp_path, "/v1/chat/completions", head + packed) as (_, tap):
        ask = {"messages": [{"role": "user", "content": "hi"}]}
        got = httpx.post(tap.url + "/v1/chat/completions", json=ask, timeout=10)
        assert got.headers["content-encoding"] == "gzip" and got.json() == answer
        assert tap.log is not None and tap.log.wait()
    (path,) = tap.log.sessions
    with Session.open(path, read_only=True) as session:
        kinds = {type(r).__name__: r for r in session.records}
    assert isinstance(kinds["Assistant"], Assistant) and kinds["Assistant"].content == "Hi hi"
    usage = kinds["Usage"]
    assert (
        isinstance(usage, Usage) and usage.prompt_tokens == 15 and usage.timings["prompt_n"] == 15
    )
    end = kinds["TurnEnd"]
    assert isinstance(end, TurnEnd) and end.outcome == "answered"


@pytest.mark.parametrize(
    ("encoding", "said"),
    [("br", "encoding 'br'"), ("x-unknown", "encoding 'x-unknown'"), ("gzip\xe9", "gzip")],
)
def test_an_answer_that_does_not_decode_is_logged_as_it_came_saying_why(
    encoding: str, said: str
) -> None:
    """An encoding with no decoder here (br without the brotli package: httpx passes it
    through), one httpx does not know, a header value it cannot take: the bytes as they
    came and the reason, never a raise (the exchange was counted not logged)."""
    exchange = Exchange(
        path="/v1/chat/completions", body=b"{}", status=200, streamed=False,
        answer=b"\x1b\x00garbled", encoding=encoding,
    )  # fmt: skip
    plain, why = exchange.plain_answer()
    assert plain == b"\x1b\x00garbled" and why is not None and said in why
    gzipped = dataclasses.replace(exchange, answer=gzip.compress(b"{}"), encoding="gzip")
    assert gzipped.plain_answer() == (b"{}", None)
