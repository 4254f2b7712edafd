"""Forks in the frames: the summary's fork columns and the ``forks`` frame (where a fork
first differs from its parent, what it replayed, its answer next to the parent's)."""

from __future__ import annotations

import json
from pathlib import Path

from boxmaker import frames
from boxmaker.config import Config
from boxmaker.demo import demo_registry
from boxmaker.records import Baseline
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, Step, answer, call, calls, timings
from boxmaker.turn import Replay, Runtime, continue_fork, run_turn


def runtime(steps: list[Step]) -> Runtime:
    return Runtime(config=Config(), client=ScriptedClient(steps), registry=demo_registry())


def test_forks_frame_and_summary_columns(tmp_path: Path) -> None:
    registry = demo_registry()
    parent = Session.create(tmp_path, Baseline(tools=registry.definitions()), session_id="p")
    oslo = calls(call("get_weather", {"city": "Oslo"}), timings=timings(0, 100))
    run_turn(parent, runtime([oslo, answer("Mild.", timings=timings(100, 20))]), "Oslo?")
    edited = parent.fork(call=1, result='{"temperature": -30}', session_id="edited")
    continue_fork(edited, runtime([answer("Freezing.", timings=timings(100, 20))]))
    rerun = parent.fork(at=1, rerun=True, session_id="rerun", settings={"loop.tool_iterations": 1})
    rerun_rt = runtime([oslo, answer("Mild.", timings=timings(100, 20))])
    rerun_rt.replay = Replay.of(rerun)
    continue_fork(rerun, rerun_rt)
    for s in (parent, edited, rerun):
        s.close()

    summary = frames.summary(tmp_path).set_index("session")
    assert summary["parent_session"].isna()["p"]
    assert summary.loc["edited", "parent_session"] == "p"
    assert summary.loc["edited", "fork_point"] == "edited_result"
    assert summary.loc["rerun", "fork_turn"] == 1

    table = frames.forks(tmp_path).set_index("session")
    assert sorted(table.index) == ["edited", "rerun"]
    e = table.loc["edited"]
    # Forked, user, assistant, usage, then the edited result: the first record that differs
    assert e["first_difference"] == 5 and e["edited_call"] == 1
    assert (e["answer"], e["parent_answer"], e["same_answer"]) == ("Freezing.", "Mild.", False)
    assert (e["requests"], e["parent_requests"]) == (1, 1)  # after the fork point
    r = table.loc["rerun"]
    assert json.loads(str(r["settings"])) == {"loop.tool_iterations": 1}
    assert r["replayed"] == 1 and r["same_answer"]
    # the replayed result carries source=replayed, the parent's did not: it differs there
    assert r["first_difference"] == 5
    assert (r["prompt_tokens"], r["parent_prompt_tokens"]) == (120, 120)


def test_the_report_has_a_forks_table_only_when_there_are_forks() -> None:
    from boxmaker.frames import report

    data = Path(__file__).resolve().parents[1] / "data"
    with_fork = report.tables(frames.load([data / "schema-3.jsonl", data / "schema-4.jsonl"]))
    assert list(with_fork["Forks"]["session"]) == ["schema-4"]
    assert with_fork["Forks"]["parent_session"].tolist() == ["schema-3"]
    assert "Forks" not in report.tables(frames.load(data / "schema-3.jsonl"))
