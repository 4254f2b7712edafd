"""The tap in front of the embedded server (shipped model), with agents nobody here wrote:
pydantic-ai and the OpenAI Agents SDK from PyPI (extra ``tap-agents``; the SDK on chat
completions and on its default Responses model), and a small harness that drops the reasoning
of each reply it sends back. Every request captured, the logs well
formed, one session per conversation, the frames and the what-if read them."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from extras import need
from live_server import MODEL, GivenServer, embedded_only, live_server

from boxmaker import frames
from boxmaker.cache import reprocessed
from boxmaker.config import LoopLimits
from boxmaker.demo import get_time, get_weather
from boxmaker.records import Assistant, CacheLoss, ToolResult, TurnEnd, Usage, User
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tap import Tap, what_if_log
from boxmaker.testing import assert_log_well_formed

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer | GivenServer]:
    with live_server(n_ctx=8192, n_parallel=1) as running:  # one slot, reasoning preserved
        yield running


def _shipped(why: str) -> None:
    """Skip unless the embedded server serves the shipped model (its answers are asserted)."""
    embedded_only(why)
    if MODEL is not None:
        pytest.skip(f"needs the shipped model ({why}); BOXMAKER_TEST_MODEL is set")


def _counted(sent: list[str]) -> Any:
    """An ``httpx2`` client (what the openai SDK and pydantic-ai take now) that notes the
    path of every request the agent sends."""
    import httpx2

    async def note(request: Any) -> None:
        sent.append(request.url.path)

    return httpx2.AsyncClient(event_hooks={"request": [note]})


def _only_session(tap: Tap) -> Session:
    assert tap.log is not None
    assert tap.log.problems == []
    (path,) = tap.log.sessions
    with Session.open(path, read_only=True) as session:
        assert_log_well_formed(session)
        return session


def _kinds(session: Session, kind: type[Any]) -> list[Any]:
    return [r for r in session.records if isinstance(r, kind)]


def test_pydantic_ai_two_turns_with_tools_are_one_session_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    _shipped("the shipped model's answers")
    need("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    sent: list[str] = []

    async def run(url: str) -> tuple[Any, Any]:
        async with _counted(sent) as http:
            provider = OpenAIProvider(base_url=url + "/v1", api_key="none", http_client=http)
            agent = Agent(
                OpenAIChatModel("tiny", provider=provider),
                tools=[get_weather, get_time],
                model_settings={"temperature": 0.0},
            )
            first = await agent.run("What is the weather in Lisbon?")
            history = first.all_messages()
            return first, await agent.run("What time is it in Tokyo?", message_history=history)

    with Tap(server.url, directory=tmp_path) as tap:
        first, second = asyncio.run(run(tap.url))
    session = _only_session(tap)
    assert "Lisbon" in str(first.output) and "Tokyo" in str(second.output)
    # every request captured: one completion logged per chat request the agent sent
    assert sent.count("/v1/chat/completions") == len(_kinds(session, Usage)) == 4
    assert [u.content for u in _kinds(session, User)] == [
        "What is the weather in Lisbon?",
        "What time is it in Tokyo?",
    ]
    results = _kinds(session, ToolResult)
    assert [(r.name, r.content) for r in results] == [
        ("get_weather", get_weather("Lisbon")),
        ("get_time", get_time("Tokyo")),
    ]
    assert [e.outcome for e in _kinds(session, TurnEnd)] == ["answered", "answered"]
    assert _kinds(session, CacheLoss) == []  # pydantic-ai sends every reply back as it came
    # the frames read the tapped log as boxmaker's own
    requests, turns = frames.requests(tmp_path), frames.turns(tmp_path)
    assert list(requests["cached_tokens"]) == [u.timings["cache_n"] for u in _kinds(session, Usage)]
    assert list(turns["outcome"]) == ["answered", "answered"]
    # which of boxmaker's limits would have stopped it: none by default, one tool round each
    assert what_if_log(session.path).hits == []
    hits = what_if_log(session.path, LoopLimits(tool_iterations=0)).hits
    assert [(t, c, kind) for t, c, kind, _ in hits] == [
        (1, 1, "tool_iterations"),
        (2, 1, "tool_iterations"),
    ]


def test_openai_agents_streamed_loop_and_its_dropped_reasoning_are_in_the_log_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    _shipped("the shipped model's answers")
    need("agents")
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no traces sent anywhere
    sent: list[str] = []

    async def run(url: str) -> None:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", http_client=_counted(sent))
        agent = Agent(
            name="weather",
            model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
            tools=[function_tool(get_weather)],
            model_settings=ModelSettings(temperature=0.0),
        )
        result = Runner.run_streamed(agent, "What is the weather in Lisbon?", max_turns=3)
        with pytest.raises(MaxTurnsExceeded):
            async for _ in result.stream_events():
                pass
        await client.close()

    with Tap(server.url, directory=tmp_path) as tap:
        asyncio.run(run(tap.url))
    session = _only_session(tap)
    # the SDK sends each reply back without its reasoning; the tiny model, not seeing it,
    # calls the same tool again: three completions, one call each, the same call
    assert sent.count("/v1/chat/completions") == len(_kinds(session, Usage)) == 3
    calls = [c for a in _kinds(session, Assistant) for c in a.tool_calls]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Lisbon"})
    ] * 3
    assert [u.finish_reason for u in _kinds(session, Usage)] == ["tool_calls"] * 3
    # the prompt held each time (no CacheLoss by the loop's rule, issue 34: the tap's own
    # slack rule logged these); what the SDK costs shows in the timings: the reply the slot
    # held, re-processed because it came back without its reasoning
    assert _kinds(session, CacheLoss) == []
    usages = _kinds(session, Usage)
    for before, after in itertools.pairwise(usages):
        prompt = int(before.timings["cache_n"] + before.timings["prompt_n"])
        assert after.timings["cache_n"] >= prompt
        again = reprocessed(before.timings, after.timings)
        assert again is not None and again[0] > 0
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "cancelled"  # the SDK gave up
    # boxmaker's loop guard would have answered the first repeat without running it
    hits = what_if_log(session.path).hits
    assert [(t, c, kind) for t, c, kind, _ in hits] == [(1, 2, "repeat")]


def _harness(url: str, *, keep_reasoning: bool) -> list[dict[str, Any]]:
    """A minimal agent loop (plain httpx, streamed): ask, run the demo tool, answer; sends
    each reply back with or without its ``reasoning_content``."""
    from boxmaker.client import StreamDecoder

    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": "The city name."}},
                    "required": ["city"],
                },
            },
        }
    ]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is the weather in Oslo?"}]
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(3):
            body = {"messages": messages, "tools": tools, "stream": True, "temperature": 0}
            decoder = StreamDecoder()
            with client.stream("POST", "/v1/chat/completions", json=body) as r:
                if r.status_code != 200:
                    raise AssertionError(f"HTTP {r.status_code}: {r.read()!r}")
                for raw in r.iter_raw():
                    decoder.feed(raw)
            got = decoder.chunks.finish()
            reply: dict[str, Any] = {"role": "assistant", "content": got.content or ""}
            if keep_reasoning and got.reasoning:
                reply["reasoning_content"] = got.reasoning
            if not got.tool_calls:
                return [*messages, reply]
            reply["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": c.arguments}}
                for c in got.tool_calls
            ]  # fmt: skip
            messages = [*messages, reply]
            for c in got.tool_calls:
                content = get_weather(json.loads(c.arguments)["city"])
                messages.append({"role": "tool", "tool_call_id": c.id, "content": content})
    return messages


def test_a_harness_that_drops_reasoning_makes_the_server_reprocess_the_reply_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    _shipped("the shipped model and template")
    with Tap(server.url, directory=tmp_path / "drop") as tap:
        _harness(tap.url, keep_reasoning=False)
    session = _only_session(tap)
    first = _kinds(session, Usage)[0]
    first_prompt = int(first.timings["cache_n"] + first.timings["prompt_n"])
    # the slot held the first prompt, then <think>...; the reply came back without it: the
    # prompt held (no CacheLoss by the loop's rule, issue 34), the reply was re-processed
    assert _kinds(session, CacheLoss) == []
    second = _kinds(session, Usage)[1]
    assert second.timings["cache_n"] == first_prompt
    again = reprocessed(first.timings, second.timings)
    assert again is not None and again[0] > 2
    # the same harness sending the reasoning back loses nothing
    with Tap(server.url, directory=tmp_path / "keep") as tap:
        _harness(tap.url, keep_reasoning=True)
    assert _kinds(_only_session(tap), CacheLoss) == []


def test_an_agents_sdk_stream_recorded_by_the_tap_replays_offline_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    _shipped("the shipped model's answers")
    need("agents")
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from agents.exceptions import MaxTurnsExceeded
    from openai import AsyncOpenAI

    from boxmaker.cassettes import load_interactions, use_cassette

    set_tracing_disabled(True)  # no traces sent anywhere

    async def run(url: str) -> list[tuple[str, str]]:
        """The SDK's streamed events (type, text delta or item), as its caller sees them."""
        client = AsyncOpenAI(base_url=url + "/v1", api_key="sk-live-secret-0123456789")
        agent = Agent(
            name="weather",
            model=OpenAIChatCompletionsModel(model="tiny", openai_client=client),
            tools=[function_tool(get_weather)],
            model_settings=ModelSettings(temperature=0.0),
        )
        seen: list[tuple[str, str]] = []
        result = Runner.run_streamed(agent, "What is the weather in Lisbon?", max_turns=2)
        with pytest.raises(MaxTurnsExceeded):
            async for event in result.stream_events():
                data = getattr(event, "data", None)
                item = getattr(event, "item", None)
                seen.append(
                    (event.type, str(getattr(data, "delta", "") or getattr(item, "type", "")))
                )
        await client.close()
        return seen

    cassette = tmp_path / "agents.yaml"
    with Tap(server.url, cassette=cassette) as tap:
        live = asyncio.run(run(tap.url))
    assert tap.cassette is not None and tap.cassette.problems == []
    interactions = load_interactions(cassette)
    assert [i["request"]["uri"].removeprefix(server.url) for i in interactions] == [
        "/v1/chat/completions"
    ] * 2
    assert "sk-live-secret" not in cassette.read_text()
    deltas = [d for kind, d in live if kind == "raw_response_event" and d]
    assert len(deltas) > 5  # streamed: many events
    # offline: the tap and the server are gone; the SDK reads the cassette, event by event
    with use_cassette(cassette, "none") as played:
        replayed = asyncio.run(run("http://127.0.0.1:9"))
    assert played.all_played
    assert replayed == live


def test_openai_agents_default_responses_model_is_one_session_a_row_per_response_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    _shipped("the shipped model's answers")
    need("agents")
    from agents import (
        Agent,
        ModelSettings,
        OpenAIProvider,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        TResponseInputItem,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # no traces sent anywhere
    sent: list[str] = []

    async def run(url: str) -> tuple[Any, Any]:
        client = AsyncOpenAI(base_url=url + "/v1", api_key="none", http_client=_counted(sent))
        provider = OpenAIProvider(openai_client=client)  # the SDK's default provider...
        assert isinstance(provider.get_model("tiny"), OpenAIResponsesModel)  # ...and model
        agent = Agent(
            name="weather",
            instructions="You answer questions about the weather.",
            model="tiny",
            tools=[function_tool(get_weather)],
            model_settings=ModelSettings(temperature=0.0),
        )
        config = RunConfig(model_provider=provider)
        first = await Runner.run(agent, "What is the weather in Lisbon?", run_config=config)
        ask: TResponseInputItem = {"role": "user", "content": "What is the weather in Tokyo?"}
        again = [*first.to_input_list(), ask]
        second = Runner.run_streamed(agent, again, run_config=config)  # the second one streamed
        async for _ in second.stream_events():
            pass
        await client.close()
        return first, second

    with Tap(server.url, directory=tmp_path) as tap:
        first, second = asyncio.run(run(tap.url))
    assert tap.log is not None and tap.log.notes == []
    session = _only_session(tap)
    assert "Lisbon" in str(first.final_output) and "Tokyo" in str(second.final_output)
    # one session, a request row per response the agent asked for (whole and streamed)
    usages = _kinds(session, Usage)
    assert set(sent) == {"/v1/responses"}
    assert len(sent) == len(usages) == len(frames.requests(tmp_path)) == 4
    assert [u.content for u in _kinds(session, User)] == [
        "What is the weather in Lisbon?",
        "What is the weather in Tokyo?",
    ]
    results = _kinds(session, ToolResult)
    assert [(r.name, r.content) for r in results] == [
        ("get_weather", get_weather("Lisbon")),
        ("get_weather", get_weather("Tokyo")),
    ]
    assert [e.outcome for e in _kinds(session, TurnEnd)] == ["answered", "answered"]
    assert [u.finish_reason for u in usages] == ["tool_calls", "stop"] * 2
    # the whole answers: no timings from llama.cpp, reasoning uncounted (unknown, never 1);
    # the streamed ones: llama.cpp's timings, one reasoning delta a token
    assert [bool(u.timings) for u in usages] == [False, False, True, True]
    assert [u.reasoning_tokens is None for u in usages] == [True, True, False, False]
    assert all(u.prompt_tokens and u.completion_tokens for u in usages)
    # the SDK sends each reply back with its reasoning: the prompt held in the streamed turn
    assert _kinds(session, CacheLoss) == []


def test_a_responses_history_edit_is_a_loss_forensics_finds_where_the_server_did_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    _shipped("the shipped model's template and answers")
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city name."}},
            "required": ["city"],
        },
    }
    ask = {"role": "user", "content": "What is the weather in Lisbon?"}
    body: dict[str, Any] = {
        "model": "tiny",
        "instructions": "You answer questions about the weather.",
        "tools": [tool],
        "temperature": 0,
        "stream": True,
    }

    def output(url: str, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        r = httpx.post(url + "/v1/responses", json={**body, "input": items}, timeout=120)
        assert r.status_code == 200, r.text
        events = [json.loads(line[5:]) for line in r.text.splitlines() if line[:5] == "data:"]
        assert events[-1]["type"] == "response.completed"
        got: list[dict[str, Any]] = events[-1]["response"]["output"]
        return got

    with Tap(server.url, directory=tmp_path) as tap:
        call = output(tap.url, [ask])
        result = {"type": "function_call_output", "call_id": call[-1]["call_id"], "output": "20 C"}
        answer = output(tap.url, [ask, *call, result])
        edited = {**result, "output": "21 C"}  # the agent rewrote a result in its history
        oslo = {"role": "user", "content": "And in Oslo?"}
        output(tap.url, [ask, *call, edited, *answer, oslo])
    session = _only_session(tap)
    (loss,) = _kinds(session, CacheLoss)
    # forensics rendered the requests as llama-server converted them (/apply-template): the
    # first token that differs is the one the server stopped reusing at
    assert loss.cause == "history_edited" and loss.position == loss.reused
    assert loss.old_window is not None and "20 C" in loss.old_window
    assert loss.new_window is not None and "21 C" in loss.new_window
