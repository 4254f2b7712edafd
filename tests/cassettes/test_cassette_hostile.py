"""Hostile cassette files (issue 23): each is one clear CassetteError naming the file.

Billion laughs ran out of memory (3 GB, 34 s to a ``MemoryError``), deep nesting raised
``RecursionError``, ``!!float x`` a bare ``ValueError``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from boxmaker.cassettes import load_interactions
from boxmaker.cassettes.whatif import what_if
from boxmaker.errors import CassetteError


def laughs(levels: int = 9, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    for i in range(1, levels + 1):
        refs = ", ".join([f"*a{i - 1}"] * width)
        lines.append(f"a{i}: &a{i} [{refs}]")
    lines.append(f"interactions: [*a{levels}]")
    lines.append("version: 1")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "billion_laughs": (laughs(), "more than 16 YAML aliases"),
    "deep_lists": ("interactions: " + "[" * 5000 + "]" * 5000 + "\nversion: 1\n", "deeper than 64"),
    "deep_maps": ("interactions: " + "{a: " * 5000 + "1" + "}" * 5000 + "\n", "deeper than 64"),
    "bad_float": ("interactions: []\nversion: !!float x\n", "ValueError"),
    "bad_int": ("interactions: []\nversion: !!int x\n", "ValueError"),
    "bad_timestamp": ("interactions: []\nversion: !!timestamp 2026-13-45\n", "ValueError"),
    "bad_binary": ("interactions: []\nversion: !!binary ä\n", "not a readable cassette"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_cassette_is_one_clear_error(tmp_path: Path, name: str) -> None:
    text, words = HOSTILE[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(CassetteError) as info:
        load_interactions(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)
    with pytest.raises(CassetteError, match=words):
        what_if(path)


def test_a_few_aliases_still_load(tmp_path: Path) -> None:
    path = tmp_path / "aliases.yaml"
    path.write_text(laughs(levels=2, width=2).replace("interactions: [*a2]", "interactions: []"))
    assert load_interactions(path) == []
