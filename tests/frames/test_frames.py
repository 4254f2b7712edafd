"""boxmaker.frames: hand-made logs give exactly the expected frames; totals equal the sums over
the records for generated sessions; unknown, corrupt and torn logs warn and the rest is read."""

from __future__ import annotations

import contextlib
import json
import re
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from extras import has
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal

from boxmaker.client import Completion
from boxmaker.config import Config, LoopLimits
from boxmaker.errors import InferError, SessionError, TurnError
from boxmaker.frames import COLUMNS, LogReadWarning
from boxmaker.frames import _build as frames
from boxmaker.records import (
    LIMIT_KINDS,
    NOT_RUN_REASONS,
    SCHEMA_VERSION,
    TURN_END_OUTCOMES,
    Approval,
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    Record,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
    record_to_json,
)
from boxmaker.session import CALL_SOURCES, Session
from boxmaker.testing import ScriptedClient, Step, answer, calls, context_full
from boxmaker.testing import call as fake_call
from boxmaker.testing import timings as fake_timings
from boxmaker.tools import Registry
from boxmaker.turn import ALREADY_MADE, Runtime, run_turn

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 11, 30, 7, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ts(*seconds: float) -> pd.Series:
    return pd.Series([pd.Timestamp(at(s)) for s in seconds], dtype="datetime64[ns, UTC]")


def usage(cache: int, prompt: int, predicted: int, t: float, **kw: Any) -> Usage:
    timings = {
        "cache_n": cache,
        "prompt_n": prompt,
        "prompt_ms": prompt * 0.5,
        "predicted_n": predicted,
        "predicted_ms": predicted * 2.0,
    }
    return Usage(timings=timings, time=at(t), **kw)


def call(i: int, args: str = '{"city": "Oslo"}') -> ToolCall:
    return ToolCall(id=f"c{i}", name="get_weather", arguments=args)


NOT_RUN_LIMIT = "This call was not run: the turn ended (tool_iterations: 2 completions)."
NOT_RUN_CANCEL = "This call was not run: the turn ended (the turn was cancelled)."

RECORDS: list[Record] = [
    # turn 1: a tool call, a cache loss, then the answer
    User(content="weather?", time=at(0)),
    Assistant(content=None, reasoning="r", tool_calls=(call(1),), time=at(1)),
    usage(0, 100, 20, 1.5, reasoning_tokens=5, finish_reason="tool_calls"),
    ToolResult(call=1, tool_call_id="c1", name="get_weather", content="sunny", time=at(2)),
    Assistant(content="It is sunny.", time=at(3)),
    usage(80, 40, 10, 3.5, finish_reason="stop"),
    CacheLoss(
        expected=120,
        reused=80,
        position=80,
        cause="history_edited",
        old_window="sunny",
        new_window="rainy",
        detail="messages[2] (tool) changed",
        time=at(3.5),
    ),
    # turn 2: tool iterations limit (the second call was not run)
    User(content="again", time=at(10)),
    Assistant(content=None, tool_calls=(call(2),), time=at(11)),
    usage(130, 10, 5, 11.5, thinking_capped=True),
    LimitHit(kind="thinking_cap", detail="capped", time=at(11.5)),
    ToolResult(
        call=2, tool_call_id="c2", name="get_weather", content="x" * 8, truncated=True, time=at(12)
    ),
    LimitHit(kind="tool_result_cap", detail="cut", time=at(12)),
    Assistant(content=None, tool_calls=(call(3, "{}"),), time=at(13)),
    usage(145, 10, 5, 13.5),
    ToolResult(
        call=3,
        tool_call_id="c3",
        name="get_weather",
        content=NOT_RUN_LIMIT,
        not_run="tool_iterations",
        time=at(14),
    ),
    LimitHit(kind="tool_iterations", detail="2 completions", time=at(14)),
    # turn 3: context full
    User(content="more", time=at(20)),
    LimitHit(kind="context_full", detail="400", time=at(21)),
    # turn 4: cancelled between tool calls, with a repeat answered by the loop
    User(content="twice", time=at(30)),
    Assistant(content=None, tool_calls=(call(4), call(5)), time=at(31)),
    usage(160, 20, 8, 31.5),
    ToolResult(
        call=4,
        tool_call_id="c4",
        name="get_weather",
        content=ALREADY_MADE,
        not_run="repeat",
        time=at(32),
    ),
    ToolResult(
        call=5,
        tool_call_id="c5",
        name="get_weather",
        content=NOT_RUN_CANCEL,
        not_run="cancelled",
        time=at(33),
    ),
    # turn 5: the completion failed: nothing after the user message (a log without TurnEnd
    # records, as schema 1 wrote them: the outcomes are inferred from the records)
    User(content="fail", time=at(40)),
]


@pytest.fixture
def log(tmp_path: Path) -> Path:
    with Session.create(tmp_path, Baseline(time=at(-1)), session_id="s1") as session:
        session.extend(RECORDS)
    return session.path


def plain(series: pd.Series) -> list[Any]:
    """The column's values, missing ones as None."""
    return [None if pd.isna(v) else v for v in series]


def cat(values: list[Any], categories: list[str]) -> pd.Series:
    return pd.Series(pd.Categorical(values, categories=pd.Index(categories, dtype="str")))


def frame(data: dict[str, Any], name: str) -> pd.DataFrame:
    """An expected frame: values with the dtypes COLUMNS gives (a log that is no fork: no row
    from a parent, nothing inherited, unless ``data`` says)."""
    out = {}
    rows = len(next(iter(data.values())))
    for c in COLUMNS[name]:
        if c.name not in data and c.name == "from_parent":
            data = {**data, c.name: [False] * rows}
        elif c.name not in data and c.name.startswith("inherited_"):
            data = {**data, c.name: [0] * rows}
        value = data[c.name]
        out[c.name] = value if isinstance(value, pd.Series) else pd.array(value, dtype=c.dtype)
    return pd.DataFrame(out)


def test_requests_exact(log: Path) -> None:
    expected = frame(
        {
            "session": cat(["s1"] * 5, ["s1"]),
            "request": [1, 2, 3, 4, 5],
            "turn": [1, 1, 2, 2, 4],
            "turn_request": [1, 2, 1, 2, 1],
            "time": ts(1.5, 3.5, 11.5, 13.5, 31.5),
            "cached_tokens": [0, 80, 130, 145, 160],
            "processed_tokens": [100, 40, 10, 10, 20],
            "usage_prompt_tokens": [None] * 5,  # the OpenAI usage fields: not sent here
            "usage_completion_tokens": [None] * 5,
            "prompt_tokens": [100, 120, 140, 155, 180],
            "generated_tokens": [20, 10, 5, 5, 8],
            "reasoning_tokens": [5, 0, 0, 0, 0],
            "prompt_ms": [50.0, 20.0, 5.0, 5.0, 10.0],
            "generation_ms": [40.0, 20.0, 10.0, 10.0, 16.0],
            "prompt_tokens_per_s": [2000.0] * 5,
            "generation_tokens_per_s": [500.0] * 5,
            "cache_reuse_ratio": [0.0, 80 / 120, 130 / 140, 145 / 155, 160 / 180],
            "thinking_capped": [False, False, True, False, False],
            "finish_reason": ["tool_calls", "stop", None, None, None],
            "tool_calls": [1, 0, 1, 1, 2],
        },
        "requests",
    )
    assert_frame_equal(frames.requests(log), expected)


def test_turns_exact(log: Path) -> None:
    expected = frame(
        {
            "session": cat(["s1"] * 5, ["s1"]),
            "turn": [1, 2, 3, 4, 5],
            "started": ts(0, 10, 20, 30, 40),
            "ended": ts(3.5, 14, 21, 33, 40),
            "wall_ms": [3500.0, 4000.0, 1000.0, 3000.0, 0.0],
            "outcome": cat(
                ["answered", "tool_iterations", "session_full", "cancelled", "no_answer"],
                list(frames.TURN_OUTCOMES),
            ),
            "end_detail": [None] * 5,
            "http_status": [None] * 5,
            "requests": [2, 2, 0, 1, 0],
            "iterations": [1, 2, 0, 1, 0],
            "tool_calls": [1, 2, 0, 2, 0],
            "tool_results": [1, 2, 0, 2, 0],
            "cached_tokens": [80, 275, 0, 160, 0],
            "processed_tokens": [140, 20, 0, 20, 0],
            "prompt_tokens": [220, 295, 0, 180, 0],
            "generated_tokens": [30, 10, 0, 8, 0],
            "reasoning_tokens": [5, 0, 0, 0, 0],
            "prompt_ms": [70.0, 10.0, 0.0, 10.0, 0.0],
            "generation_ms": [60.0, 20.0, 0.0, 16.0, 0.0],
            "thinking_capped": [0, 1, 0, 0, 0],
            "cache_losses": [1, 0, 0, 0, 0],
            "lost_tokens": [40, 0, 0, 0, 0],
            # turn 1's loss was recorded before re-processed tokens were counted: unknown
            "reprocessed_tokens": [None, 0, 0, 0, 0],
            "reprocessed_ms": [None, 0.0, 0.0, 0.0, 0.0],
            "limit_hits": [0, 3, 1, 0, 0],
        },
        "turns",
    )
    assert_frame_equal(frames.turns(log), expected)


def test_a_loss_has_two_quantities_each_under_one_name(tmp_path: Path) -> None:
    """Issue 24: the loss counts the reply the slot held too (Gemma 3: 275 tokens in 2963 ms,
    not "5 tokens lost, 53 ms"); issue 34: ``lost_tokens`` is expected - reused everywhere
    (``cache explain`` said 206 where the frames said 236 under the same word) and the tokens
    the server re-processed are ``reprocessed_tokens``."""
    records = [
        *RECORDS[:6],
        CacheLoss(expected=30, reused=25, reprocessed=275, reprocessed_ms=2963.0, time=at(3.5)),
    ]
    with Session.create(tmp_path, Baseline(time=at(-1)), session_id="s2") as session:
        session.extend(records)
    losses = frames.cache_losses(session.path)
    assert plain(losses["lost_tokens"]) == [5]
    assert plain(losses["reprocessed_tokens"]) == [275]
    assert plain(losses["reprocessed_ms"]) == [2963.0]
    row = frames.summary(session.path).iloc[0]
    assert (row["lost_tokens"], row["reprocessed_tokens"], row["reprocessed_ms"]) == (5, 275, 2963)


def test_cache_losses_limit_hits_tool_calls_exact(log: Path) -> None:
    assert_frame_equal(
        frames.cache_losses(log),
        frame(
            {
                "session": cat(["s1"], ["s1"]),
                "request": [2],
                "turn": [1],
                "time": ts(3.5),
                "expected_tokens": [120],
                "reused_tokens": [80],
                "lost_tokens": [40],
                "reprocessed_tokens": [None],  # a loss recorded before it was counted
                "reprocessed_ms": [None],
                "position": [80],
                "cause": cat(["history_edited"], ["history_edited"]),
                "old_window": ["sunny"],
                "new_window": ["rainy"],
                "detail": ["messages[2] (tool) changed"],
            },
            "cache_losses",
        ),
    )
    assert_frame_equal(
        frames.limit_hits(log),
        frame(
            {
                "session": cat(["s1"] * 4, ["s1"]),
                "turn": [2, 2, 2, 3],
                "request": [3, 3, 4, 4],
                "time": ts(11.5, 12, 14, 21),
                "kind": cat(
                    ["thinking_cap", "tool_result_cap", "tool_iterations", "context_full"],
                    list(LIMIT_KINDS),
                ),
                "detail": ["capped", "cut", "2 completions", "400"],
                "ended_turn": [False, False, True, True],
            },
            "limit_hits",
        ),
    )
    assert_frame_equal(
        frames.tool_calls(log),
        frame(
            {
                "session": cat(["s1"] * 5, ["s1"]),
                "turn": [1, 2, 2, 4, 4],
                "time": ts(2, 12, 14, 32, 33),
                "call": [1, 2, 3, 4, 5],
                "name": cat(["get_weather"] * 5, ["get_weather"]),
                "tool_call_id": ["c1", "c2", "c3", "c4", "c5"],
                "arguments_chars": [16, 16, 2, 16, 16],
                "result_chars": [5, 8, len(NOT_RUN_LIMIT), len(ALREADY_MADE), len(NOT_RUN_CANCEL)],
                "truncated": [False, True, False, False, False],
                "data_class": cat(["public"] * 5, ["public"]),
                "untrusted": [False] * 5,
                "source": cat(["ran", "ran", "not_run", "not_run", "not_run"], list(CALL_SOURCES)),
                "ran": [True, True, False, False, False],
                "not_run": cat(
                    [None, None, "tool_iterations", "repeat", "cancelled"], list(NOT_RUN_REASONS)
                ),
                "server": cat([None] * 5, []),
                "approval": cat([None] * 5, ["approved", "denied"]),
                "approved_by": cat([None] * 5, []),
                "approval_reason": [None] * 5,
                "approval_wait_ms": [None] * 5,
            },
            "tool_calls",
        ),
    )


def test_summary_exact(log: Path) -> None:
    got = frames.summary(log)
    assert list(got.columns) == [c.name for c in COLUMNS["summary"]]
    row = got.iloc[0].to_dict()
    assert row["path"] == str(log)
    assert row["started"] == pd.Timestamp(at(-1)) and row["ended"] == pd.Timestamp(at(40))
    expected = {
        "session": "s1",
        "records": len(RECORDS),
        "unknown_records": 0,
        "turns": 5,
        "answered_turns": 1,
        "length_turns": 0,
        "tool_iterations_turns": 1,
        "repeated_call_turns": 0,
        "session_full_turns": 1,
        "cancelled_turns": 1,
        "no_answer_turns": 1,
        "requests": 5,
        "tool_calls": 5,
        "cached_tokens": 515,
        "processed_tokens": 180,
        "generated_tokens": 48,
        "reasoning_tokens": 5,
        "prompt_ms": 90.0,
        "generation_ms": 96.0,
        "cache_reuse_ratio": 515 / 695,
        "cache_losses": 1,
        "lost_tokens": 40,
        "limit_hits": 4,
        "tool_iterations_hits": 1,
        "repeated_call_hits": 0,
        "thinking_cap_hits": 1,
        "context_full_hits": 1,
        "tool_result_cap_hits": 1,
    }
    assert {k: row[k] for k in expected} == expected
    assert pd.isna(row["reprocessed_tokens"]) and pd.isna(row["reprocessed_ms"])  # unknown
    assert str(got.dtypes["turns"]) == "Int64" and str(got.dtypes["reprocessed_ms"]) == "Float64"


def test_sources_directory_list_and_sessions_agree(tmp_path: Path, log: Path) -> None:
    nested = tmp_path / "more" / "deeper"
    with Session.create(nested, Baseline(time=at(0)), session_id="s2") as other:
        other.extend([User(content="hi", time=at(1)), Assistant(content="yo", time=at(2))])
        other.append(usage(0, 5, 1, 2.5))
    by_dir = frames.requests(tmp_path)
    assert list(by_dir.session) == ["s2", "s1", "s1", "s1", "s1", "s1"]  # sorted paths
    by_list = frames.requests([log, other.path])
    assert list(by_list.session) == ["s1"] * 5 + ["s2"]
    reopened = Session.open(log)
    assert_frame_equal(frames.requests(reopened), frames.requests(log))
    assert_frame_equal(frames.turns([reopened]), frames.turns(log))


def test_a_path_that_names_no_log_is_an_error(tmp_path: Path, log: Path) -> None:
    """Issue 21: a misspelled path (before: empty frames and a warning) or a directory without
    logs (before: empty frames, silently) raises a SessionError that names the path."""
    with pytest.raises(SessionError, match=r"nope\.jsonl: no such file or directory$"):
        frames.load(tmp_path / "nope.jsonl")
    (tmp_path / "logs").mkdir()
    with pytest.raises(SessionError, match=r"logs: no session logs \(\*\.jsonl\) in this"):
        frames.summary(tmp_path / "logs")
    with pytest.raises(SessionError, match="typo"):
        frames.load([log, tmp_path / "typo"])


def test_all_frames_empty_keep_their_columns_and_dtypes() -> None:
    loaded = frames.load([])
    for name in loaded._fields:
        df = getattr(loaded, name)
        assert df.empty
        assert [(n, str(d)) for n, d in df.dtypes.items()] == [
            (c.name, c.dtype) for c in COLUMNS[name]
        ]


def test_load_gives_every_frame_as_its_function(log: Path) -> None:
    loaded = frames.load(log)
    for name in loaded._fields:
        assert_frame_equal(getattr(loaded, name), getattr(frames, name)(log))


def test_docs_come_from_the_columns() -> None:
    for name, columns in COLUMNS.items():
        doc = getattr(frames, name).__doc__
        for c in columns:
            assert f"``{c.name}``" in doc
        assert list(frames.describe(name).column) == [c.name for c in columns]
        assert len({c.name for c in columns}) == len(columns)


ENGINES_HERE: tuple[frames.Engine, ...] = ("pandas", "duckdb") if has("duckdb") else ("pandas",)
"""The frame engines installed here."""


def write_lines(path: Path, objects: list[dict[str, Any]], tail: str = "") -> Path:
    text = "".join(json.dumps(o) + "\n" for o in objects) + tail
    path.write_text(text, encoding="utf-8")
    return path


HEAD = {"type": "baseline", "schema": 1, "session_id": "h", "system": "", "tools": []}


def test_unknown_records_warn_and_are_counted(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "h.jsonl",
        [
            HEAD,
            {"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"},
            {"type": "future_thing", "payload": 1, "time": "2026-11-30T07:00:00Z"},
            {"type": "assistant", "content": "y", "time": "2026-11-30T07:00:01Z"},
        ],
    )
    with pytest.warns(LogReadWarning, match=r"h\.jsonl: records of unknown type skipped: future"):
        got = frames.summary(path)
    assert got.unknown_records.tolist() == [1]
    assert got.answered_turns.tolist() == [1]


def test_corrupt_log_names_file_and_line_and_others_are_read(tmp_path: Path, log: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HEAD) + "\n" + '{"type": "user", "content": \n' + "{}\n")
    with pytest.warns(LogReadWarning, match=r"bad\.jsonl:2: corrupt line"):
        got = frames.requests(tmp_path)
    assert set(got.session) == {"s1"} and len(got) == 5


AT = '"time": "2026-11-30T07:00:01Z"'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            '{"type": "usage", "timings": {"prompt_n": "many"}, ' + AT + "}",
            r"bad\.jsonl:3: usage record: timings\.prompt_n = 'many' is not a finite number >= 0",
        ),
        ("[1, 2]", r"bad\.jsonl:3: line is not a JSON object"),
        ('{"a": 1}, {"b": 2}', r"bad\.jsonl:3: corrupt line"),
        (
            '{"type": "tool_result", "call": 1, ' + AT + "}",
            r"bad\.jsonl:3: tool_result record without",
        ),
        (
            '{"type": "turn_end", "outcome": 5, ' + AT + "}",
            r"bad\.jsonl:3: turn_end record: outcome",
        ),
        (
            '{"type": "turn_end", "outcome": "answered", "status": "500", ' + AT + "}",
            r"bad\.jsonl:3: turn_end record: status = '500' is not int or null",
        ),
        (
            '{"type": "tool_result", "call": 1, "tool_call_id": "a", "name": "n", "content": "", '
            '"not_run": 1, ' + AT + "}",
            r"bad\.jsonl:3: tool_result record: not_run = 1 is not one of repeat, ",
        ),
        (
            '{"type": "cache_loss", "expected": 1, "reused": 0, "position": "1", ' + AT + "}",
            r"bad\.jsonl:3: cache_loss record: position = '1' is not int >= 0 and <= 2147483647 "
            "or null",
        ),
        ('{"type": "usage", "timings": {}}', r"bad\.jsonl:3: usage record without 'time'"),
        ('{"timings": {}, ' + AT + "}", r"bad\.jsonl:3: record without a 'type' string"),
    ],
)
def test_malformed_record_leaves_out_the_whole_log(tmp_path: Path, line: str, message: str) -> None:
    user = '{"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"}'
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(HEAD) + "\n" + user + "\n" + line + "\n")
    if not message.endswith("corrupt line"):  # the session refuses it with the same words
        with pytest.raises(SessionError, match=message):
            Session.open(bad, read_only=True)
    with pytest.warns(LogReadWarning, match=message):
        loaded = frames.load(bad)
    assert all(getattr(loaded, name).empty for name in loaded._fields)


def test_bad_heads_and_missing_paths_warn(tmp_path: Path) -> None:
    newer = write_lines(tmp_path / "newer.jsonl", [{**HEAD, "schema": 99}])
    headless = write_lines(tmp_path / "headless.jsonl", [{"type": "user", "content": "x"}])
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for path, message in (
        (newer, r"newer\.jsonl:1: log schema 99"),
        (headless, r"headless\.jsonl:1: first line is not a baseline"),
        (empty, r"empty\.jsonl: empty session log"),
    ):
        with pytest.warns(LogReadWarning, match=message):
            assert frames.summary(path).empty


def test_torn_last_line_is_dropped_with_a_warning_and_the_log_left_alone(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "torn.jsonl",
        [HEAD, {"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"}],
        tail='{"type": "assist',
    )
    before = path.read_bytes()
    with pytest.warns(LogReadWarning, match=r"torn\.jsonl: dropped a torn last line"):
        got = frames.turns(path)
    assert got.outcome.tolist() == ["no_answer"]
    assert path.read_bytes() == before
    assert not (tmp_path / "torn.jsonl.torn").exists()


def test_a_good_log_reads_without_warnings(log: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        frames.load(log)


def test_demo_log_from_the_embedded_server() -> None:
    path = ROOT / "cassettes" / "demo-turns.session.jsonl"
    loaded = frames.load(path)
    records = [json.loads(line) for line in path.read_text().splitlines()[1:]]
    usages = [r for r in records if r["type"] == "usage"]
    assert len(loaded.requests) == len(usages)
    assert loaded.summary.generated_tokens.tolist() == [
        sum(u["timings"]["predicted_n"] for u in usages)
    ]
    outcomes = loaded.turns.outcome.tolist()
    assert outcomes == ["answered"] * sum(r["type"] == "user" for r in records)
    assert loaded.summary.turns.tolist() == [len(outcomes)]


# -- property: totals in the frames equal the sums over the records ---------------------------

timings = st.fixed_dictionaries(
    {
        "cache_n": st.integers(0, 10_000),
        "prompt_n": st.integers(0, 5_000),
        "predicted_n": st.integers(0, 2_000),
        "prompt_ms": st.floats(0, 1e4, allow_nan=False),
        "predicted_ms": st.floats(0, 1e4, allow_nan=False),
    }
)
a_record = st.one_of(
    st.builds(User, content=st.text(max_size=5)),
    st.builds(
        Assistant,
        content=st.none() | st.text(max_size=5),
        tool_calls=st.lists(
            st.builds(ToolCall, id=st.text(max_size=3), name=st.just("f"), arguments=st.text()),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        Usage,
        timings=timings,
        reasoning_tokens=st.integers(0, 500),
        thinking_capped=st.booleans(),
    ),
    st.builds(CacheLoss, expected=st.integers(0, 1000), reused=st.integers(0, 1000)),
    st.builds(
        ToolResult,
        call=st.integers(1, 50),
        tool_call_id=st.text(max_size=3),
        name=st.sampled_from(["f", "g"]),
        content=st.text(max_size=20),
        truncated=st.booleans(),
        not_run=st.none() | st.sampled_from(NOT_RUN_REASONS),
    ),
    st.builds(LimitHit, kind=st.sampled_from(LIMIT_KINDS), detail=st.text(max_size=5)),
    st.builds(
        TurnEnd,
        outcome=st.sampled_from(TURN_END_OUTCOMES),
        detail=st.text(max_size=5),
        status=st.none() | st.integers(100, 599),
    ),
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sessions=st.lists(st.lists(a_record, max_size=25), min_size=1, max_size=3))
def test_totals_equal_sums_over_records(tmp_path: Path, sessions: list[list[Record]]) -> None:
    folder = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
    folder.mkdir()
    for n, records in enumerate(sessions):
        head = {**HEAD, "session_id": f"g{n}", "time": "2026-11-30T07:00:00Z"}
        write_lines(folder / f"g{n}.jsonl", [head, *(record_to_json(r) for r in records)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = frames.load(folder)
    every = [r for records in sessions for r in records]
    usages = [r for r in every if isinstance(r, Usage)]
    losses = [r for r in every if isinstance(r, CacheLoss)]
    hits = [r for r in every if isinstance(r, LimitHit)]
    s = loaded.summary
    assert len(s) == len(sessions)
    assert s.records.sum() == len(every)
    assert s.turns.sum() == len(loaded.turns) == sum(isinstance(r, User) for r in every)
    assert s.requests.sum() == len(loaded.requests) == len(usages)
    for column, key in (
        ("cached_tokens", "cache_n"),
        ("processed_tokens", "prompt_n"),
        ("generated_tokens", "predicted_n"),
    ):
        total = sum(int(u.timings[key]) for u in usages)
        assert s[column].sum() == loaded.requests[column].sum() == total
    assert s.prompt_ms.sum() == pytest.approx(sum(u.timings["prompt_ms"] for u in usages))
    assert s.reasoning_tokens.sum() == sum(u.reasoning_tokens or 0 for u in usages)
    assert s.lost_tokens.sum() == sum(c.expected - c.reused for c in losses)
    assert s.limit_hits.sum() == len(hits) == len(loaded.limit_hits)
    for kind in LIMIT_KINDS:
        assert s[f"{kind}_hits"].sum() == sum(h.kind == kind for h in hits)
    results = [r for r in every if isinstance(r, ToolResult)]
    assert len(loaded.tool_calls) == len(results)
    assert loaded.tool_calls.ran.sum() == sum(r.not_run is None for r in results)
    # a turn with TurnEnd records has the last one's outcome
    ends: list[TurnEnd | None] = []
    for records in sessions:
        in_turn = False
        for r in records:
            if isinstance(r, User):
                ends.append(None)
                in_turn = True
            elif isinstance(r, TurnEnd) and in_turn:
                ends[-1] = r
    for outcome, end in zip(loaded.turns.outcome, ends, strict=True):
        assert end is None or outcome == end.outcome
    assert s[[f"{o}_turns" for o in frames.TURN_OUTCOMES]].sum(axis=1).tolist() == list(s.turns)
    # what belongs to a turn adds up to what the session has after its first user message
    in_turns = loaded.requests[loaded.requests.turn.notna()]
    assert loaded.turns.generated_tokens.sum() == in_turns.generated_tokens.sum()
    assert loaded.turns.requests.sum() == len(in_turns)


# -- the outcomes the real loop leaves in the log -----------------------------------------------


def test_turn_outcomes_of_the_real_loop(tmp_path: Path) -> None:
    box: dict[str, Runtime] = {}

    def weather(city: str) -> str:
        """Weather for a city; "stop" sets the runtime's cancel switch."""
        if city == "stop":
            box["rt"].cancel.set()
        return '{"sky": "clear"}'

    registry = Registry()
    registry.add(weather)
    oslo = {"city": "Oslo"}
    steps = [
        # 1 answered after one tool call
        calls(fake_call("weather", oslo, "a"), timings=fake_timings(0, 50)),
        answer("clear", timings=fake_timings(50, 20)),
        # 2 repeated call: the same call three times
        *(
            calls(fake_call("weather", oslo, f"r{i}"), timings=fake_timings(70, 10))
            for i in range(3)
        ),
        # 3 tool iterations (cap 3): four completions with calls
        *(calls(fake_call("weather", {"city": f"c{i}"}, f"t{i}")) for i in range(4)),
        # 4 context full
        context_full(),
        # 5 cancelled between tool calls
        calls(fake_call("weather", {"city": "stop"}, "s1"), fake_call("weather", oslo, "s2")),
        # 6 an inference error
        Step(error=InferError("HTTP 500", status=500, body="boom")),
    ]
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    config = Config(loop=LoopLimits(tool_iterations=3))
    runtime = Runtime(config=config, client=ScriptedClient(steps), registry=registry)
    box["rt"] = runtime
    for text in ("1", "2", "3", "4", "5", "6"):
        runtime.cancel.clear()  # the caller's switch (set by turn 5): the loop never clears it
        with contextlib.suppress(TurnError):
            run_turn(session, runtime, text)
    session.close()
    got = frames.turns(session.path)
    outcomes = ["answered", "repeated_call", "tool_iterations", "session_full", "cancelled"]
    assert got.outcome.tolist() == [*outcomes, "infer_error"]  # from the TurnEnd records
    assert plain(got.http_status) == [None] * 5 + [500]
    assert got.end_detail.tolist()[0] == "" and "HTTP 500" in got.end_detail.tolist()[5]
    assert got.requests.tolist() == [2, 3, 4, 0, 1, 0]
    assert got.iterations.tolist() == [1, 3, 4, 0, 1, 0]
    calls_frame = frames.tool_calls(session.path)
    assert calls_frame.ran.tolist() == [True, True, False, False] + [True] * 3 + [False] + [
        True,
        False,
    ]
    assert plain(calls_frame.not_run) == [
        *(None, None, "repeat", "repeated_call"),
        *(None, None, None, "tool_iterations"),
        *(None, "cancelled"),
    ]
    assert frames.summary(session).tool_calls.tolist() == [1 + 3 + 4 + 2]
    assert frames.summary(session).infer_error_turns.tolist() == [1]
    # without its TurnEnd records (as schema 1 wrote turns) the same log gives the same
    # outcomes from its records' structure, but for the failed request, which left no trace
    bare = without_turn_ends(session.path, tmp_path / "bare" / "bare.jsonl")
    assert frames.turns(bare).outcome.tolist() == [*outcomes, "no_answer"]
    assert frames.turns(bare).http_status.isna().all()


def without_turn_ends(path: Path, dest: Path) -> Path:
    """A copy of the log at ``dest`` without its turn_end lines (nor the group markers of the
    writes they were part of: a log as written before schema 2)."""
    dest.parent.mkdir(parents=True)
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert any('"type":"turn_end"' in line for line in lines)
    kept = (re.sub(r',"group":\d+}$', "}", x.rstrip("\n")) + "\n" for x in lines)
    dest.write_text("".join(x for x in kept if '"type":"turn_end"' not in x), encoding="utf-8")
    return dest


def run_one_turn(tmp_path: Path, tool: Any, steps: list[Step]) -> Path:
    """Run one turn of the real loop with ``tool`` and the scripted completions; the log."""
    registry = Registry()
    registry.add(tool)
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    runtime = Runtime(config=Config(), client=ScriptedClient(steps), registry=registry)
    try:
        run_turn(session, runtime, "go")
    finally:
        session.close()
    return session.path


def test_a_keyboard_interrupt_in_a_tool_is_a_cancelled_turn(tmp_path: Path) -> None:
    def weather(city: str) -> str:
        """Weather for a city; Ctrl-C arrives while it runs."""
        raise KeyboardInterrupt

    steps = [calls(fake_call("weather", {"city": "Oslo"}, "k1"), fake_call("weather", {}, "k2"))]
    with pytest.raises(KeyboardInterrupt):
        run_one_turn(tmp_path, weather, steps)
    (log,) = tmp_path.glob("*.jsonl")
    got = frames.turns(log)
    assert got.outcome.tolist() == ["cancelled"]  # the loop's words say "interrupted"
    calls_frame = frames.tool_calls(log)
    assert calls_frame.ran.tolist() == [False, False]
    assert calls_frame.not_run.tolist() == ["cancelled", "cancelled"]
    # a log without TurnEnd records: the not_run reason still says cancelled
    bare = without_turn_ends(log, tmp_path / "bare" / "bare.jsonl")
    assert frames.turns(bare).outcome.tolist() == ["cancelled"]


def test_the_loop_s_words_in_a_tool_result_are_not_read(tmp_path: Path) -> None:
    words = "This call was not run: the turn ended (the turn was cancelled)."

    def echo(text: str) -> str:
        """Says what it is given."""
        return words

    steps = [calls(fake_call("echo", {"text": "x"}, "e1")), answer("done")]
    log = run_one_turn(tmp_path, echo, steps)
    got = frames.tool_calls(log)
    assert got.ran.tolist() == [True]
    assert got.not_run.isna().tolist() == [True]
    assert got.result_chars.tolist() == [len(words)]
    assert frames.turns(log).outcome.tolist() == ["answered"]
    bare = without_turn_ends(log, tmp_path / "bare" / "bare.jsonl")
    assert frames.turns(bare).outcome.tolist() == ["answered"]
    # the same texts ending a turn without a TurnEnd record: not cancelled (no not_run)
    lines = [
        {**HEAD, "schema": 2},
        record_to_json(User(content="go", time=at(0))),
        record_to_json(Assistant(content=None, tool_calls=(call(1),), time=at(1))),
        record_to_json(usage(0, 10, 5, 1.5)),
        record_to_json(ToolResult(call=1, tool_call_id="c1", name="f", content=words)),
    ]
    path = write_lines(tmp_path / "texts.jsonl", lines)
    assert frames.turns(path).outcome.tolist() == ["no_answer"]
    assert frames.tool_calls(path).ran.tolist() == [True]


@pytest.mark.parametrize("schema", [0, None, True, SCHEMA_VERSION + 1, "2"])
def test_a_log_session_open_refuses_is_left_out(tmp_path: Path, schema: Any) -> None:
    head = {k: v for k, v in HEAD.items() if k != "schema"}
    if schema is not None:
        head["schema"] = schema
    user = {"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"}
    path = write_lines(tmp_path / "old.jsonl", [head, user])
    with pytest.raises(SessionError, match=r"old\.jsonl:1: log schema"):
        Session.open(path, read_only=True)
    with pytest.warns(LogReadWarning, match=r"old\.jsonl:1: log schema .* the log is left out"):
        loaded = frames.load(path)
    assert all(getattr(loaded, name).empty for name in loaded._fields)


@pytest.mark.parametrize("bad", [-5.0, -1, float("inf"), "12"])
def test_a_timing_that_is_no_measurement_is_judged_alike_by_session_and_frames(
    tmp_path: Path, bad: object
) -> None:
    user = {"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"}
    used = record_to_json(usage(0, 10, 5, 1.5))
    used["timings"]["predicted_ms"] = bad
    path = write_lines(tmp_path / "odd.jsonl", [HEAD, user, used])
    with pytest.raises(SessionError, match=r"odd\.jsonl:3: .*timings\.predicted_ms = .* is not"):
        Session.open(path, read_only=True)
    with pytest.warns(LogReadWarning, match=r"odd\.jsonl:3: .* is not .*the log is left out"):
        loaded = frames.load(path)
    assert loaded.requests.empty


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("predicted_n", 1.5, "is not a count"),  # a count that is no integer: pandas crashed
        ("cache_n", 2**63 - 1, "is not a"),  # DuckDB overflowed adding prompt_n
        ("prompt_ms", 1e308, "is not a finite number >= 0 and <= 10000000000"),  # OTel overflowed
    ],
)
def test_an_absurd_timing_is_refused_alike_by_session_and_frames(
    tmp_path: Path, field: str, value: object, why: str
) -> None:
    """Issue 36: values the rule allowed that crashed or overflowed a reader or exporter are
    no measurements (token counts integers up to MAX_TOKENS, times up to MAX_MS)."""
    user = {"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"}
    used = record_to_json(usage(0, 10, 5, 1.5))
    used["timings"][field] = value
    path = write_lines(tmp_path / "odd.jsonl", [HEAD, user, used])
    with pytest.raises(SessionError, match=rf"odd\.jsonl:3: .*timings\.{field} = .* {why}"):
        Session.open(path, read_only=True)
    for engine in ENGINES_HERE:
        with pytest.warns(LogReadWarning, match=r"odd\.jsonl:3: .*the log is left out"):
            assert frames.load(path, engine=engine).requests.empty


def test_a_negative_token_count_is_judged_alike_by_session_and_frames(tmp_path: Path) -> None:
    user = {"type": "user", "content": "x", "time": "2026-11-30T07:00:00Z"}
    loss = {"type": "cache_loss", "expected": 10**6, "reused": -5, "time": "2026-11-30T07:00:01Z"}
    path = write_lines(tmp_path / "neg.jsonl", [HEAD, user, loss])
    with pytest.raises(SessionError, match=r"neg\.jsonl:3: cache_loss record: reused = -5 is not"):
        Session.open(path, read_only=True)
    with pytest.warns(LogReadWarning, match=r"neg\.jsonl:3: .*-5 is not a count .*left out"):
        assert frames.load(path).cache_losses.empty


def test_a_null_timing_from_the_server_is_left_out_of_the_record() -> None:
    """llama.cpp sends ``null`` for a rate it cannot compute (NaN in C++): the usage record
    keeps the measurements only, so the log it writes always reads back."""
    done = Completion(
        id="c",
        content="ok",
        reasoning=None,
        tool_calls=(),
        finish_reason="stop",
        timings={"prompt_n": 3, "prompt_ms": 0.0, "prompt_per_second": None},  # type: ignore[dict-item]
    )
    assert dict(done.usage_record().timings) == {"prompt_n": 3, "prompt_ms": 0.0}


def test_a_schema_1_log_is_read_through_the_migrations(tmp_path: Path) -> None:
    """Schema 1 said "not run" in the result text only; the upgrade on read gives not_run."""
    v1: list[dict[str, Any]] = [dict(HEAD)]
    for rec in RECORDS:
        data = record_to_json(rec)
        data.pop("not_run", None)
        if rec.__class__ is CacheLoss:
            data = {k: data[k] for k in ("type", "expected", "reused", "time")}
        v1.append(data)
    path = write_lines(tmp_path / "v1.jsonl", v1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = frames.load(path)
    not_run = [None, None, "tool_iterations", "repeat", "cancelled"]
    assert plain(loaded.tool_calls.not_run) == not_run
    assert loaded.turns.outcome.tolist() == [
        "answered",
        "tool_iterations",
        "session_full",
        "cancelled",
        "no_answer",
    ]
    assert loaded.cache_losses.position.isna().all() and loaded.cache_losses.cause.isna().all()


def test_a_completion_cut_at_max_tokens_is_not_an_answer(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(), session_id="cut")
    session.append(User(content="think long", time=at(0)))
    session.append(Assistant(content="It is", reasoning="r" * 9, time=at(1)))
    session.append(usage(0, 10, 1024, 1.5, finish_reason="length"))
    session.close()
    assert frames.turns(session.path).outcome.tolist() == ["length"]
    assert frames.requests(session.path).finish_reason.tolist() == ["length"]
    assert frames.summary(session.path).length_turns.tolist() == [1]


def test_tool_calls_join_their_approval_and_server(tmp_path: Path) -> None:
    """A call that needed approval shows the decision; the port's server is kept."""
    with Session.create(tmp_path, Baseline(), session_id="a1") as session:
        session.extend(
            [
                User(content="delete it"),
                Assistant(
                    content=None,
                    tool_calls=(
                        ToolCall(id="d1", name="rm", arguments="{}"),
                        ToolCall(id="d2", name="ls", arguments="{}"),
                    ),
                ),
                Approval(
                    call=1, name="rm", decision="denied", by="console", reason="no", waited_ms=12.5
                ),
                ToolResult(
                    call=1, tool_call_id="d1", name="rm", content="denied", not_run="denied"
                ),
                ToolResult(call=2, tool_call_id="d2", name="ls", content="a b", server="files"),
            ]
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an approval record is known: no warning
        got = frames.tool_calls(tmp_path)
    assert plain(got.approval) == ["denied", None]
    assert plain(got.approved_by) == ["console", None]
    assert plain(got.approval_reason) == ["no", None]
    assert plain(got.approval_wait_ms) == [12.5, None]
    assert plain(got.server) == [None, "files"]
    assert plain(got.ran) == [False, True]
