"""The model-graded scorer (issue 26): a grader behind a fake llama-server (boxmaker.testing's
LlamaScript over httpx.MockTransport) grades each run; the request and reply are kept with the
score in scores.ndjson, a reply without a grade is a failed score, and re-scoring offline
keeps the grades without asking again."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx
import pytest
from test_score_batch import _two_settings

from boxmaker.batch import GRADE_TEMPLATE, model_graded, read_scores, score_batch
from boxmaker.client import Client
from boxmaker.config import ClientConfig
from boxmaker.records import Assistant, Record, User
from boxmaker.score import apply
from boxmaker.testing import LlamaScript, Reply

RUN: list[Record] = [
    User(content="What is the weather in Lisbon?"),
    Assistant(content="In Lisbon it is 34 C."),
]


def _grader(*replies: str) -> tuple[Client, LlamaScript]:
    script = LlamaScript([Reply(content=text) for text in replies])
    config = ClientConfig(url="http://grader:8080", retry_attempts=1)
    return Client(config, transport=httpx.MockTransport(script.handler)), script


@pytest.mark.parametrize(
    ("reply", "value"),
    [
        ("It names the temperature.\nGRADE: C", 1.0),
        ("Only the city.\nGRADE: P", 0.5),
        ("GRADE: C at first, but no.\nGRADE: I", 0.0),  # the last grade counts
    ],
)
def test_the_grade_letter_gives_the_value_and_the_request_is_kept(reply: str, value: float) -> None:
    client, script = _grader(reply)
    with client:
        score = apply(model_graded(client, "names the temperature"), RUN)
    assert score.value == value and score.error is None
    assert score.reply == reply
    (body,) = script.bodies
    assert score.request is not None and score.request["messages"] == body["messages"]
    prompt = body["messages"][0]["content"]
    assert prompt == GRADE_TEMPLATE.format(
        question="What is the weather in Lisbon?",
        answer="In Lisbon it is 34 C.",
        criterion="names the temperature",
    )
    assert body["temperature"] == 0.0 and body["seed"] == 0


def test_a_reply_without_a_grade_is_a_failed_score_that_keeps_the_reply() -> None:
    client, _ = _grader("I am not sure what you mean.")
    with client:
        score = apply(model_graded(client, "names the temperature"), RUN)
    assert math.isnan(score.value)
    assert score.error is not None and "has no GRADE: C, P or I" in score.error
    assert score.reply == "I am not sure what you mean."


def test_a_grader_that_cannot_be_reached_is_a_failed_score() -> None:
    config = ClientConfig(url="http://127.0.0.1:9", retry_attempts=1)
    with Client(config) as client:
        score = apply(model_graded(client, "anything"), RUN)
    assert math.isnan(score.value) and score.error is not None
    assert score.error.startswith(
        "InferError: cannot connect to llama-server at http://127.0.0.1:9"
    )


def test_graded_scores_are_written_with_their_requests_and_kept_offline(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    client, script = _grader("Right.\nGRADE: C")
    with client:
        frame = score_batch(folder, [model_graded(client, "says the temperature")])
    graded = frame[frame.scorer == "model_graded"]
    assert len(graded) == 12 and set(graded.value) == {1.0}
    assert len(script.bodies) == 12  # one request per run
    lines = [s for s in read_scores(folder) if s["scorer"] == "model_graded"]
    assert all(s["reply"] == "Right.\nGRADE: C" for s in lines)
    assert all(s["request"]["messages"][0]["content"].startswith("You are grading") for s in lines)
    before = (folder / "scores.ndjson").read_bytes()
    offline, _ = _grader()  # would answer "ok": never asked
    with offline:
        again = score_batch(folder, [model_graded(offline, "says the temperature")])
    assert (folder / "scores.ndjson").read_bytes() == before
    assert json.loads(before.splitlines()[-1])["scorer"] in ("target", "model_graded")
    assert set(again[again.scorer == "model_graded"].value) == {1.0}


def test_a_key_the_grader_echoes_is_hidden_in_scores_ndjson(tmp_path: Path) -> None:
    """Issue 36: a model grader's reply quoting its own key was kept in plain (and copied
    into the Inspect export); the scores are written by the logs' and cassettes' rule."""
    key = "sk-grader-0123456789"
    folder = _two_settings(tmp_path)
    script = LlamaScript([Reply(content=f"My key is {key}.\nGRADE: C")])
    config = ClientConfig(url="http://grader:8080", retry_attempts=1, api_key=key)
    with Client(config, transport=httpx.MockTransport(script.handler)) as client:
        grader = model_graded(client, "says the temperature")
        assert grader.secrets == (key,)
        score_batch(folder, [grader], secrets=["sk-batch-abcdefghij"])
    text = (folder / "scores.ndjson").read_text()
    assert key not in text
    graded = [s for s in read_scores(folder) if s["scorer"] == "model_graded"]
    assert len(graded) == 12
    assert all(s["reply"] == "My key is <API_KEY>.\nGRADE: C" for s in graded)
