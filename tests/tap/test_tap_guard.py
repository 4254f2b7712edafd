"""The tap forwards only to its upstream (issue 36): hostile bytes sent on a raw socket, as an
attacker on the machine or a web page would send them, are answered with a refusal, never a
traceback, and the upstream (and any other host named in the request) never sees them.

The count of generated targets is ``BOXMAKER_HOSTILE_EXAMPLES`` (default 40; thousands for a
long run)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_llama import FakeLlama, Reply, running
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker.config import TapConfig
from boxmaker.errors import ConfigError
from boxmaker.tap import Tap

ANSWER = Reply(content="Sunny.")
CHAT = b"/v1/chat/completions"
BODY = json.dumps({"messages": [{"role": "user", "content": "Hi"}], "stream": True}).encode()
EXAMPLES = int(os.environ.get("BOXMAKER_HOSTILE_EXAMPLES", "40"))


@contextlib.contextmanager
def tapped(tmp_path: Path, **config: Any) -> Iterator[tuple[FakeLlama, Tap]]:
    with (
        running([ANSWER]) as up,
        Tap(
            up.url, directory=tmp_path / "logs", forensics=False, config=TapConfig(**config)
        ) as tap,
    ):
        yield up, tap


def exchange(port: int, data: bytes, *, wait_s: float = 5.0) -> bytes:
    """Send ``data`` on a new connection and read until the tap closes it (or ``wait_s``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as sock:
        sock.sendall(data)
        return read_all(sock, wait_s)


def read_all(sock: socket.socket, wait_s: float) -> bytes:
    out = b""
    sock.settimeout(wait_s)
    with contextlib.suppress(TimeoutError, ConnectionResetError):
        while piece := sock.recv(65536):
            out += piece
    return out


def request(
    port: int, target: bytes = CHAT, *, method: bytes = b"POST", host: bytes | None = None,
    headers: bytes = b"", body: bytes = BODY,
) -> bytes:  # fmt: skip
    """The bytes of one HTTP/1.1 request (``Host`` the tap's unless given)."""
    host = host if host is not None else b"127.0.0.1:%d" % port
    head = b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method, target, host, headers)
    head += b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head + body


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def refusal_of(answer: bytes) -> dict[str, Any]:
    """The JSON error body of a refusal (and it said ``Connection: close``)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    error: dict[str, Any] = json.loads(body)["error"]
    assert error["type"] == "tap_refused" and error["code"] == status_of(answer)
    return error


def no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    bad = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert bad == [], [r.getMessage() for r in bad]


def test_a_request_for_the_upstreams_path_passes_on_a_raw_socket(tmp_path: Path) -> None:
    with tapped(tmp_path) as (up, tap):
        answer = exchange(tap.port, request(tap.port, headers=b"Connection: close\r\n"))
    assert status_of(answer) == 200 and b"data: [DONE]" in answer
    assert len(up.requests) == 1 and up.requests[0].startswith(b"POST /v1/chat/completions ")


@pytest.mark.parametrize(
    ("method", "target"),
    [
        (b"POST", b"@127.0.0.1:{bait}/v1/chat/completions"),  # issue 36: went to the bait
        (b"POST", b"http://127.0.0.1:{bait}/v1/chat/completions"),  # absolute form
        (b"GET", b"http://evil.example/health"),
        (b"CONNECT", b"127.0.0.1:{bait}"),  # authority form: a tunnel
        (b"OPTIONS", b"*"),  # asterisk form
        (b"POST", b"v1/chat/completions"),  # no leading slash
        (b"POST", b"/v1/chat/completions#frag"),
    ],
)
def test_a_target_not_in_origin_form_is_refused_and_reaches_no_host(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, method: bytes, target: bytes
) -> None:
    with running([ANSWER]) as bait, tapped(tmp_path) as (up, tap):
        target = target.replace(b"{bait}", str(bait.url.rsplit(":", 1)[1]).encode())
        answer = exchange(tap.port, request(tap.port, target, method=method))
        time.sleep(0.1)
    assert status_of(answer) == 400
    assert "origin form" in refusal_of(answer)["message"]
    assert up.requests == [] and up.connections == 0
    assert bait.requests == [] and bait.connections == 0  # the agent's key never left
    no_traceback(caplog)


def test_a_websocket_upgrade_and_an_http2_preface_are_refused_cleanly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    upgrade = (
        b"Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    )
    h2c = (
        b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        b"HTTP2-Settings: AAMAAABkAAQAAP__\r\n"
    )
    with tapped(tmp_path) as (up, tap):
        ws = exchange(tap.port, request(tap.port, b"/ws", method=b"GET", headers=upgrade, body=b""))
        cleartext = exchange(
            tap.port, request(tap.port, b"/", method=b"GET", headers=h2c, body=b"")
        )
        preface = exchange(tap.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 24)
    assert status_of(ws) == status_of(cleartext) == 400
    assert "does not switch protocols" in refusal_of(ws)["message"]
    assert "Upgrade: h2c" in refusal_of(cleartext)["message"]
    assert status_of(preface) == 400 and "PRI" in refusal_of(preface)["message"]
    assert up.requests == []
    no_traceback(caplog)


def test_host_must_name_the_tap(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with tapped(tmp_path, allowed_hosts=("myhost",)) as (up, tap):
        port = tap.port
        rebound = exchange(port, request(port, host=b"evil.example:%d" % port))
        other_port = exchange(port, request(port, host=b"127.0.0.1:%d" % (port + 1)))
        missing = exchange(port, request(port).replace(b"Host: 127.0.0.1:%d\r\n" % port, b""))
        twice = exchange(port, request(port, headers=b"Host: evil.example\r\n"))
        old = exchange(port, b"GET /health HTTP/1.0\r\n\r\n")  # HTTP/1.0 may omit Host
        for name in (b"localhost", b"LOCALHOST", b"[::1]", b"myhost"):
            close = b"Connection: close\r\n"
            ok = exchange(port, request(port, host=b"%s:%d" % (name, port), headers=close))
            assert status_of(ok) == 200, name
    assert status_of(rebound) == status_of(other_port) == 421
    assert "DNS rebinding" in refusal_of(rebound)["message"]
    assert status_of(missing) == status_of(twice) == 400  # h11: not HTTP/1.1
    assert "not an HTTP/1.1 request" in refusal_of(twice)["message"]
    assert status_of(old) == 400 and "no Host header" in refusal_of(old)["message"]
    assert len(up.requests) == 4  # the four allowed names only
    no_traceback(caplog)


def test_a_browsers_request_is_refused_unless_its_origin_is_allowed(tmp_path: Path) -> None:
    allowed = "http://localhost:8888"
    with tapped(tmp_path, allowed_origins=(allowed,)) as (up, tap):
        evil = exchange(tap.port, request(tap.port, headers=b"Origin: http://evil.example\r\n"))
        null = exchange(tap.port, request(tap.port, headers=b"Origin: null\r\n"))
        preflight = request(
            tap.port, method=b"OPTIONS", headers=b"Origin: http://evil.example\r\n", body=b""
        )
        options = exchange(tap.port, preflight)
        mine = b"Origin: %s\r\nConnection: close\r\n" % allowed.encode()
        ok = exchange(tap.port, request(tap.port, headers=mine))
    assert status_of(evil) == status_of(null) == status_of(options) == 403
    assert "--allow-origin" in refusal_of(evil)["message"]
    assert status_of(ok) == 200 and len(up.requests) == 1


def test_any_origin_can_be_allowed_on_purpose(tmp_path: Path) -> None:
    with tapped(tmp_path, allowed_origins=("*",)) as (up, tap):
        headers = b"Origin: http://anything.example\r\nConnection: close\r\n"
        assert status_of(exchange(tap.port, request(tap.port, headers=headers))) == 200
    assert len(up.requests) == 1


def test_a_body_over_the_cap_is_refused_before_or_while_it_is_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cap = 64 * 1024
    with tapped(tmp_path, max_body_bytes=cap) as (up, tap):
        port = tap.port
        # said by Content-Length: answered at once, the body never sent
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port
            sock.sendall(head + b"Content-Length: %d\r\n\r\n" % (1 << 30))
            said = read_all(sock, 5)
        huge = b"9" * 5000  # more digits than an int is parsed from
        absurd = exchange(port, head + b"Content-Length: " + huge + b"\r\n\r\n")
        # chunked, no length said: refused once it grows past the cap
        chunked = head + b"Transfer-Encoding: chunked\r\n\r\n"
        piece = b"x" * 16384
        chunked += (b"%x\r\n%s\r\n" % (len(piece), piece)) * 8 + b"0\r\n\r\n"
        grown = exchange(port, chunked)
        # at the cap exactly: forwarded
        body = BODY + b" " * (cap - len(BODY))
        ok = exchange(port, request(port, body=body, headers=b"Connection: close\r\n"))
    assert status_of(said) == 413 and "--max-body-bytes" in refusal_of(said)["message"]
    assert status_of(absurd) in (400, 413)
    assert status_of(grown) == 413
    assert status_of(ok) == 200
    assert len(up.requests) == 1 and len(up.requests[0]) > cap
    no_traceback(caplog)


def test_slow_heads_bodies_and_silent_connections_are_closed(tmp_path: Path) -> None:
    with tapped(tmp_path, head_timeout_s=0.5, idle_timeout_s=0.8) as (up, tap):
        port = tap.port
        started = time.monotonic()
        # a head trickled byte by byte: each byte comes in time, the whole head does not
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            closed_at = None
            for byte in request(port):
                try:
                    slow.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.05)
                if time.monotonic() - started > 3:
                    break
            trickled = read_all(slow, 3)
            closed_at = time.monotonic() - started
        # a connection that never sends a byte
        with socket.create_connection(("127.0.0.1", port), timeout=5) as silent:
            t0 = time.monotonic()
            nothing = read_all(silent, 5)
            silent_s = time.monotonic() - t0
        # a body that stops half way
        with socket.create_connection(("127.0.0.1", port), timeout=5) as stalled:
            whole = request(port)
            stalled.sendall(whole[: len(whole) - 10])
            t0 = time.monotonic()
            cut = read_all(stalled, 5)
            stalled_s = time.monotonic() - t0
    assert status_of(trickled) == 408 and "tap.head_timeout_s" in refusal_of(trickled)["message"]
    assert closed_at < 2.5
    assert nothing == b"" and 0.6 < silent_s < 3
    assert status_of(cut) == 408 and "tap.idle_timeout_s" in refusal_of(cut)["message"]
    assert 0.6 < stalled_s < 3
    assert up.requests == []


def test_one_connection_over_the_cap_is_answered_503_and_closed(tmp_path: Path) -> None:
    with tapped(tmp_path, max_connections=4) as (up, tap):
        held = [socket.create_connection(("127.0.0.1", tap.port), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.2)
            over = exchange(tap.port, request(tap.port))
        finally:
            for sock in held:
                sock.close()
        time.sleep(0.3)  # the held ones closed: room again
        again = exchange(tap.port, request(tap.port, headers=b"Connection: close\r\n"))
    assert status_of(over) == 503 and "tap.max_connections" in refusal_of(over)["message"]
    assert status_of(again) == 200 and len(up.requests) == 1


_TARGET_BYTES = st.binary(min_size=1, max_size=60).map(
    lambda b: bytes(0x21 + (c % 94) for c in b)  # visible ASCII: what HTTP/1.1 lets through
)


def test_any_target_either_reaches_the_upstream_as_a_path_or_no_host_at_all(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with tapped(tmp_path) as (up, tap):

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        @given(target=st.one_of(_TARGET_BYTES, _TARGET_BYTES.map(lambda b: b"@127.0.0.1:1/" + b)))
        def one(target: bytes) -> None:
            before = len(up.requests)
            close = b"Connection: close\r\n"
            status = status_of(exchange(tap.port, request(tap.port, target, headers=close)))
            if target.startswith(b"/") and b"#" not in target:
                assert status != 500
                assert all(r.split(b" ", 2)[1].startswith(b"/") for r in up.requests[before:])
            else:
                assert status == 400 and len(up.requests) == before

        one()
    no_traceback(caplog)


def test_the_config_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(ConfigError, match="not an IP address"):
        TapConfig(host="localhost")
    with pytest.raises(ConfigError, match="bare host name"):
        TapConfig(allowed_hosts=("evil.example:80",))
    with pytest.raises(ConfigError, match="scheme://host"):
        TapConfig(allowed_origins=("evil.example",))
    with pytest.raises(ConfigError, match="max_body_bytes"):
        TapConfig(max_body_bytes=0)
    assert TapConfig().loopback and not TapConfig(host="0.0.0.0").loopback


def test_the_tap_listens_on_loopback_unless_told_and_its_url_says_where(tmp_path: Path) -> None:
    tap = Tap("http://127.0.0.1:9")
    tap.bind()
    try:
        assert tap.url == f"http://127.0.0.1:{tap.port}"
        assert tap._socket is not None and tap._socket.getsockname()[0] == "127.0.0.1"
    finally:
        tap.stop()
    everywhere = Tap("http://127.0.0.1:9", config=TapConfig(host="0.0.0.0"))
    everywhere.bind()
    try:
        assert everywhere._socket is not None
        assert everywhere._socket.getsockname()[0] == "0.0.0.0"
        assert everywhere.url == f"http://127.0.0.1:{everywhere.port}"  # reached on loopback
    finally:
        everywhere.stop()


def test_the_command_refuses_what_the_config_refuses_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from boxmaker.cli import main

    upstream = ["tap", "--upstream", "http://127.0.0.1:9", "--port", "0"]
    assert main([*upstream, "--max-body-bytes", "0"]) == 1
    assert capsys.readouterr().err == "boxmaker: tap.max_body_bytes = 0 is out of range\n"
    assert main([*upstream, "--host", "localhost"]) == 1
    assert "tap.host = 'localhost' is not an IP address" in capsys.readouterr().err
    assert main([*upstream, "--allow-origin", "evil.example"]) == 1
    assert "is not scheme://host[:port] or '*'" in capsys.readouterr().err


def test_each_agent_connection_keeps_its_upstream_connection(tmp_path: Path) -> None:
    """The tap splits its upstream pool (httpcore's scan grew with the square of the agents,
    issue 38) by the agent's connection: each agent connection's requests keep to one pool,
    so its kept-alive upstream connection serves them all."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    opened: list[int] = []

    class KeepAlive(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # connections kept alive

        def setup(self) -> None:
            opened.append(1)
            super().setup()

        def do_GET(self) -> None:
            body = b'{"status": "ok"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    upstream.daemon_threads = True
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    errors: list[BaseException] = []
    try:
        with Tap(url, directory=tmp_path / "logs", forensics=False) as tap:

            def agent() -> None:
                try:
                    with httpx.Client(base_url=tap.url, timeout=10) as client:  # one connection
                        for _ in range(4):
                            assert client.get("/health").status_code == 200
                except BaseException as exc:
                    errors.append(exc)

            agents = [threading.Thread(target=agent) for _ in range(8)]
            for thread in agents:
                thread.start()
            for thread in agents:
                thread.join(30)
    finally:
        upstream.shutdown()
        upstream.server_close()
    assert not errors, errors
    # 32 requests; at most one upstream connection per agent connection (8 at once)
    assert 1 <= len(opened) <= 8, len(opened)
