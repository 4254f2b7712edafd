"""The pytest plugin (boxmaker.cassettes.pytest_plugin) run by pytester on small test files: marker
and fixture, --record-mode, the network blocked in mode none, unplayed interactions fail a test."""

from __future__ import annotations

import importlib.metadata
import shutil
from pathlib import Path

import pytest

# imported here so pytester's inner runs find them loaded (its module snapshot would make
# every inner run import jsonschema, vcrpy and httpx again)

pytest_plugins = ["pytester"]

HAND_MADE = Path(__file__).resolve().parents[1] / "data" / "cassettes"


def _plugin_args() -> list[str]:
    """``-p boxmaker.cassettes.pytest_plugin`` unless the installed entry point loads it already;
    hypothesis's terminal summary off in the inner run (it costs seconds and says nothing here)."""
    quiet = ["-p", "no:hypothesispytest"]
    for ep in importlib.metadata.entry_points(group="pytest11"):
        if ep.value in ("boxmaker._pytest_entry", "boxmaker.cassettes.pytest_plugin"):
            return quiet
    return [*quiet, "-p", "boxmaker.cassettes.pytest_plugin"]


HEADER = """
import httpx, pytest
from boxmaker.client import Client
from boxmaker.config import ClientConfig

BODY = {
    "messages": [{"role": "user", "content": "Hello"}], "id_slot": 0,
    "chat_template_kwargs": {"enable_thinking": True}, "temperature": 0.0,
    "max_tokens": 1024, "seed": 0,
}

def chat(body=BODY, transport=None):
    config = ClientConfig(url="http://127.0.0.1:9", retry_attempts=0)
    with Client(config, transport=transport) as client:
        return client.chat(body, lambda e: None)
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    shutil.copy(HAND_MADE / "empty-choices.yaml", pytester.path / "hello.yaml")
    return pytester


def test_none_mode_replays_fails_unmatched_and_unplayed_blocks_network(
    project: pytest.Pytester,
) -> None:
    project.makepyfile(
        HEADER
        + """
import socket
from boxmaker.errors import CassetteError

@pytest.mark.cassette("hello.yaml")
def test_hello():
    assert chat().content == "Hello"

@pytest.mark.cassette("hello.yaml")
def test_other_question():
    chat({**BODY, "messages": [{"role": "user", "content": "Bye"}]})

@pytest.mark.cassette("hello.yaml")
def test_swallowed():
    try:
        chat({**BODY, "seed": 1})
    except Exception:
        pass
    chat()

@pytest.mark.cassette("hello.yaml")
def test_unplayed():
    pass

@pytest.mark.cassette("hello.yaml")
def test_socket(cassette):
    with pytest.raises(CassetteError, match="network is blocked"):
        socket.create_connection(("127.0.0.1", 9), timeout=1)
    chat()

def test_fixture_without_a_file(cassette):
    pass
"""
    )
    result = project.runpytest(*_plugin_args())
    result.assert_outcomes(passed=2, failed=3, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at setup of test_fixture_without_a_file*",
            "*test_fixture_without_a_file.yaml: no such cassette*",
            "*_ test_other_question _*",
            "*hello.yaml: request 1 (POST /v1/chat/completions) matches no recorded interaction*"
            "messages[[]0[]].content (recorded 'Hello', sent 'Bye')*",
            "*_ test_swallowed _*",
            "*hello.yaml: request 1 *at seed (recorded 0, sent 1) (the code under test caught it)",
            "*_ test_unplayed _*",
            "*hello.yaml: 1 recorded interaction(s) were not played, the first is 1 (POST *",
        ]
    )


def test_record_once_then_replay(project: pytest.Pytester) -> None:
    project.makepyfile(
        HEADER
        + """
def answer(request):
    body = (b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}'
            b'\\n\\ndata: [DONE]\\n\\n')
    return httpx.Response(200, headers={"content-type": "text/event-stream"},
                          content=iter([body]))

def test_recorded(cassette):
    transport = None if cassette.play_count or len(cassette.data) else httpx.MockTransport(answer)
    assert chat(transport=transport).content == "Hi"
"""
    )
    project.runpytest(*_plugin_args(), "--record-mode", "once").assert_outcomes(passed=1)
    recorded = project.path / "cassettes" / "test_record_once_then_replay" / "test_recorded.yaml"
    assert "sse: |" in recorded.read_text()
    project.runpytest(*_plugin_args()).assert_outcomes(passed=1)


def test_record_mode_choices(project: pytest.Pytester) -> None:
    project.makepyfile("def test_x(): pass")
    result = project.runpytest(*_plugin_args(), "--record-mode", "sometimes")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--record-mode*invalid choice*"])
