"""Every reader and exporter takes every log the session accepts (issue 36): the same mutants
of a log (a hostile value put in one field of one record) through the pandas and DuckDB
frames, ``report --json``, the transcript, the OTel spans and the Inspect export; no
traceback, whatever the rule lets through; what the rule refuses, every reader leaves out
alike. ``BOXMAKER_FUZZ=5000`` runs thousands (the quick suite: 60).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

import pytest
from extras import has
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker import frames
from boxmaker.cli import main
from boxmaker.errors import SessionError
from boxmaker.records import SCHEMA_VERSION
from boxmaker.session import LogReadWarning, Session, read_logs, split_turns
from boxmaker.view import Transcript

FUZZ = int(os.environ.get("BOXMAKER_FUZZ", "60"))

T = "2026-11-30T07:00:0{}Z"
BASE: list[dict[str, Any]] = [
    {"type": "user", "content": "x", "time": T.format(1)},
    {
        "type": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "name": "f", "arguments": '{"a": 1}'}],
        "time": T.format(2),
    },
    {
        "type": "usage",
        "timings": {"cache_n": 1, "prompt_n": 2, "predicted_n": 3, "prompt_ms": 1.0},
        "reasoning_tokens": 0,
        "time": T.format(3),
    },
    {"type": "cache_loss", "expected": 9, "reused": 1, "time": T.format(3)},
    {
        "type": "tool_result",
        "call": 1,
        "tool_call_id": "c1",
        "name": "f",
        "content": "ok",
        "time": T.format(4),
    },
    {"type": "limit_hit", "kind": "loop", "detail": "d", "time": T.format(5)},
    {"type": "turn_end", "outcome": "answered", "time": T.format(6)},
]
"""A small log (after its baseline) whose fields the mutants change."""

HOSTILE: list[Any] = [
    "a\ud800b",  # a lone surrogate (a JSON \ud800 escape)
    "\x1b[2J<script>alert(1)</script>",
    "é😀\u202e",
    "",
    -1,
    0,
    1.5,
    2**31 - 1,
    2**31,
    4 * 10**18,
    2**63 - 1,
    2**64,
    1e10,
    1e308,
    True,
    None,
    [],
    {},
    "[" * 2000 + "]" * 2000,  # deep nesting, as text (arguments)
    "2026-11-30T06:00:00Z",  # a time before the others: the clock went back
    "9999-12-31T23:59:59Z",
    "2026-11-30T07:00:00+14:00",
]

KEYS = ["content", "detail", "time", "expected", "reused", "call", "arguments", "cache_n"]
KEYS += ["prompt_n", "predicted_n", "prompt_ms", "reasoning_tokens"]

mutants = st.tuples(
    st.integers(0, len(BASE) - 1),
    st.sampled_from(KEYS),
    st.sampled_from(HOSTILE),
)


def _mutated(index: int, key: str, value: Any) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = json.loads(json.dumps(BASE))
    rec = records[index]
    if key in ("cache_n", "prompt_n", "predicted_n", "prompt_ms") and "timings" in rec:
        rec["timings"][key] = value
    elif key == "arguments" and rec.get("tool_calls"):
        rec["tool_calls"][0]["arguments"] = value
    else:
        rec[key] = value
    return records


def _write(folder: Path, records: list[dict[str, Any]]) -> Path:
    head = {"type": "baseline", "schema": SCHEMA_VERSION, "session_id": "s",
            "time": T.format(0), "system": "", "tools": []}  # fmt: skip
    path = folder / "s.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [head, *records]))
    return path


@settings(
    max_examples=FUZZ,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(mutant=mutants)
def test_every_reader_takes_every_log_the_session_accepts(
    tmp_path: Path, mutant: tuple[int, str, Any]
) -> None:
    folder = tmp_path / "logs"
    folder.mkdir(exist_ok=True)
    path = _write(folder, _mutated(*mutant))
    try:
        Session.open(path, read_only=True).close()
        accepted = True
    except SessionError:
        accepted = False
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogReadWarning)
        loaded = frames.load(folder)
        assert len(loaded.summary) == int(accepted)  # the session's verdict, the frames' too
        if has("duckdb"):
            assert len(frames.load(folder, engine="duckdb").summary) == int(accepted)
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = main(["report", "--json", str(folder)])
        assert code == (0 if accepted else 1)
        if not accepted:
            return
        with Session.open(path, read_only=True) as session:
            Transcript().extend(session.records)
        if has("opentelemetry.sdk"):
            from opentelemetry.sdk.trace import TracerProvider

            from boxmaker.export import session_spans

            provider = TracerProvider()
            for log in read_logs(folder):
                session_spans(split_turns(log), provider.get_tracer("fuzz"), content=True)
            provider.shutdown()
        if has("inspect_ai"):
            from boxmaker.export import export_inspect

            export_inspect(folder, tmp_path / "fuzz.eval")


def test_a_turn_that_ends_before_it_starts_is_said_by_both_engines(tmp_path: Path) -> None:
    """Issue 36: 19 of 5,000 fuzzed logs got a negative wall_ms without a word."""
    records = _mutated(0, "time", "2026-11-30T08:00:00Z")  # the user message after the rest
    path = _write(tmp_path, records)
    engines: tuple[frames.Engine, ...] = ("pandas", "duckdb") if has("duckdb") else ("pandas",)
    for engine in engines:
        with pytest.warns(LogReadWarning, match=r"turn 1 ends before it starts"):
            turns = frames.turns(path, engine=engine)
        assert float(turns.wall_ms.iloc[0]) < 0  # kept as the log says, and said


def test_a_lone_surrogate_reads_as_in_duckdb(tmp_path: Path) -> None:
    """Issue 36: a lone surrogate in a limit's detail crashed the pandas frames (pandas' text
    storage holds UTF-8 only); both engines read it as U+FFFD."""
    path = _write(tmp_path, _mutated(5, "detail", "a\ud800b"))
    assert frames.limit_hits(path).detail.tolist() == ["a\ufffdb"]
    if has("duckdb"):
        assert frames.limit_hits(path, engine="duckdb").detail.tolist() == ["a\ufffdb"]


def test_duckdbs_spill_folder_is_private(tmp_path: Path) -> None:
    """Issue 36: the spill folder was ``<tmp>/boxmaker-duckdb-<pid>``, used through a link
    planted there; now a folder of the process's own, made by mkdtemp (mode 0700)."""
    if not has("duckdb"):
        pytest.skip("needs the 'duckdb' extra (duckdb is not installed)")
    from boxmaker.frames import _duck

    path = _write(tmp_path, BASE)
    planted = Path(os.environ.get("TMPDIR", "/tmp")) / f"boxmaker-duckdb-{os.getpid()}"
    if not planted.exists():
        planted.symlink_to(tmp_path)
    try:
        con = _duck.connect(path)
        (spill,) = con.execute("SELECT current_setting('temp_directory')").fetchone() or ("",)
        con.close()
    finally:
        if planted.is_symlink():
            planted.unlink()
    assert Path(spill) != planted and not Path(spill).is_symlink()
    assert stat.S_IMODE(Path(spill).stat().st_mode) == 0o700


def test_deep_arguments_are_kept_as_text_in_the_inspect_export(tmp_path: Path) -> None:
    """Issue 36: nested arguments (a log the loop itself wrote) made export inspect raise
    RecursionError."""
    if not has("inspect_ai"):
        pytest.skip("needs the 'inspect' extra (inspect_ai is not installed)")
    from inspect_ai.log import read_eval_log

    from boxmaker.export import export_inspect

    deep = "[" * 5000 + "]" * 5000
    path = _write(tmp_path, _mutated(1, "arguments", '{"a": ' + deep + "}"))
    export_inspect(path, tmp_path / "deep.eval")
    (sample,) = read_eval_log(str(tmp_path / "deep.eval")).samples or []
    (call,) = [c for m in sample.messages for c in (getattr(m, "tool_calls", None) or [])]
    assert call.arguments == {"_text": '{"a": ' + deep + "}"}
