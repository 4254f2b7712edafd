"""CassetteWriter: a cassette written from exchanges seen elsewhere (the tap's), one interaction
appended at a time, is the file the serializer writes whole, scrubbed by use_cassette's rules,
and it replays."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vcr.request import Request as VcrRequest
from vcr.serialize import serialize as vcr_serialize

from boxmaker.cassettes import CassetteWriter, load_interactions, serializer, use_cassette

URI = "http://127.0.0.1:8080/v1/chat/completions"
SSE = [("Content-Type", "text/event-stream")]


def _add(writer: CassetteWriter, body: bytes, request: dict[str, object] | None = None) -> None:
    writer.add(
        method="POST",
        uri=URI,
        request_headers=[("Content-Type", "application/json")],
        request_body=json.dumps(request or {"messages": []}).encode(),
        status=200,
        response_headers=SSE,
        body=body,
        reason="OK",
    )


_EVENT = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\n"), max_size=30
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(streams=st.lists(st.lists(_EVENT, min_size=1, max_size=4), min_size=1, max_size=4))
def test_appending_gives_the_file_the_serializer_writes_whole(
    tmp_path: Path, streams: list[list[str]]
) -> None:
    path = tmp_path / "appended.yaml"
    bodies = [b"".join(f"data: {e}\n\n".encode() for e in events) for events in streams]
    with CassetteWriter(path) as writer:
        for n, body in enumerate(bodies):
            _add(writer, body, {"messages": [{"role": "user", "content": str(n)}]})
    assert writer.count == len(bodies)
    loaded = load_interactions(path)
    assert [i["response"]["body"]["string"] for i in loaded] == bodies
    whole = vcr_serialize(
        {
            "requests": [VcrRequest._from_dict(i["request"]) for i in loaded],
            "responses": [i["response"] for i in loaded],
        },
        serializer,
    )
    assert path.read_text() == whole


def test_the_request_credentials_are_hidden_everywhere_and_headers_dropped(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    token, header_key = "tok-0123456789abcdef", "hdr-0123456789abcdef"
    echoed = json.dumps({"echo": f"{token} {header_key}", "api_key": "leaked-value-123"})
    with CassetteWriter(path) as writer:
        writer.add(
            method="POST",
            uri=URI + f"?token={token}&keep=1",
            request_headers=[("Authorization", f"Bearer {token}"), ("X-Api-Key", header_key)],
            request_body=json.dumps({"messages": [], "api_key": "body-secret-12345"}).encode(),
            status=400,
            response_headers=[("Content-Type", "application/json"), ("Set-Cookie", "s=1")],
            body=echoed.encode(),
        )
    text = path.read_text()
    for secret in (token, header_key, "body-secret-12345", "leaked-value-123", "s=1"):
        assert secret not in text
    (interaction,) = load_interactions(path)
    assert interaction["request"]["uri"] == URI + "?keep=1"
    assert interaction["request"]["headers"] == {}
    assert json.loads(interaction["response"]["body"]["string"]) == {
        "echo": "<API_KEY> <API_KEY>",
        "api_key": "<SECRET>",
    }


def test_a_compressed_answer_is_stored_decoded_and_replays(tmp_path: Path) -> None:
    path = tmp_path / "gzip.yaml"
    plain = b'{"status":"ok"}'
    with CassetteWriter(path) as writer:
        writer.add(
            method="GET",
            uri="http://127.0.0.1:8080/health",
            request_headers=[],
            request_body=b"",
            status=200,
            response_headers=[("Content-Type", "application/json"), ("Content-Encoding", "gzip")],
            body=gzip.compress(plain),
        )
    (interaction,) = load_interactions(path)
    assert interaction["response"]["body"]["string"] == plain
    assert interaction["response"]["headers"] == {"Content-Type": ["application/json"]}
    with use_cassette(path, "none"):
        assert httpx.get("http://elsewhere.test/health").content == plain


def test_an_existing_file_is_replaced_only_when_the_first_interaction_comes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.yaml"
    path.write_text("old")
    writer = CassetteWriter(path)
    assert path.read_text() == "old"
    _add(writer, b"data: [DONE]\n\n")
    writer.close()
    writer.close()  # idempotent
    (interaction,) = load_interactions(path)
    assert interaction["response"]["body"]["string"] == b"data: [DONE]\n\n"


def test_a_key_a_body_shows_only_once_decoded_is_hidden_even_beside_a_lone_surrogate(
    tmp_path: Path,
) -> None:
    """A body that shows the key only decoded (``\\u0073k-...``) is written again with it
    hidden; one that also holds a lone surrogate (``\\ud83d``, valid JSON, no UTF-8) raised
    ``UnicodeEncodeError``, which stopped the tap's cassette. The headers may be a mapping,
    as before."""
    key = "sk-decoded-0123456789"
    body = b'{"messages":[{"role":"user","content":"\\ud83d \\u0073' + key[1:].encode() + b'"}]}'
    assert key in json.loads(body)["messages"][0]["content"]
    path = tmp_path / "c.yaml"
    with CassetteWriter(path) as writer:
        writer.add(
            method="POST",
            uri=URI,
            request_headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            request_body=body,
            status=200,
            response_headers=SSE,
            body=b"data: {}\n\n",
            reason="OK",
        )
    text = path.read_text()
    assert key not in text and key[3:] not in text and "<API_KEY>" in text
    (interaction,) = load_interactions(path)
    stored = json.loads(interaction["request"]["body"])  # kept as text: YAML holds no surrogate
    assert stored["messages"][0]["content"] == "\ud83d <API_KEY>"
