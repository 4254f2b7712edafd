"""Reasoning in any format, live against llama.cpp's own server code (embedded, xllamacpp):
``--reasoning-format none`` (``<think>...</think>`` left in content), the exact thinking cap
there, and the warning when a cap cannot be enforced."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import MODEL, SERVER_API_KEY, embedded_only, live_server, require

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig, ThinkingConfig
from boxmaker.demo import DEMO_PROMPTS, demo_registry
from boxmaker.errors import TurnLimit
from boxmaker.events import CapNotEnforced, Reasoning, ThinkingCapped
from boxmaker.records import Assistant, Baseline, LimitHit, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live


@pytest.fixture(scope="module")
def none_server() -> Iterator[EmbeddedServer]:
    embedded_only("--reasoning-format none")
    with EmbeddedServer(MODEL, n_ctx=4096, n_threads=1, reasoning_format="none") as running:
        require(running, "tools", "reasoning")
        yield running


def _turn(
    url: str, tmp_path: Path, cap: int | None, *, thinking: bool = True
) -> tuple[Session, list[Any]]:
    config = Config(
        client=ClientConfig(url=url, retry_attempts=0, api_key=SERVER_API_KEY),
        loop=LoopLimits(tool_iterations=2, thinking_tokens=cap),
        sampling=SamplingConfig(max_tokens=200),
        thinking=ThinkingConfig(enabled=thinking),
    )
    session = Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))
    events: list[Any] = []
    with Client(config.client) as client, contextlib.suppress(TurnLimit):
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        run_turn(session, runtime, DEMO_PROMPTS[0], events.append)
    return session, events


def test_think_tags_in_content_become_reasoning_live(
    none_server: EmbeddedServer, tmp_path: Path
) -> None:
    session, events = _turn(none_server.url, tmp_path, None)
    first = next(r for r in session.records if isinstance(r, Assistant))
    # the server left <think>...</think> in content: the client moved it to reasoning
    assert first.reasoning and len(first.reasoning) > 20
    assert "<think>" not in (first.content or "") and "</think>" not in (first.content or "")
    usage = next(r for r in session.records if isinstance(r, Usage))
    assert (usage.reasoning_tokens or 0) > 20 and not usage.thinking_capped
    assert sum(isinstance(e, Reasoning) for e in events) == sum(
        u.reasoning_tokens or 0 for u in session.records if isinstance(u, Usage)
    )


@pytest.mark.parametrize("cap", [3, 10])
def test_thinking_cap_is_exact_with_tags_in_content_live(
    none_server: EmbeddedServer, tmp_path: Path, cap: int
) -> None:
    session, events = _turn(none_server.url, tmp_path, cap)
    reasoning = "".join(r.reasoning or "" for r in session.records if isinstance(r, Assistant))
    url = f"{none_server.url}/tokenize"
    tokens = httpx.post(url, json={"content": reasoning}).json()["tokens"]
    assert 0 < len(tokens) <= cap
    assert isinstance(next(e for e in events if isinstance(e, ThinkingCapped)), ThinkingCapped)
    hits = [r for r in session.records if isinstance(r, LimitHit) and r.kind == "thinking_cap"]
    assert hits and not any(h.detail.startswith("not enforced") for h in hits)
    assert not any(isinstance(e, CapNotEnforced) for e in events)


def test_cap_without_visible_reasoning_warns_once_live(tmp_path: Path) -> None:
    # thinking disabled on a server that separates reasoning: no reasoning field, no tag
    with live_server(n_ctx=4096) as server:
        require(server, "tools", "reasoning")  # without it the cap says the model cannot reason
        session, events = _turn(server.url, tmp_path, 10, thinking=False)
    warnings = [e for e in events if isinstance(e, CapNotEnforced)]
    assert len(warnings) == 1 and "no reasoning seen" in warnings[0].detail
    hits = [r for r in session.records if isinstance(r, LimitHit)]
    assert [h.detail for h in hits if h.kind == "thinking_cap"] == [
        f"not enforced: {warnings[0].detail}"
    ]
