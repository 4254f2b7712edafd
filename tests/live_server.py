"""The llama-server the live tests use: the embedded one (CI), or the one named by
``BOXMAKER_SERVER_URL`` (``http://host:port``), so a user can run the live suite against their
own llama-server build. ``BOXMAKER_SERVER_API_KEY`` is its key, if it needs one.

Tests that need a particular server setup (a small context, a reasoning format, an API key)
call :func:`embedded_only`: they are skipped against a given server. What a test needs of the
server and model (:data:`NEEDS`: tools, reasoning, one slot, a cold cache, the shipped model)
it states with ``@pytest.mark.needs(...)`` (checked against its ``server`` fixture by
``tests/conftest.py``) or by calling :func:`require`: both read ``GET /props`` and skip with
the unmet need, so the live suite is green against any server and model.

``BOXMAKER_TEST_MODEL`` may also be a short name of :data:`boxmaker.model.real.REAL_MODELS`
(``smollm2``, ``gemma3``): the fetched copy (``scripts/fetch_models.py``), or of a shipped
multi-format file (``tiny-qwen3``, ``tiny-llama3``: :data:`boxmaker.model.MODEL_FILES`)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

import httpx
import pytest

from boxmaker.client import capabilities_of
from boxmaker.model import MODEL_FILENAME, MODEL_FILES, model_file
from boxmaker.model.real import REAL_MODELS, models_dir, real_model_path
from boxmaker.records import Capabilities
from boxmaker.server import EmbeddedServer

SERVER_URL = os.environ.get("BOXMAKER_SERVER_URL") or None
SERVER_API_KEY = os.environ.get("BOXMAKER_SERVER_API_KEY") or None
MODELS_DIR = models_dir()  # read now: tests/conftest.py points HOME elsewhere for each test


def _test_model(given: str | None) -> str | None:
    if given is not None and given in REAL_MODELS:
        path = real_model_path(given, MODELS_DIR)
        if path is None:
            raise pytest.UsageError(
                f"BOXMAKER_TEST_MODEL={given}: not in {MODELS_DIR}; run scripts/fetch_models.py"
            )
        return str(path)
    if given is not None and given.startswith("tiny-") and given[5:] in MODEL_FILES:
        return str(model_file(given))
    return given


MODEL = _test_model(os.environ.get("BOXMAKER_TEST_MODEL") or None)
"""The GGUF file the embedded live servers load (``None``: the shipped model)."""

Need = Literal["tools", "reasoning", "one_slot", "cold_cache", "shipped_model"]
NEEDS: tuple[Need, ...] = get_args(Need)
"""What a live test may need: ``tools`` (the template renders tools and tool calls),
``reasoning`` (it renders reasoning), ``one_slot`` (``total_slots`` 1), ``cold_cache`` (a
server this test run started: a given server may hold earlier prompts in its slots or its
``--cache-ram``), ``shipped_model`` (the char-level ``tiny-agent``: assertions on its trained
answers or one token per character)."""


def real_model(name: str) -> Path:
    """The fetched copy of a real model; skips the test when it is not there."""
    path = real_model_path(name, MODELS_DIR)
    if path is None:
        pytest.skip(f"real model {name} not in {MODELS_DIR}: run scripts/fetch_models.py")
    return path


def _props(url: str, api_key: str | None) -> Capabilities | None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return capabilities_of(httpx.get(f"{url}/props", headers=headers, timeout=10.0).json())


def unmet(
    server: EmbeddedServer | GivenServer, *needs: Need, api_key: str | None = SERVER_API_KEY
) -> list[str]:
    """The needs ``server`` does not meet, each with what ``GET /props`` said."""
    caps = _props(server.url, api_key) or Capabilities()
    missing = []
    for need in needs:
        if need not in NEEDS:
            raise ValueError(f"unknown need {need!r}: one of {NEEDS}")
        if need == "tools" and not (caps.supports_tools and caps.supports_tool_calls):
            missing.append(
                f"tools (supports_tools {caps.supports_tools}, "
                f"supports_tool_calls {caps.supports_tool_calls})"
            )
        elif need == "reasoning" and not caps.reasoning:
            missing.append(f"reasoning (the template renders none: {caps.reasoning})")
        elif need == "one_slot" and caps.slots != 1:
            missing.append(f"one slot (total_slots {caps.slots})")
        elif need == "cold_cache" and isinstance(server, GivenServer):
            missing.append("a cold cache (a given server may hold earlier prompts)")
        elif need == "shipped_model" and _served(caps.model) != Path(MODEL_FILENAME).stem:
            missing.append(f"the shipped model (serving {caps.model})")
    return missing


def _served(model: str | None) -> str | None:
    """The model's name as ``GET /props`` gives it, without folder and ``.gguf``: the
    embedded server names its alias, an upstream llama-server the ``-m`` path it was given."""
    return Path(model).name.removesuffix(".gguf") if model else None


def require(
    server: EmbeddedServer | GivenServer, *needs: Need, api_key: str | None = SERVER_API_KEY
) -> None:
    """Skip the calling test unless ``server`` meets every one of ``needs`` (:data:`NEEDS`)."""
    missing = unmet(server, *needs, api_key=api_key)
    if missing:
        pytest.skip("the server lacks " + "; ".join(missing))


@dataclass(frozen=True)
class GivenServer:
    """A running llama-server the tests did not start (``BOXMAKER_SERVER_URL``)."""

    url: str


def embedded_only(why: str) -> None:
    """Skip the calling test when the live tests run against a given server."""
    if SERVER_URL is not None:
        pytest.skip(f"needs the embedded server ({why}); BOXMAKER_SERVER_URL is set")


def not_on_the_shipped_model(why: str) -> None:
    """A model did not do what the test needs: skip against a given server or model (another
    model may answer otherwise), fail on the embedded server's shipped model, which is
    deterministic and trained to do it (a skip there would hide a defect: issue 21)."""
    if SERVER_URL is not None:
        pytest.skip(f"the model at BOXMAKER_SERVER_URL: {why}")
    if MODEL is not None:
        pytest.skip(f"the model {Path(MODEL).name}: {why}")
    pytest.fail(f"the shipped model (deterministic, trained for this prompt): {why}")


@contextlib.contextmanager
def live_server(**settings: Any) -> Iterator[EmbeddedServer | GivenServer]:
    """The given server when ``BOXMAKER_SERVER_URL`` is set (``settings`` are then the
    user's business), else an embedded server on ``BOXMAKER_TEST_MODEL`` or the shipped
    model, started with ``settings`` (``n_threads=1`` unless given)."""
    if SERVER_URL is not None:
        yield GivenServer(SERVER_URL.rstrip("/"))
        return
    settings.setdefault("n_threads", 1)
    with EmbeddedServer(MODEL, **settings) as running:
        yield running
