"""What-if replay (``boxmaker replay``): the loop re-run on a recording with other limits says
which limits fire and when, and stops cleanly where the cassette holds no answer.

The recordings are made here, from the shared fake llama-server (``fake_llama``) behind
httpx.MockTransport, through the real client, loop and recorder, so the tests do not depend on
a model's text."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.cassettes import recorded_session, use_cassette, what_if
from boxmaker.cli import main
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits
from boxmaker.demo import demo_registry
from boxmaker.errors import CassetteError, TurnError
from boxmaker.records import Baseline
from boxmaker.session import Session
from boxmaker.testing import LlamaScript, Reply
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

DEMO = demo_registry()
"""The demo recordings' tools, passed explicitly (the library never falls back to them)."""


def _completion(n: int, call: tuple[str, dict[str, Any]] | None, answer: str = "") -> Reply:
    reasoning = ("I ", "should ", "look ", "it ")
    if call:
        name, args = call
        tool_calls = [(f"call{n}", name, json.dumps(args))]
        return Reply(content="", reasoning=reasoning, tool_calls=tool_calls, id=f"chatcmpl-{n}")
    return Reply(content=(answer,), reasoning=reasoning, id=f"chatcmpl-{n}")


LISBON = {"city": "Lisbon"}
SCRIPT = [  # turn 1: two tool calls, then an answer; turn 2: one call, then an answer
    ("get_weather", LISBON),
    ("get_time", LISBON),
    None,
    ("get_weather", {"city": "Oslo"}),
    None,
]
PROMPTS = ("Weather and time in Lisbon?", "And the weather in Oslo?")


def _record(path: Path, tmp_path: Path, registry: Registry, script: list[Any]) -> None:
    server = LlamaScript([_completion(n, step, f"answer {n}") for n, step in enumerate(script)])

    config = Config(client=ClientConfig(url="http://llama.test", retry_attempts=0))
    session = Session.create(tmp_path / "rec", Baseline(tools=registry.definitions()))
    with (
        use_cassette(path, "once"),
        Client(config.client, transport=httpx.MockTransport(server.handler)) as client,
    ):
        runtime = Runtime(config=config, client=client, registry=registry)
        for text in PROMPTS:
            with contextlib.suppress(TurnError):
                run_turn(session, runtime, text)


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "session.yaml"
    _record(path, tmp_path, demo_registry(), SCRIPT)
    return path


def test_the_recorded_session_is_read_back(recording: Path) -> None:
    recorded = recorded_session(recording)
    assert recorded.users == PROMPTS
    assert [t["function"]["name"] for t in recorded.tools] == ["get_weather", "get_time"]
    assert recorded.chat_requests == 5
    assert len(recorded.results[("get_weather", '{"city":"Lisbon"}')]) == 1


def test_same_limits_replay_every_turn(recording: Path) -> None:
    report = what_if(recording, registry=DEMO)
    assert report.stopped is None and report.hits == []
    assert report.lines[2] == "tools: the registry given (get_weather, get_time)"
    assert report.lines[-3:] == [
        f"turn 1 ({PROMPTS[0]!r}): answered after 3 completion(s)",
        f"turn 2 ({PROMPTS[1]!r}): answered after 2 completion(s)",
        "played 5 of 5 recorded interactions",
    ]


def test_without_a_registry_the_recorded_results_answer_not_the_demo_tools(
    recording: Path,
) -> None:
    report = what_if(recording)
    assert report.lines[2] == "tools: results recorded in the cassette (get_weather, get_time)"
    assert report.stopped is None and report.lines[-1] == "played 5 of 5 recorded interactions"


def test_a_registry_without_a_recorded_tool_is_refused(recording: Path) -> None:
    registry = Registry()
    registry.add_port_tool("get_weather", "Weather.", {"type": "object", "properties": {}})
    with pytest.raises(CassetteError, match="has no tool get_time"):
        what_if(recording, registry=registry)


def test_fewer_tool_iterations_fire_then_stop_where_the_cassette_ends(recording: Path) -> None:
    report = what_if(recording, LoopLimits(tool_iterations=1), registry=DEMO)
    assert report.hits[0][:3] == (1, 2, "tool_iterations")
    assert report.stopped is not None
    assert report.stopped.startswith(f"turn 2 ({PROMPTS[1]!r}), completion 1: the loop needs")
    # turn 1's last call was answered "not run": the request differs there
    assert "differs from recorded interaction 3 at messages[4].content" in report.stopped
    assert report.lines[-1] == "played 2 of 5 recorded interactions"


def test_a_smaller_tool_result_cap_fires_at_the_first_call(recording: Path) -> None:
    report = what_if(recording, LoopLimits(tool_result_cap=10), registry=DEMO)
    assert [h[:3] for h in report.hits] == [(1, 1, "tool_result_cap")]
    assert report.stopped is not None and "completion 2" in report.stopped


def test_a_thinking_cap_stops_where_reasoning_end_would_change_the_answer(
    recording: Path,
) -> None:
    report = what_if(recording, LoopLimits(thinking_tokens=2), registry=DEMO)
    assert report.stopped is not None
    assert "the thinking cap fires in completion 1" in report.stopped
    assert report.lines[-1] == "played 1 of 5 recorded interactions"


def test_other_tools_answer_from_the_recorded_results(tmp_path: Path) -> None:
    registry = Registry()

    @registry.add
    def lookup(city: str) -> str:
        """Look a city up.

        Args:
            city: The city name.
        """
        return f"{city}: 1 million people"

    path = tmp_path / "lookup.yaml"
    _record(path, tmp_path, registry, [("lookup", LISBON), None, ("lookup", LISBON), None])
    report = what_if(path)
    assert report.lines[2] == "tools: results recorded in the cassette (lookup)"
    assert report.stopped is None
    assert report.lines[-1] == "played 4 of 4 recorded interactions"


def test_cli(recording: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["replay", str(recording), "--tool-iterations", "1", "--no-repeat-detection"]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    cap = LoopLimits().tool_result_cap  # the default stays in force
    assert out[1] == (
        f"limits: tool_iterations 1, repeat_detection off, tool_result_cap {cap}, "
        "thinking_tokens none"
    )
    assert out[3].startswith("loop guard: cycle_length 4 x 2 repeats, stale_results_at none")
    assert out[4].startswith("turn 1, completion 2: tool_iterations fired")
    assert out[-2].startswith("stopped at turn 2")


def test_the_replay_takes_the_config_s_own_limits_where_none_is_off(recording: Path) -> None:
    report = what_if(
        recording, LoopLimits(tool_result_cap=None, tool_iterations=None), registry=DEMO
    )
    assert report.lines[1] == (
        "limits: tool_iterations none, repeat_detection on (answered at 2, ends the turn at 3), "
        "tool_result_cap none, thinking_tokens none"
    )
    assert report.stopped is None and report.hits == []


def test_cli_minus_one_turns_a_limit_off(
    recording: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["replay", str(recording), "--tool-result-cap", "-1", "--thinking-tokens", "5"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[1].endswith("tool_result_cap none, thinking_tokens 5")


def _many_calls(n: int, calls: list[tuple[str, dict[str, Any]]]) -> Reply:
    """One completion making all of ``calls`` (one assistant message with several calls)."""
    made = [(f"c{n}-{i}", name, json.dumps(args)) for i, (name, args) in enumerate(calls)]
    return Reply(content="", tool_calls=made, id=f"chatcmpl-{n}")


LOOPING = [("get_weather", LISBON), ("get_time", LISBON)] * 2 + [("get_weather", LISBON)]


@pytest.fixture
def looping(tmp_path: Path) -> Path:
    """A recorded looping turn: one completion calling A, B, A, B, A (recorded with the loop
    guard off, so every call ran), then an answer."""
    path = tmp_path / "loop.yaml"
    server = LlamaScript([_many_calls(0, LOOPING), _completion(1, None, answer="done")])

    off = LoopLimits(repeat_detection=False, cycle_length=None)
    config = Config(client=ClientConfig(url="http://llama.test", retry_attempts=0), loop=off)
    session = Session.create(tmp_path / "rec", Baseline(tools=demo_registry().definitions()))
    with (
        use_cassette(path, "once"),
        Client(config.client, transport=httpx.MockTransport(server.handler)) as client,
    ):
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        assert run_turn(session, runtime, "Keep checking Lisbon").content == "done"
    return path


def test_a_looping_turn_replayed_with_other_guard_settings(looping: Path) -> None:
    recorded = what_if(
        looping, LoopLimits(repeat_detection=False, cycle_length=None), registry=DEMO
    )
    assert recorded.stopped is None and recorded.hits == []
    default = what_if(
        looping, registry=DEMO
    )  # the identical-repeat rule: nudges at calls 3 and 4, stop at 5
    assert [line for line in default.lines if "nudge" in line] == [
        "turn 1, completion 1: repeat nudge on get_weather (call 3 not run): "
        "'This call was already made with these arguments in this t...'",
        "turn 1, completion 1: repeat nudge on get_time (call 4 not run): "
        "'This call was already made with these arguments in this t...'",
    ]
    assert [h[:3] for h in default.hits] == [(1, 1, "repeated_call")]
    cycles = what_if(
        looping, LoopLimits(repeat_detection=False), registry=DEMO
    )  # cycles of up to 4 calls
    assert [h[:3] for h in cycles.hits] == [(1, 1, "loop")]
    assert cycles.hits[0][3].startswith(
        'rule cycle: a cycle of 2 calls (get_time {"city":"Lisbon"}, get_weather'
    )
    assert any("loop nudge on get_time (call 4 not run)" in line for line in cycles.lines)
    assert cycles.stopped is None


def test_cli_takes_the_loop_guard_knobs(looping: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", str(looping), "--demo-tools", "--no-repeat-detection", "--loop-cycle", "2"]
    assert main([*args, "--loop-repeats", "3"]) == 0
    out = capsys.readouterr().out
    assert "cycle_length 2 x 3 repeats" in out and "on_limit stop" in out
    assert "nudge" not in out and "answered after 2 completion(s)" in out
    assert main([*args, "--repeat-exempt", "get_time", "--on-limit", "answer"]) == 0
    out = capsys.readouterr().out
    assert "repeat_exempt get_time" in out and "on_limit answer" in out
    assert "nudge" not in out
    assert main([*args, "--on-limit", "answer"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("turn 1, completion 1: loop fired: rule cycle") for line in lines)
    # the answer after the limit asks a request the recording does not hold (tool_choice none)
    assert lines[-2].startswith("stopped at turn 1 ('Keep checking Lisbon'), completion 2:")


RECORDED_LOOP = Path(__file__).resolve().parents[2] / "cassettes" / "loop-cycle.yaml"


def test_a_recorded_looping_turn_of_the_shipped_model_replayed_with_other_guard_settings() -> None:
    """Real llama.cpp traffic (scripts/record_cassettes.py): the shipped model alternates
    get_weather(Paris) and get_time(London), recorded with the guard off until the
    tool-iteration limit (5); replayed with the cycle rule, it nudges the fourth call, after
    which the cassette holds no answer."""
    as_recorded = what_if(
        RECORDED_LOOP,
        LoopLimits(tool_iterations=5, repeat_detection=False, cycle_length=None),
        registry=DEMO,
    )
    assert as_recorded.stopped is None
    assert [h[:3] for h in as_recorded.hits] == [(1, 6, "tool_iterations")]
    cycle = what_if(
        RECORDED_LOOP, LoopLimits(repeat_detection=False, cycle_length=2), registry=DEMO
    )
    nudges = [line for line in cycle.lines if "nudge" in line]
    assert nudges == [
        "turn 1, completion 4: loop nudge on get_time (call 4 not run): "
        '\'Loop guard: a cycle of 2 calls (get_weather {"city":"Pari...\''
    ]
    # the nudge is a tool result the recording does not hold: the replay stops after it
    assert cycle.hits == []
    assert cycle.stopped is not None and cycle.stopped.startswith("turn 1 (")
    assert "completion 5: the loop needs traffic the cassette does not hold" in cycle.stopped
    repeat = what_if(
        RECORDED_LOOP, registry=DEMO
    )  # the default identical-repeat rule answers call 3
    assert any("repeat nudge on get_weather (call 3 not run)" in line for line in repeat.lines)


def test_cli_replays_the_recorded_looping_turn(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["replay", str(RECORDED_LOOP), "--no-repeat-detection", "--loop-cycle", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "turn 1, completion 4: loop nudge on get_time (call 4 not run)" in out
    assert "played 4 of 6 recorded interactions" in out
