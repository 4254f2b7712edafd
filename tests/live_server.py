"""The llama-server the live tests use: the embedded one (CI), or the one named by
``BOXMAKER_SERVER_URL`` (``http://host:port``), so a user can run the live suite against their
own llama-server build. ``BOXMAKER_SERVER_API_KEY`` is its key, if it needs one.

Tests that need a particular server setup (a small context, a reasoning format, an API key)
call :func:`embedded_only`: they are skipped against a given server."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from boxmaker.server import EmbeddedServer

SERVER_URL = os.environ.get("BOXMAKER_SERVER_URL") or None
SERVER_API_KEY = os.environ.get("BOXMAKER_SERVER_API_KEY") or None
MODEL = os.environ.get("BOXMAKER_TEST_MODEL") or None


@dataclass(frozen=True)
class GivenServer:
    """A running llama-server the tests did not start (``BOXMAKER_SERVER_URL``)."""

    url: str


def embedded_only(why: str) -> None:
    """Skip the calling test when the live tests run against a given server."""
    if SERVER_URL is not None:
        pytest.skip(f"needs the embedded server ({why}); BOXMAKER_SERVER_URL is set")


def not_on_the_shipped_model(why: str) -> None:
    """A model did not do what the test needs: skip against a given server (another model may
    answer otherwise), fail on the embedded server, whose shipped model is deterministic and
    trained to do it (a skip there would hide a defect: issue 21)."""
    if SERVER_URL is not None:
        pytest.skip(f"the model at BOXMAKER_SERVER_URL: {why}")
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
