"""boxmaker report: text tables and a self-contained HTML report; exit codes; the demo's log."""

from __future__ import annotations

import base64
import json
import re
import shutil
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from hostile import HOSTILE_MARKDOWN, live_hazards
from test_frames import RECORDS, at

from boxmaker.cli import main
from boxmaker.frames import _build as frames
from boxmaker.frames.report import SESSION_COLUMNS, TEXT_WIDTH, format_text, tables
from boxmaker.records import (
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from boxmaker.session import Session

ROOT = Path(__file__).resolve().parents[2]
DEMO_LOG = ROOT / "cassettes" / "demo-turns.session.jsonl"
CASSETTE_LOGS = ("demo-turns", "loop-cycle", "demo-thinking-cap")


def run_report(paths: list[str], html: str | None = None) -> int:
    """``boxmaker report PATHS [--html FILE]``, the exit code."""
    return main(["report", *paths, *(["--html", html] if html is not None else [])])


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    folder = tmp_path / "sessions"
    with Session.create(folder, Baseline(time=at(-1)), session_id="s1") as session:
        session.extend(RECORDS)
    return folder


def test_text_report_has_every_table(logs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_report([str(logs)]) == 0
    out = capsys.readouterr().out
    for title in (
        "Sessions",
        "Turns by outcome",
        "Limit hits by kind",
        "Cache losses by session",
        "Tool calls by tool",
    ):
        assert f"{title}\n{'-' * len(title)}\n" in out
    assert re.search(r"^\s*s1\s+5\s+1\s+5\s+5\s+515\s+180\s+48$", out, re.M)  # first block
    assert re.search(r"^\s*s1\s+5\s+90.0\s", out, re.M)  # reasoning tokens lead the next one
    assert re.search(r"^\s*s1\s+unknown\s+4$", out, re.M)  # a loss that does not say
    assert re.search(r"^\s*total\s+5\s+1\s+5\s", out, re.M)
    assert re.search(r"^\s*tool_iterations\s+1\s+1\s+1\s*$", out, re.M)  # hits, sessions, ended
    assert re.search(r"^\s*get_weather\s+5\s+2\s+1\s", out, re.M)  # calls, ran, truncated


def test_tables_show_only_what_happened_and_unknown_as_unknown(logs: Path) -> None:
    """Issue 37: an outcome no turn had and a limit that never fired have no row (the report
    printed ~30 rows of zeros); a loss that does not say what was re-processed is unknown in
    its totals, never 0."""
    t = tables(frames.load(logs))
    by_outcome = t["Turns by outcome"].set_index("outcome").turns.to_dict()
    happened = ("answered", "tool_iterations", "session_full", "cancelled", "no_answer")
    assert by_outcome == dict.fromkeys(happened, 1)
    kinds = t["Limit hits by kind"].set_index("kind").hits.to_dict()
    assert kinds == {"tool_iterations": 1, "thinking_cap": 1, "context_full": 1,
                     "tool_result_cap": 1}  # fmt: skip
    assert t["Cache losses by session"].lost_tokens.tolist() == [40]
    assert t["Cache losses by session"].reprocessed_tokens.isna().tolist() == [True]
    (by_cause,) = t["Cache losses by cause"].to_dict("records")
    assert {k: by_cause[k] for k in ("cause", "losses", "sessions", "lost_tokens")} == {
        "cause": "history_edited",
        "losses": 1,
        "sessions": 1,
        "lost_tokens": 40,
    }
    assert pd.isna(by_cause["reprocessed_tokens"]) and pd.isna(by_cause["reprocessed_ms"])
    text = format_text(frames.load(logs))
    assert "unknown" in text and "<NA>" not in text


def test_html_report_is_self_contained(logs: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert run_report([str(logs)], html=str(out)) == 0
    text = out.read_text(encoding="utf-8")
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    # limit hits, cache reuse, lost tokens by cause, tokens and time of the one session
    assert len(images) == 5
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "<table" in text and "Limit hits by kind" in text
    assert "Cache losses by cause" in text and 'alt="Tokens lost to cache misses, by cause"' in text
    assert "http://" not in text and "https://" not in text and "<script" not in text


def test_no_logs_found_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_report([str(tmp_path)]) == 1
    assert "no session logs (*.jsonl) found" in capsys.readouterr().err
    assert run_report([str(tmp_path / "missing")]) == 1
    assert "missing: no such file or directory" in capsys.readouterr().err


def test_unreadable_logs_named_on_stderr(
    logs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "baseline", "schema": 1}\nnot json\n')
    assert run_report([str(bad)]) == 1
    err = capsys.readouterr().err
    assert "bad.jsonl:2: corrupt line" in err and "none of the 1 session logs" in err
    assert run_report([str(bad), str(logs)]) == 0
    captured = capsys.readouterr()
    assert "bad.jsonl:2: corrupt line" in captured.err
    assert "1 session logs, 5 requests" in captured.out


def test_html_report_names_what_it_left_out(logs: Path, tmp_path: Path) -> None:
    bad = logs / "zz-bad.jsonl"
    bad.write_text('{"type": "baseline", "schema": 1}\nnot json\n')
    out = tmp_path / "report.html"
    assert run_report([str(logs)], html=str(out)) == 0
    text = out.read_text(encoding="utf-8")
    assert "<h2>Left out</h2>" in text and "zz-bad.jsonl:2" in text


def test_html_not_writable_exits_1(logs: Path, tmp_path: Path) -> None:
    assert run_report([str(logs)], html=str(tmp_path / "no" / "such" / "dir.html")) == 1


def test_report_on_the_demo_log_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    copy = tmp_path / DEMO_LOG.name  # read a copy: the cassette stays as recorded
    shutil.copyfile(DEMO_LOG, copy)
    out = tmp_path / "demo.html"
    assert main(["report", str(copy), "--html", str(out)]) == 0
    text = capsys.readouterr().out
    assert "demo-turns" in text and "Turns by outcome" in text
    assert "data:image/png;base64," in out.read_text(encoding="utf-8")
    assert copy.read_bytes() == DEMO_LOG.read_bytes()


def test_format_text_of_nothing() -> None:
    text = format_text(frames.load([]))
    assert "Cache losses by session\n-----------------------\n(none)" in text


REPORT_TAGS = frozenset(
    {"html", "head", "meta", "title", "style", "body", "h1", "h2", "ul", "li", "p", "img"}
    | {"table", "thead", "tbody", "tr", "th", "td"}
)
"""Every tag the HTML report may hold."""


def _plot(tag: str, value: str) -> bool:
    """The report's own plots: inline PNG images."""
    return tag == "img" and value.startswith("data:image/png;base64,")


def test_html_report_keeps_hostile_model_text_inert(tmp_path: Path) -> None:
    folder = tmp_path / "sessions"
    texts = list(HOSTILE_MARKDOWN.values())
    with Session.create(folder, Baseline(time=at(-1)), session_id="hostile") as session:
        for i, text in enumerate(texts):
            session.append(User(content=text, time=at(3 * i)))
            hostile_call = ToolCall(id=f"c{i}", name=text, arguments=json.dumps({"q": text}))
            session.append(Assistant(content=text, tool_calls=(hostile_call,), time=at(3 * i)))
            session.append(ToolResult(call=i + 1, tool_call_id=f"c{i}", name=text, content=text))
            session.append(LimitHit(kind="tool_iterations", detail=text, time=at(3 * i + 1)))
    bad = folder / "zz-<img src=x onerror=alert(1)>.jsonl"
    bad.write_text('{"type": "baseline", "schema": 1}\n<script>alert(1)</script>\n')
    out = tmp_path / "report.html"
    assert run_report([str(folder)], html=str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert live_hazards(page, tags=REPORT_TAGS, src_ok=_plot, css_ok=lambda css: True) == []
    assert page.count("<style>") == 1 and "<script" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page  # the tool name, shown as text
    assert "zz-&lt;img src=x onerror=alert(1)&gt;.jsonl:2" in page  # left out, as text


def test_text_report_prints_terminal_controls_from_a_log_inert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Tool names, limit kinds and cache-loss causes come from the log: printed to a terminal
    their escape sequences (title, blink, clear) must show as text, never act."""
    folder = tmp_path / "sessions"
    name = "get_\x1b]0;PWN\x07weather"
    with Session.create(folder, Baseline(time=at(-1)), session_id="esc") as session:
        session.append(User(content="x", time=at(0)))
        made = ToolCall(id="c1", name=name, arguments="{}")
        session.append(Assistant(content=None, tool_calls=(made,)))
        session.append(ToolResult(call=1, tool_call_id="c1", name=name, content="ok"))
        # a limit kind is one of LIMIT_KINDS (the log's rule): a cause is any text
        session.append(CacheLoss(expected=9, reused=0, cause="evicted\x1b[5m", time=at(1)))
        session.append(LimitHit(kind="loop", detail="\x1b[2J", time=at(1)))
    bad = folder / "zz-\x1b[31m.jsonl"
    bad.write_text('{"type": "baseline", "schema": 1}\n\x1b[2J\n')
    assert run_report([str(folder)]) == 0
    out, err = capsys.readouterr()
    for stream in (out, err):
        assert "\x1b" not in stream and "\x07" not in stream
    assert "get_\\x1b]0;PWN\\x07weather" in out and "evicted\\x1b[5m" in out
    assert "zz-\\x1b[31m.jsonl" in err


@pytest.mark.parametrize("dollars", ["$", "a$b$c", "$x^{$"])
def test_html_report_draws_a_dollar_in_a_kind_or_a_session_id(tmp_path: Path, dollars: str) -> None:
    """Issue 23: matplotlib read ``$`` as mathtext and the drawing failed (a lone ``$``, or
    ``$x^{$``); a ``$`` from a log is a character. Limit kinds and session ids are checked by
    the log's rule now (no ``$`` gets in), so the ``$`` rides in a cache loss's cause, which
    the lost-tokens plot draws as a label."""
    folder = tmp_path / "sessions"
    with Session.create(folder, Baseline(time=at(-1)), session_id="s1") as session:
        session.append(User(content="x", time=at(0)))
        session.append(Assistant(content="y", time=at(1)))
        session.append(Usage(timings={"cache_n": 0, "prompt_n": 5}, time=at(1)))
        session.append(CacheLoss(expected=9, reused=0, cause=f"c{dollars}", time=at(2)))
        session.append(LimitHit(kind="loop", detail=f"d{dollars}", time=at(2)))
    out = tmp_path / "report.html"
    assert run_report([str(folder)], html=str(out)) == 0
    page = out.read_text(encoding="utf-8")
    assert "Limit hits per kind" in page and "Tokens per request: s" in page


def test_the_text_report_fits_100_columns() -> None:
    """Issue 21: the Sessions table was ~230 characters wide; now it comes in blocks of whole
    columns, each led by the session, and no value is lost."""
    logs = [ROOT / "cassettes" / f"{name}.session.jsonl" for name in CASSETTE_LOGS]
    loaded = frames.load(logs)
    text = format_text(loaded)
    assert max(len(line) for line in text.splitlines()) <= TEXT_WIDTH
    sessions = text.split("Sessions\n--------\n", 1)[1].split("\n\nTurns by outcome", 1)[0]
    blocks = sessions.split("\n\n")
    assert len(blocks) >= 2 and all(b.split()[0] == "session" for b in blocks)
    for name in SESSION_COLUMNS[1:]:  # each once; the session leads every block
        assert sum(b.splitlines()[0].split().count(name) for b in blocks) == 1, name
    assert "loop-cycle" in blocks[-1] and "total" in blocks[-1]
