"""Cache forensics live on llama.cpp's own server code (embedded, xllamacpp, shipped model and
template): each cause provoked for real and classified with its position, and ``keep`` proven
to keep the cache across user turns."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from live_server import SERVER_API_KEY, GivenServer, embedded_only, live_server

from boxmaker.cache import explain_log
from boxmaker.cli import main
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, HistoryConfig, LoopLimits, SamplingConfig
from boxmaker.demo import DEMO_PROMPTS, demo_registry
from boxmaker.errors import TurnLimit
from boxmaker.records import Baseline, CacheLoss, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live

EXTRA_TOOL = {
    "type": "function",
    "function": {
        "name": "get_tide",
        "description": "Get the tide in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer | GivenServer]:
    with live_server(n_ctx=4096, n_parallel=1, reasoning_preserve=False) as running:  # one slot
        yield running


def _config(url: str, reasoning: str = "drop") -> Config:
    return Config(
        client=ClientConfig(url=url, retry_attempts=0, api_key=SERVER_API_KEY),
        loop=LoopLimits(tool_iterations=2),
        sampling=SamplingConfig(max_tokens=200),
        history=HistoryConfig(reasoning=reasoning),
    )


def _turns(session: Session, runtime: Runtime, prompts: tuple[str, ...]) -> None:
    for text in prompts:
        with contextlib.suppress(TurnLimit):
            run_turn(session, runtime, text)


def _losses(session: Session) -> list[CacheLoss]:
    return [r for r in session.records if isinstance(r, CacheLoss)]


def _usages(session: Session) -> list[Usage]:
    return [r for r in session.records if isinstance(r, Usage)]


def _prompt_tokens(usage: Usage) -> int:
    return int(usage.timings["cache_n"] + usage.timings["prompt_n"])


def _tokens(url: str, text: str) -> int:
    answer = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": True}).json()
    return len(answer["tokens"])


@pytest.mark.needs("tools", "reasoning", "shipped_model")
def test_dropped_reasoning_is_history_rewritten_where_the_first_reply_began_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    embedded_only("the shipped template, which drops earlier reasoning")
    config = _config(server.url)
    session = Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        _turns(session, runtime, DEMO_PROMPTS[:2])
    (loss,) = _losses(session)
    # the first reply (reasoning, then a tool call) began right after the first prompt: with
    # the next user message the template renders it without its reasoning
    first_prompt = _prompt_tokens(_usages(session)[0])
    assert (loss.cause, loss.position, loss.reused) == (
        "history_rewritten",
        first_prompt,
        first_prompt,
    )
    assert loss.old_window is not None and "<think>" in loss.old_window
    assert loss.new_window is not None and "<tool_call>" in loss.new_window
    # the same explanation for the log afterwards (boxmaker cache explain)
    (explained,) = explain_log(session.path, server.url, config=config, api_key=SERVER_API_KEY)
    assert explained.found is not None
    assert (explained.found.cause, explained.found.position) == ("history_rewritten", first_prompt)
    assert explained.lost_tokens == loss.expected - loss.reused > 0
    # and from the command line, as text and as JSON
    log, url = str(session.path), server.url
    assert main(["cache", "explain", log, "--url", url]) == 0
    text, err = capsys.readouterr()
    assert "warning" not in err  # drop, as the session ran: the prompts rebuilt agree
    lost = loss.expected - loss.reused
    head = (
        f"request 3: lost_tokens {lost} ({loss.reused} of the previous prompt's "
        f"{loss.expected} reused), reprocessed_tokens {loss.reprocessed}"
    )
    assert f"{head}, history_rewritten at token {first_prompt}" in text
    assert '  old: "' in text and "<think>" in text
    assert main(["cache", "explain", log, "--url", url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["cause"], row["position"], row["lost_tokens"]) == (
        "history_rewritten",
        first_prompt,
        lost,
    )
    # the wrong history setting (issue 37: wrong causes without a word): said, with the fix
    assert main(["cache", "explain", log, "--url", url, "--reasoning", "keep", "--json"]) == 0
    out, err = capsys.readouterr()
    (row,) = json.loads(out)
    counted = _prompt_tokens(_usages(session)[row["request"] - 1])
    assert row["rebuilt_tokens"] != row["prompt_tokens"] == counted
    rebuilt = row["rebuilt_tokens"]
    assert f"with --reasoning keep is {rebuilt} tokens where the server counted" in err
    assert err.rstrip().endswith("try --reasoning drop")
    # a folder, as report takes it (issue 37): the same losses, keyed by log
    assert main(["cache", "explain", str(session.path.parent), "--url", url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[log][0]["lost_tokens"] == lost


@pytest.mark.needs("tools")
def test_tools_changed_between_turns_is_history_edited_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    embedded_only("the shipped template's tools block")
    config = _config(server.url, "keep")  # keep: nothing else is lost
    tools = demo_registry().definitions()
    session = Session.create(tmp_path, Baseline(tools=tools))
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        _turns(session, runtime, DEMO_PROMPTS[:1])
        session.baseline = dataclasses.replace(session.baseline, tools=(*tools, EXTRA_TOOL))
        _turns(session, runtime, DEMO_PROMPTS[1:2])
    (loss,) = _losses(session)
    # the prompts part where the old tools block ended and the new one goes on
    old = httpx.post(f"{server.url}/apply-template", json={"messages": [], "tools": list(tools)})
    new = httpx.post(
        f"{server.url}/apply-template", json={"messages": [], "tools": [*tools, EXTRA_TOOL]}
    )
    old_text, new_text = old.json()["prompt"], new.json()["prompt"]
    shared = next(i for i, (a, b) in enumerate(zip(old_text, new_text, strict=False)) if a != b)
    assert (loss.cause, loss.detail) == ("history_edited", "the tools changed")
    assert loss.position == _tokens(server.url, old_text[:shared]) == loss.reused


@pytest.mark.needs("tools", "one_slot")
def test_another_conversation_on_the_one_slot_is_evicted_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    embedded_only("one slot")
    config = _config(server.url, "keep")  # keep: the session's own prompts agree throughout
    registry = demo_registry()
    mine = Session.create(tmp_path / "a", Baseline(tools=registry.definitions()))
    other = Session.create(tmp_path / "b", Baseline(tools=registry.definitions()))
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=registry)
        _turns(mine, runtime, DEMO_PROMPTS[:1])
        _turns(other, runtime, ("Tell me the weather in Oslo.",))  # takes slot 0
        _turns(mine, runtime, DEMO_PROMPTS[1:2])
    (loss,) = _losses(mine)
    assert loss.cause == "evicted"
    # the session's prompts agree past the old prompt (the slot held it and the reply)
    assert loss.position is not None and loss.position > loss.expected > loss.reused
    # /props does not say n_swa; the model file (a llama architecture, no window) does: no
    # guess of a context checkpoint in the detail
    assert loss.detail == (
        f"the prompts agree on {loss.expected} tokens, the server reused {loss.reused}"
    )
    assert not _losses(other)


@pytest.mark.needs("tools", "reasoning", "shipped_model")
def test_keep_loses_no_cache_at_the_next_user_turn_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    embedded_only("the shipped template renders kept reasoning")
    config = _config(server.url, "keep")
    session = Session.create(tmp_path, Baseline(tools=demo_registry().definitions()))
    with Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        _turns(session, runtime, DEMO_PROMPTS)
    usages = _usages(session)
    assert len(usages) >= 6 and not _losses(session)
    for before, after in itertools.pairwise(usages):
        assert after.timings["cache_n"] >= _prompt_tokens(before)  # reused >= expected
