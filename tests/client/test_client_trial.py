"""What issue 22's trial found (section 3): a reused connection closed under a request, a URL
ending in ``/v1``, an answer nested too deep for :func:`json.loads`.

The reused connection is provoked for real: a socket server that, as llama.cpp's does,
closes a connection after a streamed answer although its head said ``Keep-Alive``, at the
worst moment (once the next request has arrived on it, without answering it).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.cli.doctor import diagnose
from boxmaker.client import Client, send_once_more
from boxmaker.config import ClientConfig, Config, LoopLimits
from boxmaker.errors import InferError
from boxmaker.events import CapNotEnforced
from boxmaker.records import Baseline, TurnEnd
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

STREAM = (
    b"".join(
        b"data: " + json.dumps(obj).encode() + b"\n\n"
        for obj in (
            {
                "id": "c1",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}],
            },
            {"id": "c1", "choices": [{"index": 0, "delta": {"content": "ok"}}]},
            {"id": "c1", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        )
    )
    + b"data: [DONE]\n\n"
)


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)


class ClosingServer:
    """127.0.0.1, a free port; each connection answers one request, then reads the next one
    and closes unanswered (``dropped`` counts them, ``requests`` counts all). ``GET`` answers
    a small JSON object, ``POST .../control`` ``{"success": true}``, other ``POST``s the SSE
    stream above, chunked, with llama.cpp's ``Keep-Alive: timeout=5, max=100`` head."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests = 0
        self.dropped = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket, buf: bytearray) -> tuple[str, str] | None:
        while b"\r\n\r\n" not in buf:
            got = conn.recv(65536)
            if not got:
                return None
            buf += got
        head, _, rest = bytes(buf).partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        length = next(
            (int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length")), 0
        )
        while len(rest) < length:
            rest += conn.recv(65536)
        buf[:] = rest[length:]
        method, path, _ = lines[0].split(" ")
        return method, path

    def _serve(self, conn: socket.socket) -> None:
        buf = bytearray()
        with conn:
            request = self._read(conn, buf)
            if request is None:
                return
            self.requests += 1
            method, path = request
            if method == "GET" or path.endswith("/control"):
                answer = _GET.get(path, {}) if method == "GET" else {"success": True}
                body = json.dumps(answer).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                conn.sendall(head + b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
                    + _chunked(STREAM)
                )
            if self._read(conn, buf) is not None:  # the next request: closed unanswered
                self.requests += 1
                self.dropped += 1

    def close(self) -> None:
        self.sock.close()


_GET: dict[str, Any] = {
    "/health": {"status": "ok"},
    "/props": {"total_slots": 1, "default_generation_settings": {"n_ctx": 4096}},
    "/slots": [{"id": 0, "n_ctx": 4096}],
}


@contextmanager
def closing_server() -> Iterator[ClosingServer]:
    server = ClosingServer()
    try:
        yield server
    finally:
        server.close()


def test_a_request_on_a_connection_closed_after_a_stream_is_sent_once_more() -> None:
    with closing_server() as server, httpx.Client() as http:
        with http.stream("POST", f"{server.url}/v1/chat/completions", json={}) as r:
            r.read()
        # sent on the pooled connection, which the server closes unanswered
        answer = send_once_more(
            lambda trace: http.get(f"{server.url}/health", extensions={"trace": trace})
        )
        assert answer.json() == {"status": "ok"}
        assert server.dropped == 1 and server.requests == 3


def test_without_sending_once_more_the_same_request_fails() -> None:
    with closing_server() as server, httpx.Client() as http:
        with http.stream("POST", f"{server.url}/v1/chat/completions", json={}) as r:
            r.read()
        with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
            http.get(f"{server.url}/health")


def test_a_failure_on_a_new_connection_is_not_sent_again() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        tries = []

        listener.settimeout(10)

        def drop() -> None:
            # a second try would come at once; one second without it ends the wait
            # (the listener stays open until the thread is done, so accept never meets a
            # closed socket)
            for _ in range(2):
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    return
                tries.append(conn.recv(65536))
                conn.close()
                listener.settimeout(1)

        thread = threading.Thread(target=drop, daemon=True)
        thread.start()
        with httpx.Client() as http, pytest.raises(httpx.RemoteProtocolError):
            send_once_more(lambda trace: http.get(f"{url}/x", extensions={"trace": trace}))
        thread.join(15)
        assert not thread.is_alive()
        assert len(tries) == 1


def test_the_client_sends_a_chat_once_more_on_a_pooled_connection_closed_under_it() -> None:
    with closing_server() as server:
        config = ClientConfig(url=server.url, retry_attempts=0)
        # a keep-alive pool (the client's own keeps no idle connection)
        with Client(config, transport=httpx.HTTPTransport()) as client:
            assert client.reasoning_end("c1") is True  # its connection goes back to the pool
            answer = client.chat({"messages": []}, lambda e: None)  # sent on it, dropped
    assert answer.content == "ok" and server.dropped == 1 and server.requests == 3


def test_doctor_against_a_server_that_closes_after_each_stream_gives_a_whole_report() -> None:
    with closing_server() as server:
        report = diagnose(server.url)
    names = [c.name for c in report.checks]
    assert "answers" not in names and names[-2:] == ["slot shared", "fork from a slot"], names
    fork = report.checks[-1]  # the last probe too gets an answer, if not the timings it needs
    assert (fork.ok, fork.seen) == (None, "the timings do not say cache_n and predicted_n")
    assert server.dropped >= 3  # every probe after a stream met a closed connection


def test_a_url_ending_in_v1_is_accepted() -> None:
    assert ClientConfig(url="http://h:8080/v1/").url == "http://h:8080"
    assert ClientConfig(url="http://h:8080/v1").url == "http://h:8080"
    assert ClientConfig(url="http://h:8080/").url == "http://h:8080"
    assert ClientConfig(url="http://h:8080/llama/v1").url == "http://h:8080/llama"
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(404, text="File Not Found")

    report = diagnose("http://llama:8080/v1", transport=httpx.MockTransport(handler))
    assert seen[0] == "/health" and all(not p.startswith("/v1/v1") for p in seen)
    assert "(the URL's /v1 dropped" in report.check("reachable").seen


DEEP = "[" * 100_000 + "]" * 100_000  # json.loads: RecursionError


def test_reasoning_end_answered_too_deep_is_an_infer_error() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(200, text=DEEP))
    client = Client(ClientConfig(url="http://llama.test"), transport=transport)
    with client, pytest.raises(InferError, match="not a JSON object"):
        client.reasoning_end("chatcmpl-1")


def test_an_http_error_body_too_deep_is_an_infer_error_keeping_it() -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(500, text=DEEP))
    client = Client(ClientConfig(url="http://llama.test", retry_attempts=0), transport=transport)
    with client, pytest.raises(InferError) as info:
        client.chat({"messages": []}, lambda e: None)
    assert info.value.status == 500 and info.value.body == DEEP


def test_a_turn_whose_reasoning_end_is_answered_too_deep_ends_with_a_turn_end(
    tmp_path: Path,
) -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
        return b"data: " + json.dumps(obj).encode() + b"\n\n"

    stream = b"".join(
        [chunk({"role": "assistant"})]
        + [chunk({"reasoning_content": f"r{i}"}) for i in range(8)]
        + [chunk({"content": "Sunny."}), chunk({}, "stop"), b"data: [DONE]\n\n"]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            return httpx.Response(200, text=DEEP)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)

    config = Config(
        client=ClientConfig(url="http://llama.test", retry_attempts=0),
        loop=LoopLimits(thinking_tokens=2),
    )
    events: list[Any] = []
    session = Session.create(tmp_path, Baseline())
    with session, Client(config.client, transport=httpx.MockTransport(handler)) as client:
        runtime = Runtime(config=config, client=client, registry=Registry())
        outcome = run_turn(session, runtime, "weather?", events.append)
    assert outcome.content == "Sunny."
    assert any(isinstance(e, CapNotEnforced) and "not a JSON object" in e.detail for e in events)
    assert session.records[-1] == TurnEnd(outcome="answered", time=session.records[-1].time)
    reopened = Session.open(session.path)
    assert not reopened.turn_left_open()  # the next open records no process_died
    reopened.close()
