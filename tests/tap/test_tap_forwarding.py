"""What the tap's forwarding adds to a request and an answer: nothing of its own. Real
sockets: the fake llama-server (tests/fake_llama.py) upstream, its raw bytes read back."""

from __future__ import annotations

import http.client
from pathlib import Path

import pytest
from fake_llama import Raw, running

from boxmaker.tap import Tap
from boxmaker.tap._proxy import broke_name

ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nServer: llama.cpp\r\n"
    b"Date: Sat, 05 Dec 2026 10:00:00 GMT\r\nSet-Cookie: session=upstream-cookie\r\n"
    b"Content-Length: 2\r\n\r\n{}"
)


def _head(raw: bytes) -> list[tuple[str, str]]:
    """The header lines of a raw request, names in lower case, in order."""
    lines = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [(n.strip().lower(), v.strip()) for n, _, v in (line.partition(":") for line in lines)]


def test_the_tap_adds_no_header_and_keeps_no_cookie(tmp_path: Path) -> None:
    """A request without User-Agent, Accept, Accept-Encoding or Content-Type reaches the
    upstream without them (the tap's client would add its own), ``Host`` names the upstream,
    the agent's own headers pass in order; an upstream's cookie is not sent back with a later
    request; the answer's ``Server`` and ``Date`` are the upstream's alone."""
    with running([]) as up:
        up.paths["/x?a=%2F"] = Raw([ANSWER], hold=False)
        with Tap(up.url, directory=tmp_path / "logs") as tap:
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
    """The cassette's ``error`` names an httpx error (what boxmaker.cassettes replays)."""
    import aiohttp

    kind = getattr(aiohttp, error, None) or TimeoutError
    got = broke_name(kind("it broke"))
    assert got.partition(": ")[0] == name
    assert "it broke" in got
