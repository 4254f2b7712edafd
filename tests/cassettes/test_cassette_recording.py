"""Recording through the streaming tee: events reach the caller while the response streams, the
interaction is appended when it ends (a cut one with the error), files stay readable and hold
no secret, and every recording replays through the same client path."""

from __future__ import annotations

import gzip
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boxmaker.cassettes import MISSING, first_body_difference, serializer, use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.errors import CassetteError, StreamCut
from boxmaker.events import ClientEvent, Content

URL = "http://127.0.0.1:9"  # nothing listens there
CID = "chatcmpl-test"
BODY = {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0}


def event(delta: dict[str, Any] | None = None, finish: str | None = None) -> bytes:
    obj = {
        "choices": [{"finish_reason": finish, "index": 0, "delta": delta or {}}],
        "id": CID,
        "object": "chat.completion.chunk",
    }
    return f"data: {json.dumps(obj)}\n\n".encode()


FINAL = (
    b'data: {"choices":[],"id":"chatcmpl-test","timings":{"cache_n":0,"prompt_n":5}}\n\n'
    b"data: [DONE]\n\n"
)


def sse(chunks: Iterator[bytes]) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=chunks)


def client_for(handler: Callable[[httpx.Request], httpx.Response], **cfg: Any) -> Client:
    config = ClientConfig(url=URL, retry_attempts=0, **cfg)
    return Client(config, transport=httpx.MockTransport(handler))


def replay_events(path: Path, **kw: Any) -> tuple[list[ClientEvent], BaseException | None]:
    events: list[ClientEvent] = []
    failure: BaseException | None = None
    with use_cassette(path, "none", **kw), Client(ClientConfig(url=URL, retry_attempts=0)) as c:
        try:
            c.chat(BODY, events.append)
        except StreamCut as exc:
            failure = exc
    return events, failure


def test_events_reach_the_caller_while_the_recorded_stream_is_open(tmp_path: Path) -> None:
    seen_first = threading.Event()
    in_time: list[bool] = []

    def body() -> Iterator[bytes]:
        yield event({"role": "assistant", "content": None})
        yield event({"content": "Hel"})
        # the rest is sent only once the caller has seen "Hel": a recorder that buffers the
        # whole body would wait here in vain
        in_time.append(seen_first.wait(5))
        yield event({"content": "lo"})
        yield event({}, finish="stop")
        yield FINAL

    def on_event(e: ClientEvent) -> None:
        if isinstance(e, Content):
            seen_first.set()

    path = tmp_path / "live.yaml"
    with use_cassette(path, "once") as cassette, client_for(lambda r: sse(body())) as client:
        completion = client.chat(BODY, on_event)
        assert len(cassette.data) == 1  # appended when the response ended
    assert in_time == [True]
    assert completion.content == "Hello"
    events, failure = replay_events(path)
    assert failure is None
    assert "".join(e.text for e in events if isinstance(e, Content)) == "Hello"


def test_a_cut_stream_is_kept_with_what_arrived_and_the_error(tmp_path: Path) -> None:
    def body() -> Iterator[bytes]:
        yield event({"role": "assistant", "content": None})
        yield event({"content": "Hel"})
        yield b'data: {"choi'
        raise httpx.RemoteProtocolError("peer closed connection without sending complete body")

    path = tmp_path / "cut.yaml"
    with (
        use_cassette(path, "once"),
        client_for(lambda r: sse(body())) as client,
        pytest.raises(StreamCut),
    ):
        client.chat(BODY, lambda e: None)
    stored = yaml.safe_load(path.read_text())["interactions"][0]["response"]
    assert stored["error"].startswith("RemoteProtocolError: peer closed connection")
    assert stored["body"]["partial"] == 'data: {"choi'
    assert stored["body"]["sse"].count("\n") == 2
    events, failure = replay_events(path)
    assert isinstance(failure, StreamCut) and "broke mid-stream" in str(failure)
    assert [e.text for e in events if isinstance(e, Content)] == ["Hel"]


def test_sse_bodies_are_one_event_a_line_and_round_trip() -> None:
    raw = event({"content": "a"}) + event({}, finish="stop") + FINAL
    data = {
        "version": 1,
        "interactions": [
            {
                "request": {"method": "POST", "uri": URL, "headers": {}, "body": b"{}"},
                "response": {
                    "status": {"code": 200, "message": "OK"},
                    "headers": {"content-type": ["text/event-stream"]},
                    "body": {"string": raw},
                },
            }
        ],
    }
    text = serializer.serialize(data)
    assert "\n\n" not in text.split("sse: |", 1)[1]
    stored = yaml.safe_load(text)["interactions"][0]
    assert stored["request"]["body_json"] == {}
    lines = stored["response"]["body"]["sse"].splitlines()
    assert len(lines) == 4 and all(line.startswith("data: ") for line in lines)
    back = serializer.deserialize(text)["interactions"][0]["response"]["body"]["string"]
    assert back == raw


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'{"error":{"code":503,"message":"Loading model"}}', "json"),
        (b'{"error": {"code": 503}}', "text"),  # not llama.cpp's compact form: kept as text
        (b"data: one\nmore\n\n", "text"),  # a multi-line event: kept as text
        (b"\xff\xfe", "base64"),
        (b"", "text"),
    ],
)
def test_other_bodies_round_trip(raw: bytes, kind: str) -> None:
    ctype = "text/event-stream" if raw.startswith(b"data") else "application/json"
    response = {
        "status": {"code": 503},
        "headers": {"Content-Type": [ctype]},
        "body": {"string": raw},
    }
    request = {"method": "POST", "uri": "http://x/v1/chat/completions", "body": None}
    data: dict[str, Any] = {"interactions": [{"request": request, "response": response}]}
    text = serializer.serialize(data)
    assert list(yaml.safe_load(text)["interactions"][0]["response"]["body"]) == [kind]
    assert serializer.deserialize(text)["interactions"][0]["response"]["body"]["string"] == raw


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "read"])
def test_a_compressed_response_is_stored_decoded_and_replayed_once(
    tmp_path: Path, streamed: bool
) -> None:
    answer = b'{"success":true}'
    packed = gzip.compress(answer)

    def handler(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "application/json", "content-encoding": "gzip"}
        return httpx.Response(200, headers=headers, content=iter([packed]) if streamed else packed)

    path = tmp_path / "gz.yaml"
    with use_cassette(path, "once"), client_for(handler) as client:
        assert client.reasoning_end(CID) is True
    stored = yaml.safe_load(path.read_text())["interactions"][0]["response"]
    assert stored["body"] == {"json": {"success": True}}
    assert "content-encoding" not in {k.lower() for k in stored["headers"]}
    with use_cassette(path, "none"), Client(ClientConfig(url=URL)) as client:
        assert client.reasoning_end(CID) is True


def test_the_api_key_never_reaches_the_file_and_replay_still_matches(tmp_path: Path) -> None:
    key = "sk-boxmakerSECRETvalue42"
    body = {**BODY, "messages": [{"role": "user", "content": f"my key is {key}"}]}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == f"Bearer {key}"
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream", "set-cookie": "session=abc"},
            content=iter([event({"content": f"echo {key}"}), event({}, "stop"), FINAL]),
        )

    path = tmp_path / "secret.yaml"
    with use_cassette(path, "once", secrets=[key]), client_for(handler, api_key=key) as client:
        client.chat(body, lambda e: None)
    text = path.read_text()
    assert key not in text and "<API_KEY>" in text
    assert "authorization" not in text.lower() and "cookie" not in text.lower()
    events: list[ClientEvent] = []
    with use_cassette(path, "none", secrets=[key]), Client(ClientConfig(url=URL)) as client:
        client.chat(body, events.append)
    assert [e.text for e in events if isinstance(e, Content)] == [f"echo {key}"]


def test_first_difference_names_the_place() -> None:
    a = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    b = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "c"}]}
    assert first_body_difference(a, b) == ("messages[1].content", "b", "c")
    assert first_body_difference(a, json.loads(json.dumps(a))) is None
    assert first_body_difference({"x": 1, "y": 2}, {"y": 2, "x": 1}) is None  # key order
    shorter = {"messages": a["messages"][:1]}
    assert first_body_difference(a, shorter) == ("messages[1]", a["messages"][1], MISSING)
    assert first_body_difference({"x": 1}, {"x": 1, "tools": []}) == ("tools", MISSING, [])
    assert first_body_difference(None, {"x": 1}) == ("", None, {"x": 1})


def test_no_match_when_everything_was_played(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    handler: Callable[[httpx.Request], httpx.Response] = lambda r: sse(  # noqa: E731
        iter([event({"content": "x"}, "stop"), FINAL])
    )
    with use_cassette(path, "once"), client_for(handler) as client:
        client.chat(BODY, lambda e: None)
    with use_cassette(path, "none") as cassette, Client(ClientConfig(url=URL)) as client:
        client.chat(BODY, lambda e: None)
        with pytest.raises(CassetteError, match=r"request 2 .*all 1 recorded interactions"):
            client.chat(BODY, lambda e: None)
        with pytest.raises(CassetteError, match=r"request 3 \(POST /v1/chat/completions/control"):
            client.reasoning_end(CID)
    assert len(cassette.failures) == 2


def test_secrets_in_the_uri_are_scrubbed_too(tmp_path: Path) -> None:
    key = "sk-urisecret12345"
    path = tmp_path / "uri.yaml"
    transport = httpx.MockTransport(lambda r: httpx.Response(200, json={"ok": True}))
    with use_cassette(path, "once", secrets=[key]), httpx.Client(transport=transport) as c:
        c.get(f"http://llama.test/{key}/models?api_key={key}&x=1")
        c.get("http://llama.test/props?token=abc&x=1")
    uris = [i["request"]["uri"] for i in yaml.safe_load(path.read_text())["interactions"]]
    assert uris == ["http://llama.test/<API_KEY>/models?x=1", "http://llama.test/props?x=1"]


def test_where_a_request_ran_is_not_matched_and_a_look_at_the_slots_need_not_replay(
    tmp_path: Path,
) -> None:
    """A recording made where the server picked the slot (``id_slot`` -1, and the client's
    ``GET /slots`` look the tap records) replays where the client pins (issue 39: the slot
    is where a request ran, not what the model was asked)."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "id_task": 3, "n_prompt_tokens": 0}])
        return sse(iter([event({"content": "Hi"}), event({}, finish="stop"), FINAL]))

    path = tmp_path / "placed.yaml"
    with (
        use_cassette(path, "once"),
        httpx.Client(transport=httpx.MockTransport(handler)) as http,
        client_for(handler, slot_choice="server") as client,
    ):
        assert http.get(f"{URL}/slots").status_code == 200
        client.chat(BODY, lambda e: None)  # sent with id_slot -1
    events, failure = replay_events(path)  # BODY pins slot 0; the look is not sent
    assert failure is None and [e.text for e in events if isinstance(e, Content)] == ["Hi"]
