"""Every reader of a cassette on mutated recordings (issue 36: 5 of 1,500 fuzzed cassettes
raised bare exceptions): ``load_interactions``, ``cassette show`` (``transcript``),
``cassette check`` (``check_prefix``), the replay's ``recorded_session`` and ``use_cassette``
itself either read a mutant or raise one :class:`~boxmaker.errors.BoxmakerError` (a
``CassetteError`` naming the file); nothing else escapes.

The mutants are ``test_cassette_mutants``' (text cut, doubled, overwritten, truncated; a
parsed value swapped or dropped). Each test tries ``BOXMAKER_MUTANTS`` (default 40; 750 per
test gives the issue's 1,500)."""

from __future__ import annotations

import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cassette_mutants import MUTANTS, ODD_VALUES, PLACES, _mutated_data, _mutated_text

from boxmaker.cassettes import check_prefix, load_interactions, transcript, use_cassette
from boxmaker.cassettes._inspection import recorded_session
from boxmaker.errors import BoxmakerError


def _enter(path: Path) -> None:
    with use_cassette(path, "none"):
        pass


READERS: dict[str, Callable[[Path], Any]] = {
    "load_interactions": load_interactions,
    "cassette show": transcript,
    "cassette check": check_prefix,
    "recorded_session": recorded_session,
    "use_cassette": _enter,
}


def _every_reader_reads_or_refuses(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutant.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        for name, read in READERS.items():
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # a replay's own notes are not the point
                    read(path)
            except BoxmakerError as exc:
                assert str(exc).startswith(f"{path}: "), (name, str(exc))


@settings(max_examples=MUTANTS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_text_mutant_is_read_or_refused_by_every_reader(data: st.DataObject) -> None:
    _every_reader_reads_or_refuses(_mutated_text(data))


@settings(max_examples=MUTANTS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PLACES), st.sampled_from(ODD_VALUES), st.booleans())
def test_a_data_mutant_is_read_or_refused_by_every_reader(
    place: tuple[Any, ...], value: Any, drop: bool
) -> None:
    _every_reader_reads_or_refuses(_mutated_data(place, value, drop))


def test_the_shapes_the_fuzz_found_are_clear_errors(tmp_path: Path) -> None:
    """The bare exceptions the fuzz found: tools or messages of the wrong type in a recorded
    request (show), messages not a list (check), a URI that is a mapping (use_cassette)."""
    head = "version: 1\ninteractions:\n- request:\n    method: POST\n"
    tail = "  response:\n    status: {code: 200}\n    body: {text: ok}\n"
    uri = "    uri: http://x/v1/chat/completions\n"
    cases = {
        "tools": (head + uri + "    body_json: {messages: [], tools: [a]}\n" + tail, transcript),
        "messages": (head + uri + "    body_json: {messages: [[1]]}\n" + tail, transcript),
        "check": (
            head
            + uri
            + "    body_json: {messages: []}\n"
            + tail
            + "- request:\n    method: POST\n"
            + uri
            + "    body_json: {messages: 3}\n"
            + tail,
            check_prefix,
        ),
        "uri": (head + "    uri: {a: 1}\n" + tail, _enter),
    }
    for name, (text, read) in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            read(path)
        except BoxmakerError as exc:
            assert str(exc).startswith(f"{path}: "), name
        else:
            raise AssertionError(f"{name}: read without an error")
