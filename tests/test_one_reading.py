"""The disagreements between views of one session that issue 34 measured, each made equal:
a fork's turn timed alike everywhere, a backup copy of a fork never counted, an edited result
never passed off as a tool run, one loss rule and two named quantities, and a figure the
server never sent never becoming 0. The property over generated logs is tests/test_agreement.py.
"""

from __future__ import annotations

import json
import shutil
import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from extras import need

from boxmaker import frames
from boxmaker.config import Config
from boxmaker.demo import demo_registry
from boxmaker.frames.report import format_json, format_text
from boxmaker.records import (
    Assistant,
    Baseline,
    CacheLoss,
    Usage,
    User,
    format_time,
    parse_time,
)
from boxmaker.session import LogReadWarning, Session, read_log, read_logs, split_turns
from boxmaker.testing import ScriptedClient, Step, answer, call, calls, timings
from boxmaker.turn import Runtime, continue_fork, run_turn


def _runtime(steps: list[Step]) -> Runtime:
    return Runtime(config=Config(), client=ScriptedClient(steps), registry=demo_registry())


def _an_hour_earlier(path: Path) -> None:
    """The parent's records in a log (and its baseline) an hour earlier: the fork was made an
    hour after its parent's turn (a researcher forking yesterday's run)."""
    lines = path.read_text().splitlines()
    out = []
    for k, line in enumerate(lines):
        rec = json.loads(line)
        if k == 0 or rec["type"] != "forked":
            rec["time"] = format_time(parse_time(rec["time"]) - timedelta(hours=1))
        out.append(json.dumps(rec))
    path.write_text("\n".join(out) + "\n")


def _parent_and_edited_fork(folder: Path) -> tuple[Path, Path]:
    registry = demo_registry()
    parent = Session.create(folder, Baseline(tools=registry.definitions()), session_id="p")
    oslo = calls(call("get_weather", {"city": "Oslo"}), timings=timings(0, 100))
    run_turn(parent, _runtime([oslo, answer("Mild.", timings=timings(100, 20))]), "Oslo?")
    parent.close()
    _an_hour_earlier(parent.path)
    edited = Session.open(parent.path, read_only=True).fork(
        call=1, result='{"temperature": -30}', session_id="fork"
    )
    continue_fork(edited, _runtime([answer("Freezing.", timings=timings(100, 25))]))
    edited.close()
    return parent.path, edited.path


def test_a_forks_turn_is_timed_from_the_fork_in_the_frames_the_summary_and_otel(
    tmp_path: Path,
) -> None:
    """Measured: frames.turns 27 ms, the OTel export 2,070 ms, frames.summary starting the
    fork at its parent's start."""
    need("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from boxmaker.export import session_spans

    _, fork = _parent_and_edited_fork(tmp_path / "logs")
    forked_at = pd.Timestamp(read_log(fork).records[0]["time"])
    turn = frames.turns(fork).set_index("turn").loc[1]
    assert not turn["from_parent"] and turn["started"] == forked_at
    assert 0 <= turn["wall_ms"] < 60_000  # not the hour between the parent's run and the fork
    summary = frames.summary(fork).iloc[0]
    assert summary["started"] == forked_at
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    (log,) = read_logs(fork)
    session_spans(split_turns(log), provider.get_tracer("t"))
    (root,) = [s for s in memory.get_finished_spans() if s.name == "invoke_agent boxmaker"]
    assert root.start_time == forked_at.value
    assert ((root.end_time or 0) - (root.start_time or 0)) / 1e6 == pytest.approx(
        turn["wall_ms"], abs=0.001
    )
    # the edited result: no tool ran, no time taken, never "ran"
    (tool,) = [s for s in memory.get_finished_spans() if s.name.startswith("execute_tool")]
    attrs: Any = tool.attributes
    assert (attrs["boxmaker.ran"], attrs["boxmaker.source"]) == (False, "edited")
    assert tool.start_time == tool.end_time
    assert frames.tool_calls(fork).set_index("call").loc[1, "source"] == "edited"
    assert not frames.tool_calls(fork).set_index("call").loc[1, "ran"]


def test_a_backup_copy_of_a_fork_is_left_out_once_by_every_view(tmp_path: Path) -> None:
    """Measured: frames.forks showed two rows for one fork, export otel exported the copied
    turns twice, export inspect wrote two samples with one id and warned twice; the copy named
    backup-of-fork.jsonl (sorted first) was taken for the fork."""
    folder = tmp_path / "logs"
    _, fork = _parent_and_edited_fork(folder)
    shutil.copyfile(fork, folder / "backup-of-fork.jsonl")

    def told(call: Any) -> tuple[Any, list[str]]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LogReadWarning)
            value = call()
        return value, [str(w.message) for w in caught if issubclass(w.category, LogReadWarning)]

    summary, said = told(lambda: frames.summary(folder))
    assert sorted(summary.session.astype(str)) == ["fork", "p"]
    assert summary.set_index("session").loc["fork", "path"] == str(fork)  # <id>.jsonl is it
    assert said == [
        f"{folder / 'backup-of-fork.jsonl'}: a copy of session fork, which is read from "
        f"{fork}; the log is left out"
    ]
    table, said = told(lambda: frames.forks(folder))
    assert table.session.tolist() == ["fork"] and len(said) == 1
    need("inspect_ai")
    from inspect_ai.log import read_eval_log

    from boxmaker.export import export_inspect

    _, said = told(lambda: export_inspect(folder, tmp_path / "run.eval"))
    assert len(said) == 1  # read once, said once
    samples = read_eval_log(str(tmp_path / "run.eval")).samples or []
    assert sorted(str(s.id) for s in samples) == ["fork", "p"]


def test_a_value_the_server_never_sent_is_unknown_in_every_total(tmp_path: Path) -> None:
    """Measured: a vLLM log (no timings) summed to 0 cached, processed and generated tokens;
    a build without cache_n showed a cache-reuse ratio of 0.0; Inspect wrote input_tokens 0."""
    with Session.create(tmp_path, Baseline(), session_id="vllm") as s:
        s.extend([User(content="hi"), Assistant(content="yo")])
        s.append(Usage(prompt_tokens=812, completion_tokens=9))
    with Session.create(tmp_path, Baseline(), session_id="nocache") as s:
        for prompt in (812, 9):
            s.extend([User(content="hi"), Assistant(content="yo")])
            s.append(Usage(timings={"prompt_n": prompt, "predicted_n": 3, "prompt_ms": 1.0}))
    summary = frames.summary(tmp_path).set_index("session")
    vllm, nocache = summary.loc["vllm"], summary.loc["nocache"]
    assert vllm["prompt_tokens"] == 812 and vllm["generated_tokens"] == 9  # sent another way
    assert pd.isna(vllm["cached_tokens"]) and pd.isna(vllm["processed_tokens"])
    assert pd.isna(vllm["cache_reuse_ratio"])
    assert nocache["processed_tokens"] == 821 and pd.isna(nocache["cached_tokens"])
    assert pd.isna(nocache["cache_reuse_ratio"]) and pd.isna(nocache["prompt_tokens"])
    loaded = frames.load(tmp_path)
    rows = {r["session"]: r for r in json.loads(format_json(loaded))["sessions"]}
    assert rows["vllm"]["cached_tokens"] is None and rows["vllm"]["prompt_tokens"] == 812
    assert "unknown" in format_text(loaded)
    duck = None
    try:
        need("duckdb")
        duck = frames.summary(tmp_path, engine="duckdb").set_index("session")
    except pytest.skip.Exception:
        pass
    if duck is not None:
        assert (
            pd.isna(duck.loc["vllm", "cached_tokens"]) and duck.loc["vllm", "prompt_tokens"] == 812
        )
        assert pd.isna(duck.loc["nocache", "cache_reuse_ratio"])
    need("inspect_ai")
    from inspect_ai.log import read_eval_log

    from boxmaker.export import export_inspect

    export_inspect(tmp_path, tmp_path / "run.eval")
    samples = {str(s.id): s for s in read_eval_log(str(tmp_path / "run.eval")).samples or []}
    (usage,) = samples["vllm"].model_usage.values()
    assert (usage.input_tokens, usage.output_tokens) == (812, 9)
    assert usage.input_tokens_cache_read is None  # unknown: left out, never 0
    assert samples["nocache"].model_usage == {}  # the prompt total is unknown: no usage


def test_a_usage_line_without_its_reasoning_figures_is_unknown_in_every_view(
    tmp_path: Path,
) -> None:
    """Another writer's ``usage`` line without ``reasoning_tokens`` and ``thinking_capped``
    (the log's rule lets both go): the frames said unknown, the record objects (transcript,
    scores) 0 and ``False`` (the dataclass defaults), OTel ``False``, and an ATIF round trip
    wrote 0 and ``False`` into the new log."""
    lines: list[dict[str, Any]] = [
        {"type": "baseline", "schema": 4, "session_id": "other", "system": "", "tools": []},
        {"type": "user", "content": "hi"},
        {"type": "assistant", "content": "yo", "tool_calls": []},
        {"type": "usage", "timings": {"cache_n": 0, "prompt_n": 5, "predicted_n": 3}},
        {"type": "turn_end", "outcome": "answered"},
    ]
    for n, line in enumerate(lines):
        line["time"] = f"2026-11-30T07:00:0{n}.000000Z"
    folder = tmp_path / "logs"
    folder.mkdir()
    (folder / "other.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with Session.open(folder / "other.jsonl", read_only=True) as session:
        (usage,) = [r for r in session.records if isinstance(r, Usage)]
    assert (usage.reasoning_tokens, usage.thinking_capped) == (None, None)
    requests = frames.requests(folder)
    assert requests.reasoning_tokens.isna().all() and requests.thinking_capped.isna().all()
    need("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from boxmaker.export import export_atif, import_atif, session_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    (log,) = read_logs(folder)
    session_spans(split_turns(log), provider.get_tracer("t"))
    (chat,) = [s for s in memory.get_finished_spans() if s.name.startswith("chat")]
    assert "boxmaker.thinking_capped" not in (chat.attributes or {})
    (trajectory,) = export_atif(folder, tmp_path / "atif")
    back = tmp_path / "back"
    import_atif(trajectory, back)
    again = frames.requests(back)
    assert again.reasoning_tokens.isna().all() and again.thinking_capped.isna().all()
    (written,) = back.glob("*.jsonl")
    usage_line = next(
        x for x in map(json.loads, written.read_text().splitlines()) if x["type"] == "usage"
    )
    assert "thinking_capped" not in usage_line  # unknown is left out: older readers take it


def test_a_loss_has_one_rule_and_its_two_quantities_one_name_each_in_every_view(
    tmp_path: Path,
) -> None:
    """Measured: cache explain said 206 tokens "lost" (expected - reused), the frames and
    report 236 (re-processed) under the same word."""
    with Session.create(tmp_path, Baseline(), session_id="s") as s:
        s.extend([User(content="hi"), Assistant(content="yo")])
        s.append(Usage(timings={"cache_n": 0, "prompt_n": 777, "predicted_n": 31}))
        s.extend([User(content="and?"), Assistant(content="so")])
        s.append(Usage(timings={"cache_n": 571, "prompt_n": 260, "predicted_n": 3}))
        s.append(CacheLoss(expected=777, reused=571, reprocessed=236))
    losses = frames.cache_losses(tmp_path)
    assert losses[["lost_tokens", "reprocessed_tokens"]].iloc[0].tolist() == [206, 236]
    turn = frames.turns(tmp_path).set_index("turn").loc[2]
    assert (turn["lost_tokens"], turn["reprocessed_tokens"]) == (206, 236)
    rows = json.loads(format_json(frames.load(tmp_path)))["cache_losses"]
    assert (rows[0]["lost_tokens"], rows[0]["reprocessed_tokens"]) == (206, 236)
    from boxmaker.cache import ExplainedLoss

    explained = ExplainedLoss(request=2, expected=777, reused=571, found=None, reprocessed=236)
    assert (explained.to_json()["lost_tokens"], explained.to_json()["reprocessed_tokens"]) == (
        206,
        236,
    )
