"""Shared fixtures: every test works in its own temporary directory and never reads $HOME."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import require


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    runtime = tmp_path / "runtime"  # the slot locks (boxmaker.client) go here
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    yield


@pytest.fixture(autouse=True)
def _needs(request: pytest.FixtureRequest) -> None:
    """``@pytest.mark.needs("tools", ...)``: skip unless the test's ``server`` fixture meets
    them (read from ``GET /props``: tests/live_server.py ``require``)."""
    marker = request.node.get_closest_marker("needs")
    if marker is not None:
        require(request.getfixturevalue("server"), *marker.args)
