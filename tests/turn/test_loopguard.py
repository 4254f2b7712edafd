"""The loop guard (boxmaker.turn) through run_turn: cycles, stale results, per-tool
rules, the nudge-then-stop policy, on_limit="answer", and a property over call sequences."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker.config import Config, LoopLimits, load_config
from boxmaker.errors import ConfigError, TurnLimit
from boxmaker.frames import turns
from boxmaker.records import Assistant, Baseline, LimitHit, ToolResult, TurnEnd
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, Step, answer, assert_log_well_formed, call, calls
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn


def weather(city: str) -> str:
    """Weather for a city."""
    return json.dumps({"city": city, "temperature": 12})


def clock(city: str) -> str:
    """Time in a city."""
    return json.dumps({"city": city, "time": "12:00"})


def lookup(page: int) -> str:
    """A search that never finds anything new."""
    return "nothing new"


def poll() -> str:
    """A status poll."""
    return "pending"


def run(
    tmp_path: Path, steps: list[Step], **loop: Any
) -> tuple[Session, ScriptedClient, Any, TurnLimit | None]:
    registry = Registry()
    for fn in (weather, clock, lookup, poll):
        registry.add(fn)
    session = Session.create(tmp_path, Baseline(system="sys", tools=registry.definitions()))
    client = ScriptedClient(steps)
    runtime = Runtime(config=Config(loop=LoopLimits(**loop)), client=client, registry=registry)
    try:
        return session, client, run_turn(session, runtime, "go"), None
    except TurnLimit as exc:
        return session, client, None, exc


def results(session: Session) -> list[ToolResult]:
    return [r for r in session.records if isinstance(r, ToolResult)]


def test_cycle_of_two_tools_is_nudged_then_ends_the_turn(tmp_path: Path) -> None:
    a, b = ("weather", {"city": "Paris"}), ("clock", {"city": "Paris"})
    seq = [a, b, a, b, a, b]
    steps = [calls(call(*c, f"c{i}")) for i, c in enumerate(seq)]
    session, _, out, stop = run(tmp_path, steps, repeat_detection=False)
    assert out is None and isinstance(stop, TurnLimit)
    assert (stop.kind, stop.value, stop.limit) == ("loop", 2, 1)
    got = results(session)
    assert [r.not_run for r in got] == [None, None, None, "loop", "loop"]
    assert got[3].content.startswith("Loop guard: a cycle of 2 calls (weather")
    assert "This call was not run" in got[3].content
    assert got[4].content.startswith("This call was not run: the turn ended (loop: rule cycle")
    hit = session.records[-2]
    assert isinstance(hit, LimitHit) and hit.kind == "loop"
    assert hit.detail.startswith("rule cycle: a cycle of 2 calls (clock")
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "loop"
    assert_log_well_formed(session)
    assert turns(session.path)["outcome"].tolist() == ["loop"]


def test_a_call_of_the_nudged_cycle_ends_the_turn_though_no_cycle_completes(
    tmp_path: Path,
) -> None:
    """What the shipped model does: told its fourth call (B) closed a cycle, it calls B again.
    A, B, A, B, B completes no cycle, but the model has not heeded the nudge: the turn ends."""
    a, b = ("weather", {"city": "Paris"}), ("clock", {"city": "London"})
    steps = [calls(call(*c, f"c{i}")) for i, c in enumerate([a, b, a, b, b, a])]
    session, _, _, stop = run(tmp_path, steps, repeat_detection=False, cycle_length=2)
    assert isinstance(stop, TurnLimit) and stop.kind == "loop"
    assert stop.detail.startswith("rule cycle: a cycle of 2 calls (weather")
    assert stop.detail.endswith("; clock was called again after the nudge")
    assert [r.not_run for r in results(session)] == [None, None, None, "loop", "loop"]
    assert_log_well_formed(session)
    other = ("lookup", {"page": 1})  # a call outside the cycle after the nudge runs
    steps = [calls(call(*c, f"c{i}")) for i, c in enumerate([a, b, a, b, other])]
    session, _, _, stop = run(tmp_path / "other", steps, repeat_detection=False, cycle_length=2)
    assert stop is None
    assert [r.not_run for r in results(session)] == [None, None, None, "loop", None]


def test_cycle_needs_the_configured_repeats_and_length(tmp_path: Path) -> None:
    a, b, c = ("weather", {"city": "A"}), ("clock", {"city": "A"}), ("lookup", {"page": 1})
    seq = [a, b, c, a, b, c]
    steps = [calls(call(*x, f"c{i}")) for i, x in enumerate(seq)]
    session, _, out, _ = run(tmp_path / "k2", steps, repeat_detection=False, cycle_length=2)
    assert out is not None and all(r.not_run is None for r in results(session))
    steps = [calls(call(*x, f"c{i}")) for i, x in enumerate(seq)]
    session, _, out, _ = run(tmp_path / "k3", steps, repeat_detection=False, cycle_length=3)
    assert [r.not_run for r in results(session)] == [None] * 5 + ["loop"]
    steps = [calls(call(*x, f"c{i}")) for i, x in enumerate(seq)]
    session, _, out, _ = run(
        tmp_path / "r3", steps, repeat_detection=False, cycle_length=3, cycle_repeats=3
    )
    assert out is not None and all(r.not_run is None for r in results(session))


def test_stale_results_whatever_the_arguments(tmp_path: Path) -> None:
    steps = [calls(call("lookup", {"page": i}, f"c{i}")) for i in range(5)]
    session, _, _, stop = run(tmp_path, steps, stale_results_at=2)
    assert isinstance(stop, TurnLimit) and stop.kind == "loop"
    assert [r.not_run for r in results(session)] == [None, None, "loop", "loop"]
    assert "lookup returned the same result 2 times" in results(session)[2].content
    assert stop.detail == "rule stale_result: lookup returned the same result 2 times in this turn"


def test_per_tool_cap_and_exempt_tool(tmp_path: Path) -> None:
    steps = [calls(call("poll", {}, f"p{i}")) for i in range(6)]
    session, _, out, stop = run(tmp_path / "exempt", steps, repeat_exempt=("poll",))
    assert stop is None and out.content == "ok"
    assert [r.content for r in results(session)] == ["pending"] * 6
    steps = [calls(call("poll", {}, f"p{i}")) for i in range(6)]
    session, _, _, stop = run(
        tmp_path / "cap", steps, repeat_exempt=("poll",), tool_call_caps={"poll": 3}
    )
    assert [r.not_run for r in results(session)] == [None, None, None, "loop", "loop"]
    assert isinstance(stop, TurnLimit) and stop.detail == (
        "rule tool_call_cap: poll called 5 times, cap 3"
    )


def test_on_limit_answer_after_tool_iterations(tmp_path: Path) -> None:
    steps = [
        calls(call("weather", {"city": "A"}, "a")),
        calls(call("weather", {"city": "B"}, "b")),
        answer("It is 12 C in A."),
    ]
    session, client, out, stop = run(tmp_path, steps, tool_iterations=1, on_limit="answer")
    assert stop is None and out.content == "It is 12 C in A."
    names = [type(r).__name__ for r in session.records]
    assert names[-5:] == ["ToolResult", "LimitHit", "Assistant", "Usage", "TurnEnd"]
    assert results(session)[-1].not_run == "tool_iterations"
    assert results(session)[-1].content == (
        "This call was not run: the turn ended (tool_iterations: 2 completions with tool calls "
        "in this turn, the cap is 1 (value 2, limit 1)); answer the user now from the results "
        "you have."
    )
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "answered_after_limit"
    assert end.detail.startswith("tool_iterations: 2 completions")
    last = client.bodies[-1]
    assert last["tool_choice"] == "none" and last["tools"] == client.bodies[0]["tools"]
    assert "tool_choice" not in client.bodies[0]
    assert [m["role"] for m in last["messages"]][-2:] == ["assistant", "tool"]
    assert_log_well_formed(session)
    assert turns(session.path)["outcome"].tolist() == ["answered_after_limit"]


def test_on_limit_answer_after_the_loop_guard_and_calls_made_anyway(tmp_path: Path) -> None:
    same = ("weather", {"city": "Oslo"})
    steps = [calls(call(*same, f"c{i}")) for i in range(3)]
    steps.append(calls(call("clock", {"city": "Oslo"}, "late")))  # tool_choice none ignored
    session, _, out, stop = run(tmp_path, steps, on_limit="answer")
    assert stop is None and out.content == ""
    assert [r.not_run for r in results(session)] == [
        None,
        "repeat",
        "repeated_call",
        "repeated_call",
    ]
    assert isinstance(session.records[-1], TurnEnd)
    assert session.records[-1].outcome == "answered_after_limit"
    assert isinstance(session.records[-4], Assistant)
    assert_log_well_formed(session)


def test_on_limit_stop_is_the_default(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": "Oslo"}, f"c{i}")) for i in range(3)]
    _, client, _, stop = run(tmp_path, steps)
    assert isinstance(stop, TurnLimit) and stop.kind == "repeated_call"
    assert len(client.bodies) == 3


def test_loop_knobs_from_toml(tmp_path: Path) -> None:
    p = tmp_path / "c.toml"
    p.write_text(
        '[loop]\ncycle_length = -1\nstale_results_at = 4\nrepeat_exempt = ["poll"]\n'
        'on_limit = "answer"\n[loop.tool_call_caps]\nweather = 3\n'
    )
    loop = load_config(p).loop
    assert (loop.cycle_length, loop.stale_results_at, loop.on_limit) == (None, 4, "answer")
    assert (loop.repeat_exempt, dict(loop.tool_call_caps)) == (("poll",), {"weather": 3})
    p.write_text('[loop]\non_limit = "retry"\n')
    with pytest.raises(ConfigError, match="on_limit"):
        load_config(p)
    p.write_text("[loop.tool_call_caps]\nweather = true\n")
    with pytest.raises(ConfigError, match=r"tool_call_caps\.weather"):
        load_config(p)
    with pytest.raises(ConfigError, match="cycle_repeats"):
        LoopLimits(cycle_repeats=1)


KEYS = [("weather", {"city": "A"}), ("weather", {"city": "B"}), ("clock", {"city": "A"})]
EXEMPT: tuple[str, dict[str, Any]] = ("poll", {})


def _cycle_at(seq: list[tuple[str, str]], k: int, r: int) -> list[tuple[str, str]]:
    """Oracle: the non-constant block of length 2..k that the sequence ends with, repeated r
    times (the shortest), else []."""
    for length in range(2, k + 1):
        tail = seq[-length * r :]
        block = tail[-length:]
        if len(tail) == length * r and len(set(block)) > 1 and tail == block * r:
            return block
    return []


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seq=st.lists(st.sampled_from([*KEYS, EXEMPT]), min_size=1, max_size=12),
    mode=st.sampled_from(["repeat", "cycle"]),
    k=st.integers(2, 3),
    r=st.integers(2, 3),
    on_limit=st.sampled_from(["stop", "answer"]),
)
def test_guard_fires_exactly_at_the_first_repetition_past_the_threshold(
    tmp_path_factory: pytest.TempPathFactory,
    seq: list[tuple[str, dict[str, str]]],
    mode: str,
    k: int,
    r: int,
    on_limit: str,
) -> None:
    """Oracle computed apart from the guard: for the repeat rule, the 2nd identical call is
    answered 'repeat' and the 3rd ends the turn; for cycles (repeat rule off), the first call
    completing a cycle is nudged, and the next one completing a cycle, or any call of the
    nudged cycle, ends the turn. Exempt calls always run, and
    the log is well formed after every stop (also with on_limit="answer", whose last
    completion may still make calls)."""
    loop: dict[str, Any] = {"repeat_exempt": ("poll",), "tool_iterations": None}
    loop["on_limit"] = on_limit
    if mode == "cycle":
        loop.update(repeat_detection=False, cycle_length=k, cycle_repeats=r)
    else:
        loop.update(cycle_length=None)
    expected: list[str | None] = []
    counted: list[tuple[str, str]] = []
    flagged: set[tuple[str, str]] = set()  # the calls of the nudged cycle
    fired = 0
    for name, args in seq:
        if name == "poll":
            expected.append(None)
            continue
        key = (name, json.dumps(args))
        counted.append(key)
        if mode == "repeat":
            n = counted.count(key)
            verdict = None if n == 1 else "repeat" if n == 2 else "repeated_call"
        else:
            block = _cycle_at(counted, k, r)
            verdict = "loop" if block or key in flagged else None
            flagged = flagged or set(block)
            fired += verdict is not None
        expected.append(verdict)
        if verdict == "repeated_call" or fired == 2:
            break
    steps = [calls(call(name, args, f"c{i}")) for i, (name, args) in enumerate(seq)]
    session, _, _, stop = run(tmp_path_factory.mktemp("g"), steps, **loop)
    got = [res.not_run for res in results(session)]
    stopped = expected[-1] in ("repeated_call",) or fired == 2
    kind = "loop" if mode == "cycle" else "repeated_call"
    end = session.records[-1]
    assert isinstance(end, TurnEnd)
    if on_limit == "stop" or not stopped:
        assert got == expected
        assert (stop is not None) == stopped
        assert end.outcome == (kind if stopped else "answered")
        if stop is not None:
            assert stop.kind == kind
    else:  # the last completion (the next scripted step) may make a call: answered not run
        assert stop is None and got[: len(expected)] == expected
        assert got[len(expected) :] in ([], [kind])
        assert end.outcome == "answered_after_limit"
    for res, (name, _) in zip(results(session)[: len(expected)], seq, strict=False):
        if name == "poll":  # exempt calls run, up to the one that ended the turn
            assert res.not_run is None and res.content == "pending"
    assert_log_well_formed(session)
