"""The DuckDB engine of boxmaker.frames: on generated logs (every record type, shared ids and
call numbers, hostile text, unknown records, older schemas, odd times, torn and repeated
lines) both engines give equal frames and the same warnings; query() runs SQL over them."""

from __future__ import annotations

import json
import os
import shutil
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from extras import need
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal

from boxmaker import frames
from boxmaker.errors import SessionError
from boxmaker.frames import _duck
from boxmaker.records import (
    FORK_POINTS,
    LIMIT_KINDS,
    NOT_RUN_REASONS,
    SCHEMA_VERSION,
    TURN_END_OUTCOMES,
    Approval,
    Assistant,
    CacheLoss,
    Forked,
    LimitHit,
    Record,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
    format_time,
    parse_time,
    record_to_json,
)

need("duckdb")

DATA = Path(__file__).resolve().parents[1] / "data"
T0 = datetime(2026, 11, 30, 7, 0, 0, tzinfo=UTC)
HOSTILE = st.sampled_from(["<script>alert(1)</script>", "\x1b[2J", "a'b\"c", "é😀", "\n{}", ""])
text = st.text(max_size=6) | HOSTILE
ids = st.sampled_from(["c1", "c2", "c'3"])
timings = st.fixed_dictionaries(
    {
        "cache_n": st.integers(0, 10_000),
        "prompt_n": st.integers(0, 5_000),
        "predicted_n": st.integers(0, 2_000),
        "prompt_ms": st.floats(0, 1e4, allow_nan=False) | st.integers(0, 50),
        "predicted_ms": st.floats(0, 1e4, allow_nan=False),
    },
    optional={"extra": st.integers(0, 5)},
)
a_record = st.one_of(
    st.builds(User, content=text),
    st.builds(
        Assistant,
        content=st.none() | text,
        tool_calls=st.lists(
            st.builds(ToolCall, id=ids, name=st.just("f"), arguments=text), max_size=3
        ).map(tuple),
    ),
    st.builds(
        Usage,
        timings=timings | st.just({}),
        reasoning_tokens=st.integers(0, 500),
        thinking_capped=st.booleans(),
        finish_reason=st.none() | st.sampled_from(["stop", "length", "tool_calls"]),
    ),
    st.builds(
        CacheLoss,
        expected=st.integers(0, 1000),
        reused=st.integers(0, 1000),
        reprocessed=st.none() | st.integers(0, 1000),
        cause=st.none() | st.sampled_from(["evicted", "checkpoint"]),
        detail=text,
    ),
    st.builds(
        ToolResult,
        call=st.integers(1, 3),
        tool_call_id=ids,
        name=st.sampled_from(["f", "g"]),
        content=text,
        truncated=st.booleans(),
        not_run=st.none() | st.sampled_from(NOT_RUN_REASONS),
    ),
    st.builds(
        Approval,
        call=st.integers(1, 3),
        name=st.just("f"),
        decision=st.sampled_from(["approved", "denied"]),
        by=text,
        reason=text,
        waited_ms=st.floats(0, 100),
    ),
    st.builds(LimitHit, kind=st.sampled_from(LIMIT_KINDS), detail=text),
    st.builds(
        TurnEnd,
        outcome=st.sampled_from(TURN_END_OUTCOMES),
        detail=text,
        status=st.none() | st.integers(100, 599),
    ),
)


def _lines(sid: str, records: list[Record], unknown: bool) -> list[dict[str, Any]]:
    head = {
        "type": "baseline",
        "schema": SCHEMA_VERSION,
        "session_id": sid,
        "time": format_time(T0),
        "system": "",
        "tools": [],
    }
    out: list[dict[str, Any]] = [head]
    for n, r in enumerate(records):
        rec = record_to_json(r)
        rec["time"] = format_time(T0 + timedelta(seconds=n, microseconds=n * 7))
        out.append(rec)
    if unknown:
        out.insert(1, {"type": "future", "time": format_time(T0), "call": "x", "timings": 3})
    return out


def assert_engines_agree(source: Any) -> frames.Frames:
    """Both engines: equal frames (floats summed in another order: to 1e-9) and the same
    warnings, in the same words; the frames."""
    with warnings.catch_warnings(record=True) as by_pandas:
        warnings.simplefilter("always")
        a = frames.load(source)
    with warnings.catch_warnings(record=True) as by_duckdb:
        warnings.simplefilter("always")
        b = frames.load(source, engine="duckdb")
    assert sorted(str(w.message) for w in by_pandas) == sorted(str(w.message) for w in by_duckdb)
    for name in frames.Frames._fields:
        assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=False, rtol=1e-9)
    return a


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sessions=st.lists(
        st.tuples(st.lists(a_record, max_size=20), st.booleans(), st.booleans()),
        min_size=1,
        max_size=3,
    ),
    forks=st.lists(
        st.tuples(
            st.integers(0, 5),  # which log (a later fork may fork an earlier one)
            st.integers(0, 20),  # how many of its records are copied
            st.sampled_from(FORK_POINTS),
            st.lists(a_record, max_size=8),
        ),
        max_size=3,
    ),
)
def test_both_engines_give_equal_frames(
    tmp_path: Path,
    sessions: list[tuple[list[Record], bool, bool]],
    forks: list[tuple[int, int, str, list[Record]]],
) -> None:
    folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    logs: list[list[dict[str, Any]]] = []
    for n, (records, unknown, torn) in enumerate(sessions):
        lines = _lines(f"g{n}", records, unknown)
        logs.append(lines)
        body = "".join(json.dumps(o, ensure_ascii=n % 2 == 0) + "\n" for o in lines)
        (folder / f"g{n}.jsonl").write_text(body + ('{"type": "us' if torn else ""), "utf-8")
    for n, (of, cut, point, own) in enumerate(forks):
        lines = fork_lines(logs[of % len(logs)], f"f{n}", cut, point, own)
        logs.append(lines)  # a later fork may fork this one
        (folder / f"f{n}.jsonl").write_text("".join(json.dumps(o) + "\n" for o in lines))
    got = assert_engines_agree(folder)
    # the summary counts each log's own rows, its copied ones apart; a turn its rows' origin
    summary = got.summary.set_index("session")
    for frame, total, inherited in (
        (got.requests, "requests", "inherited_requests"),
        (got.turns, "turns", "inherited_turns"),
        (got.limit_hits, "limit_hits", None),
        (got.cache_losses, "cache_losses", None),
    ):
        for copied, column in ((False, total), (True, inherited)):
            counted = frame[frame.from_parent == copied].groupby("session", observed=False)
            if column is not None:
                want = counted.size().reindex(summary.index, fill_value=0)
                assert summary[column].tolist() == want.tolist()
    by_turn = got.requests.groupby(["session", "turn", "from_parent"], observed=True).size()
    sizes: dict[Any, int] = {k: int(v) for k, v in by_turn.items()}
    for row in got.turns.itertuples():
        assert row.requests == sizes.get((row.session, row.turn, row.from_parent), 0)
    assert not any(got.summary.inherited_requests[got.summary.parent_session.isna()])


def fork_lines(
    parent: list[dict[str, Any]], sid: str, cut: int, point: str, own: list[Record]
) -> list[dict[str, Any]]:
    """A fork's log of the log ``parent`` (its JSON lines, the baseline first), as
    :meth:`Session.fork` writes one: the baseline, a ``Forked`` record, the parent's records
    before ``cut`` (clipped to them; the parent's own ``Forked`` record too, for a fork of a
    fork), an edited tool result for ``edited_result``, then ``own`` (later times)."""
    copied = [dict(r) for r in parent[1 : 1 + cut]]
    turns = sum(1 for r in copied if r["type"] == "user")
    edited = [
        {**record_to_json(ToolResult(call=1, tool_call_id="c1", name="f", content="edited",
                                     source="edited")), "time": format_time(T0)}
    ] if point == "edited_result" else []  # fmt: skip
    forked = record_to_json(
        Forked(
            parent_session=parent[0]["session_id"],
            parent_path="x.jsonl",
            parent_schema=SCHEMA_VERSION,
            turn=max(turns, 1),
            point=point,  # type: ignore[arg-type]
            record=len(copied) + 1,
            edited_call=1 if edited else None,
        )
    )
    forked["time"] = format_time(T0)
    later = _lines(sid, own, False)[1:]
    for k, rec in enumerate(later):
        rec["time"] = format_time(T0 + timedelta(hours=1, seconds=k))
    return [{**parent[0], "session_id": sid}, forked, *copied, *edited, *later]


def _zoo(tmp_path: Path) -> None:
    """Logs of every schema, a refused one, a copy of another, odd times, a lone surrogate and
    a duplicated line, in ``tmp_path``."""
    for p in DATA.glob("schema-*.jsonl"):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "bad.jsonl").write_text('{"type": "baseline", "schema": 1}\nnot json\n')
    (tmp_path / "copy.jsonl").write_bytes((DATA / "schema-3.jsonl").read_bytes())
    (tmp_path / "week.jsonl").write_text(
        json.dumps({**_lines("w", [], False)[0], "time": "2026-W48-1T07:00:00+01:00"})
        + "\n"
        + json.dumps({"type": "user", "time": "2026-W48-1T07:00:01+01:00", "content": "x"})
        + "\n"
        + json.dumps({"type": "user", "time": "2026-11-30T07:00:02Z", "content": "\ud800"})
        + "\n"
        + json.dumps({"type": "user", "time": "2026-11-30T07:00:02Z", "content": "\ud800"})
        + "\n"
    )


def test_logs_of_every_schema_and_refused_logs_agree(tmp_path: Path) -> None:
    _zoo(tmp_path)
    assert_engines_agree(tmp_path)
    with pytest.warns(frames.LogReadWarning, match="duplicated line"):
        turns = frames.turns(tmp_path / "week.jsonl", engine="duckdb")
    assert turns.started[0] == parse_time("2026-W48-1T07:00:01+01:00")
    assert turns.wall_ms.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("checkpoint", [1, 3])
def test_logs_read_a_batch_at_a_time_and_compressed_give_the_same_frames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, checkpoint: int
) -> None:
    """Every log its own batch (BATCH_BYTES 1), the rows compressed after each batch or after
    every few batches and at the end: the frames equal the pandas engine's, and the
    ``records`` table holds compressed columns."""
    _zoo(tmp_path)
    sizes = sorted(p.stat().st_size for p in tmp_path.iterdir())
    monkeypatch.setattr(_duck, "BATCH_BYTES", 1)
    monkeypatch.setattr(_duck, "CHECKPOINT_BYTES", sum(sizes[:checkpoint]))
    assert_engines_agree(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", frames.LogReadWarning)
        con = _duck.connect(tmp_path)
        want = len(frames.requests(tmp_path))
    try:
        kinds = {k for (k,) in con.execute(
            "SELECT DISTINCT compression FROM pragma_storage_info('records')"
        ).fetchall()}  # fmt: skip
        assert {"Constant", "RLE"} <= kinds, kinds  # (a tiny column may stay uncompressed)
        assert con.execute("SELECT count(*) FROM requests").fetchone() == (want,) != (0,)
    finally:
        con.close()


def test_small_logs_rows_are_not_compressed(tmp_path: Path) -> None:
    """Below CHECKPOINT_BYTES of logs no checkpoint is made (it costs more than it saves)."""
    _zoo(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", frames.LogReadWarning)
        con = _duck.connect(tmp_path)
    try:
        kinds = con.execute(
            "SELECT DISTINCT compression FROM pragma_storage_info('records')"
        ).fetchall()
        assert kinds == [("Uncompressed",)]
    finally:
        con.close()


def test_query_runs_sql_over_the_frames() -> None:
    got = frames.query(
        "SELECT session, sum(generated_tokens) AS n FROM requests GROUP BY session ORDER BY 1",
        DATA,
    )
    want = frames.requests(DATA).groupby("session", observed=True).generated_tokens.sum()
    assert got.n.tolist() == want.tolist()
    assert got.session.tolist() == sorted(want.index)
    with pytest.raises(frames.EngineError, match="no_such"):
        frames.query("SELECT * FROM no_such", DATA)
    with pytest.raises(SessionError, match="no such file"):
        frames.query("SELECT 1", DATA / "nope.jsonl")


@pytest.mark.parametrize("name", ["requests", "turns", "cache_losses", "tool_calls", "summary"])
def test_query_shows_the_frames_columns_not_the_engines_keys(name: str) -> None:
    """Issue 37: ``SELECT *`` gave the hidden join keys (``_l``, ``_i``, ``_turn``) too."""
    got = frames.query(f"SELECT * FROM {name}", DATA)
    assert list(got.columns) == list(getattr(frames, name)(DATA).columns)
    assert len(got) == len(getattr(frames, name)(DATA))
    assert frames.query("SELECT count(*) AS n FROM records", DATA).n[0] > len(got) > 0


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="engine 'spark'"):
        frames.turns(DATA, engine="spark")  # type: ignore[arg-type]


def test_empty_sources_give_empty_frames_with_the_same_dtypes() -> None:
    a, b = frames.load([]), frames.load([], engine="duckdb")
    for name in frames.Frames._fields:
        assert_frame_equal(getattr(a, name), getattr(b, name))


def test_edge_cases_of_the_row_rules_agree(tmp_path: Path) -> None:
    """An approval is used by the first result of its call only; a usage without an assistant
    before it (since the last usage) has no tool_calls count; a repeated call id takes the
    later arguments; records before the first user message belong to no turn."""
    t = [format_time(T0 + timedelta(seconds=s)) for s in range(20)]
    calls = [
        {"id": "a", "name": "f", "arguments": "x"},
        {"id": "a", "name": "f", "arguments": "xyz"},
    ]
    recs: list[dict[str, Any]] = [
        {"type": "usage", "time": t[1], "timings": {"cache_n": 1, "prompt_n": 0}},
        {"type": "limit_hit", "time": t[1], "kind": "loop", "detail": "before"},
        {"type": "user", "time": t[2], "content": "q"},
        {"type": "assistant", "time": t[3], "content": None, "tool_calls": calls},
        {"type": "usage", "time": t[4], "timings": {"cache_n": 0, "prompt_n": 0, "prompt_ms": 2}},
        {"type": "usage", "time": t[5], "finish_reason": "length"},
        {"type": "approval", "time": t[6], "call": 1, "name": "f", "decision": "denied",
         "by": "code"},
        {"type": "tool_result", "time": t[7], "call": 1, "tool_call_id": "a", "name": "f",
         "content": "r"},
        {"type": "tool_result", "time": t[8], "call": 1, "tool_call_id": "a", "name": "f",
         "content": "again"},
        {"type": "cache_loss", "time": t[9], "expected": 5, "reused": 1},
        {"type": "assistant", "time": t[10], "content": "done", "tool_calls": []},
        {"type": "usage", "time": t[11], "finish_reason": "length"},
        {"type": "user", "time": t[12], "content": "q2"},
        {"type": "tool_result", "time": t[13], "call": 2, "tool_call_id": "zz", "name": "g",
         "content": "x", "not_run": "cancelled"},
    ]  # fmt: skip
    head = _lines("edge", [], False)[0]
    (tmp_path / "edge.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [head, *recs]))
    assert_engines_agree(tmp_path)
    calls_frame = frames.tool_calls(tmp_path, engine="duckdb")
    assert _values(calls_frame.approval)[:2] == ["denied", None]
    assert _values(calls_frame.arguments_chars) == [3, 3, None]
    assert _values(frames.requests(tmp_path, engine="duckdb").tool_calls) == [None, 2, None, 0]
    assert frames.turns(tmp_path, engine="duckdb").outcome.tolist() == ["length", "cancelled"]


def _values(column: Any) -> list[Any]:
    return [None if pd.isna(v) else v for v in column]


def _duck_frames(source: Any, workers: int | None) -> tuple[dict[str, pd.DataFrame], list[str]]:
    with warnings.catch_warnings(record=True) as told:
        warnings.simplefilter("always")
        con = frames.connect(source, workers=workers)
        try:
            got = {n: _duck.frame(con, n) for n in frames.Frames._fields}
        finally:
            con.close()
    return got, [str(w.message) for w in told]


def test_worker_processes_check_logs_as_this_process_does(tmp_path: Path) -> None:
    """Logs checked in two worker processes: the same frames, and the same warnings in the
    same order (the refused log, the copy, the duplicated line, the unknown records)."""
    _zoo(tmp_path)
    lines = _lines("unknown", [User(content="hi")], unknown=True)
    (tmp_path / "unknown.jsonl").write_text("".join(json.dumps(o) + "\n" for o in lines))
    here, told_here = _duck_frames(tmp_path, 1)
    there, told_there = _duck_frames(tmp_path, 2)
    assert told_there == told_here
    assert any("left out" in m and "bad.jsonl" in m for m in told_here)
    assert any("a copy of session" in m for m in told_here)
    assert any("records of unknown type skipped: future" in m for m in told_here)
    for name in frames.Frames._fields:
        assert_frame_equal(here[name], there[name])
    assert len(here["summary"]) == 6


def test_big_inputs_are_checked_in_worker_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``workers=None``: worker processes from PARALLEL_BYTES of logs in two or more files,
    this process below it (a small analysis never pays for starting processes)."""
    import concurrent.futures

    from boxmaker.session import _sources as _build

    pools: list[int] = []

    class Counted(concurrent.futures.ProcessPoolExecutor):
        def __init__(self, workers: int) -> None:
            pools.append(workers)
            super().__init__(workers)

    monkeypatch.setattr(_build, "ProcessPoolExecutor", Counted)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    _zoo(tmp_path)
    small, _ = _duck_frames(tmp_path, None)
    assert pools == []
    monkeypatch.setattr(_build, "PARALLEL_BYTES", 1)
    big, _ = _duck_frames(tmp_path, None)
    assert pools == [3]
    for name in frames.Frames._fields:
        assert_frame_equal(small[name], big[name])


def test_a_big_read_shows_its_progress_on_stderr_and_nothing_on_stdout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """From PARALLEL_BYTES of logs a tqdm bar of the logs read goes to stderr; DuckDB's own
    bar (stdout, which a piped report holds) is off."""
    from boxmaker.session import _sources as _build

    _zoo(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", frames.LogReadWarning)
        frames.load(tmp_path, engine="duckdb")
        assert "reading logs" not in capfd.readouterr().err
        monkeypatch.setattr(_build, "PARALLEL_BYTES", 1)
        con = frames.connect(tmp_path, workers=1)
    try:
        con.execute("SET progress_bar_time = 0")  # turns DuckDB's bar on: never printed
        con.execute(f"COPY (SELECT * FROM turns) TO '{tmp_path / 't.parquet'}'")
    finally:
        con.close()
    out, err = capfd.readouterr()
    n = len(list(tmp_path.glob("*.jsonl")))
    assert "reading logs" in err and f"0/{n} " in err  # the bar, with its total
    assert out == ""
