"""boxmaker's pytest plugin beside pytest-recording (issue 14): pytest starts, ``--record-mode``
means one thing, and a ``vcr``-marked test with :func:`boxmaker_vcr_config` records a live
stream into a readable cassette and replays it. Each inner run is a subprocess: once with
pytest-recording taking part, once with ``-p no:recording`` (boxmaker's own option and
fixture, as without it)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

HAND_MADE = Path(__file__).resolve().parents[1] / "data" / "cassettes"

needs_recording = pytest.mark.skipif(
    importlib.util.find_spec("pytest_recording") is None, reason="pytest-recording not installed"
)

STREAM = """
import httpx, pytest
from boxmaker.cassettes.pytest_plugin import boxmaker_vcr_config

SSE = (b'data: {"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}'
       b'\\n\\ndata: [DONE]\\n\\n')
SEEN = []

def answer(request):
    def parts():
        yield SSE[:40]
        SEEN.append("first part passed on before the stream ended")
        yield SSE[40:]
    return httpx.Response(200, headers={"content-type": "text/event-stream",
                                        "authorization": "Bearer sk-secret"},
                          content=parts())

@pytest.fixture
def vcr_config():
    return boxmaker_vcr_config()

@pytest.mark.vcr
def test_stream(vcr):
    recording = not vcr.data
    transport = httpx.MockTransport(answer) if recording else None
    with httpx.Client(transport=transport) as client:
        with client.stream("POST", "http://127.0.0.1:9/v1/chat/completions",
                           json={"messages": [{"role": "user", "content": "Hello"}]},
                           headers={"Authorization": "Bearer sk-secret"}) as response:
            chunks = []
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                if recording and len(chunks) == 1:
                    assert SEEN == []  # the first part arrived before the rest was made
    assert b"".join(chunks) == SSE
    if recording:
        assert SEEN
"""


def _run(pytester: pytest.Pytester, *args: str, fresh: bool = False) -> pytest.RunResult:
    """An inner pytest, its warnings errors as in the outer run. In this process (the plugins
    are imported already: a run costs ~0.1 s instead of ~1.5 s), or with ``fresh`` in its own
    process, where the order in which the plugins import is tried for real (issue 21: the
    plugin imported vcr before pytest-recording's assert rewrite, a warning that passed)."""
    args = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-W", "error", *args)
    if fresh:
        return pytester.runpytest_subprocess(*args)
    return pytester.runpytest_inprocess(*args)


@needs_recording
def test_pytest_starts_with_pytest_recording_and_record_mode_is_its_option(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile("def test_x(): pass")
    result = _run(pytester, "--record-mode", "rewrite", "--help", fresh=True)
    assert result.ret == 0, result.stderr.str()
    assert "already used" not in result.stderr.str()
    # one --record-mode, pytest-recording's (its group is "recording")
    assert result.stdout.str().count("--record-mode") == 1
    result.stdout.fnmatch_lines(["recording:", "*--record-mode*"])
    _run(pytester, fresh=True).assert_outcomes(passed=1)


@needs_recording
def test_vcr_marker_with_boxmaker_config_records_live_then_replays(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(STREAM)
    _run(pytester, "--record-mode", "once").assert_outcomes(passed=1)
    recorded = (
        pytester.path
        / "cassettes"
        / "test_vcr_marker_with_boxmaker_config_records_live_then_replays"
        / "test_stream.yaml"
    )
    text = recorded.read_text()
    assert "sse: |" in text
    assert "sk-secret" not in text
    _run(pytester).assert_outcomes(passed=1)
    # a different body in replay fails with boxmaker's message
    pytester.makepyfile(STREAM.replace('"content": "Hello"', '"content": "Bye"'))
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*matches no recorded interaction*messages[[]0[]].content*"])


@needs_recording
def test_cassette_marker_reads_pytest_recordings_record_mode(pytester: pytest.Pytester) -> None:
    shutil.copy(HAND_MADE / "empty-choices.yaml", pytester.path / "hello.yaml")
    pytester.makepyfile(
        """
import pytest

@pytest.mark.cassette("hello.yaml")
def test_unplayed():
    pass

def test_missing(cassette):
    pass
"""
    )
    result = _run(pytester)
    result.assert_outcomes(failed=1, errors=1)
    result.stdout.fnmatch_lines(["*hello.yaml: 1 recorded interaction(s) were not played*"])
    # recording mode: the unplayed check is off, the missing cassette is recorded (empty)
    _run(pytester, "--record-mode", "once").assert_outcomes(passed=2)


def test_without_pytest_recording_boxmaker_owns_record_mode(pytester: pytest.Pytester) -> None:
    shutil.copy(HAND_MADE / "empty-choices.yaml", pytester.path / "hello.yaml")
    pytester.makepyfile(
        """
import pytest

@pytest.mark.cassette("hello.yaml")
def test_unplayed():
    pass
"""
    )
    result = _run(pytester, "-p", "no:recording", "--help")
    result.stdout.fnmatch_lines(["boxmaker cassettes:", "*--record-mode*"])
    result = _run(pytester, "-p", "no:recording")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hello.yaml: 1 recorded interaction(s) were not played*"])
    _run(pytester, "-p", "no:recording", "--record-mode", "once").assert_outcomes(passed=1)
    bad = _run(pytester, "-p", "no:recording", "--record-mode", "rewrite")
    assert bad.ret != 0


@pytest.mark.parametrize("plugins", [("-p", "no:recording"), ()], ids=["without", "with"])
def test_missing_cassette_hint_is_the_command_line_option(
    pytester: pytest.Pytester, plugins: tuple[str, ...]
) -> None:
    if plugins == () and importlib.util.find_spec("pytest_recording") is None:
        pytest.skip("pytest-recording not installed")
    pytester.makepyfile("def test_missing(cassette):\n    pass\n")
    result = _run(pytester, *plugins)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*test_missing.yaml: no such cassette (record it with --record-mode once)*"]
    )
    assert "record_mode='once'" not in result.stdout.str()


@needs_recording
def test_rewrite_mode_re_records_a_boxmaker_cassette(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(STREAM)
    _run(pytester, "--record-mode", "once").assert_outcomes(passed=1)
    folder = pytester.path / "cassettes" / "test_rewrite_mode_re_records_a_boxmaker_cassette"
    recorded = folder / "test_stream.yaml"
    assert '"content":"Hi"' in recorded.read_text()
    pytester.makepyfile(STREAM.replace('"content":"Hi"', '"content":"Yo"'))
    _run(pytester, "--record-mode", "rewrite").assert_outcomes(passed=1)
    text = recorded.read_text()
    assert '"content":"Yo"' in text and '"content":"Hi"' not in text  # the old one is gone
    assert sorted(p.name for p in folder.iterdir()) == [recorded.name]
    _run(pytester).assert_outcomes(passed=1)
