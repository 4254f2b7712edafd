"""ATIF live on llama.cpp's own server code (embedded, xllamacpp; the shipped model, or
``BOXMAKER_TEST_MODEL``'s): each completion's ``prompt_token_ids`` are the server's own
rendering and tokenization of the request the session sent, as many as the server processed
(``cache_n + prompt_n``); a log brought back from ATIF (boxmaker's, or ATIF's own fields only)
is explained by ``cache explain`` as the original is."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from extras import need
from live_server import SERVER_API_KEY, GivenServer, live_server

from boxmaker.cache import explain_log
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits, SamplingConfig
from boxmaker.demo import DEMO_PROMPTS, demo_registry
from boxmaker.errors import TurnError
from boxmaker.export import export_atif, import_atif
from boxmaker.records import Baseline
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session, messages
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live
atif = need("atif")


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer | GivenServer]:
    with live_server(n_ctx=4096, n_parallel=1, reasoning_preserve=False) as running:
        yield running


def _config(url: str) -> Config:
    return Config(
        client=ClientConfig(url=url, retry_attempts=0, api_key=SERVER_API_KEY),
        loop=LoopLimits(tool_iterations=2),
        sampling=SamplingConfig(max_tokens=200),
    )


def _session(folder: Path, url: str, baseline: Baseline, prompts: tuple[str, ...]) -> Path:
    config = _config(url)
    with Session.create(folder, baseline) as session, Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=demo_registry())
        for text in prompts:
            with contextlib.suppress(TurnError):  # a limit or a cut answer: still a log
                run_turn(session, runtime, text)
    return session.path


def _headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {SERVER_API_KEY}"} if SERVER_API_KEY else {}


def _server_ids(url: str, body: dict[str, Any]) -> list[int]:
    prompt = httpx.post(f"{url}/apply-template", json=body, headers=_headers(), timeout=60)
    text = prompt.json()["prompt"]
    answer = httpx.post(
        f"{url}/tokenize",
        json={"content": text, "add_special": True},
        headers=_headers(),
        timeout=60,
    )
    return [t if isinstance(t, int) else t["id"] for t in answer.json()["tokens"]]


def _check_prompts(path: Path, out: Path, url: str) -> list[Any]:
    """Export ``path`` with the server's tokens: each step's ids are what the server makes of
    the request rebuilt from the log, and as many as it processed for that completion."""
    config = _config(url)
    (file,) = export_atif(
        path, out, url=url, api_key=SERVER_API_KEY, template_kwargs=config.template_kwargs()
    )
    trajectory = atif.Trajectory.model_validate_json(file.read_text())
    agents = [s for s in trajectory.steps if s.source == "agent"]
    assert agents
    with Session.open(path, read_only=True) as session:
        records = list(session.records)
        baseline = session.baseline
    assistants = [i for i, r in enumerate(records) if type(r).__name__ == "Assistant"]
    for step, at in zip(agents, assistants, strict=True):
        metrics = step.metrics
        assert metrics is not None and metrics.prompt_token_ids is not None
        assert len(metrics.prompt_token_ids) == metrics.prompt_tokens  # cache_n + prompt_n
        assert metrics.extra is not None and metrics.extra["prompt_token_ids_match"] is True
        body: dict[str, Any] = {"messages": messages(baseline, records[:at])}
        if baseline.tools:
            body["tools"] = list(baseline.tools)
        body["chat_template_kwargs"] = config.template_kwargs()
        assert metrics.prompt_token_ids == _server_ids(url, body)
    return agents


def test_prompt_token_ids_are_what_the_server_processed_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    """Any model: a plain chat (no tools), two turns."""
    baseline = Baseline(system="Answer in one short sentence.")
    path = _session(tmp_path / "logs", server.url, baseline, ("Hello!", "And again?"))
    assert len(_check_prompts(path, tmp_path / "atif", server.url)) >= 2


@pytest.mark.needs("tools", "reasoning")
def test_a_tool_session_round_trips_and_its_losses_are_explained_alike_live(
    server: EmbeddedServer | GivenServer, tmp_path: Path
) -> None:
    baseline = Baseline(tools=demo_registry().definitions())
    path = _session(tmp_path / "logs", server.url, baseline, DEMO_PROMPTS[:2])
    agents = _check_prompts(path, tmp_path / "atif", server.url)
    assert any(s.tool_calls for s in agents) and any(s.observation for s in agents)
    config = _config(server.url)
    want = [e.to_json() for e in explain_log(path, server.url, config=config,
                                             api_key=SERVER_API_KEY)]  # fmt: skip
    assert want  # the shipped template drops earlier reasoning: a loss at the second turn
    (file,) = (tmp_path / "atif").glob("*.json")
    back = import_atif(file, tmp_path / "back")
    got = [e.to_json() for e in explain_log(back.path, server.url, config=config,
                                            api_key=SERVER_API_KEY)]  # fmt: skip
    assert got == want
    own = json.loads(file.read_text())  # ATIF's own fields only: the cache rule finds them
    stripped = tmp_path / "own.json"
    stripped.write_text(json.dumps(_strip(own)))
    foreign = import_atif(stripped, tmp_path / "foreign", session_id="foreign")
    found = explain_log(foreign.path, server.url, config=config, api_key=SERVER_API_KEY)
    assert [(e.request, e.expected, e.reused) for e in found] == [
        (w["request"], w["expected"], w["reused"]) for w in want
    ]
    assert [e.found.cause if e.found else None for e in found] == [w["cause"] for w in want]


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "extra"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value
