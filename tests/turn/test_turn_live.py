"""The turn loop live against llama.cpp's own server code (embedded, xllamacpp), on the
shipped model. BOXMAKER_TEST_MODEL=path.gguf runs them on another model."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import (
    MODEL,
    SERVER_API_KEY,
    GivenServer,
    embedded_only,
    live_server,
    not_on_the_shipped_model,
    require,
)

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import SessionFull, TurnCancelled, TurnLimit
from boxmaker.events import Content, Progress, Reasoning, ThinkingCapped
from boxmaker.records import Assistant, Baseline, CacheLoss, LimitHit, ToolResult, TurnEnd, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer | GivenServer]:
    with live_server(n_ctx=4096) as running:
        yield running


def _runtime(url: str, **loop: Any) -> tuple[Runtime, Client]:
    config = Config(
        client=ClientConfig(url=url, retry_attempts=0, api_key=SERVER_API_KEY),
        loop=LoopLimits(tool_iterations=2, **loop),
        sampling=SamplingConfig(max_tokens=200),  # bounded even if the model rambles
    )
    client = Client(config.client)
    return Runtime(config=config, client=client, registry=demo_registry()), client


def _session(tmp_path: Path) -> Session:
    return Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))


@pytest.mark.needs("tools", "shipped_model", "cold_cache")  # one token per character
def test_prompt_progress_and_cache_reuse_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    runtime, client = _runtime(server.url)
    session = _session(tmp_path)
    events: list[Any] = []
    with client:
        for text in ("What is the weather in Paris?", "What time is it in Lima?"):
            with contextlib.suppress(TurnLimit):
                run_turn(session, runtime, text, events.append)
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and progress[-1].processed == progress[-1].total > 0
    usages = [r for r in session.records if isinstance(r, Usage)]
    assert len(usages) >= 2
    first = usages[0].timings
    assert first["prompt_n"] > 500  # the tools prefix, one token per character
    # every later request extends the earlier ones: llama.cpp reuses the shared prefix
    assert all(u.timings["cache_n"] > 0 for u in usages[1:])
    assert usages[1].timings["cache_n"] >= first["prompt_n"] // 2


@pytest.mark.needs("tools")
def test_follow_up_inside_a_turn_keeps_the_cache_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    runtime, client = _runtime(server.url)
    session = _session(tmp_path)
    with client, contextlib.suppress(TurnLimit):
        run_turn(session, runtime, "What is the weather in Paris?")
    assistants = [r for r in session.records if isinstance(r, Assistant)]
    if not assistants[0].tool_calls:
        not_on_the_shipped_model(
            "this model answered without a tool call: no follow-up request to check"
        )
    # the follow-up request re-sends reasoning_content, so the template renders the same
    # prefix and llama.cpp reuses all of it: no CacheLoss inside the turn
    assert not any(isinstance(r, CacheLoss) for r in session.records)
    usages = [r for r in session.records if isinstance(r, Usage)]
    expected = usages[0].timings["cache_n"] + usages[0].timings["prompt_n"]
    assert usages[1].timings["cache_n"] >= expected


@pytest.mark.needs("tools", "reasoning")
def test_thinking_cap_live_through_reasoning_control(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    runtime, client = _runtime(server.url, thinking_tokens=3)
    session = _session(tmp_path)
    events: list[Any] = []
    with client, contextlib.suppress(TurnLimit):
        run_turn(session, runtime, "What is the weather in Paris?", events.append)
    capped = [e for e in events if isinstance(e, ThinkingCapped)]
    # the budget spans the turn and is sent as thinking_budget_tokens: llama.cpp's sampler
    # ends the first completion's reasoning after 2 deltas (budget - 1), any later one in the
    # same turn (budget 0) before the first
    assert capped and capped[0].reasoning_tokens == 2
    assert all(c.reasoning_tokens == 0 for c in capped[1:])
    first = next(r for r in session.records if isinstance(r, Usage))
    assert first.thinking_capped
    assert first.reasoning_tokens == 2  # nothing in flight: exact
    reasoning = [e for e in events if isinstance(e, Reasoning)]
    assert len(reasoning) == sum(
        u.reasoning_tokens or 0 for u in session.records if isinstance(u, Usage)
    )
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    # one LimitHit a turn, however many of its completions the cap ended
    assert [h.kind for h in hits if h.kind == "thinking_cap"] == ["thinking_cap"]
    # and the model went on after reasoning was ended: an answer or a tool call
    assistant = next(r for r in session.records if isinstance(r, Assistant))
    assert assistant.content or assistant.tool_calls


@pytest.mark.parametrize("cap", [1, 3, 10, 40])
@pytest.mark.needs("tools", "reasoning")
def test_thinking_cap_is_exact_counted_by_the_server_tokenizer_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path, cap: int
) -> None:
    runtime, client = _runtime(server.url, thinking_tokens=cap)
    session = _session(tmp_path)
    with client, contextlib.suppress(TurnLimit):
        run_turn(session, runtime, "What is the weather in Paris?")
    assistants = [r for r in session.records if isinstance(r, Assistant)]
    reasoning = "".join(a.reasoning or "" for a in assistants)
    tokens = httpx.post(f"{server.url}/tokenize", json={"content": reasoning}).json()["tokens"]
    # the reasoning of the whole turn, as the server's tokenizer counts it, stays in the cap
    assert len(tokens) <= cap
    usages = [r for r in session.records if isinstance(r, Usage)]
    assert usages[0].thinking_capped  # the model reasons far longer than 40 tokens
    assert sum(u.reasoning_tokens or 0 for u in usages) <= cap


def test_context_full_live_small_n_ctx(tmp_path: Path) -> None:
    embedded_only("n_ctx=256")
    with EmbeddedServer(MODEL, n_ctx=256, n_threads=1) as small:
        require(small, "tools", "shipped_model")  # its tools prefix: ~700 tokens
        runtime, client = _runtime(small.url)
        session = _session(tmp_path)  # the tools prefix alone is ~700 tokens
        with client, pytest.raises(SessionFull) as info:
            run_turn(session, runtime, "What is the weather in Paris?")
    assert info.value.n_ctx == 256
    assert info.value.n_prompt_tokens is not None and info.value.n_prompt_tokens > 256
    assert info.value.cause.status == 400
    kinds = [type(r).__name__ for r in session.records]  # what /props said, then the turn
    assert kinds == ["Capabilities", "User", "LimitHit", "TurnEnd"]
    assert session.records[-2].kind == "context_full"  # type: ignore[union-attr]


@pytest.mark.needs("tools")
def test_cancel_live_stops_the_stream_and_the_server_serves_on(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    runtime, client = _runtime(server.url)
    session = _session(tmp_path)

    def stop_at_first_token(event: object) -> None:
        if isinstance(event, Reasoning | Content):
            runtime.cancel.set()

    with client:
        with pytest.raises(TurnCancelled):
            run_turn(session, runtime, "What is the weather in Paris?", stop_at_first_token)
        kinds = [type(r).__name__ for r in session.records]
        # the completion stopped mid-stream left no record: the turn's last is its TurnEnd
        end = session.records[-1]
        assert isinstance(end, TurnEnd) and end.outcome == "cancelled"
        assert kinds[-2] in ("User", "ToolResult")
        if kinds != ["Capabilities", "User", "TurnEnd"]:
            # a first reply that was a tool call alone streams no text to stop at
            not_on_the_shipped_model(f"no text before the first tool call: {kinds}")
        runtime.cancel.clear()  # the caller's switch: the loop never clears it
        with contextlib.suppress(TurnLimit):
            run_turn(session, runtime, "Hello!")
    assert isinstance(session.records[-1], TurnEnd)
    assert isinstance(session.records[-2], Usage | LimitHit)
    assert any(isinstance(r, Assistant) for r in session.records)


def test_demo_command_live(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from boxmaker.cli import main

    args = ["demo", "--dir", str(tmp_path / "sessions")]
    if MODEL:
        args += ["--model", MODEL]
    code = main(args)
    out = capsys.readouterr().out
    if MODEL and "[turn ended: ToolsNotSupported: " in out:  # the demo offers its tools
        pytest.skip("the server lacks tools (the demo's turns ended ToolsNotSupported)")
    assert code == 0
    assert "request  prompt_n  cache_n  predicted_n  reasoning  prompt_ms  predicted_ms" in out
    logs = list((tmp_path / "sessions").glob("*.jsonl"))
    assert len(logs) == 1 and f"session log: {logs[0]}" in out
    session = Session.open(logs[0])
    users = [r for r in session.records if type(r).__name__ == "User"]
    assert len(users) >= 2


@pytest.mark.needs("tools")
def test_on_limit_answer_live_after_a_tool_iteration_stop(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    """The model card's looping prompt, one tool iteration allowed, ``on_limit="answer"``: the
    turn ends with one last completion sent with ``tool_choice: "none"`` (tools kept), and the
    prompt cache holds across it."""
    runtime, client = _runtime(server.url)
    loop = LoopLimits(tool_iterations=1, on_limit="answer")
    runtime.config = dataclasses.replace(runtime.config, loop=loop)
    session = _session(tmp_path)
    with client:
        out = run_turn(session, runtime, "Keep checking the weather in Paris.")
    assistants = [r for r in session.records if isinstance(r, Assistant)]
    if len(assistants) < 3:
        not_on_the_shipped_model("the model stopped calling tools before the tool-iteration limit")
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "answered_after_limit"
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    assert [h.kind for h in hits] == ["tool_iterations"]
    assert out.content == (assistants[-1].content or "")
    assert not assistants[-1].tool_calls  # the parser made no calls with tool_choice none
    assert out.content.strip() and "<tool_call>" not in out.content  # an answer, not a call
    usages = [r for r in session.records if isinstance(r, Usage)]
    previous = usages[-2].timings
    assert usages[-1].timings["cache_n"] >= previous["cache_n"] + previous["prompt_n"]


@pytest.mark.needs("tools")
def test_loop_guard_live_stale_results_nudge_then_stop(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    """The model card's looping prompt with the identical-repeat rule off: the loop guard's
    stale-result rule (the same weather twice) nudges the third call, then ends the turn."""
    runtime, client = _runtime(server.url)
    loop = LoopLimits(tool_iterations=6, repeat_detection=False, stale_results_at=2)
    runtime.config = dataclasses.replace(runtime.config, loop=loop)
    session = _session(tmp_path)
    limit: TurnLimit | None = None
    with client:
        try:
            run_turn(session, runtime, "Keep checking the weather in Paris.")
        except TurnLimit as exc:
            limit = exc
    if limit is None or limit.kind != "loop":
        ended = session.records[-1]
        outcome = ended.outcome if isinstance(ended, TurnEnd) else type(ended).__name__
        not_on_the_shipped_model(f"this model stopped otherwise: {limit or outcome}")
    assert limit is not None
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.not_run for r in results] == [None, None, "loop", "loop"]
    assert results[2].content.startswith("Loop guard: get_weather returned the same result 2")
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "loop"
    assert limit.detail.startswith("rule stale_result: get_weather returned")


@pytest.mark.needs("tools", "shipped_model")
def test_loop_guard_live_stops_a_cycle_of_two_tools(server: EmbeddedServer, tmp_path: Path) -> None:
    """The model card's cycling prompt (two things to keep checking) with the identical-repeat
    rule off: the model alternates get_weather(Paris) and get_time(London); the cycle rule
    (length 2, twice) answers the fourth call with a nudge; the model calls one of the cycle
    again, which ends the turn."""
    runtime, client = _runtime(server.url)
    loop = LoopLimits(tool_iterations=8, repeat_detection=False, cycle_length=2)
    runtime.config = dataclasses.replace(runtime.config, loop=loop)
    session = _session(tmp_path)
    with client, pytest.raises(TurnLimit) as info:
        run_turn(session, runtime, "Keep checking the weather in Paris and the time in London.")
    calls = [
        (c.name, c.arguments)
        for r in session.records
        if isinstance(r, Assistant)
        for c in r.tool_calls
    ]
    paris, london = ("get_weather", '{"city": "Paris"}'), ("get_time", '{"city": "London"}')
    assert calls[:4] == [paris, london, paris, london]
    assert len(calls) == 5 and calls[4] in (paris, london)  # a call of the cycle: it ends
    assert info.value.kind == "loop"
    assert info.value.detail.startswith("rule cycle: a cycle of 2 calls")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.not_run for r in results] == [None, None, None, "loop", "loop"]
    assert results[3].content.startswith("Loop guard: a cycle of 2 calls")
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    assert hits[-1].kind == "loop"
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "loop"
