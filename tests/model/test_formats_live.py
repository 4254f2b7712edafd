"""The multi-format tiny models live: ``tiny-agent-qwen3.gguf`` (Qwen3's real template) and
``tiny-agent-llama3.gguf`` (Llama 3.1's) on the embedded server, their tool calls parsed by
llama.cpp's own parser for each template into ``tool_calls`` and answered; doctor's format
check on each; on Qwen3's template, which drops earlier turns' reasoning, the cache forensics
name the loss ``history_rewritten`` on a server with llama-server's defaults (4 slots, a
unified KV cache, ``--cache-ram``, reasoning preservation on: the template cannot preserve)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from boxmaker.cli.doctor import diagnose
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import DEMO_PROMPTS, demo_registry
from boxmaker.errors import TurnLimit
from boxmaker.model import model_file
from boxmaker.records import Assistant, Baseline, CacheLoss, Capabilities, TurnEnd, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live

FORMATS = ("qwen3", "llama3")


@pytest.fixture(scope="module", params=FORMATS)
def server(request: pytest.FixtureRequest) -> Iterator[EmbeddedServer]:
    """One slot of 4096 tokens on the format's file (module-wide: each start costs ~1 s)."""
    path = model_file(request.param)
    with EmbeddedServer(path, n_ctx=4096, n_parallel=1, n_threads=1) as running:
        yield running


def _config(url: str) -> Config:
    return Config(
        client=ClientConfig(url=url, retry_attempts=0),
        loop=LoopLimits(tool_iterations=3),
        sampling=SamplingConfig(max_tokens=200),
    )


def _session(url: str, folder: Path, prompts: tuple[str, ...]) -> Session:
    session = Session.create(folder, Baseline(tools=demo_registry().definitions()))
    config = _config(url)
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        for prompt in prompts:
            with contextlib.suppress(TurnLimit):
                run_turn(session, runtime, prompt)
    return session


def test_the_templates_are_the_real_ones_with_their_tokens_live(server: EmbeddedServer) -> None:
    props = httpx.get(f"{server.url}/props", timeout=10).json()
    caps = props["chat_template_caps"]
    assert caps["supports_tools"] is True and caps["supports_tool_calls"] is True
    assert caps["supports_preserve_reasoning"] is False  # neither template can keep reasoning
    if server.model_path == model_file("qwen3"):
        assert (
            "You are provided with function signatures within <tools></tools>"
            in (props["chat_template"])
        )
        assert (props["bos_token"], props["eos_token"]) == ("<s>", "<|im_end|>")
    else:
        assert "<|start_header_id|>ipython<|end_header_id|>" in props["chat_template"]
        assert (props["bos_token"], props["eos_token"]) == ("<|begin_of_text|>", "<|eot_id|>")
        assert caps["supports_parallel_tool_calls"] is False  # "only single tool-calls"


def test_a_tool_turn_is_parsed_into_tool_calls_and_answered_live(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    session = _session(server.url, tmp_path, DEMO_PROMPTS[:1])
    records = list(session.records)
    (caps,) = [r for r in records if isinstance(r, Capabilities)]
    assert caps.supports_tools and caps.supports_tool_calls
    first, final = [r for r in records if isinstance(r, Assistant)]
    # llama.cpp's parser for the template turned the model's text into a tool call
    assert [(c.name, c.arguments) for c in first.tool_calls] == [
        ("get_weather", '{"city": "Lisbon"}')
    ]
    assert "<tool_call>" not in (first.content or "") and '"parameters"' not in (
        first.content or ""
    )
    assert not final.tool_calls and "Lisbon" in (final.content or "")
    (end,) = [r for r in records if isinstance(r, TurnEnd)]
    assert end.outcome == "answered"
    reasoning = [r.reasoning for r in records if isinstance(r, Assistant)]
    if server.model_path == model_file("qwen3"):
        assert all(reasoning)  # Qwen3 thinks in <think>, separated by the server
    else:
        assert not any(reasoning)  # Llama 3.x has no reasoning


def test_doctor_finds_tool_calls_parsed_live(server: EmbeddedServer) -> None:
    report = diagnose(server.url)
    seen = {c.name: (c.ok, c.seen) for c in report.checks}
    assert seen["tool calls parsed"] == (True, "delta.tool_calls")
    if server.model_path == model_file("qwen3"):
        assert seen["reasoning separated"][0] is True
    else:
        assert seen["reasoning separated"] == (None, "no reasoning seen on the demo prompt")


def test_qwen3_dropped_reasoning_is_history_rewritten_on_upstream_defaults_live(
    tmp_path: Path,
) -> None:
    # llama-server's defaults: 4 slots sharing a unified KV, --cache-ram 8192, reasoning
    # preservation on, which Qwen3's template cannot honour: it drops turn 1's reasoning
    with EmbeddedServer(model_file("qwen3"), n_ctx=4096, n_threads=1) as upstream:
        assert (upstream.n_parallel, upstream.kv_unified) == (4, True)
        session = _session(upstream.url, tmp_path, DEMO_PROMPTS[:2])
    records = list(session.records)
    losses = [r for r in records if isinstance(r, CacheLoss)]
    assert [loss.cause for loss in losses] == ["history_rewritten"]
    (loss,) = losses
    first = next(r for r in records if isinstance(r, Usage))
    first_prompt = int(first.timings["cache_n"] + first.timings["prompt_n"])
    # the first reply began right after the first prompt; there the history now differs
    assert (loss.position, loss.reused) == (first_prompt, first_prompt)
    assert loss.old_window is not None and "<think>" in loss.old_window
    assert loss.new_window is not None and "<tool_call>" in loss.new_window
    assert loss.expected - loss.reused > 0
