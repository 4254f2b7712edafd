"""Forks: branch a session at each kind of point, go on live, replay the parent's tools."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from boxmaker.config import Config, LoopLimits
from boxmaker.errors import ForkDiverged, SessionError
from boxmaker.records import Baseline, Forked, ToolResult, TurnEnd, User, record_to_json
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, Step, answer, assert_log_well_formed, call, calls
from boxmaker.tools import Registry
from boxmaker.turn import Replay, Runtime, continue_fork, run_turn

RAN: list[str] = []


def weather(city: str) -> str:
    """Weather for a city.

    Args:
        city: The city name.
    """
    RAN.append(city)
    return json.dumps({"city": city, "temperature": len(city)})


def registry() -> Registry:
    reg = Registry()
    reg.add(weather)
    return reg


def runtime(steps: list[Step], **loop: Any) -> tuple[Runtime, ScriptedClient]:
    client = ScriptedClient(steps)
    config = Config(loop=LoopLimits(**loop)) if loop else Config()
    return Runtime(config=config, client=client, registry=registry()), client


@pytest.fixture
def parent(tmp_path: Path) -> Session:
    """Two turns: turn 1 calls weather(Oslo) then weather(Bergen) and answers; turn 2 answers."""
    baseline = Baseline(system="Be brief.", tools=registry().definitions())
    session = Session.create(tmp_path, baseline)
    rt, _ = runtime(
        [
            calls(call("weather", {"city": "Oslo"})),
            calls(call("weather", {"city": "Bergen"})),
            answer("Oslo 4, Bergen 6."),
            answer("You are welcome."),
        ]
    )
    run_turn(session, rt, "Weather in Oslo and Bergen?")
    run_turn(session, rt, "Thanks")
    RAN.clear()
    return session


def prefixes(bodies: list[dict[str, Any]]) -> None:
    """Every request's messages extend the previous one's, byte for byte once serialised."""
    for before, after in itertools.pairwise(bodies):
        old, new = before["messages"], after["messages"]
        assert json.dumps(new[: len(old)]) == json.dumps(old)


def test_fork_after_a_turn_copies_the_records_and_says_where_it_came_from(
    parent: Session,
) -> None:
    before = parent.path.read_bytes()
    fork = parent.fork(at=1, settings={"loop.tool_iterations": 2})
    forked = fork.forked
    assert isinstance(forked, Forked)
    assert (forked.parent_session, forked.turn, forked.point) == (parent.id, 1, "after_turn")
    assert forked.parent_path == parent.path.name  # same folder: relative
    assert fork.parent_path() == parent.path
    assert dict(forked.settings) == {"loop.tool_iterations": 2}
    turn1 = [r for r in parent.records][: forked.record - 1]
    assert isinstance(parent.records[forked.record - 1], User)  # turn 2 starts there
    assert [record_to_json(r) for r in fork.records[1:]] == [record_to_json(r) for r in turn1]
    assert fork.messages() == parent.messages()[: len(fork.messages())]
    rt, _client = runtime([answer("Other answer.")])
    assert continue_fork(fork, rt, "Thanks a lot").content == "Other answer."
    assert_log_well_formed(fork)
    assert parent.path.read_bytes() == before
    reread = Session.open(fork.path, read_only=True)
    assert reread.forked == forked and reread.schema == 4
    fork.close()
    with pytest.raises(SessionError, match="needs a user message"):
        continue_fork(Session.open(fork.path), rt)


def test_fork_before_an_answer_reruns_the_turn_and_every_request_extends_the_last(
    parent: Session,
) -> None:
    before = parent.path.read_bytes()
    fork = parent.fork(at=1, rerun=True)
    assert fork.forked is not None and fork.forked.rerun == "Weather in Oslo and Bergen?"
    assert len(fork.records) == 1  # only the Forked record: turn 1 is run again
    rt, client = runtime(
        [calls(call("weather", {"city": "Oslo"})), answer("Only Oslo: 4.")], tool_iterations=1
    )
    assert continue_fork(fork, rt).content == "Only Oslo: 4."
    assert RAN == ["Oslo"]
    assert [b["messages"][-1]["role"] for b in client.bodies] == ["user", "tool"]
    prefixes(client.bodies)
    run_turn(fork, rt, "And Bergen?")
    prefixes(client.bodies)
    assert_log_well_formed(fork)
    assert parent.path.read_bytes() == before


def test_fork_at_an_edited_result_marks_the_edit_and_goes_on_with_the_turn(
    parent: Session,
) -> None:
    before = parent.path.read_bytes()
    fork = parent.fork(call=1, result='{"city": "Oslo", "temperature": -30}')
    edited = fork.records[-1]
    assert isinstance(edited, ToolResult)
    assert (edited.call, edited.source, edited.not_run) == (1, "edited", None)
    original = next(r for r in parent.records if isinstance(r, ToolResult) and r.call == 1)
    assert edited.tool_call_id == original.tool_call_id and edited.content != original.content
    assert fork.turn_left_open()
    rt, client = runtime([answer("Freezing in Oslo.")])
    parent_request = len(fork.messages())
    assert continue_fork(fork, rt).content == "Freezing in Oslo."
    assert client.bodies[0]["messages"][:parent_request] == fork.messages()[:parent_request]
    assert client.bodies[0]["messages"][-1]["content"] == edited.content
    assert isinstance(fork.records[-1], TurnEnd) and fork.records[-1].outcome == "answered"
    assert RAN == []  # the edit is no tool run
    assert_log_well_formed(fork)
    assert parent.path.read_bytes() == before


def test_tool_results_are_replayed_until_the_calls_differ_then_run_live(
    parent: Session,
) -> None:
    fork = parent.fork(at=1, rerun=True)
    rt, _client = runtime(
        [
            calls(call("weather", {"city": "Oslo"})),  # the parent's call 1: replayed
            calls(call("weather", {"city": "Tromsø"})),  # differs from Bergen: live
            calls(call("weather", {"city": "Bergen"})),  # after the difference: live too
            answer("Done."),
        ]
    )
    rt.replay = Replay.of(fork)
    continue_fork(fork, rt)
    results = [r for r in fork.records if isinstance(r, ToolResult)]
    assert [r.source for r in results] == ["replayed", None, None]
    assert RAN == ["Tromsø", "Bergen"]
    theirs = next(r for r in parent.records if isinstance(r, ToolResult) and r.call == 1)
    assert results[0].content == theirs.content
    assert rt.replay.diverged_at == 1
    assert_log_well_formed(fork)


def test_a_replay_asked_to_stop_ends_the_turn_at_the_first_difference(parent: Session) -> None:
    fork = parent.fork(at=1, rerun=True)
    rt, _ = runtime([calls(call("weather", {"city": "Paris"}))])
    rt.replay = Replay.of(fork, stop=True)
    with pytest.raises(ForkDiverged, match="differs from its parent's"):
        continue_fork(fork, rt)
    last = fork.records[-1]
    assert isinstance(last, TurnEnd) and last.outcome == "diverged"
    result = fork.records[-2]
    assert isinstance(result, ToolResult) and result.not_run == "diverged"
    assert RAN == []
    assert_log_well_formed(fork)


def test_a_fork_of_a_fork_and_its_replay(parent: Session, tmp_path: Path) -> None:
    first = parent.fork(at=1)
    rt, _ = runtime([answer("Second answer.")])
    continue_fork(first, rt, "Thanks")
    other = tmp_path / "elsewhere"
    second = first.fork(at=2, rerun=True, directory=other)
    assert second.forked is not None and second.forked.parent_session == first.id
    assert second.forked.parent_path == str(first.path)  # not under the fork's folder
    assert second.parent_path() == first.path
    assert second.forked.rerun == "Thanks"
    # the grandparent's records come through the first fork, Forked record included
    assert isinstance(second.records[1], Forked)
    rt2, client = runtime([answer("Third answer.")])
    continue_fork(second, rt2)
    prefixes([{"messages": parent.messages()[:-1]}, *client.bodies])
    assert_log_well_formed(second)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"at": 3}, "not a turn"),
        ({"at": 0}, "not a turn"),
        ({"call": 9, "result": "x"}, "no tool result of call 9"),
        ({"at": 2, "call": 1, "result": "x"}, "in turn 1, not turn 2"),
        ({"call": 1}, "needs both"),
        ({"at": 1, "rerun": True, "call": 1, "result": "x"}, "either"),
    ],
)
def test_fork_points_that_do_not_exist_are_refused(
    parent: Session, kwargs: dict[str, Any], message: str
) -> None:
    before = sorted(parent.path.parent.iterdir())
    with pytest.raises(SessionError, match=message):
        parent.fork(**kwargs)
    assert sorted(parent.path.parent.iterdir()) == before  # no half-made fork left


def test_going_on_needs_an_open_turn(parent: Session) -> None:
    rt, _ = runtime([])
    with pytest.raises(SessionError, match="no open turn"):
        run_turn(parent, rt, None)


def test_a_call_whose_parent_result_was_edited_runs_live_and_says_why(parent: Session) -> None:
    """A fork of an edited fork: the same call keeps its place but is never answered with the
    edit (it is no tool's output); the later calls are compared by position, not shifted."""
    edited = parent.fork(call=1, result='{"city": "Oslo", "temperature": -30}')
    rt, _ = runtime([calls(call("weather", {"city": "Bergen"})), answer("Cold.")])
    continue_fork(edited, rt)
    RAN.clear()
    again = edited.fork(at=1, rerun=True)
    rt2, _ = runtime(
        [
            calls(call("weather", {"city": "Oslo"})),
            calls(call("weather", {"city": "Bergen"})),
            answer("Done."),
        ]
    )
    rt2.replay = Replay.of(again)
    continue_fork(again, rt2)
    results = [r for r in again.records if isinstance(r, ToolResult)][-2:]
    assert [r.source for r in results] == [None, None]  # neither the edit nor after it
    assert RAN == ["Oslo", "Bergen"]
    assert rt2.replay.diverged_at == 0
    assert rt2.replay.why is not None and "was edited" in rt2.replay.why
    stopped = edited.fork(at=1, rerun=True)
    rt3, _ = runtime([calls(call("weather", {"city": "Oslo"}))])
    rt3.replay = Replay.of(stopped, stop=True)
    with pytest.raises(ForkDiverged, match="is its parent's, but parent's result of this call"):
        continue_fork(stopped, rt3)
