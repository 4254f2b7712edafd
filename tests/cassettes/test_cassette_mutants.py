"""``what_if`` on mutated recordings (issue 23): 33 of 1,500 mutated cassettes raised a bare
exception. Every mutant of a real llama.cpp recording either replays or is one
:class:`~boxmaker.errors.CassetteError` naming the file; nothing else escapes.

Mutations: of the text (a span cut, doubled or overwritten, the file truncated) and of the
parsed data (a value swapped for one of another type, a key dropped), then written back as
YAML, so the mutants reach past the parser into the interactions and the SSE bodies.

Each test tries 40 mutants in the suite; ``BOXMAKER_MUTANTS=750`` (per test) runs the issue's
1,500 (about 8 minutes on 2 busy cores).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker.cassettes.whatif import what_if
from boxmaker.errors import CassetteError

RECORDED = Path(__file__).resolve().parents[2] / "cassettes" / "demo-thinking-cap.yaml"
TEXT = RECORDED.read_text(encoding="utf-8")
DATA = yaml.safe_load(TEXT)
MUTANTS = int(os.environ.get("BOXMAKER_MUTANTS", "40"))
ODD_VALUES = [None, 0, -1, 2**70, 1.5, "", "x", [], {}, [1], {"a": 1}, True, "data: {\n\n"]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the parsed cassette (keys of mappings, indexes of lists)."""
    found = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _paths(value, (*prefix, i))
    return found


PLACES = [p for p in _paths(DATA) if p]


def _mutated_data(place: tuple[Any, ...], value: Any, drop: bool) -> str:
    data = yaml.safe_load(TEXT)  # a fresh copy each time
    parent = data
    for step in place[:-1]:
        parent = parent[step]
    last = place[-1]
    if drop and isinstance(parent, dict):
        del parent[last]
    else:
        parent[last] = value
    return yaml.safe_dump(data, allow_unicode=True)


def _mutated_text(data: st.DataObject) -> str:
    kind = data.draw(st.sampled_from(["cut", "double", "overwrite", "truncate"]))
    start = data.draw(st.integers(0, len(TEXT) - 1))
    length = data.draw(st.integers(1, 200))
    span = TEXT[start : start + length]
    if kind == "cut":
        return TEXT[:start] + TEXT[start + length :]
    if kind == "double":
        return TEXT[: start + length] + span + TEXT[start + length :]
    if kind == "overwrite":
        junk = data.draw(st.text(min_size=1, max_size=length))
        return TEXT[:start] + junk + TEXT[start + len(junk) :]
    return TEXT[:start]


def _replays_or_one_clear_error(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "mutant.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            result = what_if(path)
        except CassetteError as exc:
            assert str(exc), "an error with no message"
            return
        assert result is not None


@settings(max_examples=MUTANTS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_text_mutant_replays_or_is_one_clear_error(data: st.DataObject) -> None:
    _replays_or_one_clear_error(_mutated_text(data))


@settings(max_examples=MUTANTS, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PLACES), st.sampled_from(ODD_VALUES), st.booleans())
def test_a_data_mutant_replays_or_is_one_clear_error(
    place: tuple[Any, ...], value: Any, drop: bool
) -> None:
    _replays_or_one_clear_error(_mutated_data(place, value, drop))
