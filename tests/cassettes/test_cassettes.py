"""Cassettes: recorded traffic of the embedded llama.cpp server replays through the real
client and loop, offline (record mode ``none``), and never holds a secret."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from boxmaker.cassettes import use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config
from boxmaker.demo import demo_registry
from boxmaker.errors import CassetteError, TurnError
from boxmaker.events import Progress, Queued
from boxmaker.records import Baseline, TurnEnd, User, record_to_json
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

ROOT = Path(__file__).resolve().parents[2]
CASSETTES = ROOT / "cassettes"
UNREACHABLE = "http://127.0.0.1:9"  # nothing listens there: replay must not need it


LATER_FIELDS = ("reprocessed", "reprocessed_ms")
"""Fields the loop writes now that the stored logs beside the cassettes predate (a cache loss's
re-processed tokens and ms, computed from the same timings): left out of the comparison."""


def _without_time(records: Any) -> list[dict[str, Any]]:
    out = []
    for r in records:
        data = record_to_json(r)
        data.pop("time")
        for name in LATER_FIELDS:
            data.pop(name, None)
        out.append(data)
    return out


def recorded_users(session: Session) -> list[User]:
    return [r for r in session.records if isinstance(r, User)]


def _replay(name: str, tmp_path: Path, events: list[Any] | None = None) -> tuple[Session, Session]:
    """Replay a cassette through the real loop, beside the session log the recording made."""
    recorded = Session.open(CASSETTES / f"{name}.session.jsonl", read_only=True)
    prompts = [r.content for r in recorded.records if isinstance(r, User)]
    config = Config(client=ClientConfig(url=UNREACHABLE, retry_attempts=0))
    session = Session.create(tmp_path, recorded.baseline)
    with use_cassette(CASSETTES / f"{name}.yaml", "none"), Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        for text in prompts:
            with contextlib.suppress(TurnError):
                run_turn(session, runtime, text, events.append if events is not None else None)
    return recorded, session


def test_replayed_turns_append_the_same_records(tmp_path: Path) -> None:
    events: list[Any] = []
    recorded, session = _replay("demo-turns", tmp_path, events)
    assert len(session.records) >= 4
    assert recorded.schema == 2
    assert sum(isinstance(r, TurnEnd) for r in session.records) == len(recorded_users(recorded))
    assert _without_time(session.records) == _without_time(recorded.records)
    assert session.baseline.tools == recorded.baseline.tools
    # the replay went through the streaming path: queued, prompt progress, then tokens
    assert isinstance(events[1], Queued)
    assert any(isinstance(e, Progress) and e.processed == e.total for e in events)


def test_recorded_baseline_uses_the_demo_tools() -> None:
    recorded = Session.open(CASSETTES / "demo-turns.session.jsonl", read_only=True)
    assert list(recorded.baseline.tools) == list(demo_registry().definitions())


def test_unrecorded_request_fails_without_network(tmp_path: Path) -> None:
    config = Config(client=ClientConfig(url=UNREACHABLE, retry_attempts=0))
    session = Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))
    where = (
        r"demo-turns\.yaml: request 1 \(POST /v1/chat/completions\) matches no recorded "
        r"interaction: its body differs from recorded interaction 1 at messages\[0\]\.content "
        r"\(recorded 'What is the weather in Lisbon\?', sent 'A question nobody recorded'\)"
    )
    with (
        pytest.raises(CassetteError, match=where),
        use_cassette(CASSETTES / "demo-turns.yaml", "none", strict=False),
        Client(config.client) as client,
    ):
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        run_turn(session, runtime, "A question nobody recorded")
    assert [type(r).__name__ for r in session.records] == ["User"]


def test_missing_cassette_in_none_mode(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match="no such cassette"):  # noqa: SIM117
        with use_cassette(tmp_path / "absent.yaml", "none"):
            pass


def test_unplayed_interactions_fail_a_strict_replay() -> None:
    with pytest.raises(CassetteError, match=r"interaction\(s\) were not played"):  # noqa: SIM117
        with use_cassette(CASSETTES / "demo-turns.yaml", "none"):
            pass


SECRET = re.compile(
    r"(authorization|api[-_]?key|cookie|bearer\s+\S+|sk-[A-Za-z0-9]{8,})", re.IGNORECASE
)


ALL_CASSETTE_FILES = sorted(
    p
    for folder in (CASSETTES, ROOT / "tests" / "data" / "cassettes")
    for p in folder.rglob("*")
    if p.is_file()
)


@pytest.mark.parametrize("path", ALL_CASSETTE_FILES, ids=lambda p: p.name)
def test_no_cassette_holds_a_secret(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert not SECRET.search(text), f"{path.name}: {SECRET.search(text)}"
    assert "/work/" not in text and "/home/" not in text and "/root/" not in text


def test_cassettes_are_readable_json_and_sse() -> None:
    import yaml

    data = yaml.safe_load((CASSETTES / "demo-turns.yaml").read_text())
    first = data["interactions"][0]
    assert isinstance(first["request"]["body_json"]["messages"], list)
    assert set(first["request"]["headers"]) <= {"accept", "content-type"}
    # one event a line, no blank separator lines; the last is [DONE]
    events = first["response"]["body"]["sse"].splitlines()
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[0][6:])["object"] == "chat.completion.chunk"


@pytest.mark.live
def test_recording_scrubs_the_api_key(tmp_path: Path) -> None:
    from boxmaker.server import EmbeddedServer

    key = "sk-boxmakertestsecret123"
    cassette = tmp_path / "rec.yaml"
    with EmbeddedServer(n_ctx=2048, n_threads=1) as server:
        config = Config(client=ClientConfig(url=server.url, api_key=key))
        session = Session.create(tmp_path, Baseline())
        with use_cassette(cassette, "all"), Client(config.client) as client:
            runtime = Runtime(config=config, client=client, registry=demo_registry())
            run_turn(session, runtime, "Hello!")
    text = cassette.read_text()
    assert "chat/completions" in text
    assert key not in text and "authorization" not in text.lower()


def test_demo_cassette_holds_real_tool_calls_results_and_answers() -> None:
    """The recording from the shipped model: each question gets the right tool with the city
    copied exactly, the demo tool's result, and an answer quoting the result's values."""
    from boxmaker.demo import get_time, get_weather
    from boxmaker.records import Assistant, ToolResult

    recorded = Session.open(CASSETTES / "demo-turns.session.jsonl", read_only=True)
    assistants = [r for r in recorded.records if isinstance(r, Assistant)]
    calls = [(c.name, json.loads(c.arguments)) for a in assistants for c in a.tool_calls]
    assert calls == [("get_weather", {"city": "Lisbon"}), ("get_time", {"city": "Tokyo"})]
    results = [r.content for r in recorded.records if isinstance(r, ToolResult)]
    assert results == [get_weather("Lisbon"), get_time("Tokyo")]
    weather, clock = json.loads(results[0]), json.loads(results[1])
    answers = [a.content for a in assistants if not a.tool_calls]
    assert answers == [
        f"In Lisbon it is {weather['temperature']} C and {weather['sky']}.",
        f"In Tokyo it is {clock['time']}.",
    ]
    assert all(a.reasoning for a in assistants)
