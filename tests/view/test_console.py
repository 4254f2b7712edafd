"""Model text on a terminal: :func:`terminal_safe` and the console view of ``demo``/``chat``."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.config import Config, LoopLimits
from boxmaker.errors import TurnLimit
from boxmaker.events import Content, Queued, Reasoning, Retrying, ToolCallStarted, TurnEvent
from boxmaker.records import Baseline, LimitHit, Record, ToolResult
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, Step, answer, call
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn
from boxmaker.view import ConsoleView, terminal_safe

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""What must never reach the terminal from model text: C0 but tab and newline, DEL, C1."""

OSC_TITLE = "\x1b]0;pwned\x07"
CLEAR = "\x1b[2J"
CSI_8BIT = "\x9b31m"
CLIPBOARD = "\x1b]52;c;ZXZpbA==\x07"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (OSC_TITLE, "\\x1b]0;pwned\\x07"),
        (CLEAR + "gone", "\\x1b[2Jgone"),
        (CSI_8BIT + "red", "\\x9b31mred"),
        ("\x9d0;title\x9c", "\\x9d0;title\\x9c"),  # 8-bit OSC and ST
        ("fake\rreal", "fake\\rreal"),  # a lone CR would overwrite the line
        ("windows\r\nline", "windows\nline"),
        ("bell\x07 nul\x00 bs\x08 del\x7f nel\x85", "bell\\x07 nul\\x00 bs\\x08 del\\x7f nel\\x85"),
        ("tab\tnewline\n", "tab\tnewline\n"),
        ("Zürich ✓ 東京 🌧", "Zürich ✓ 東京 🌧"),
    ],
)
def test_terminal_safe_shows_controls_as_escapes(text: str, shown: str) -> None:
    assert terminal_safe(text) == shown


@given(st.text(alphabet=st.characters(codec="utf-8")))
def test_terminal_safe_leaves_no_control_and_keeps_the_rest(text: str) -> None:
    safe = terminal_safe(text)
    assert CONTROL.search(safe) is None
    if CONTROL.search(text) is None:
        assert safe == text


class Terminal(io.StringIO):
    """A text stream that says it is a terminal (so the view writes its dim and reset)."""

    def isatty(self) -> bool:
        return True


HOSTILE_EVENTS: list[TurnEvent | Record] = [
    Queued(),
    Reasoning(OSC_TITLE),
    Reasoning("\x1b"),  # a sequence split across fragments
    Reasoning("[2J"),
    Content(CLEAR),
    Content(CSI_8BIT + " red"),
    ToolCallStarted(name="get\x1b[31m", call=1, arguments='{"city": "\x1b[1A"}'),
    ToolResult(call=1, tool_call_id="c1", name="get", content=CLIPBOARD + " clipboard"),
    LimitHit(kind="tool_iterations", detail="\x1b[?1049h alternate screen"),
    Retrying(attempt=1, delay_s=0.5, reason="HTTP 503: \x1b[K\x9b2J"),
]


@pytest.mark.parametrize("stream", [io.StringIO, Terminal])
def test_console_view_writes_no_escape_from_the_model(stream: type[io.StringIO]) -> None:
    out = stream()
    view = ConsoleView(out)
    for event in HOSTILE_EVENTS:
        view(event)
    view.end()
    printed = out.getvalue()
    own = printed.replace("\x1b[2m", "").replace("\x1b[0m", "")
    assert CONTROL.search(own) is None, own
    assert ("\x1b[2m" in printed) is (stream is Terminal)
    assert "think> \\x1b]0;pwned\\x07\\x1b[2J" in own
    assert "model> \\x1b[2J\\x9b31m red" in own
    assert 'call #1 get\\x1b[31m{"city": "\\x1b[1A"}' in own
    assert "result: \\x1b]52;c;ZXZpbA==\\x07 clipboard" in own
    assert "[limit tool_iterations: \\x1b[?1049h alternate screen]" in own
    assert "HTTP 503: \\x1b[K\\x9b2J]" in own


def test_a_turn_streamed_to_the_console_shows_hostile_text_inert(tmp_path: Path) -> None:
    registry = Registry()

    @registry.add
    def echo(text: str) -> str:
        """Echo a text back, as a web page might send it.

        Args:
            text: The text.
        """
        return f"page says: {text}\x1b[2J"

    client = ScriptedClient(
        [
            Step(reasoning=OSC_TITLE, tool_calls=[call("echo", {"text": "hi"})]),
            answer(CLEAR + CSI_8BIT + "done"),
        ]
    )
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    out = Terminal()
    view = ConsoleView(out)
    runtime = Runtime(config=Config(), client=client, registry=registry)
    outcome = run_turn(session, runtime, "go", view)
    view.end()
    assert outcome.content == CLEAR + CSI_8BIT + "done"  # the log keeps the text as it was
    own = out.getvalue().replace("\x1b[2m", "").replace("\x1b[0m", "")
    assert CONTROL.search(own) is None, own
    assert "page says: hi\\x1b[2J" in own and "\\x1b[2J\\x9b31mdone" in own


def test_cassette_show_and_replay_print_no_escape_from_a_recording(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recorded model text that carries terminal escapes is printed inert by the CLI."""
    import boxmaker.cassettes as cassettes
    from boxmaker.cli import main

    monkeypatch.setattr(cassettes, "transcript", lambda path: "answer: Os\x1b]0;pwned\x07lo")
    assert main(["cassette", "show", str(tmp_path / "any.yaml")]) == 0
    out = capsys.readouterr().out
    assert "Os\\x1b]0;pwned\\x07lo" in out and "\x1b" not in out and "\x07" not in out


def test_a_call_a_limit_does_not_run_is_shown_before_its_result(tmp_path: Path) -> None:
    """The newcomer retrial (issue 21): a call the limits answered without running had no
    ToolCallStarted, so the view printed its result without the call it answers."""
    registry = Registry()

    @registry.add
    def get_weather(city: str) -> str:
        """The weather.

        Args:
            city: A city.
        """
        return "sunny"

    client = ScriptedClient([Step(tool_calls=[call("get_weather", {"city": "Oslo"})])])
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    out = io.StringIO()
    view = ConsoleView(out)
    config = Config(loop=LoopLimits(tool_iterations=0))
    with pytest.raises(TurnLimit):
        run_turn(session, Runtime(config=config, client=client, registry=registry), "go", view)
    view.end()
    printed = out.getvalue()
    (result,) = [r for r in session.records if isinstance(r, ToolResult)]
    assert result.not_run is not None
    line = f'call #{result.call} get_weather{{"city": "Oslo"}}\n  result: {result.content[:40]}'
    assert line in printed, printed
