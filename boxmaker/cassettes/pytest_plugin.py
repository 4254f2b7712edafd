"""pytest plugin: tests that run inside a cassette (:func:`boxmaker.cassettes.use_cassette`).

Load it with the entry point (``[project.entry-points.pytest11] boxmaker =
"boxmaker.cassettes.pytest_plugin"``) or with ``pytest -p boxmaker.cassettes.pytest_plugin``.
It adds:

- ``--record-mode {none,once,new_episodes,all}`` (vcrpy's record modes, default ``none``);
- a ``cassette`` fixture: the test runs inside a cassette and gets vcrpy's ``Cassette``;
- a ``cassette`` marker, ``@pytest.mark.cassette("name.yaml", secrets=("sk-...",))``: the
  same without asking for the fixture, and the way to name the file (relative to the test
  file's folder); ``secrets`` adds values to hide to the request's own credentials, which
  are always hidden (:mod:`boxmaker.cassettes`). Unnamed, a test's cassette is
  ``cassettes/<module>/<test name>.yaml`` beside the test file.

With pytest-recording installed (its ``vcr`` marker, ``vcr_config`` fixture, ``--record-mode``
and ``--block-network``), this plugin adds no option of its own: the ``cassette`` fixture and
marker read pytest-recording's ``--record-mode`` (its ``rewrite`` re-records, as ``all``), so
the option means one thing. boxmaker's cassettes are then available through the ``vcr``
marker too: return :func:`boxmaker_vcr_config` from the ``vcr_config`` fixture (or pass it to
``@pytest.mark.vcr(**boxmaker_vcr_config())``) and a marked test's cassette is readable YAML,
matched on method, path and JSON body, scrubbed, and recorded with the stream live; the
:func:`pytest_recording_configure` hook registers the serializer and matcher by name.

In record mode ``none`` (CI) no request reaches the network: an httpx request with no
recorded match fails at once with the :class:`~boxmaker.errors.CassetteError` that names the
cassette, the request's number and the first differing place in its body, and any other
socket connection to an IP address fails with a ``CassetteError`` too. A test also fails when
its cassette has interactions it did not play, or when one of its requests matched nothing
even if the code under test swallowed the error (the way pydantic-ai's ``tests/conftest.py``
holds its cassettes to account).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import socket
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from vcr import VCR

from ..errors import CassetteError
from . import RECORD_MODES, RecordMode, unplayed, unplayed_message, use_cassette
from ._matching import json_body_matcher
from ._scrub import scrub_request, scrub_response
from ._serializer import serializer
from ._transport import streaming_into

__all__ = [
    "boxmaker_vcr_config",
    "cassette",
    "cassette_path",
    "pytest_addoption",
    "pytest_configure",
    "pytest_recording_configure",
    "pytest_runtest_call",
]

_OPEN: pytest.StashKey[tuple[Any, Path, RecordMode]] = pytest.StashKey()


_RECORDING_NAMES = ("recording", "pytest_recording.plugin", "pytest_recording")
"""The names pytest-recording's plugin registers under (entry point, ``-p`` module)."""


def recording_plugin_present(pluginmanager: pytest.PytestPluginManager) -> bool:
    """Whether pytest-recording takes part in this run: registered already, or installed (a
    ``pytest11`` entry point named ``recording``), not blocked with ``-p no:recording`` and
    plugin autoloading not disabled (``PYTEST_DISABLE_PLUGIN_AUTOLOAD``)."""
    if any(pluginmanager.has_plugin(name) for name in _RECORDING_NAMES):
        return True
    if any(pluginmanager.is_blocked(name) for name in _RECORDING_NAMES):
        return False
    if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return False
    return any(
        ep.name == "recording" or ep.value.startswith("pytest_recording")
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Add ``--record-mode``, unless pytest-recording (which has its own) takes part."""
    if recording_plugin_present(pluginmanager):
        return
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
            # closed here: the caller (socket.create_connection) closes its socket only on an
            # OSError, so this one would be left open (a ResourceWarning)
            sock.close()
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
    mode = _record_mode(request.config)
    path = cassette_path(item)
    marker = item.get_closest_marker("cassette")
    secrets = tuple(marker.kwargs.get("secrets", ())) if marker else ()
    if mode == "none" and not path.exists():
        raise CassetteError(f"{path}: no such cassette (record it with --record-mode once)")
    if mode != "none":
        path.parent.mkdir(parents=True, exist_ok=True)
    with use_cassette(path, mode, strict=False, secrets=secrets) as recorded:
        item.stash[_OPEN] = (recorded, path, mode)
        if mode == "none":
            with _network_blocked(path):
                yield recorded
        else:
            yield recorded


def _record_mode(config: pytest.Config) -> RecordMode:
    """``--record-mode`` (boxmaker's or pytest-recording's: unset means ``none``, its
    ``rewrite`` means ``all``)."""
    mode = config.getoption("--record-mode", default=None) or "none"
    if mode == "rewrite":
        return "all"
    if mode not in RECORD_MODES:
        raise CassetteError(f"--record-mode {mode}: not one of {', '.join(RECORD_MODES)}")
    return mode


def boxmaker_vcr_config(**overrides: Any) -> dict[str, Any]:
    """The ``vcr_config`` (pytest-recording's fixture, keyword arguments of vcrpy's
    ``use_cassette``) for boxmaker's cassettes: the readable serializer (files end ``.yaml``),
    matching on method, path and JSON body, headers and credential-like values scrubbed,
    compressed responses stored decoded, and vcrpy's own httpx patch skipped (this plugin
    records the stream live instead). ``overrides`` replace or add keys.

    Example::

        @pytest.fixture
        def vcr_config():
            return boxmaker_vcr_config()
    """
    config: dict[str, Any] = {
        "serializer": "boxmaker",
        "match_on": ("method", "path", "json_body"),
        "before_record_request": scrub_request,
        "before_record_response": scrub_response,
        "decode_compressed_response": True,
        "skip_patchers": ("httpx", "httpx2"),
        "path_transformer": VCR.ensure_suffix(".yaml"),
    }
    config.update(overrides)
    return config


@pytest.hookimpl(optionalhook=True)
def pytest_recording_configure(config: pytest.Config, vcr: Any) -> None:
    """pytest-recording's hook: register boxmaker's serializer (``"boxmaker"``) and JSON-body
    matcher (``"json_body"``) on the ``VCR`` it builds for a ``vcr``-marked test."""
    vcr.register_serializer("boxmaker", serializer)
    vcr.register_matcher("json_body", json_body_matcher(()))


@pytest.fixture(autouse=True)
def _boxmaker_vcr(request: pytest.FixtureRequest) -> Iterator[None]:
    """A ``vcr``-marked test whose cassette uses boxmaker's serializer records and replays
    httpx with the stream live, and is held to account like the ``cassette`` fixture."""
    item = request.node
    if item.get_closest_marker("vcr") is None or "vcr" not in request.fixturenames:
        yield
        return
    opened = request.getfixturevalue("vcr")
    if opened is None or getattr(opened, "_serializer", None) is not serializer:
        yield
        return
    path = Path(opened._path)
    if _rewriting(request):  # pytest-recording deleted a ``.boxmaker`` file: start over here
        path.unlink(missing_ok=True)
        opened.data.clear()
        opened.play_counts.clear()
    mode: RecordMode = "none" if opened.record_mode.value == "none" else "once"
    with streaming_into(opened, path):
        item.stash[_OPEN] = (opened, path, mode)
        yield


def _rewriting(request: pytest.FixtureRequest) -> bool:
    """pytest-recording's ``rewrite`` mode (option, ``vcr_config`` or marker) is on: it deletes
    the cassette before the test but names the file after the serializer (``.boxmaker``), so
    for boxmaker's cassettes the ``.yaml`` file is deleted and what was loaded dropped here."""
    config = dict(request.getfixturevalue("vcr_config"))
    for marker in reversed(list(request.node.iter_markers("vcr"))):
        config.update(marker.kwargs)
    mode = request.config.getoption("--record-mode", default=None) or config.get("record_mode")
    return bool(mode == "rewrite")


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
        if mode == "none" and unplayed(recorded):
            pytest.fail(unplayed_message(recorded, path), pytrace=False)
    return result
