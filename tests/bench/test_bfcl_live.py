"""``boxmaker bench bfcl`` on the embedded server (the shipped model): the acceptance's command
on a small slice, and three harnesses on one server."""

from __future__ import annotations

from pathlib import Path

import pytest
from extras import need

pytestmark = pytest.mark.live


def test_bench_bfcl_embedded_prints_accuracy_per_category_with_intervals_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need("bfcl_eval")
    need("mpmath")
    from boxmaker.cli import main

    args = ["bench", "bfcl", "--embedded", "--limit", "2", "--dir", str(tmp_path / "b")]
    args += ["--category", "simple_python", "--category", "irrelevance"]
    assert main(args) == 0
    out = capsys.readouterr().out
    for category in ("simple_python", "irrelevance"):
        line = next(row for row in out.splitlines() if row.startswith(category))
        assert "[" in line and "]" in line  # the interval
    assert "BFCL overall" in out
    assert main(args) == 0  # the same command again resumes: nothing left to run
    capsys.readouterr()


def test_three_harnesses_on_one_server_compare_with_intervals_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    need("bfcl_eval")
    need("mpmath")
    need("pydantic_ai")
    need("agents")
    from boxmaker.cli import main

    args = ["bench", "bfcl", "--embedded", "--parallel", "1", "--limit", "1"]
    args += ["--dir", str(tmp_path / "h"), "--category", "simple_python"]
    args += ["--harness", "boxmaker", "--harness", "pydantic-ai", "--harness", "openai-agents"]
    assert main(args) == 0
    out = capsys.readouterr().out
    table = out.split("== harnesses, on the same tasks and server", 1)[1]
    for harness in ("boxmaker", "pydantic-ai", "openai-agents"):
        assert any(row.startswith(harness) for row in table.splitlines()), harness
