"""Forks in the frames: the summary's fork columns and the ``forks`` frame (where a fork
first differs from its parent, what it replayed, its answer next to the parent's)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from extras import ENGINES, has, need

from boxmaker import frames
from boxmaker.config import Config
from boxmaker.demo import demo_registry
from boxmaker.records import Baseline, format_time, parse_time
from boxmaker.session import Session, read_log
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
    # which setting each fork changed (issue 37: the report's Forks table did not say)
    settings = {"p": None, "edited": "{}", "rerun": '{"loop.tool_iterations": 1}'}
    got = summary["fork_settings"].astype(object).where(summary["fork_settings"].notna(), None)
    assert got.to_dict() == settings
    if has("duckdb"):
        duck = frames.summary(tmp_path, engine="duckdb").set_index("session")["fork_settings"]
        assert duck.astype(object).where(duck.notna(), None).to_dict() == settings
    from boxmaker.frames import report

    shown = report.tables(frames.load(tmp_path))["Forks"].set_index("session")
    assert shown["fork_settings"].to_dict() == {"edited": "{}", "rerun": settings["rerun"]}

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
    # (record 6: the fork's Warmed record after its first usage is its own, not compared)
    assert r["first_difference"] == 6
    assert (r["processed_tokens"], r["parent_processed_tokens"]) == (120, 120)


def test_the_report_has_a_forks_table_only_when_there_are_forks() -> None:
    from boxmaker.frames import report

    data = Path(__file__).resolve().parents[1] / "data"
    with_fork = report.tables(frames.load([data / "schema-3.jsonl", data / "schema-4.jsonl"]))
    assert list(with_fork["Forks"]["session"]) == ["schema-4"]
    assert with_fork["Forks"]["parent_session"].tolist() == ["schema-3"]
    assert "Forks" not in report.tables(frames.load(data / "schema-3.jsonl"))


def _fork_folder(tmp_path: Path) -> Path:
    """A parent of two turns and two forks of it: one at an edited tool result of turn 1
    (the turn straddles the fork point) and one after turn 1, each with its own completions."""
    registry = demo_registry()
    folder = tmp_path / "logs"
    parent = Session.create(folder, Baseline(tools=registry.definitions()), session_id="p")
    oslo = calls(call("get_weather", {"city": "Oslo"}), timings=timings(0, 100))
    run_turn(parent, runtime([oslo, answer("Mild.", timings=timings(100, 20))]), "Oslo?")
    run_turn(parent, runtime([answer("Wet.", timings=timings(120, 30))]), "Bergen?")
    edited = parent.fork(call=1, result='{"temperature": -30}', session_id="edited")
    continue_fork(edited, runtime([answer("Freezing.", timings=timings(100, 25))]))
    after = parent.fork(at=1, session_id="after")
    run_turn(after, runtime([answer("Cold.", timings=timings(120, 40))]), "Tromsø?")
    for s in (parent, edited, after):
        s.close()
    return folder


def _own_completions(folder: Path) -> dict[str, list[int]]:
    """Each log's own completions' prompt tokens (cache_n + prompt_n), read from the file:
    a fork's records from its ``Forked.record`` on."""
    out = {}
    for path in sorted(folder.glob("*.jsonl")):
        data = read_log(path, repair=False)
        first = data.records[0]
        start = int(first["record"]) if first["type"] == "forked" else 0
        out[data.session_id] = [
            r["timings"]["cache_n"] + r["timings"]["prompt_n"]
            for r in data.records[start:]
            if r["type"] == "usage"
        ]
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_a_parent_and_its_forks_count_each_completion_once(
    tmp_path: Path, engine: frames.Engine
) -> None:
    folder = _fork_folder(tmp_path)
    own = _own_completions(folder)
    assert own == {"p": [100, 120, 150], "edited": [125], "after": [160]}
    got = frames.load(folder, engine=engine)
    req = got.requests
    mine = req[~req.from_parent].groupby("session", observed=True).prompt_tokens.sum()
    assert mine.to_dict() == {s: sum(v) for s, v in own.items()}
    assert req.prompt_tokens[~req.from_parent].sum() == sum(map(sum, own.values()))
    by_session = req.groupby("session", observed=True).from_parent.agg(list).to_dict()
    assert by_session == {"p": [False] * 3, "edited": [True, False], "after": [True, True, False]}

    columns = ["from_parent", "requests", "iterations", "tool_results", "processed_tokens"]
    turns = {
        (str(r["session"]), int(r["turn"])): [r[c] for c in columns]
        for r in got.turns.to_dict("records")
    }
    # the edited fork's turn 1 straddles the fork point: the fork's own, its own part counted
    assert turns[("edited", 1)] == [False, 1, 0, 1, 25]
    assert turns[("after", 1)] == [True, 2, 1, 1, 120]  # the parent's turn 1, copied whole
    assert turns[("after", 2)] == [False, 1, 0, 0, 40]
    calls_frame = got.tool_calls.set_index("session")
    assert calls_frame.loc["edited", "from_parent"] == False  # noqa: E712 (the edited result)
    assert calls_frame.loc["after", "from_parent"] == True  # noqa: E712 (the parent's result)

    s = got.summary.set_index("session")
    assert s.requests.to_dict() == {k: len(v) for k, v in own.items()}
    assert s.inherited_requests.to_dict() == {"p": 0, "edited": 1, "after": 2}
    assert s.turns.to_dict() == {"p": 2, "edited": 1, "after": 1}
    assert s.inherited_turns.to_dict() == {"p": 0, "edited": 0, "after": 1}
    assert s.answered_turns.to_dict() == {"p": 2, "edited": 1, "after": 1}
    assert (s.cached_tokens + s.processed_tokens).to_dict() == mine.to_dict()
    assert s.tool_calls.to_dict() == {"p": 1, "edited": 0, "after": 0}
    assert s.records.to_dict()["after"] == len(read_log(folder / "after.jsonl").records)


def test_the_report_and_exports_of_a_parent_and_its_forks_count_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from boxmaker.cli import main
    from boxmaker.frames import report

    folder = _fork_folder(tmp_path)
    total = sum(map(sum, _own_completions(folder).values()))
    tables = report.tables(frames.load(folder))
    sessions = {str(r["session"]): r for r in tables["Sessions"].to_dict("records")}
    assert sessions["total"]["requests"] == 5
    assert sessions["total"]["cached_tokens"] + sessions["total"]["processed_tokens"] == total
    assert tables["Turns by outcome"].turns.sum() == 4  # p's two, one of each fork
    assert tables["Tool calls by tool"].results.sum() == 2  # p's call, the edited result
    forks_table = {str(r["session"]): r for r in tables["Forks"].to_dict("records")}
    assert [forks_table["after"][c] for c in ("inherited_turns", "inherited_requests")] == [1, 2]
    assert main(["report", str(folder)]) == 0
    assert "3 session logs, 5 requests (and 3 a fork copied from its parent)" in (
        capsys.readouterr().out
    )

    pq = need("pyarrow.parquet")
    from boxmaker.export import export_otel, write_parquet

    written = write_parquet(folder, tmp_path / "parquet")
    table = pq.read_table(written["requests"]).to_pandas()
    assert table.prompt_tokens[~table.from_parent].sum() == total
    assert pq.read_table(written["summary"]).to_pandas().requests.sum() == 5

    need("opentelemetry.sdk")
    out = tmp_path / "spans.json"
    export_otel(folder, file=out)
    spans = [
        span
        for line in out.read_text().splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]

    def attrs(span: dict[str, Any]) -> dict[str, Any]:
        return {kv["key"]: next(iter(kv["value"].values())) for kv in span["attributes"]}

    chats = [attrs(s) for s in spans if s["name"].startswith("chat ")]
    assert sum(int(a["gen_ai.usage.input_tokens"]) for a in chats) == total  # copies skipped
    turn_spans = [attrs(s) for s in spans if s["name"] == "invoke_agent boxmaker"]
    assert sorted((a["gen_ai.conversation.id"], int(a["boxmaker.turn"])) for a in turn_spans) == [
        ("after", 2),
        ("edited", 1),
        ("p", 1),
        ("p", 2),
    ]
    conversation = {
        s["traceId"]: attrs(s)["gen_ai.conversation.id"]
        for s in spans
        if s["name"] == "invoke_agent boxmaker"
    }
    tools = [conversation[s["traceId"]] for s in spans if s["name"].startswith("execute_tool")]
    assert sorted(tools) == ["edited", "p"]  # the parent's call; the fork's edited result

    need("inspect_ai")
    import warnings

    from boxmaker.export import export_inspect

    written_eval = export_inspect(folder, tmp_path / "forks.eval")
    with warnings.catch_warnings():  # inspect_ai's own import-time deprecations are not ours
        warnings.simplefilter("ignore")
        from inspect_ai.log import read_eval_log

        log = read_eval_log(str(written_eval))
    assert log.samples is not None
    usage = {str(s.id): next(iter(s.model_usage.values())).input_tokens for s in log.samples}
    assert usage == {s: sum(v) for s, v in _own_completions(folder).items()}
    meta = {str(s.id): s.metadata for s in log.samples}
    assert [meta["after"][k] for k in ("boxmaker_turns", "boxmaker_inherited_turns")] == [1, 1]
    assert meta["after"]["boxmaker_outcomes"] == ["answered"]  # its own turn only
    assert meta["edited"]["boxmaker_inherited_requests"] == 1


def _copied_an_hour_earlier(path: Path) -> None:
    """Move the times of a fork's copied records (its records 1..record-1) an hour back, as if
    the parent had run an hour before the fork was made."""
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines[1:]]
    copied = int(records[0]["record"])
    for k in range(1, copied):
        records[k]["time"] = format_time(parse_time(records[k]["time"]) - timedelta(hours=1))
    path.write_text("\n".join([lines[0], *(json.dumps(r) for r in records)]) + "\n")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_turn_a_fork_continues_is_timed_from_the_fork_not_the_parents_run(
    tmp_path: Path, engine: frames.Engine
) -> None:
    folder = _fork_folder(tmp_path)
    _copied_an_hour_earlier(folder / "edited.jsonl")
    _copied_an_hour_earlier(folder / "after.jsonl")
    turns = {
        (str(r["session"]), int(r["turn"])): (r["started"], float(r["wall_ms"]))
        for r in frames.turns(folder, engine=engine).to_dict("records")
    }
    forked = {
        s: pd.Timestamp(read_log(folder / f"{s}.jsonl", repair=False).records[0]["time"])
        for s in ("edited", "after")
    }
    # the edited fork's turn 1 straddles the fork point: timed from the Forked record, not
    # from the parent's user message an hour before (that wall time was ~3,600,000 ms)
    started, wall_ms = turns[("edited", 1)]
    assert started == forked["edited"]
    assert 0 <= wall_ms < 60_000
    # a turn copied whole keeps the parent's times; a turn of the fork's own its user's
    started, wall_ms = turns[("after", 1)]
    assert started < forked["after"] and wall_ms < 60_000
    assert turns[("after", 2)][0] >= forked["after"]
    assert all(wall < 60_000 for (s, _), (_, wall) in turns.items() if s == "p")


def test_a_fork_is_compared_with_the_parents_turns_it_ran_again(tmp_path: Path) -> None:
    """The newcomer trial (issue 37): a fork that ran one turn was compared with all the
    parent's turns after the fork point (its answer with the parent's third turn's)."""
    parent = Session.create(tmp_path, Baseline(), session_id="p")
    for n, text in enumerate(["One.", "Two.", "Three."]):
        step = answer(text, timings=timings(100 * n, 10 + n))
        run_turn(parent, runtime([step]), f"q{n}")
    fork = parent.fork(at=1, rerun=True, session_id="f")
    continue_fork(fork, runtime([answer("Uno.", timings=timings(0, 10))]))
    for s in (parent, fork):
        s.close()
    row = frames.forks(tmp_path).set_index("session").loc["f"]
    assert (row["answer"], row["parent_answer"]) == ("Uno.", "One.")  # turn 1 with turn 1
    assert (row["requests"], row["parent_requests"]) == (1, 1)
    assert (row["processed_tokens"], row["parent_processed_tokens"]) == (10, 10)
    # the same figure as the requests frame's for those completions
    req = frames.requests(tmp_path)
    own = req[(req.session == "f") & ~req.from_parent]
    assert own.processed_tokens.sum() == row["processed_tokens"]


def test_describe_gives_the_forks_columns_and_names_the_frames() -> None:
    """``frames.describe("forks")`` raised a bare ``KeyError: 'forks'`` (the newcomer trial)."""
    table = frames.describe("forks").set_index("column")
    assert list(table.index) == list(frames.forks([]).columns)
    assert table.loc["processed_tokens", "dtype"] == "Int64"
    assert "requests frame's processed_tokens" in str(table.loc["processed_tokens", "doc"])
    with pytest.raises(KeyError, match=r"no frame 'fork': one of requests, .*, forks"):
        frames.describe("fork")
