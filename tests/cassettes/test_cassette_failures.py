"""Hand-made failure cassettes (tests/data/cassettes/) replay through the same path as recorded ones
(use_cassette -> the real Client -> run_turn) and the loop does what the spec says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from boxmaker.cassettes import use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config
from boxmaker.demo import demo_registry
from boxmaker.errors import StreamCut, TurnInferError
from boxmaker.events import Content, Queued, Reasoning, Retrying
from boxmaker.records import Assistant, Baseline, Usage, User
from boxmaker.session import Session
from boxmaker.turn import Runtime, TurnOutcome, run_turn

HERE = Path(__file__).resolve().parents[1] / "data" / "cassettes"


def turn(name: str, tmp_path: Path) -> tuple[Session, list[Any], TurnOutcome | BaseException]:
    """One turn, "Hello", on an empty baseline with the default config, against ``name``."""
    config = Config(client=ClientConfig(url="http://127.0.0.1:9", retry_attempts=2))
    session = Session.create(tmp_path, Baseline())
    events: list[Any] = []
    result: TurnOutcome | BaseException
    with (
        use_cassette(HERE / f"{name}.yaml", "none"),
        Client(config.client, sleep=lambda s: None) as client,
    ):
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        try:
            result = run_turn(session, runtime, "Hello", events.append)
        except TurnInferError as exc:
            result = exc
    return session, events, result


def kinds(session: Session) -> list[str]:
    return [type(r).__name__ for r in session.records]


def test_cut_stream_ends_the_turn_with_an_inference_error(tmp_path: Path) -> None:
    session, events, result = turn("cut-stream", tmp_path)
    assert isinstance(result, TurnInferError) and isinstance(result.cause, StreamCut)
    assert "broke mid-stream" in str(result)
    # what arrived before the cut was passed on; a failed request appends only the TurnEnd
    assert [e.text for e in events if isinstance(e, Reasoning | Content)] == ["Greet", "Hel"]
    assert kinds(session) == ["User", "TurnEnd"]


def test_error_inside_a_200_stream_ends_the_turn_keeping_status_and_body(tmp_path: Path) -> None:
    session, events, result = turn("error-in-stream", tmp_path)
    assert isinstance(result, TurnInferError)
    assert result.cause.status == 500 and result.cause.error_type == "server_error"
    assert "the model crashed while decoding" in result.cause.body
    assert isinstance(events[1], Queued)
    assert kinds(session) == ["User", "TurnEnd"]


def test_503_then_200_is_retried_and_answered(tmp_path: Path) -> None:
    session, events, result = turn("retry-503", tmp_path)
    assert isinstance(result, TurnOutcome) and result.content == "Hello"
    retrying = [e for e in events if isinstance(e, Retrying)]
    assert len(retrying) == 1 and retrying[0].attempt == 1
    assert "Loading model" in retrying[0].reason
    # the 503 attempt emitted nothing: Retrying comes right after the User record, then the
    # second attempt streams from Queued on
    assert isinstance(events[0], User) and events[1] is retrying[0]
    assert isinstance(events[2], Queued)
    assert kinds(session) == ["User", "Assistant", "Usage", "TurnEnd"]


def test_final_chunk_with_empty_choices_carries_usage_and_timings(tmp_path: Path) -> None:
    session, _events, result = turn("empty-choices", tmp_path)
    assert isinstance(result, TurnOutcome) and result.content == "Hello"
    assert kinds(session) == ["User", "Assistant", "Usage", "TurnEnd"]
    assistant = session.records[1]
    assert isinstance(assistant, Assistant) and assistant.reasoning == "Greet"
    usage = session.records[2]
    assert isinstance(usage, Usage)
    assert usage.timings["prompt_n"] == 9 and usage.timings["predicted_n"] == 4
    assert (usage.prompt_tokens, usage.completion_tokens) == (9, 4)
    assert isinstance(session.records[0], User)


@pytest.mark.parametrize("path", sorted(HERE.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_hand_made_cassette_has_a_test(path: Path) -> None:
    tested = {"cut-stream", "error-in-stream", "retry-503", "empty-choices"}
    assert path.stem in tested
