"""pytest plugin: tests that run inside a cassette (:func:`boxmaker.cassettes.use_cassette`).

Load it with the entry point (``[project.entry-points.pytest11] boxmaker =
"boxmaker.pytest_plugin"``) or with ``pytest -p boxmaker.pytest_plugin``. It adds:

- ``--record-mode {none,once,new_episodes,all}`` (vcrpy's record modes, default ``none``);
- a ``cassette`` fixture: the test runs inside a cassette and gets vcrpy's ``Cassette``;
- a ``cassette`` marker, ``@pytest.mark.cassette("name.yaml", secrets=("sk-...",))``: the
  same without asking for the fixture, and the way to name the file (relative to the test
  file's folder); ``secrets`` adds values to hide to the request's own credentials, which
  are always hidden (:mod:`boxmaker.cassettes.scrub`). Unnamed, a test's cassette is
  ``cassettes/<module>/<test name>.yaml`` beside the test file.

In record mode ``none`` (CI) no request reaches the network: an httpx request with no
recorded match fails at once with the :class:`~boxmaker.errors.CassetteError` that names the
cassette, the request's number and the first differing place in its body, and any other
socket connection to an IP address fails with a ``CassetteError`` too. A test also fails when
its cassette has interactions it did not play, or when one of its requests matched nothing
even if the code under test swallowed the error (the way pydantic-ai's ``tests/conftest.py``
holds its cassettes to account).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from .cassettes import RECORD_MODES, RecordMode, unplayed_message, use_cassette
from .errors import CassetteError

__all__ = [
    "cassette",
    "cassette_path",
    "pytest_addoption",
    "pytest_configure",
    "pytest_runtest_call",
]

_OPEN: pytest.StashKey[tuple[Any, Path, RecordMode]] = pytest.StashKey()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--record-mode``."""
    group = parser.getgroup("boxmaker", "boxmaker cassettes")
    group.addoption(
        "--record-mode",
        action="store",
        choices=RECORD_MODES,
        default="none",
        help="vcrpy record mode for tests with a cassette (default: none, replay only, "
        "network blocked)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``cassette`` marker."""
    config.addinivalue_line(
        "markers",
        "cassette(path=None, secrets=()): run the test inside a boxmaker cassette "
        "(path relative to the test file; default cassettes/<module>/<test>.yaml)",
    )


def cassette_path(item: pytest.Item) -> Path:
    """The cassette file of a test: the marker's ``path`` (relative to the test file's folder),
    else ``cassettes/<module stem>/<test name>.yaml`` beside the test file (characters other
    than letters, digits, ``_.-`` in the name become ``_``)."""
    here = Path(str(item.path)).parent
    marker = item.get_closest_marker("cassette")
    named = (marker.args[0] if marker.args else marker.kwargs.get("path")) if marker else None
    if named:
        return here / str(named)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.name).strip("_")
    return here / "cassettes" / Path(str(item.path)).stem / f"{name}.yaml"


@contextmanager
def _network_blocked(where: Path) -> Iterator[None]:
    """Refuse socket connections to IP addresses (record mode none)."""
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def refuse(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            raise CassetteError(
                f"{where}: the network is blocked in record mode none (a connection to "
                f"{address!r}); record with --record-mode once"
            )

    def connect(sock: socket.socket, address: Any) -> None:
        refuse(sock, address)
        real_connect(sock, address)

    def connect_ex(sock: socket.socket, address: Any) -> int:
        refuse(sock, address)
        return real_connect_ex(sock, address)

    with (
        mock.patch.object(socket.socket, "connect", connect),
        mock.patch.object(socket.socket, "connect_ex", connect_ex),
    ):
        yield


@pytest.fixture
def cassette(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The test runs inside its cassette (see the module docstring); yields vcrpy's
    ``Cassette`` (``play_count``, ``all_played``, ``data``, and ``failures``)."""
    item = request.node
    mode: RecordMode = request.config.getoption("--record-mode")
    path = cassette_path(item)
    marker = item.get_closest_marker("cassette")
    secrets = tuple(marker.kwargs.get("secrets", ())) if marker else ()
    if mode != "none":
        path.parent.mkdir(parents=True, exist_ok=True)
    with use_cassette(path, mode, strict=False, secrets=secrets) as recorded:
        item.stash[_OPEN] = (recorded, path, mode)
        if mode == "none":
            with _network_blocked(path):
                yield recorded
        else:
            yield recorded


@pytest.fixture(autouse=True)
def _cassette_marker(request: pytest.FixtureRequest) -> None:
    """A test marked ``cassette`` gets the fixture without asking for it."""
    if request.node.get_closest_marker("cassette") is not None:
        request.getfixturevalue("cassette")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """After a test that passed: fail it if a request matched nothing or, in record mode
    ``none``, if its cassette has unplayed interactions."""
    result = yield
    opened = item.stash.get(_OPEN, None)
    if opened is not None:
        recorded, path, mode = opened
        failures = getattr(recorded, "failures", [])
        if failures:
            pytest.fail(f"{failures[0]} (the code under test caught it)", pytrace=False)
        if mode == "none" and not recorded.all_played:
            pytest.fail(unplayed_message(recorded, path), pytrace=False)
    return result
