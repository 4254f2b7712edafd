from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from boxmaker.config import Config, LoopLimits
from boxmaker.errors import (
    InferError,
    RequestCancelled,
    SessionFull,
    TurnCancelled,
    TurnInferError,
    TurnLimit,
)
from boxmaker.events import Content, Reasoning, ThinkingCapped, ToolCallDelta, ToolCallStarted
from boxmaker.records import (
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    ToolResult,
    TurnEnd,
    Usage,
    User,
)
from boxmaker.session import Session
from boxmaker.testing import (
    ScriptedClient,
    Step,
    answer,
    assert_log_well_formed,
    call,
    calls,
    context_full,
    timings,
)
from boxmaker.tools import Registry
from boxmaker.turn import ALREADY_MADE, CancelToken, Runtime, run_turn


def weather(city: str) -> str:
    """Weather for a city."""
    return json.dumps({"city": city, "temperature": 12})


def make(tmp_path: Path, steps: list[Step], **loop: Any) -> tuple[Session, Runtime, ScriptedClient]:
    registry = Registry()
    registry.add(weather)
    session = Session.create(tmp_path, Baseline(system="sys", tools=registry.definitions()))
    client = ScriptedClient(steps)
    config = Config(loop=LoopLimits(**loop)) if loop else Config()
    return session, Runtime(config=config, client=client, registry=registry), client


def kinds(session: Session) -> list[str]:
    return [type(r).__name__ for r in session.records]


def test_answer_without_tools(tmp_path: Path) -> None:
    session, runtime, client = make(tmp_path, [answer("Hello.", timings=timings(0, 20))])
    events: list[Any] = []
    out = run_turn(session, runtime, "hi", events.append)
    assert out.content == "Hello."
    assert out.usage.timings["prompt_n"] == 20
    assert kinds(session) == ["User", "Assistant", "Usage", "TurnEnd"]
    assert session.records[-1] == TurnEnd(outcome="answered", time=session.records[-1].time)
    body = client.bodies[0]
    assert body["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
    ]
    # id_slot None: the client leases a free slot (boxmaker.client._slots)
    assert body["id_slot"] is None and body["tools"][0]["function"]["name"] == "weather"
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    names = [type(e).__name__ for e in events]
    assert names == ["User", "Content", "Assistant", "Usage", "TurnEnd"]


def test_tool_call_then_answer(tmp_path: Path) -> None:
    session, runtime, client = make(
        tmp_path,
        [
            calls(call("weather", {"city": "Oslo"}, "c1"), timings=timings(0, 50)),
            answer("It is 12 C in Oslo.", timings=timings(55, 20)),
        ],
    )
    events: list[Any] = []
    out = run_turn(session, runtime, "Weather in Oslo?", events.append)
    assert out.content == "It is 12 C in Oslo."
    assert kinds(session) == [
        "User",
        "Assistant",
        "Usage",
        "ToolResult",
        "Assistant",
        "Usage",
        "TurnEnd",
    ]
    result = session.records[3]
    assert isinstance(result, ToolResult)
    assert (result.call, result.tool_call_id, result.name) == (1, "c1", "weather")
    assert json.loads(result.content) == {"city": "Oslo", "temperature": 12}
    assert client.bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": result.content,
    }
    started = [e for e in events if isinstance(e, ToolCallStarted)]
    assert started == [ToolCallStarted(name="weather", call=1, arguments='{"city": "Oslo"}')]
    assert not any(isinstance(e, ToolCallDelta) for e in events)
    assert session.next_call() == 2


def test_tool_iterations_limit_ends_turn_and_leaves_log_well_formed(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": f"c{i}"}, f"id{i}")) for i in range(3)]
    session, runtime, _ = make(tmp_path, steps, tool_iterations=2)
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "go")
    assert (info.value.kind, info.value.value, info.value.limit) == ("tool_iterations", 3, 2)
    last = session.records[-3]
    assert isinstance(last, ToolResult) and last.tool_call_id == "id2"
    assert last.content.startswith("This call was not run: the turn ended (tool_iterations")
    assert last.not_run == "tool_iterations"
    hit = session.records[-2]
    assert isinstance(hit, LimitHit) and hit.kind == "tool_iterations"
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "tool_iterations"
    assert_log_well_formed(session)
    assert run_turn(session, runtime, "again").content == "ok"


def test_repeated_call_first_repeat_answered_second_ends_turn(tmp_path: Path) -> None:
    same = call("weather", {"city": "Oslo"}, "a")
    reordered = call("weather", '{ "city":"Oslo" }', "b")  # same JSON, other text
    steps = [calls(same), calls(reordered), calls(call("weather", {"city": "Oslo"}, "c"))]
    session, runtime, _ = make(tmp_path, steps)
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "go")
    assert (info.value.kind, info.value.value, info.value.limit) == ("repeated_call", 3, 2)
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert json.loads(results[0].content)["city"] == "Oslo"
    assert results[1].content == ALREADY_MADE
    assert [r.not_run for r in results] == [None, "repeat", "repeated_call"]
    assert results[2].content.startswith("This call was not run: the turn ended (repeated_call")
    assert isinstance(session.records[-2], LimitHit)
    assert session.records[-2].kind == "repeated_call"
    assert session.records[-1].outcome == "repeated_call"  # type: ignore[union-attr]
    assert_log_well_formed(session)


def test_repeated_call_detection_off_runs_every_call(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": "Oslo"}, f"x{i}")) for i in range(3)]
    session, runtime, _ = make(tmp_path, [*steps, answer("done")], repeat_detection=False)
    assert run_turn(session, runtime, "go").content == "done"
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [json.loads(r.content)["city"] for r in results] == ["Oslo"] * 3


def test_repeat_thresholds_are_named_limits_and_none_turns_each_off(tmp_path: Path) -> None:
    oslo = [calls(call("weather", {"city": "Oslo"}, f"x{i}")) for i in range(4)]
    session, runtime, _ = make(
        tmp_path, [*oslo, answer("done")], repeat_answered_at=3, repeat_ends_turn_at=None
    )
    assert run_turn(session, runtime, "go").content == "done"
    results = [r.content for r in session.records if isinstance(r, ToolResult)]
    assert [r == ALREADY_MADE for r in results] == [False, False, True, True]
    session, runtime, _ = make(
        tmp_path / "b", oslo, repeat_answered_at=None, repeat_ends_turn_at=2, tool_iterations=None
    )
    with pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "go")
    assert (info.value.kind, info.value.value, info.value.limit) == ("repeated_call", 2, 1)
    assert_log_well_formed(session)


def test_tool_iterations_none_is_no_limit(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": f"c{i}"}, f"x{i}")) for i in range(12)]
    session, runtime, _ = make(tmp_path, [*steps, answer("done")], tool_iterations=None)
    assert run_turn(session, runtime, "go").content == "done"
    assert len([r for r in session.records if isinstance(r, ToolResult)]) == 12


def test_repeated_call_counts_per_turn_only(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": "Oslo"}, "a")), answer("one")]
    steps += [calls(call("weather", {"city": "Oslo"}, "b")), answer("two")]
    session, runtime, _ = make(tmp_path, steps)
    run_turn(session, runtime, "first")
    run_turn(session, runtime, "second")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert ALREADY_MADE not in [r.content for r in results]


def test_thinking_cap_budget_spans_the_turn(tmp_path: Path) -> None:
    steps = [
        calls(call("weather", {"city": "Oslo"}, "a"), reasoning="x" * 6),
        Step(content="done", reasoning="y" * 10),
    ]
    session, runtime, client = make(tmp_path, steps)
    runtime.config = dataclasses.replace(runtime.config, loop=LoopLimits(thinking_tokens=8))
    events: list[Any] = []
    run_turn(session, runtime, "go", events.append)
    assert client.budgets == [8, 2]
    usages = [r for r in session.records if isinstance(r, Usage)]
    assert [(u.reasoning_tokens, u.thinking_capped) for u in usages] == [(6, False), (2, True)]
    assert [e for e in events if isinstance(e, ThinkingCapped)] == [ThinkingCapped(2)]
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    assert [h.kind for h in hits] == ["thinking_cap"]
    assistant = [r for r in session.records if isinstance(r, Assistant)][-1]
    assert assistant.reasoning == "yy"
    assert sum(isinstance(e, Reasoning) for e in events) == 8


def test_the_thinking_cap_is_one_limit_hit_a_turn_though_it_ends_later_reasonings_too(
    tmp_path: Path,
) -> None:
    """The cap spent in the first completion: the next ones get a budget of 0, so their
    reasoning ends at once too (Usage.thinking_capped), but the cap fired once."""
    steps = [
        calls(call("weather", {"city": "Oslo"}, "a"), reasoning="x" * 6),
        calls(call("weather", {"city": "Rome"}, "b"), reasoning="yy"),
        Step(content="done", reasoning="zz"),
        Step(content="fine", reasoning="w" * 9),
    ]
    session, runtime, client = make(tmp_path, steps)
    runtime.config = dataclasses.replace(runtime.config, loop=LoopLimits(thinking_tokens=4))
    run_turn(session, runtime, "go")
    assert client.budgets == [4, 0, 0]
    usages = [r for r in session.records if isinstance(r, Usage)]
    assert [u.thinking_capped for u in usages] == [True, True, True]
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    assert [h.kind for h in hits] == ["thinking_cap"]
    run_turn(session, runtime, "again")  # a new turn, a new budget: its own hit
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    assert [h.kind for h in hits] == ["thinking_cap", "thinking_cap"]


def test_thinking_cap_off_sends_no_budget(tmp_path: Path) -> None:
    session, runtime, client = make(tmp_path, [Step(content="a", reasoning="zzz")])
    run_turn(session, runtime, "go")
    assert client.budgets == [None]


def test_context_full_ends_turn_with_session_full(tmp_path: Path) -> None:
    session, runtime, _ = make(tmp_path, [context_full()])
    with pytest.raises(SessionFull) as info:
        run_turn(session, runtime, "a long message")
    assert (info.value.n_prompt_tokens, info.value.n_ctx) == (3021, 2048)
    assert kinds(session) == ["User", "LimitHit", "TurnEnd"]
    assert session.records[-2].kind == "context_full"  # type: ignore[union-attr]
    assert session.records[-1].outcome == "session_full"  # type: ignore[union-attr]


def test_context_full_after_tool_results_leaves_log_well_formed(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": "Oslo"}, "a")), context_full()]
    session, runtime, _ = make(tmp_path, steps)
    with pytest.raises(SessionFull):
        run_turn(session, runtime, "go")
    assert kinds(session) == ["User", "Assistant", "Usage", "ToolResult", "LimitHit", "TurnEnd"]
    assert_log_well_formed(session)


def test_tool_result_cap_truncates_and_records(tmp_path: Path) -> None:
    registry = Registry()
    registry.add(lambda: "x" * 500, name="big", description="big", parameters={"type": "object"})
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    client = ScriptedClient([calls(call("big", {}, "a")), answer("done")])
    config = Config(loop=LoopLimits(tool_result_cap=100))
    run_turn(session, Runtime(config=config, client=client, registry=registry), "go")
    result = next(r for r in session.records if isinstance(r, ToolResult))
    assert result.truncated and len(result.content) == 100
    assert result.content.endswith("of 500 characters are shown]")
    hit = next(r for r in session.records if isinstance(r, LimitHit))
    assert hit.kind == "tool_result_cap" and "500 characters cut to 100" in hit.detail


def test_other_inference_error_appends_only_the_turn_end(tmp_path: Path) -> None:
    err = InferError("HTTP 500: boom", status=500, body='{"error":{"code":500}}')
    session, runtime, _ = make(tmp_path, [Step(error=err)])
    with pytest.raises(TurnInferError) as info:
        run_turn(session, runtime, "go")
    assert info.value.cause.status == 500
    assert kinds(session) == ["User", "TurnEnd"]
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and (end.outcome, end.status) == ("infer_error", 500)
    assert "HTTP 500: boom" in end.detail


def test_cancel_during_request_appends_only_the_turn_end(tmp_path: Path) -> None:
    session, runtime, _ = make(tmp_path, [Step(error=RequestCancelled("cancelled"))])
    with pytest.raises(TurnCancelled):
        run_turn(session, runtime, "go")
    assert kinds(session) == ["User", "TurnEnd"]
    assert session.records[-1].outcome == "cancelled"  # type: ignore[union-attr]


def test_cancel_between_tool_calls_answers_the_rest(tmp_path: Path) -> None:
    registry = Registry()
    session_box: dict[str, Runtime] = {}

    def stop(city: str) -> str:
        """Sets cancel while running."""
        session_box["rt"].cancel.set()
        return "stopped"

    registry.add(stop)
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    steps = [calls(call("stop", {"city": "a"}, "1"), call("stop", {"city": "b"}, "2"))]
    runtime = Runtime(config=Config(), client=ScriptedClient(steps), registry=registry)
    session_box["rt"] = runtime
    with pytest.raises(TurnCancelled):
        run_turn(session, runtime, "go")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert results[0].content == "stopped"
    assert results[1].content.startswith("This call was not run: the turn ended (the turn was")
    assert not any(isinstance(r, LimitHit) for r in session.records)
    assert_log_well_formed(session)
    with pytest.raises(TurnCancelled):  # the loop never clears the switch: it is the caller's
        run_turn(session, runtime, "next")
    assert run_turn(session, runtime, "again", cancel=CancelToken()).content == "ok"


def test_a_cancel_set_before_the_turn_starts_is_not_lost(tmp_path: Path) -> None:
    session, runtime, _ = make(tmp_path, [answer("too late")])
    runtime.cancel.set()  # a Stop pressed just before the turn (the loop cleared it as it began)
    with pytest.raises(TurnCancelled):
        run_turn(session, runtime, "go")
    assert kinds(session) == ["User", "TurnEnd"]
    assert runtime.cancel.is_set()  # still set: the loop only reads it


def test_cache_loss_recorded_and_emitted(tmp_path: Path) -> None:
    steps = [
        calls(call("weather", {"city": "Oslo"}, "a"), timings=timings(0, 100)),
        answer("x", timings=timings(30, 90)),
    ]
    session, runtime, _ = make(tmp_path, steps)
    events: list[Any] = []
    run_turn(session, runtime, "go", events.append)
    loss = next(r for r in session.records if isinstance(r, CacheLoss))
    assert (loss.expected, loss.reused) == (100, 30)
    assert loss in events


def test_no_cache_loss_when_prefix_reused(tmp_path: Path) -> None:
    steps = [
        calls(call("weather", {"city": "Oslo"}, "a"), timings=timings(0, 100)),
        answer("x", timings=timings(104, 30)),
    ]
    session, runtime, _ = make(tmp_path, steps)
    run_turn(session, runtime, "go")
    assert not any(isinstance(r, CacheLoss) for r in session.records)


def test_bad_tool_calls_become_results_not_crashes(tmp_path: Path) -> None:
    steps = [
        calls(
            call("nope", {}, "a"),
            call("weather", "{not json", "b"),
            call("weather", {"town": "x"}, "c"),
        ),
        answer("sorry"),
    ]
    session, runtime, client = make(tmp_path, steps)
    assert run_turn(session, runtime, "go").content == "sorry"
    results = [r.content for r in session.records if isinstance(r, ToolResult)]
    assert results[0].startswith("Unknown tool 'nope'")
    assert "not valid JSON" in results[1]
    assert "do not fit its schema" in results[2]
    sent = client.bodies[1]["messages"][-4]["tool_calls"]
    assert [c["function"]["arguments"] for c in sent] == ["{}", "{}", '{"town": "x"}']
    raw = next(r for r in session.records if isinstance(r, Assistant))
    assert raw.tool_calls[1].arguments == "{not json"


def test_a_raising_hook_does_not_break_the_log(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": "Oslo"}, "a")), answer("fine")]
    session, runtime, _ = make(tmp_path, steps)

    def hook(event: object) -> None:
        if isinstance(event, (ToolResult, Content)):
            raise RuntimeError("widget bug")

    assert run_turn(session, runtime, "go", hook).content == "fine"
    assert_log_well_formed(session)


def test_user_record_first_and_time_never_sent(tmp_path: Path) -> None:
    session, runtime, client = make(tmp_path, [answer("x")])
    run_turn(session, runtime, "hello")
    assert isinstance(session.records[0], User)
    assert "time" not in json.dumps(client.bodies[0]["messages"])


def test_interrupt_inside_a_tool_answers_every_call_and_propagates(tmp_path: Path) -> None:
    registry = Registry()

    def interrupted(city: str) -> str:
        """Ctrl-C in a notebook while the tool runs."""
        raise KeyboardInterrupt

    registry.add(interrupted)
    registry.add(weather)
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    steps = [calls(call("weather", {"city": "a"}, "1"), call("interrupted", {"city": "b"}, "2"))]
    steps[0].tool_calls = [*steps[0].tool_calls, call("weather", {"city": "c"}, "3")]
    runtime = Runtime(config=Config(), client=ScriptedClient(steps), registry=registry)
    with pytest.raises(KeyboardInterrupt):
        run_turn(session, runtime, "go")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.tool_call_id for r in results] == ["1", "2", "3"]
    assert results[1].content.startswith("This call was not run: the turn ended (interrupted")
    assert not any(isinstance(r, LimitHit) for r in session.records)
    assert_log_well_formed(session)


def test_limit_detail_says_it_once(tmp_path: Path) -> None:
    steps = [calls(call("weather", {"city": f"c{i}"}, f"id{i}")) for i in range(2)]
    session, runtime, _ = make(tmp_path, steps, tool_iterations=1)
    with pytest.raises(TurnLimit):
        run_turn(session, runtime, "go")
    hit = session.records[-2]
    assert isinstance(hit, LimitHit)
    assert hit.detail == "2 completions with tool calls in this turn, the cap is 1"
