"""Every string comes back byte for byte from a cassette (request and response bodies, whatever
characters they hold), and a cassette that cannot be read is refused with a CassetteError that
names the file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker.cassettes import load_interactions, serializer, use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.errors import CassetteError
from boxmaker.events import ClientEvent, Content, Reasoning

URL = "http://127.0.0.1:9"  # nothing listens there
TRICKY = "\r\n\x85\u2028\u2029\ufeff\x00\x07\x1b\x7f\t \"'\\:#-|>{}[]&*!%@`"
"""Characters YAML treats specially: every line break it knows, control characters, a byte
order mark, indicators and quotes."""

texts = st.text(
    alphabet=st.one_of(st.sampled_from(TRICKY), st.characters(codec="utf-8")), max_size=40
)
"""Any text an HTTP body can carry (UTF-8: no lone surrogates), the tricky characters often."""


def _cassette(request_body: bytes, content_type: str, response_body: bytes) -> dict[str, Any]:
    """One interaction as vcrpy hands it to the serializer."""
    return {
        "version": 1,
        "interactions": [
            {
                "request": {
                    "method": "POST",
                    "uri": f"{URL}/v1/chat/completions",
                    "body": request_body,
                    "headers": {"Content-Type": ["application/json"]},
                },
                "response": {
                    "status": {"code": 200, "message": "OK"},
                    "headers": {"Content-Type": [content_type]},
                    "body": {"string": response_body},
                },
            }
        ],
    }


def _round_trip(data: dict[str, Any]) -> dict[str, Any]:
    back: dict[str, Any] = serializer.deserialize(serializer.serialize(data))
    first: dict[str, Any] = back["interactions"][0]
    return first


def _event(delta: dict[str, Any], finish: str | None = None) -> str:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": "c1"}
    return "data: " + json.dumps(obj, ensure_ascii=False)  # raw UTF-8, as llama.cpp sends


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(a=texts, b=texts, key=texts, tail=texts)
def test_any_text_comes_back_byte_for_byte(a: str, b: str, key: str, tail: str) -> None:
    body = {"messages": [{"role": "user", "content": a}, {key: b}], "id_slot": 0}
    stream = f"{_event({'reasoning_content': a})}\n\n{_event({'content': b}, 'stop')}\n\n"
    raw = (stream + "data: [DONE]\n\n" + tail.replace("\n", "")).encode()
    item = _round_trip(
        _cassette(json.dumps(body, ensure_ascii=False).encode(), "text/event-stream", raw)
    )
    assert json.loads(item["request"]["body"]) == body
    assert item["response"]["body"]["string"] == raw
    # the same strings as a plain-text answer and as a JSON answer
    for ctype, answer in (("text/plain", f"{a}\n{b}"), ("application/json", json.dumps([a, b]))):
        item = _round_trip(_cassette(b"", ctype, answer.encode()))
        assert item["response"]["body"]["string"] == answer.encode()


def test_a_stream_with_yaml_line_breaks_stays_one_event_a_line() -> None:
    events = [_event({"content": "a\x85b"}), _event({"content": "plain"}), "data: [DONE]"]
    raw = "".join(f"{e}\n\n" for e in events).encode()
    text = serializer.serialize(_cassette(b"", "text/event-stream", raw))
    stored = yaml.safe_load(text)["interactions"][0]["response"]["body"]["sse"]
    assert stored == events  # a list, one event an item
    assert r"\"a\Nb\"" in text  # the NEL escaped, in the one event that holds it
    assert """- 'data: {"choices": [{"index": 0, "delta": {"content": "plain"}""" in text


def _sse(pieces: list[str]) -> Iterator[bytes]:
    for i, piece in enumerate(pieces):
        finish = "stop" if i == len(pieces) - 1 else None
        yield (_event({"content": piece}, finish) + "\n\n").encode()
    yield b"data: [DONE]\n\n"


@pytest.mark.parametrize("odd", ["\x85", "\u2028", "\u2029", "\r", "\x00", "\ufeff"])
def test_recorded_content_and_request_replay_exactly(tmp_path: Path, odd: str) -> None:
    pieces = [f"one{odd}", f"{odd}two", f"th{odd}ree"]
    body = {"messages": [{"role": "user", "content": f"say{odd}it"}], "id_slot": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=_sse(pieces)
        )

    path = tmp_path / "odd.yaml"
    config = ClientConfig(url=URL, retry_attempts=0)
    with use_cassette(path, "once"), Client(config, transport=httpx.MockTransport(handler)) as c:
        c.chat(body, lambda e: None)
    events: list[ClientEvent] = []
    with use_cassette(path, "none"), Client(config) as client:  # the request must match
        completion = client.chat(body, events.append)
    assert [e.text for e in events if isinstance(e, Content)] == pieces
    assert completion.content == "".join(pieces)
    assert not [e for e in events if isinstance(e, Reasoning)]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("interactions: [\n", "invalid YAML"),
        ("interactions:\n- request: 1\n  response: {}\n", "interaction 1 is not a mapping"),
        ("interactions:\n- {request: {method: GET}, response: {}}\n", "has no method or uri"),
        (
            "interactions:\n- {request: {method: GET, uri: {a: 1}}, response: {}}\n",
            "has no method or uri",  # a mapping where the URI belongs (a fuzzed cassette)
        ),
        (
            "interactions:\n- {request: {method: GET, uri: 'http://[x'}, response: {}}\n",
            "not a URL",
        ),
        ("version: 1\n", "no 'interactions' list"),
        (
            "interactions:\n- request: {method: GET, uri: 'http://x/'}\n  response: {body: 3}\n",
            "body",
        ),
        ("!!python/object:os.system {}\n", "invalid YAML"),
    ],
)
@pytest.mark.parametrize("mode", ["none", "once", "all"])
def test_an_unreadable_cassette_raises_cassette_error_naming_the_file(
    tmp_path: Path, text: str, why: str, mode: Any
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(text)
    with pytest.raises(CassetteError, match=why) as info, use_cassette(path, mode):
        pass
    assert str(info.value).startswith(f"{path}: ")
    assert path.read_text() == text  # never overwritten


def test_a_cassette_that_is_not_utf8_is_refused_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"interactions: []\n# caf\xe9\n")
    for mode in ("none", "all"):
        with pytest.raises(CassetteError, match="not UTF-8") as info, use_cassette(path, mode):
            pass
        assert str(info.value).startswith(f"{path}: ")
    with pytest.raises(CassetteError, match=f"{path}: .*not UTF-8"):
        load_interactions(path)
    assert path.read_bytes() == b"interactions: []\n# caf\xe9\n"
