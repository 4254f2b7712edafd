"""Cassettes cost time linear in their size (issue 36: 200,000 interactions took 67-72 s and
1.5 GB to show or check, and replay had not finished at 300 s). Counted, not timed: replay
compares each request with the recorded ones of its own match key only, ``show`` parses the
body of the reasoning-control requests only, and the YAML of boxmaker's layout is read one
interaction at a time, giving what the whole document gives (the ratios over sizes are
``benchmarks/cassette_scale.py``'s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.cassettes import (
    CassetteWriter,
    _inspection,
    _serializer,
    _transport,
    check_prefix,
    load_interactions,
    transcript,
    use_cassette,
)
from boxmaker.errors import CassetteError
from boxmaker.testing import Reply, Stall

URL = "http://127.0.0.1:8080/v1/chat/completions"
ROOT = Path(__file__).resolve().parents[2]


def _cassette(path: Path, n: int) -> list[bytes]:
    """``n`` chat interactions (a new user message each), written by CassetteWriter; the
    request bodies."""
    events = b"".join(e for e in Reply(content="Hi.").events() if not isinstance(e, Stall))
    bodies = []
    with CassetteWriter(path) as writer:
        for i in range(n):
            messages = [{"role": "user", "content": f"question {i}"}]
            body = json.dumps({"messages": messages, "stream": True}).encode()
            bodies.append(body)
            writer.add(method="POST", uri=URL, request_headers=[], request_body=body,
                       status=200, response_headers=[("content-type", "text/event-stream")],
                       body=events)  # fmt: skip
    return bodies


def test_replay_compares_each_request_with_its_own_key_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    bodies = _cassette(path, 300)
    compared = 0
    real = _transport.first_body_difference  # type: ignore[attr-defined]

    def counting(*args: Any, **kwargs: Any) -> Any:
        nonlocal compared
        compared += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(_transport, "first_body_difference", counting)
    with use_cassette(path, "none"), httpx.Client() as client:
        for body in reversed(bodies):  # the worst order for a scan from the start
            answer = client.post("http://127.0.0.1:9/v1/chat/completions", content=body)
            assert answer.status_code == 200 and b"[DONE]" in answer.read()
    assert compared == 300  # one confirmation each (vcrpy's scan: 45,150 comparisons)


def test_the_same_request_recorded_many_times_plays_in_order_each_once(tmp_path: Path) -> None:
    path = tmp_path / "same.yaml"
    body = json.dumps({"messages": [{"role": "user", "content": "again"}]}).encode()
    with CassetteWriter(path) as writer:
        for i in range(50):
            writer.add(method="POST", uri=URL, request_headers=[], request_body=body, status=200,
                       response_headers=[("content-type", "application/json")],
                       body=json.dumps({"n": i}).encode())  # fmt: skip
    with use_cassette(path, "none"), httpx.Client() as client:
        got = [client.post(URL, content=body).json()["n"] for _ in range(50)]
        assert got == list(range(50))
        with pytest.raises(CassetteError, match="all 50 recorded interactions were played"):
            client.post(URL, content=body)


def test_a_body_equal_as_json_matches_whatever_its_spelling(tmp_path: Path) -> None:
    """The index files equal JSON under one key: key order, 1 == 1.0, True == 1."""
    path = tmp_path / "json.yaml"
    recorded = {"messages": [], "temperature": 1.0, "stream": True, "n": 2}
    with CassetteWriter(path) as writer:
        writer.add(method="POST", uri=URL, request_headers=[], status=200,
                   request_body=json.dumps(recorded).encode(), body=b'{"ok": 1}',
                   response_headers=[("content-type", "application/json")])  # fmt: skip
    sent = b'{"n": 2.0, "stream": 1, "temperature": 1, "messages": []}'
    with use_cassette(path, "none"), httpx.Client() as client:
        assert client.post(URL, content=sent).json() == {"ok": 1}


def test_show_parses_only_the_control_requests_bodies_to_place_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    _cassette(path, 200)
    parsed = 0
    real = _inspection._request_json

    def counting(item: Any) -> Any:
        nonlocal parsed
        parsed += 1
        return real(item)

    monkeypatch.setattr(_inspection, "_request_json", counting)
    text = transcript(path)
    assert text.count("\n[") == 200 and "question 199" in text
    assert parsed == 200  # once each, for the transcript itself (was 400: and n**2 scans)


def test_boxmakers_layout_is_read_one_interaction_at_a_time_as_the_whole_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "c.yaml"
    _cassette(path, 40)
    texts = [path.read_text(encoding="utf-8")]
    texts += [p.read_text(encoding="utf-8") for p in sorted((ROOT / "cassettes").glob("*.yaml"))]
    for text in texts:
        itemwise = _serializer._load_items(text)
        assert itemwise is not None and itemwise == _serializer._load_whole(text)
    whole: list[int] = []
    real = _serializer._load_whole

    def sized(text: str, **kw: Any) -> Any:
        whole.append(len(text))
        return real(text, **kw)

    monkeypatch.setattr(_serializer, "_load_whole", sized)
    assert len(load_interactions(path)) == 40
    assert check_prefix(path).chat_requests == 40
    assert max(whole) < 100  # only the head ("version: 1 / interactions:") read whole


def test_an_alias_across_interactions_falls_back_to_the_whole_document(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    _cassette(path, 2)
    text = path.read_text(encoding="utf-8")
    text = text.replace("    method: POST", "    method: &m POST", 1)
    text = text[::-1].replace("TSOP :dohtem", "m* :dohtem", 1)[::-1]  # the last one: *m
    path.write_text(text, encoding="utf-8")
    assert _serializer._load_items(text) is None  # *m is undefined in the second item alone
    assert [i["request"]["method"] for i in load_interactions(path)] == ["POST", "POST"]


def test_aliases_are_counted_over_every_interaction(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    _cassette(path, 20)
    parts = path.read_text(encoding="utf-8").split("    method: POST")
    text = parts[0] + "".join(
        f"    method: &m{i} POST\n    extra: [*m{i}]" + part for i, part in enumerate(parts[1:])
    )
    path.write_text(text, encoding="utf-8")  # 20 aliases, each in its own interaction
    with pytest.raises(CassetteError, match="more than 16 YAML aliases"):
        load_interactions(path)
