"""``boxmaker doctor`` reads under the client's cap on one event (issue 36: a 300 MB line took
178 s and 3.4 GB): a streamed line that never ends is stopped once it grows past 16 MiB, and
so is a JSON answer; the report says so in a failed check, nothing is held whole."""

from __future__ import annotations

from collections.abc import Iterator

import httpx

from boxmaker.cli.doctor import ANSWER_CAP, diagnose

PIECE = 1024 * 1024


class _Endless(httpx.SyncByteStream):
    """``head``, then ``PIECE`` bytes of ``x`` for ever, counting what was taken."""

    def __init__(self, head: bytes) -> None:
        self.head = head
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        yield self.head
        while True:
            self.sent += PIECE
            yield b"x" * PIECE


def _server(endless: _Endless, where: str) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == where:
            kind = "text/event-stream" if "chat" in path else "application/json"
            return httpx.Response(200, headers={"content-type": kind}, stream=endless)
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/props":
            return httpx.Response(200, json={"chat_template_caps": {"supports_tools": True}})
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0}])
        error = {"code": 501, "message": "no slot saving", "type": "not_supported_error"}
        return httpx.Response(501, json={"error": error})

    return httpx.MockTransport(handler)


def test_a_stream_line_that_never_ends_is_stopped_at_the_cap() -> None:
    endless = _Endless(b'data: {"choices": [{"delta": {"content": "')
    report = diagnose("http://llama:8080", transport=_server(endless, "/v1/chat/completions"))
    bounded = report.check("bounded")
    assert bounded.ok is False and not report.ok
    assert (
        f"past the cap of {ANSWER_CAP:,} (ClientConfig.max_event_bytes); stream closed"
        == (bounded.seen[bounded.seen.index("past the cap") :])
    )
    assert ANSWER_CAP <= endless.sent <= ANSWER_CAP + 2 * PIECE  # read no further than the cap


def test_a_json_answer_larger_than_the_cap_is_not_read_whole() -> None:
    endless = _Endless(b'[{"id": 0, "n_ctx": "')
    report = diagnose("http://llama:8080", transport=_server(endless, "/slots"))
    bounded = report.check("bounded")
    assert bounded.ok is False
    assert f"the answer to GET http://llama:8080/slots is larger than {ANSWER_CAP}" in bounded.seen
    assert endless.sent <= ANSWER_CAP + 2 * PIECE


def test_a_health_answer_larger_than_the_cap_is_an_unreachable_server() -> None:
    endless = _Endless(b'{"status": "')
    report = diagnose("http://llama:8080", transport=_server(endless, "/health"))
    (reachable,) = report.checks
    assert reachable.name == "reachable" and reachable.ok is False
    assert "larger than" in reachable.seen and endless.sent <= ANSWER_CAP + 2 * PIECE
