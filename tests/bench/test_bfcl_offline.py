"""BFCL on boxmaker, offline: the slice, the tasks, each run's tools, and a recorded slice
(``cassettes/bench``, ``tests/bench/data/bfcl``: made by ``benchmarks/bfcl.py --record`` on
the shipped model) replayed through the batch and scored again, for boxmaker's loop and the
two other harnesses the tap recorded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from extras import need

need("bfcl_eval")
need("mpmath")

from boxmaker.bench import (  # noqa: E402
    BENCH_CONFIG,
    CATEGORIES,
    RunTools,
    bfcl_scorer,
    bfcl_summary,
    compare_harnesses,
    format_harnesses,
    format_summary,
    load_entries,
    pick,
    read_slice,
    run_bfcl,
    task_of,
)
from boxmaker.cassettes import use_cassette  # noqa: E402
from boxmaker.cli import main  # noqa: E402
from boxmaker.config import Config  # noqa: E402
from boxmaker.errors import BenchError  # noqa: E402
from boxmaker.session import Session  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "bench" / "data" / "bfcl"
CASSETTE = ROOT / "cassettes" / "bench" / "bfcl-boxmaker.yaml"
HARNESSES = ("boxmaker", "pydantic-ai", "openai-agents")


def test_a_slice_takes_limit_entries_per_category_seeded_and_stable() -> None:
    first = pick(("simple_python", "irrelevance"), limit=3)
    assert [e.id for e in first] == [f"simple_python_{i}" for i in range(3)] + [
        f"irrelevance_{i}" for i in range(3)
    ]
    drawn = pick(("simple_python",), limit=5, seed=7)
    assert drawn == pick(("simple_python",), limit=5, seed=7)
    assert drawn != pick(("simple_python",), limit=5, seed=8)
    assert len(pick(CATEGORIES, limit=1)) == len(CATEGORIES)
    with pytest.raises(BenchError, match="none of"):
        pick(("simple_java",))
    with pytest.raises(BenchError, match="1 or more"):
        pick(limit=0)


def test_an_entry_is_a_task_under_bfcls_protocol() -> None:
    single = load_entries("parallel")[0]
    task = task_of(single)
    assert task.id == single.id and task.messages == single.turns
    assert task.config == {"loop.tool_iterations": 0}  # one completion, as BFCL asks once
    multi = load_entries("multi_turn_base")[0]
    assert task_of(multi).config == {"loop.tool_iterations": 20}
    assert len(task_of(multi).messages) == len(multi.ground_truth)
    names = [t["function"]["name"] for t in load_entries("simple_python")[1].tools()]
    assert names == ["math_factorial"]  # a '.' is sent as '_', as BFCL does for FC models
    config = Config().with_settings(BENCH_CONFIG)
    assert not config.loop.repeat_detection and config.loop.tool_result_cap is None


def test_each_multi_turn_run_has_its_own_api_state(tmp_path: Path) -> None:
    entry = load_entries("multi_turn_base")[0]  # a file system with document/
    tools = RunTools([entry], tmp_path)
    one, two = tools("run-a", task_of(entry)), tools("run-b", task_of(entry))
    cd, mkdir, ls = (one.get(n) for n in ("cd", "mkdir", "ls"))
    assert cd and mkdir and ls and cd.function and mkdir.function and ls.function
    assert "document" in cd.function(folder="document")
    mkdir.function(dir_name="fresh")
    assert "fresh" in ls.function()
    other = two.get("ls")
    assert other is not None and other.function is not None
    assert "fresh" not in other.function()  # the other run's file system is untouched
    tools.close()
    single = RunTools([load_entries("simple_python")[0]])
    registry = single("r", task_of(load_entries("simple_python")[0]))
    assert registry.names == ("calculate_triangle_area",)


def test_a_recorded_slice_replays_through_the_batch_and_scores_as_recorded(
    tmp_path: Path,
) -> None:
    recorded = {
        line["run"]: line["value"]
        for line in map(json.loads, (DATA / "boxmaker" / "scores.ndjson").read_text().splitlines())
    }
    held = read_slice(DATA / "boxmaker")
    with use_cassette(CASSETTE, "none"):
        run_bfcl(
            tmp_path / "b",
            servers=["http://127.0.0.1:9"],
            categories=held.categories,
            limit=held.limit,
            seed=held.seed,
        )
    again = bfcl_summary(tmp_path / "b")
    from boxmaker.batch import scores

    replayed = dict(
        zip(scores(tmp_path / "b")["run"], scores(tmp_path / "b")["value"], strict=True)
    )
    assert replayed == recorded
    assert set(again["category"]) == {*held.categories, "bfcl_overall"}
    assert "accuracy" in format_summary(again)


def test_each_harness_run_scores_again_as_recorded(tmp_path: Path) -> None:
    for harness in HARNESSES[1:]:
        folder = DATA / harness
        entries = read_slice(folder).load()
        for line in map(json.loads, (folder / "runs.ndjson").read_text().splitlines()):
            with Session.open(folder / line["log"], read_only=True) as session:
                score = bfcl_scorer(entries[line["task"]]).fn(session.records)
            assert not isinstance(score, bool | float)
            assert (score.value, score.explanation) == (line["value"], line["explanation"])


def test_the_harnesses_compare_on_accuracy_and_reprocessed_tokens_with_intervals(
    tmp_path: Path,
) -> None:
    root = tmp_path / "bfcl"
    shutil.copytree(DATA, root)
    table = compare_harnesses(root, HARNESSES)
    assert sorted(table["harness"]) == sorted(HARNESSES)
    for column in ("success", "success_low", "success_high", "reprocessed_per_task"):
        assert table[column].notna().all(), column
    assert (table["reprocessed_low"] <= table["reprocessed_per_task"]).all()
    assert table.attrs["baseline"] == "harness=boxmaker"
    assert "reprocessed/task" in format_harnesses(table)


def test_bench_report_prints_the_table_of_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copytree(DATA / "boxmaker", tmp_path / "b")
    assert main(["bench", "report", str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "simple_python" in out and "BFCL overall" in out
    assert main(["bench", "report", str(tmp_path)]) == 1  # no bench.json: said, not a traceback
