"""Recording live from the embedded llama.cpp server: the stream reaches the loop while it is
recorded, so the thinking cap sends ``reasoning_end`` in time; the recording replays offline."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from live_server import SERVER_API_KEY, live_server, require

from boxmaker.cassettes import CHAT_PATH, load_interactions, use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import TurnError
from boxmaker.events import Content, Reasoning, ThinkingCapped
from boxmaker.records import Baseline, Usage, record_to_json
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live


def _config(url: str) -> Config:
    return Config(
        # no thinking_budget_tokens: the cap goes through reasoning_end, as on servers without it
        client=ClientConfig(
            url=url, retry_attempts=0, send_thinking_budget=False, api_key=SERVER_API_KEY
        ),
        loop=LoopLimits(tool_iterations=2, thinking_tokens=3),
        sampling=SamplingConfig(max_tokens=120),
    )


def _turn(session: Session, config: Config, events: list[Any] | None = None) -> None:
    with Client(config.client) as client, contextlib.suppress(TurnError):
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        run_turn(
            session,
            runtime,
            "What is the weather in Paris?",
            events.append if events is not None else None,
        )


def test_thinking_cap_fires_while_recording_and_the_recording_replays(tmp_path: Path) -> None:
    path = tmp_path / "capped.yaml"
    events: list[Any] = []
    pending_at_first_token: list[int] = []
    session = Session.create(tmp_path / "live", Baseline(tools=demo_registry().definitions()))
    with live_server(n_ctx=4096) as server:
        require(server, "tools")
        config = _config(server.url)
        with use_cassette(path, "all") as cassette:

            def on_event(event: Any) -> None:
                events.append(event)
                if isinstance(event, Reasoning | Content) and not pending_at_first_token:
                    # the first token reached the loop while its response was still open:
                    # nothing of this completion is in the cassette yet, only the ones
                    # before it (none, unless a first reply was a tool call alone)
                    done = sum(isinstance(r, Usage) for r in session.records)
                    pending_at_first_token.append(len(cassette.data) - done)

            with Client(config.client) as client, contextlib.suppress(TurnError):
                runtime = Runtime(config=config, client=client, registry=demo_registry())
                run_turn(session, runtime, "What is the weather in Paris?", on_event)
    assert pending_at_first_token == [0]
    paths = [item["request"]["uri"].split("127.0.0.1")[1] for item in load_interactions(path)]
    reasoned = any(isinstance(e, Reasoning) for e in events)
    if reasoned:  # the trained model reasons: the cap fired mid-stream, during the recording
        # ThinkingCapped came right after the third reasoning token, not when the stream ended
        first = events.index(next(e for e in events if isinstance(e, ThinkingCapped)))
        assert sum(isinstance(e, Reasoning) for e in events[:first]) == 3
        assert isinstance(events[first - 1], Reasoning)
        usage = next(r for r in session.records if isinstance(r, Usage))
        assert usage.thinking_capped
        # the control request was recorded, it ended before the stream it belongs to, and the
        # server accepted it: the completion was still running when reasoning_end arrived
        interactions = load_interactions(path)
        control = [i for i, p in enumerate(paths) if p.endswith("/control")]
        assert control and paths[control[0] + 1].endswith(CHAT_PATH)
        assert interactions[control[0]]["response"]["body"]["string"] == b'{"success":true}'
    # offline: the same turn replays from the recording, record for record
    replayed = Session.create(tmp_path / "replay", Baseline(tools=demo_registry().definitions()))
    with use_cassette(path, "none"):
        _turn(replayed, _config("http://127.0.0.1:9"))

    def strip(records: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in record_to_json(r).items() if k != "time"} for r in records]

    assert strip(replayed.records) == strip(session.records)
