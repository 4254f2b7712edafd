"""No secret reaches a cassette file: an api key put in every place a request or response can
carry it is recorded through the real recording path and found nowhere in the file, and the
cassette still replays."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from boxmaker.cassettes import SECRET_FIELDS, SECRET_QUERY_PARAMETERS, use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.events import ClientEvent, Content

ROOT = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:9"  # nothing listens there
KEY = "sk-live/0123456789+abcdef"  # '/' and '+' change under URL encoding
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "login",
            "description": "Log in.",
            "parameters": {"type": "object", "properties": {"token": {"type": "string"}}},
        },
    }
]
BODY: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": f"my key is {KEY}, keep it"},  # 1: inside a message
    ],
    "api_key": KEY,  # 2: a JSON body field
    "auth": {"Access-Token": KEY, "nested": [{"PASSWORD": "hunter2"}]},  # 3, 4: nested
    "tools": TOOLS,
    "max_tokens": 64,
    "id_slot": 0,
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": "c1"}
    return f"data: {json.dumps(obj)}\n\n".encode()


def _handler(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/chat/completions"):
        assert request.headers["authorization"] == f"Bearer {KEY}"  # 5: the header
        stream: Iterator[bytes] = iter(
            [
                _chunk({"content": f"you said {KEY}"}),  # 6: echoed in a stream
                _chunk({"content": " ok"}, "stop"),
                b"data: [DONE]\n\n",
            ]
        )
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=stream)
    echo = {"url": str(request.url), "token": KEY, "note": f"key={KEY}"}  # 7: echoed in JSON
    return httpx.Response(200, json=echo, headers={"set-cookie": f"k={KEY}"})


def test_a_key_in_every_place_never_reaches_the_file_and_replay_still_works(
    tmp_path: Path,
) -> None:
    path = tmp_path / "secrets.yaml"
    transport = httpx.MockTransport(_handler)
    config = ClientConfig(url=URL, api_key=KEY, retry_attempts=0)  # no secrets= given
    quoted = urllib.parse.quote(KEY, safe="")
    with use_cassette(path, "once"):
        with Client(config, transport=transport) as client:
            client.chat(BODY, lambda e: None)
        with httpx.Client(transport=transport) as raw:
            # 8-11: query variants, 12: a path segment; no credential header at all
            raw.get(f"{URL}/v1/{quoted}/props?apikey={quoted}&Api-Key={quoted}&x=1")
            raw.get(f"{URL}/props?key={quoted}&access_token={quoted}&y=2")
            raw.get(f"{URL}/slots", headers={"x-api-key": KEY, "api-key": KEY})
    text = path.read_text(encoding="utf-8")
    for form in {KEY, quoted, urllib.parse.quote_plus(KEY), json.dumps(KEY)[1:-1], "hunter2"}:
        assert form not in text
    assert "sk-live" not in text and "0123456789" not in text
    data = yaml.safe_load(text)["interactions"]
    chat = data[0]["request"]["body_json"]
    assert chat["messages"][1]["content"] == "my key is <API_KEY>, keep it"
    assert chat["api_key"] == "<SECRET>"
    assert chat["auth"] == {"Access-Token": "<SECRET>", "nested": [{"PASSWORD": "<SECRET>"}]}
    assert chat["tools"] == TOOLS and chat["max_tokens"] == 64  # look-alikes left alone
    assert "you said <API_KEY>" in data[0]["response"]["body"]["sse"]
    assert [d["request"]["uri"] for d in data[1:]] == [
        f"{URL}/v1/<API_KEY>/props?x=1",
        f"{URL}/props?y=2",
        f"{URL}/slots",
    ]
    assert data[1]["response"]["body"]["json"]["token"] == "<SECRET>"
    assert data[1]["response"]["body"]["json"]["note"] == "key=<API_KEY>"
    assert all(set(d["request"]["headers"]) <= {"accept", "content-type"} for d in data)
    assert all(set(d["response"]["headers"]) == {"content-type"} for d in data)

    # replay with the same configuration: the request's credentials are hidden the same way
    # before matching, and the key comes back in the replayed stream
    events: list[ClientEvent] = []
    with use_cassette(path, "none", strict=False), Client(config) as client:
        client.chat(BODY, events.append)
    assert "".join(e.text for e in events if isinstance(e, Content)) == f"you said {KEY} ok"


def test_a_recording_made_with_one_key_replays_with_another(tmp_path: Path) -> None:
    def echo(request: httpx.Request) -> httpx.Response:
        token = request.headers["authorization"].removeprefix("Bearer ")
        return httpx.Response(200, json={"message": f"hello {token}"})

    path = tmp_path / "echo.yaml"
    with use_cassette(path, "once"), httpx.Client(transport=httpx.MockTransport(echo)) as raw:
        raw.get(f"{URL}/props", headers={"authorization": "Bearer sk-recorded-1"})
    text = path.read_text()
    assert "sk-recorded-1" not in text and "hello <API_KEY>" in text
    with use_cassette(path, "none"), httpx.Client() as raw:
        answer = raw.get(f"{URL}/props", headers={"authorization": "Bearer sk-other-2"})
    assert answer.json() == {"message": "hello sk-other-2"}


def test_the_docs_name_exactly_what_is_scrubbed() -> None:
    """The cassettes guide (the README's section before the docs site) lists the rule's names."""
    page = (ROOT / "docs" / "guides" / "cassettes.md").read_text()
    section = page[page.index("What is scrubbed before") : page.index("Not covered")]
    query = section[section.index("query parameters named") : section.index("are removed")]
    fields = section[section.index("JSON keys named") : section.index("become `<SECRET>`")]
    assert sorted(re.findall(r"`([^`]+)`", query)) == sorted(SECRET_QUERY_PARAMETERS)
    assert sorted(re.findall(r"`([^`]+)`", fields)) == sorted(SECRET_FIELDS)


@pytest.mark.parametrize("key", ["e", "Oslo", "EMPTY"])
def test_a_short_placeholder_key_does_not_garble_the_cassette(tmp_path: Path, key: str) -> None:
    """A key shorter than 8 characters cannot be told from text: it is not searched for, so
    the recording stays readable and checkable (the header itself is never written)."""
    path = tmp_path / "short.yaml"
    body = {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "stream": False}

    def server(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"choices": [{"message": {"content": "Oslo: sunny"}}]})

    with use_cassette(path, "all"), httpx.Client(transport=httpx.MockTransport(server)) as http:
        http.post(
            "http://llama.test/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        )
    text = path.read_text()
    assert "<API_KEY>" not in text and "Authorization" not in text
    assert "/v1/chat/completions" in text and "messages" in text and "Oslo: sunny" in text
