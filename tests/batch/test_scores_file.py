"""scores.ndjson has the session log's guarantees (issue 36): one writer at a time, whole lines
or nothing, a torn tail set aside in scores.ndjson.torn before the next append (a killed
``score`` glued the next line to it and every later read failed), bad lines reported by
number in one warning, odd values, unknown runs and a 100,000-deep line never a traceback.

Kills of a real scoring process: ``BOXMAKER_SCORE_KILLS`` (default 3)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
from test_score_batch import _two_settings

from boxmaker.batch import SCORES_TORN, compare, read_scores, score_batch, scores
from boxmaker.errors import LogBusy
from boxmaker.score import Scorer
from boxmaker.session import LogReadWarning

ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("BOXMAKER_SCORE_KILLS", "3"))


def _line(name: str, **over: Any) -> bytes:
    item = {"time": "2026-12-01T10:00:00+00:00", "run": name, "task": "t0", "scorer": "target",
            "version": "1", "value": 1.0, "explanation": "ok"} | over  # fmt: skip
    return json.dumps(item).encode() + b"\n"


def test_a_torn_tail_is_set_aside_before_the_next_append(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    score_batch(folder)
    path = folder / "scores.ndjson"
    whole = path.read_bytes()
    torn = b'{"time": "2026-12-01T10:00:00+00:00", "run": "t0.a", "sco'
    path.write_bytes(whole + torn)  # a kill in the middle of a write
    with pytest.warns(LogReadWarning, match=rf"line 13 \(torn: {len(torn)} bytes"):
        assert len(read_scores(folder)) == 12  # read: skipped, said, the file untouched
    assert path.read_bytes() == whole + torn
    named = Scorer(name="short", fn=lambda records: 0.5)
    with pytest.warns(LogReadWarning, match="set aside in scores.ndjson.torn"):
        frame = score_batch(folder, [named])
    assert (folder / SCORES_TORN).read_bytes() == torn + b"\n"
    text = path.read_bytes()
    assert text.startswith(whole) and text.endswith(b"\n") and torn not in text
    assert len(frame) == 24 and set(frame[frame.scorer == "short"].value) == {0.5}
    assert [json.loads(line)["scorer"] for line in text.splitlines()[12:]] == ["short"] * 12
    score_batch(folder, [named])  # again: nothing torn, nothing said, nothing new
    assert path.read_bytes() == text


def test_a_second_scorer_at_once_is_refused_naming_the_first(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder / "scores.ndjson")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(LogBusy, match=f"pid {holder.pid}"):
            score_batch(folder)
    finally:
        holder.kill()
        holder.communicate()
    assert len(score_batch(folder)) == 12  # the holder gone: scored


HOLD = """
import sys, time
from pathlib import Path
from boxmaker.session import LogWriter
writer = LogWriter(Path(sys.argv[1]), create=None, what="scores file")
print("held", flush=True)
time.sleep(60)
"""

SCORE = """
import sys
from boxmaker.batch import score_batch
from boxmaker.score import Scorer

def long(records):
    from boxmaker.score import Score
    return Score(value=1.0, explanation="x" * 8_000_000)

print("scoring", flush=True)
score_batch(sys.argv[1], [Scorer(name="long", fn=long)], targets=False)
print("done", flush=True)
"""


def test_a_scoring_process_killed_at_random_leaves_a_file_the_next_run_reads_and_extends(
    tmp_path: Path,
) -> None:
    rng = random.Random(36)
    folder = _two_settings(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    torn = 0
    for _ in range(KILLS):
        child = subprocess.Popen(
            [sys.executable, "-c", SCORE, str(folder)], stdout=subprocess.PIPE, text=True, env=env
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "scoring"
        time.sleep(rng.uniform(0.0, 0.6))
        os.kill(child.pid, signal.SIGKILL)
        child.communicate()
        with warnings.catch_warnings(record=True) as said:  # what the kill left: said
            warnings.simplefilter("always")
            frame = score_batch(folder, [Scorer(name="after", fn=lambda records: 1.0)])
        assert all(issubclass(w.category, LogReadWarning) for w in said), said
        torn += any("set aside" in str(w.message) for w in said)
        assert set(frame[frame.scorer == "after"].value) == {1.0}
        raw = (folder / "scores.ndjson").read_bytes()
        assert raw.endswith(b"\n")
        for line in raw.splitlines():  # every line whole: a score
            assert json.loads(line)["scorer"] in ("long", "after", "target")
        (folder / "scores.ndjson").unlink()  # the next round from nothing
    # a kill tears a line only when it lands inside a write: the torn rounds' bytes are kept
    assert (folder / SCORES_TORN).exists() == (torn > 0)


def test_bad_lines_are_skipped_and_reported_by_number_never_a_traceback(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    lines = [
        _line("t0.a"),
        b"not json at all\n",
        b"[1, 2, 3]\n",
        _line("t0.b", value="high"),
        _line("t1.a", value=5),
        _line("t1.b", value=float("nan")),
        _line("t2.a", value=True),
        _line("t2.b", run=5),
        _line("t3.a", scorer=["a", "list"]),
        _line("t3.b", time="yesterday"),
        _line("t4.a", explanation={"a": 1}),
        b"[" * 100_000 + b"]" * 100_000 + b"\n",
        _line("t4.b", value=None, error="it failed"),
        _line("t5.a", time="0001-01-01T00:00:00+00:00"),  # valid ISO, beyond pandas' range
        _line("ghost.run", task="gone"),  # a run the manifest does not know
        b"\n",
    ]
    (folder / "scores.ndjson").write_bytes(b"".join(lines))
    with pytest.warns(LogReadWarning) as said:
        kept = read_scores(folder)
    assert [item["run"] for item in kept] == ["t0.a", "t4.b", "t5.a", "ghost.run"]
    (message,) = [str(w.message) for w in said]
    assert "skipped 11 line(s)" in message
    for part in ("line 2 (not JSON", "line 3 (a JSON list", "line 4 (value 'high'",
                 "line 5 (value '5'"):  # fmt: skip
        assert part in message
    assert "and 6 more" in message
    with pytest.warns(LogReadWarning) as said:
        frame = scores(folder)
    assert "scores of 1 run(s) the manifest does not know left out: ghost.run" in str(
        said[-1].message
    )
    assert list(frame.run) == ["t0.a", "t4.b", "t5.a"]
    assert frame.value.isna().tolist() == [False, True, False]
    years = [None if t is None or t != t else t.year for t in frame.time]
    assert years in ([2026, 2026, 1], [2026, 2026, None])  # pandas 2: NaT, no year 1
    (folder / "scores.ndjson").unlink()
    score_batch(folder)  # the batch scored, then the odd lines after its own
    with open(folder / "scores.ndjson", "ab") as fh:
        fh.write(b"".join(lines))
    with pytest.warns(LogReadWarning) as said:
        table = compare(folder, "loop.cap")
    messages = [str(w.message) for w in said]
    assert any("skipped 11 line" in m for m in messages)
    assert any("left out: ghost.run" in m for m in messages)
    assert sorted(table.index) == [40, 4000] or sorted(table["loop.cap"]) == [40, 4000]


def test_the_warning_names_every_kind_of_bad_line(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    cases = {
        b"[" * 100_000 + b"]" * 100_000 + b"\n": "nested too deeply",
        _line("t0.a", run=5): "run is not a text",
        _line("t0.a", value=float("inf")): "value 'inf' is not a number in [0, 1]",
        _line("t0.a", explanation=3): "explanation is not a text",
        _line("t0.a", time="yesterday"): "time is not an ISO 8601 text",
        _line("t0.a", error=["x"]): "error is not a text",
    }
    for line, why in cases.items():
        (folder / "scores.ndjson").write_bytes(line)
        with pytest.warns(LogReadWarning, match=re.escape(f"line 1 ({why}")):
            assert read_scores(folder) == []


def test_a_line_written_by_hand_without_a_time_is_a_score(tmp_path: Path) -> None:
    folder = _two_settings(tmp_path)
    line = {"run": "t0.a", "scorer": "target", "version": "1", "value": 1.0}
    (folder / "scores.ndjson").write_text(json.dumps(line) + "\n")
    assert read_scores(folder) == [line]
    frame = scores(folder)
    assert list(frame.run) == ["t0.a"] and frame.time.isna().all()
