"""Scoring and comparing a batch folder: scores.ndjson apart from the logs, re-scoring offline
leaves it as it was, a failing scorer is an error score, malformed targets are refused with the
task named, compare's table and CLI; and live, a batch with targets on the embedded server."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from boxmaker.batch import (
    Task,
    compare,
    format_compare,
    load_tasks,
    manifest,
    read_scores,
    run_batch,
    score_batch,
    scores,
)
from boxmaker.batch._manifest import Manifest
from boxmaker.cli import main
from boxmaker.errors import ConfigError
from boxmaker.records import (
    Assistant,
    Baseline,
    LimitHit,
    Record,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
)
from boxmaker.score import Scorer
from boxmaker.session import Session

TARGET = {
    "answer": {"contains": "34 C"},
    "calls": [{"name": "get_weather", "arguments": {"city": "Lisbon"}}],
}


def _records(city: str, answer: str, *, limit: bool = False) -> list[Record]:
    call = ToolCall(id="c1", name="get_weather", arguments=json.dumps({"city": city}))
    timings = {"cache_n": 0, "prompt_n": 100, "predicted_n": 20, "prompt_ms": 50.0}
    out: list[Record] = [
        User(content="What is the weather in Lisbon?"),
        Assistant(content=None, tool_calls=(call,)),
        Usage(timings=timings, finish_reason="tool_calls"),
        ToolResult(call=1, tool_call_id="c1", name="get_weather", content="{}"),
        Assistant(content=answer),
        Usage(timings={**timings, "cache_n": 120, "prompt_n": 10}, finish_reason="stop"),
    ]
    if limit:
        out.append(LimitHit(kind="tool_result_cap", detail="capped"))
    out.append(TurnEnd(outcome="answered"))
    return out


def _batch(folder: Path, runs: dict[str, tuple[str, Any, Any, list[Record]]]) -> Path:
    """A batch folder by hand: run id -> (task, setting value, target, records)."""
    book = Manifest(folder)
    for run, (task, value, target, records) in runs.items():
        extra = {} if target is None else {"target": target}
        book.write(run, "planned", task=task, settings={"loop.cap": value}, messages=1, **extra)
        with Session.create(folder / "logs", Baseline(), session_id=run) as session:
            session.extend(records)
        book.write(run, "done", turns=1, outcome="answered")
    book.close()
    return folder


def _two_settings(tmp_path: Path) -> Path:
    right = _records("Lisbon", "In Lisbon it is 34 C.")
    wrong = _records("Lisboa", "In Lisboa it is 12 C.", limit=True)
    runs = {}
    for i in range(6):
        runs[f"t{i}.a"] = (f"t{i}", 40, TARGET, right if i < 5 else wrong)
        runs[f"t{i}.b"] = (f"t{i}", 4000, TARGET, right if i < 2 else wrong)
    return _batch(tmp_path / "b", runs)


def test_scores_are_written_apart_from_the_logs_and_rescoring_changes_nothing(
    tmp_path: Path,
) -> None:
    folder = _two_settings(tmp_path)
    logs_before = {p.name: p.read_bytes() for p in (folder / "logs").iterdir()}
    frame = score_batch(folder)
    assert len(frame) == 12 and set(frame["scorer"]) == {"target"}
    by_run = dict(zip(frame["run"], frame["value"], strict=True))
    assert by_run["t0.a"] == 1.0 and by_run["t5.a"] == 0.0 and by_run["t2.b"] == 0.0
    assert list(frame.columns[:3]) == ["run", "task", "loop.cap"]
    text = (folder / "scores.ndjson").read_bytes()
    assert len(text.splitlines()) == 12
    score_batch(folder)  # offline, again
    assert (folder / "scores.ndjson").read_bytes() == text
    assert {p.name: p.read_bytes() for p in (folder / "logs").iterdir()} == logs_before
    line = json.loads(text.splitlines()[0])
    assert set(line) == {"time", "run", "task", "scorer", "version", "value", "explanation"}


def test_a_scorer_that_raises_is_recorded_as_an_error_and_the_rest_still_score(
    tmp_path: Path,
) -> None:
    folder = _two_settings(tmp_path)

    def calls_made(records: Sequence[Record]) -> float:
        if any(isinstance(r, LimitHit) for r in records):
            raise RuntimeError("cannot score a capped run")
        return 1.0

    frame = score_batch(folder, [Scorer(name="calls", fn=calls_made, version="2")])
    mine = frame[frame["scorer"] == "calls"]
    assert len(mine) == 12
    failed = mine[mine["error"].notna()]
    assert set(failed["run"]) == {"t5.a", "t2.b", "t3.b", "t4.b", "t5.b"}
    assert failed["value"].isna().all()
    assert failed["error"].iloc[0] == "RuntimeError: cannot score a capped run"
    lines = [s for s in read_scores(folder) if s["scorer"] == "calls"]
    assert sum(s["value"] is None for s in lines) == 5 and lines[0]["version"] == "2"


def test_compare_gives_rates_intervals_differences_and_costs(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    score_batch(folder)
    table = compare(folder, "loop.cap", baseline="loop.cap=40", resamples=1000, seed=3)
    assert list(table["setting"]) == ["loop.cap=40", "loop.cap=4000"]
    assert list(table["loop.cap"]) == [40, 4000]
    assert list(table["success"]) == pytest.approx([5 / 6, 2 / 6])
    assert list(table["runs"]) == [6, 6] and list(table["tasks"]) == [6, 6]
    assert table["success_low"].iloc[0] <= 5 / 6 <= table["success_high"].iloc[0]
    assert table["diff"].iloc[1] == pytest.approx(-0.5)
    assert table["diff_high"].iloc[1] < 0  # paired: task by task the larger cap never wins
    assert table["diff"].iloc[0] == 0.0
    assert list(table["generated_tokens"]) == [40.0, 40.0]
    assert list(table["prefill_ms"]) == [100.0, 100.0]
    assert list(table["tool_result_cap_hits"]) == pytest.approx([1 / 6, 4 / 6])
    assert table.attrs == {
        "seed": 3,
        "resamples": 1000,
        "confidence": 0.95,
        "scorer": "target",
        "baseline": "loop.cap=40",
    }
    again = compare(folder, "loop.cap", resamples=1000, seed=3)
    assert again[["success_low", "success_high"]].equals(table[["success_low", "success_high"]])
    text = format_compare(table)
    assert "seed 3" in text and "1000 resamples" in text and "baseline" in text
    assert text.splitlines()[1].split()[:3] == ["loop.cap", "runs", "success"]  # a column each
    long = table.assign(**{"loop.cap": ["a" * 45 + "1", "a" * 45 + "2"]})
    shown = format_compare(long)  # issue 37: labels cut at 40 characters read the same
    assert "a" * 45 + "1" in shown and "a" * 45 + "2" in shown
    with pytest.raises(ConfigError, match="unknown setting column"):
        compare(folder, "loop.nope")
    with pytest.raises(
        ConfigError, match="no scores of scorer 'other'; the batch has scores of: target"
    ):
        compare(folder, scorer="other")
    with pytest.raises(ConfigError, match="baseline 'x' is none of the settings"):
        compare(folder, baseline="x")


def test_malformed_targets_are_refused_naming_the_task(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"task lisbon: answer regex '\('"):
        Task(id="lisbon", messages=("q",), target={"answer": {"regex": "("}})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        json.dumps({"id": "ok", "message": "q", "target": TARGET})
        + "\n"
        + json.dumps({"id": "oslo", "message": "q", "target": {"calls": "get_weather"}})
        + "\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_tasks(tasks)
    assert "tasks.jsonl:2" in str(caught.value) and "task oslo" in str(caught.value)


def test_score_and_compare_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _two_settings(tmp_path)
    assert main(["score", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "target: 12 run(s), mean 0.583" in out and "scores.ndjson" in out
    assert main(["compare", str(folder), "--by", "loop.cap", "--seed", "5"]) == 0
    out = capsys.readouterr().out
    assert "seed 5" in out and "loop.cap=40" in out and "0.83 [" in out
    assert main(["compare", str(folder), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["setting"] for r in rows] == ["loop.cap=40", "loop.cap=4000"]
    assert main(["score", str(folder), "--scorer", "nowhere.module:fn"]) == 1
    assert "--scorer 'nowhere.module:fn'" in capsys.readouterr().err


def test_a_scorer_in_the_current_folder_needs_no_pythonpath(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37: ``score --scorer graders:said_hi`` with graders.py in the current folder
    failed until PYTHONPATH=.; compare --scorer of a name not scored listed none."""
    folder = _two_settings(tmp_path)
    (tmp_path / "boxmaker_graders_here.py").write_text("def said_hi(records):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    assert main(["score", str(folder), "--scorer", "boxmaker_graders_here:said_hi"]) == 0
    assert "boxmaker_graders_here:said_hi" in capsys.readouterr().out
    assert main(["compare", str(folder), "--scorer", "said_hi"]) == 1
    err = capsys.readouterr().err
    assert "the batch has scores of: boxmaker_graders_here:said_hi, target" in err


@pytest.mark.live
def test_a_batch_with_targets_is_scored_on_the_embedded_server(tmp_path: Path) -> None:
    from boxmaker.demo import demo_registry
    from boxmaker.server import EmbeddedServer

    lisbon = {"calls": [{"name": "get_weather", "arguments": {"city": "Lisbon"}}]}
    tokyo = {"calls": [{"name": "get_time", "arguments": {"city": "Tokyo"}}], "match": "strict"}
    tasks = [
        Task(id="lisbon", messages=("What is the weather in Lisbon?",), target=lisbon),
        Task(id="tokyo", messages=("What time is it in Tokyo?",), target=tokyo),
    ]
    grid = {"loop.thinking_tokens": [64, 512]}
    with EmbeddedServer(n_ctx=8192, n_parallel=2, n_threads=1) as server:
        progress = run_batch(
            tasks, tmp_path / "b", servers=[server], grid=grid, registry=demo_registry()
        )
    assert progress.done == 4 and progress.failed == 0
    frame = score_batch(tmp_path / "b")
    assert len(frame) == 4
    assert frame["value"].notna().all()
    # the shipped model calls the right tool with the city copied (its card: 177/180 calls)
    assert frame["value"].sum() >= 3, frame[["run", "value", "explanation"]]
    table = compare(tmp_path / "b", resamples=500)
    assert list(table["runs"]) == [2, 2]
    assert all(not math.isnan(v) for v in table["processed_tokens"])
    text = (tmp_path / "b" / "scores.ndjson").read_bytes()
    score_batch(tmp_path / "b")
    assert (tmp_path / "b" / "scores.ndjson").read_bytes() == text
    assert scores(tmp_path / "b")["run"].nunique() == 4


def test_the_success_versus_cost_plot_and_the_compare_view(tmp_path: Path) -> None:
    from boxmaker.batch import CompareView, success_vs_cost

    folder = _two_settings(tmp_path)
    score_batch(folder)
    table = compare(folder, "loop.cap", resamples=200)
    figure = success_vs_cost(table, "prefill_ms")
    ax = figure.axes[0]
    assert len(ax.containers) == 2  # one error bar per setting
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "loop.cap=40 (baseline)",
        "loop.cap=4000",
    ]
    with pytest.raises(ConfigError, match="'nope' is not a cost column"):
        success_vs_cost(table, "nope")
    view = CompareView(table)
    assert view._plot.value.startswith("<img alt='success vs prefill_ms'")
    first = view._plot.value
    view._pick.value = "generated_tokens"
    assert view._plot.value != first and "generated_tokens" in view._plot.value
    assert "loop.cap=40" in view._text.value and type(view).__module__ == "boxmaker.batch"


def _looping(calls: int, city: str = "Lisbon") -> list[Record]:
    """One turn: the same call ``calls`` times, one completion each, then an answer."""
    out: list[Record] = [User(content="Keep checking the weather.")]
    for i in range(calls):
        call = ToolCall(id=f"c{i}", name="get_weather", arguments=json.dumps({"city": city}))
        out += [
            Assistant(content=None, tool_calls=(call,)),
            Usage(timings={}, reasoning_tokens=30),
            ToolResult(call=i + 1, tool_call_id=call.id, name="get_weather", content="{}"),
        ]
    return [*out, Assistant(content="done"), Usage(timings={}), TurnEnd(outcome="answered")]


def test_calibrating_limits_counts_runaways_stopped_and_good_runs_cut() -> None:
    from boxmaker.batch import calibrate, rules_fired
    from boxmaker.config import LoopLimits

    runs = {"loop1": _looping(6), "loop2": _looping(4), "good": _looping(1), "two": _looping(2)}
    runaway = {"loop1": True, "loop2": True, "good": False, "two": False}
    off = LoopLimits(repeat_detection=False, tool_iterations=None)
    assert rules_fired(runs["loop1"], LoopLimits(repeat_ends_turn_at=3)) >= {"repeated_call"}
    assert rules_fired(runs["good"], off) == set()
    table = calibrate(
        runs, runaway, {"tool_iterations": [1, 3, 10], "thinking_tokens": [None]}, base=off
    )
    iterations = table[table["rule"] == "tool_iterations"].set_index("tool_iterations")
    assert list(iterations["runaways_stopped"]) == [2, 2, 0]
    assert list(iterations["good_cut"]) == [1, 0, 0]  # a cap of 1 cuts the run of 2 calls
    assert set(iterations["runaways"]) == {2} and set(iterations["good"]) == {2}
    capped = calibrate(runs, runaway, {"thinking_tokens": [100]}, base=off)
    think = capped[capped["rule"] == "thinking_cap"].iloc[0]
    assert (think["runaways_stopped"], think["good_cut"]) == (2, 0)  # 4 x 30 and 6 x 30 tokens
    anyrule = capped[capped["rule"] == "any"].iloc[0]
    assert anyrule["stop_rate"] == 1.0 and anyrule["cut_rate"] == 0.0
    with pytest.raises(ConfigError, match="unknown LoopLimits knobs"):
        calibrate(runs, runaway, {"nope": [1]})
    with pytest.raises(ConfigError, match="no run has a label"):
        calibrate(runs, {}, {"tool_iterations": [1]})


def test_the_html_report_of_a_batch_shows_its_runs_and_the_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issues 21 and 26: the HTML report named a batch's runs by hash only and left the
    comparison of settings out."""
    folder = _two_settings(tmp_path)
    page = tmp_path / "report.html"
    assert main(["report", str(folder), "--html", str(page)]) == 0
    unscored = page.read_text()
    assert f"Batch runs in {folder}" in unscored
    assert "not scored: run boxmaker score on the batch" in unscored
    for run in manifest(folder).run:
        assert f"<td>{run}</td>" in unscored
    assert main(["score", str(folder)]) == 0
    assert main(["report", str(folder), "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert f"Settings compared in {folder}" in out and "seed 0" in out  # the text report too
    scored = page.read_text()
    table = compare(folder)
    assert f"Settings compared in {folder}" in scored and "seed 0" in scored
    for setting, success in zip(table.setting, table.success, strict=True):
        assert f"<td>{setting}</td>" in scored
        assert f"<td>{success:.6f}</td>" in scored
    assert scored.count('src="data:image/png;base64,') == unscored.count("data:image/png") + 1
