"""One reading of a log: every view of a session gives the same numbers (issue 34).

A folder of generated logs (plain sessions, forks after a turn, at an edited tool result and
before an answer, a fork of a fork, cancelled and limited turns, completions whose server sent
no ``timings`` or only OpenAI ``usage``, a byte-for-byte copy of a fork's log and a corrupt
log) is read by every view: the pandas frames, the DuckDB frames, the Parquet files, the
OpenTelemetry spans, the Inspect samples, the ATIF trajectories, the transcript view and
``report --json``. Per
session and per turn they must agree on turns, completions, tokens (unknown where the server
did not say, in every view), times, cache losses and limit hits. The views of an optional
extra take part where it is installed (CI installs them all).

Two properties over the same generated folders: the light views (pandas frames, ``report
--json``, the transcript, the OTel spans, ATIF) over :data:`EXAMPLES` examples, and the heavy ones
(the DuckDB engine, Parquet, Inspect's ``.eval``, a second or more each) over a sixth of them.
``BOXMAKER_AGREEMENT=2000`` runs 2,000 examples of the first (and 333 of the second); the
quick suite runs 150 (and 25).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from extras import has
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker import frames
from boxmaker.cli import main
from boxmaker.records import (
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
)
from boxmaker.session import LogReadWarning, Session, read_log, read_logs
from boxmaker.view import Transcript

EXAMPLES = int(os.environ.get("BOXMAKER_AGREEMENT", "150"))
"""Examples of the light views' property; the heavy views' property runs a sixth of them."""


# -- generated sessions ------------------------------------------------------------------------


@dataclass(frozen=True)
class Completion:
    """One completion of a generated turn: its tool calls (0: an answer), what its server
    sent of its usage, and what follows it."""

    calls: int
    usage: str  # "timings", "no_cache_n", "usage_only", "nothing"
    tokens: tuple[int, int, int]  # cache_n, prompt_n, predicted_n
    loss: bool
    limit: bool


@dataclass(frozen=True)
class TurnPlan:
    completions: tuple[Completion, ...]
    ending: str  # "answered", "cancelled", "tool_iterations"


@dataclass
class Plan:
    turns: list[TurnPlan]
    forks: list[tuple[str, int]] = field(default_factory=list)


completion = st.builds(
    Completion,
    calls=st.integers(0, 2),
    usage=st.sampled_from(["timings", "timings", "timings", "no_cache_n", "usage_only", "nothing"]),
    tokens=st.tuples(st.integers(0, 900), st.integers(0, 300), st.integers(1, 60)),
    loss=st.booleans(),
    limit=st.booleans(),
)
turn_plan = st.builds(
    TurnPlan,
    completions=st.lists(completion, min_size=0, max_size=3).map(tuple),
    ending=st.sampled_from(["answered", "answered", "cancelled", "tool_iterations"]),
)
plans = st.builds(
    Plan,
    turns=st.lists(turn_plan, min_size=1, max_size=3),
    forks=st.lists(
        st.tuples(st.sampled_from(["after", "edit", "rerun", "fork_of_fork"]), st.integers(1, 3)),
        max_size=3,
    ),
)


def _usage(c: Completion) -> Usage:
    cache_n, prompt_n, predicted_n = c.tokens
    timings = {
        "cache_n": cache_n,
        "prompt_n": prompt_n,
        "predicted_n": predicted_n,
        "prompt_ms": prompt_n * 0.5,
        "predicted_ms": predicted_n * 2.0,
    }
    if c.usage == "timings":
        return Usage(timings=timings, reasoning_tokens=3, finish_reason="stop")
    if c.usage == "no_cache_n":  # a llama.cpp build whose timings have no cache_n
        return Usage(timings={k: v for k, v in timings.items() if k != "cache_n"})
    if c.usage == "usage_only":  # vLLM: OpenAI usage, no timings
        return Usage(prompt_tokens=cache_n + prompt_n, completion_tokens=predicted_n)
    return Usage()


def _turn(session: Session, plan: TurnPlan, text: str) -> None:
    session.append(User(content=text))
    call = session.next_call()
    for k, c in enumerate(plan.completions):
        calls = tuple(
            ToolCall(id=f"c{call + j}", name="get_weather", arguments='{"city": "Oslo"}')
            for j in range(c.calls)
        )
        records: list[Any] = [Assistant(content=None if calls else "done", tool_calls=calls)]
        records.append(_usage(c))
        if c.loss:
            cache_n, prompt_n, _ = c.tokens
            expected = cache_n + prompt_n + 10
            again = None if k % 2 else 12 + cache_n % 7
            records.append(CacheLoss(expected=expected, reused=cache_n, reprocessed=again))
        if c.limit:
            records.append(LimitHit(kind="thinking_cap", detail="capped"))
        for j, made in enumerate(calls):
            ran = plan.ending != "cancelled" or j == 0
            records.append(
                ToolResult(
                    call=call + j,
                    tool_call_id=made.id,
                    name=made.name,
                    content="sunny" if ran else "not run: cancelled",
                    not_run=None if ran else "cancelled",
                )
            )
        call += len(calls)
        session.extend(records)
    if plan.ending == "tool_iterations":
        session.append(LimitHit(kind="tool_iterations", detail="2 completions"))
    outcome = plan.ending if plan.ending != "tool_iterations" else "tool_iterations"
    session.append(TurnEnd(outcome=outcome))  # type: ignore[arg-type]


def _make(folder: Path, plan: Plan) -> list[Path]:
    """The plan's logs in ``folder``: a parent, its forks, a copy of the last fork's log and a
    corrupt log. Returns the logs that are sessions (the copy and the corrupt one are not)."""
    made: list[Path] = []
    with Session.create(folder, Baseline(system="sys"), session_id="parent") as parent:
        for n, turn in enumerate(plan.turns, 1):
            _turn(parent, turn, f"question {n}")
    made.append(parent.path)
    last = parent.path
    for k, (how, at) in enumerate(plan.forks):
        source = Session.open(last if how == "fork_of_fork" else parent.path, read_only=True)
        turns = sum(isinstance(r, User) for r in source.records)
        results = [r.call for r in source.records if isinstance(r, ToolResult)]
        at = min(at, turns)
        sid = f"fork{k}"
        with source:
            if how == "edit" and results:
                fork = source.fork(call=results[at % len(results)], result="edited", session_id=sid)
            elif how == "rerun":
                fork = source.fork(at=at, rerun=True, session_id=sid)
            else:
                fork = source.fork(at=at, session_id=sid)
        with fork:
            if how == "edit" and results:
                fork.extend([Assistant(content="after the edit"), _usage(_BASIC)])
                fork.append(TurnEnd(outcome="answered"))
            _turn(fork, plan.turns[0], "the fork's own question")
        made.append(fork.path)
        last = fork.path
    if len(made) > 1:  # a backup copy of a fork's log: not a session of its own
        shutil.copyfile(made[-1], folder / f"backup-of-{made[-1].name}")
    (folder / "corrupt.jsonl").write_text('{"type": "baseline", "schema": 4}\n{not json\n')
    return made


_BASIC = Completion(0, "timings", (100, 20, 5), loss=False, limit=False)


# -- the views ----------------------------------------------------------------------------------


def _int(value: Any) -> int | None:
    return None if value is None or pd.isna(value) else int(value)


def _turn_key(row: Any) -> tuple[str, int]:
    return (str(row["session"]), int(row["turn"]))


def _frames_view(loaded: frames.Frames) -> dict[str, Any]:
    """Per session and per own turn, the figures every view must give."""
    out: dict[str, Any] = {"sessions": {}, "turns": {}}
    for row in loaded.summary.to_dict("records"):
        out["sessions"][str(row["session"])] = {
            "turns": int(row["turns"]),
            "requests": int(row["requests"]),
            "prompt_tokens": _int(row["prompt_tokens"]),
            "cached_tokens": _int(row["cached_tokens"]),
            "generated_tokens": _int(row["generated_tokens"]),
            "cache_losses": int(row["cache_losses"]),
            "limit_hits": int(row["limit_hits"]),
            "wall_us": _us(row["ended"]) - _us(row["started"]),
        }
    for row in loaded.turns.to_dict("records"):
        if row["from_parent"]:
            continue
        out["turns"][_turn_key(row)] = {
            "requests": int(row["requests"]),
            "prompt_tokens": _int(row["prompt_tokens"]),
            "cached_tokens": _int(row["cached_tokens"]),
            "generated_tokens": _int(row["generated_tokens"]),
            "cache_losses": int(row["cache_losses"]),
            "limit_hits": int(row["limit_hits"]),
            "tool_results": int(row["tool_results"]),
            "wall_us": _us(row["ended"]) - _us(row["started"]),
        }
    return out


def _us(t: Any) -> int:
    return int(pd.Timestamp(t).value // 1000)


def _otel_view(folder: Path) -> dict[tuple[str, int], Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from boxmaker.export import session_spans
    from boxmaker.session import split_turns

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("agreement")
    for log in read_logs(folder):
        session_spans(split_turns(log), tracer)
    spans = memory.get_finished_spans()
    roots = {s.context.span_id: s for s in spans if s.name == "invoke_agent boxmaker"}
    turns: dict[tuple[str, int], dict[str, Any]] = {}
    for root in roots.values():
        attrs: Any = root.attributes or {}
        events = [e.name for e in root.events]
        turns[(str(attrs["gen_ai.conversation.id"]), int(attrs["boxmaker.turn"]))] = {
            "requests": 0,
            "prompt_tokens": 0,
            "cached_tokens": 0,
            "generated_tokens": 0,
            "cache_losses": events.count("boxmaker.cache_loss"),
            "limit_hits": events.count("boxmaker.limit_hit"),
            "tool_results": 0,
            "wall_us": ((root.end_time or 0) - (root.start_time or 0)) // 1000,
        }
    for span in spans:
        if span.parent is None or span.parent.span_id not in roots:
            continue
        root = roots[span.parent.span_id]
        ra: Any = root.attributes or {}
        turn = turns[(str(ra["gen_ai.conversation.id"]), int(ra["boxmaker.turn"]))]
        attrs = span.attributes or {}
        if span.name.startswith("chat "):
            turn["requests"] += 1
            for name, key in (
                ("prompt_tokens", "gen_ai.usage.input_tokens"),
                ("cached_tokens", "gen_ai.usage.cache_read.input_tokens"),
                ("generated_tokens", "gen_ai.usage.output_tokens"),
            ):
                value = attrs.get(key)
                turn[name] = None if value is None or turn[name] is None else turn[name] + value
        elif span.name.startswith("execute_tool "):
            turn["tool_results"] += 1
    provider.shutdown()
    return turns


def _inspect_view(folder: Path, out: Path) -> dict[str, Any]:
    from inspect_ai.log import read_eval_log

    from boxmaker.export import export_inspect

    export_inspect(folder, out / "run.eval")
    log = read_eval_log(str(out / "run.eval"))
    sessions: dict[str, Any] = {}
    for sample in log.samples or []:
        usage = next(iter(sample.model_usage.values()), None)
        meta = sample.metadata
        sessions[str(sample.id)] = {
            "turns": meta["boxmaker_turns"],
            "requests": meta["boxmaker_requests"],
            "prompt_tokens": usage.input_tokens if usage else None,
            "cached_tokens": usage.input_tokens_cache_read if usage else None,
            "generated_tokens": usage.output_tokens if usage else None,
            "cache_losses": meta["boxmaker_cache_losses"],
            "limit_hits": meta["boxmaker_limit_hits"],
            "wall_us": round((sample.total_time or 0.0) * 1e6),
        }
    return sessions


def _plus(total: int | None, value: Any) -> int | None:
    """A sum that stays unknown once a part is (the frames' ``sum(skipna=False)``)."""
    return None if total is None or value is None else total + int(value)


def _atif_view(folder: Path, out: Path) -> dict[str, Any]:
    """Per session (``final_metrics`` and the records kept in ``extra``) and per own turn (a
    user step and the steps after it: own agent steps' metrics, own records), what the ATIF
    export says; every trajectory validated by the ``atif`` package's models where installed."""
    from boxmaker.export import export_atif

    if out.exists():
        shutil.rmtree(out)
    sessions: dict[str, Any] = {}
    turns: dict[tuple[str, int], Any] = {}
    for path in export_atif(folder, out):
        body = json.loads(path.read_text())
        if has("atif"):
            import atif

            atif.Trajectory.model_validate(body)
        sid = str(body["session_id"])
        before = body["extra"]["boxmaker"].get("records", [])
        forked = next((r["time"] for r in before if r["type"] == "forked"), None)
        times = [r["time"] for r in before]
        number, current, mine_of = 0, None, {}
        for step in body["steps"]:
            if step["source"] == "system":
                continue
            kept = step["extra"]["boxmaker"]
            records = kept["records"]
            copied = bool(step.get("is_copied_context"))
            mine = records[kept.get("own", len(records) if copied else 0) :]
            times += [r["time"] for r in records]
            if step["source"] == "user":
                number += 1
                current = turns.setdefault((sid, number), dict.fromkeys(_TURN_FIGURES, 0))
                current["started"], mine_of[(sid, number)] = step["timestamp"], False
            if current is None:
                continue
            current["ended"] = records[-1]["time"]
            mine_of[(sid, number)] = mine_of[(sid, number)] or bool(mine)
            if step.get("llm_call_count") and not copied:
                current["requests"] += 1
                for name in ("prompt_tokens", "cached_tokens"):
                    current[name] = _plus(current[name], step["metrics"].get(name))
                generated = step["metrics"].get("completion_tokens")
                current["generated_tokens"] = _plus(current["generated_tokens"], generated)
            current["cache_losses"] += sum(r.get("type") == "cache_loss" for r in mine)
            current["limit_hits"] += sum(r.get("type") == "limit_hit" for r in mine)
            current["tool_results"] += sum(
                r.get("native") == "tool_result" or r.get("type") == "tool_result" for r in mine
            )
        own = [k for k in mine_of if k[0] == sid and mine_of[k]]
        for key in [k for k in mine_of if k[0] == sid]:
            if not mine_of[key]:
                del turns[key]
                continue
            turn = turns[key]
            started = turn.pop("started")
            if forked is not None and _us(forked) > _us(started):
                started = forked  # a turn the fork goes on with from copied records
            turn["wall_us"] = _us(turn.pop("ended")) - _us(started)
        final = body["final_metrics"]
        start = forked or body["extra"]["boxmaker"]["baseline_time"]
        sessions[sid] = {
            "turns": len(own),
            "requests": final["extra"]["boxmaker"]["completions"],
            "prompt_tokens": final.get("total_prompt_tokens"),
            "cached_tokens": final.get("total_cached_tokens"),
            "generated_tokens": final.get("total_completion_tokens"),
            "cache_losses": sum(turns[k]["cache_losses"] for k in own),
            "limit_hits": sum(turns[k]["limit_hits"] for k in own),
            "wall_us": _us(times[-1] if times else start) - _us(start),
        }
    return {"sessions": sessions, "turns": turns}


_TURN_FIGURES = (
    "requests",
    "prompt_tokens",
    "cached_tokens",
    "generated_tokens",
    "cache_losses",
    "limit_hits",
    "tool_results",
)


def _report_view(folder: Path) -> dict[tuple[str, int], Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["report", "--json", str(folder)]) == 0
    body = json.loads(out.getvalue())
    turns = {}
    for row in body["turns"]:
        if row["from_parent"]:
            continue
        turns[_turn_key(row)] = {
            k: row[k]
            for k in (
                "requests",
                "prompt_tokens",
                "cached_tokens",
                "generated_tokens",
                "cache_losses",
                "limit_hits",
                "tool_results",
            )
        } | {"wall_us": _us(row["ended"]) - _us(row["started"])}
    return turns


def _transcript_view(loaded: frames.Frames, folder: Path) -> dict[tuple[str, int], Any]:
    """The transcript's counters of each turn, against all the turn's requests rows (copied
    and own: the transcript shows a turn whole)."""
    got: dict[tuple[str, int], Any] = {}
    for log in read_logs(folder):
        with Session.open(log.path, read_only=True) as session:
            transcript = Transcript().extend(session.records)
        for n, view in enumerate(transcript.turns, 1):  # one per User record
            got[(session.id, n)] = {
                "requests": view.completions,
                "processed_tokens": view.prompt,
                "cached_tokens": view.cached,
                "cache_losses": sum(kind == "cache_loss" for kind, _ in view.badges),
            }
    return got


def _all_requests_of_turns(loaded: frames.Frames) -> dict[tuple[str, int], Any]:
    want: dict[tuple[str, int], Any] = {}
    req, loss = loaded.requests, loaded.cache_losses
    for row in loaded.turns.to_dict("records"):
        session, turn = row["session"], row["turn"]
        key = (str(session), int(turn))
        rows = req[(req.session == session) & (req.turn == turn)]
        losses = loss[(loss.session == session) & (loss.turn == turn)]
        want[key] = {
            "requests": len(rows),
            "processed_tokens": _int(rows.processed_tokens.sum(skipna=False)),
            "cached_tokens": _int(rows.cached_tokens.sum(skipna=False)),
            "cache_losses": len(losses),
        }
    return want


# -- the property ---------------------------------------------------------------------------


@contextlib.contextmanager
def _quiet() -> Iterator[list[str]]:
    """The LogReadWarning messages of a block (the copy and the corrupt log are left out)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LogReadWarning)
        told: list[str] = []
        yield told
    told += [str(w.message) for w in caught if issubclass(w.category, LogReadWarning)]


def _folder(tmp_path: Path, plan: Plan) -> tuple[Path, list[Path], frames.Frames]:
    """A fresh folder of the plan's logs, the logs that are sessions, and their frames; the
    copy and the corrupt log are left out, each said once, and which log is the session does
    not depend on the sort order (``backup-of-...`` sorts first)."""
    folder = tmp_path / "logs"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir()
    sessions = _make(folder, plan)
    ids = [read_log(p).session_id for p in sessions]
    with _quiet() as told:
        loaded = frames.load(folder)
    assert sorted(loaded.summary.session.astype(str)) == sorted(ids)
    assert set(loaded.summary.path) == {str(p) for p in sessions}
    if len(sessions) > 1:
        assert sum("a copy of session" in m for m in told) == 1
    assert sum("corrupt.jsonl" in m for m in told) == 1
    return folder, sessions, loaded


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@_settings(EXAMPLES)
@given(plan=plans)
def test_the_light_views_of_a_session_give_the_same_numbers(tmp_path: Path, plan: Plan) -> None:
    folder, _, loaded = _folder(tmp_path, plan)
    want = _frames_view(loaded)
    with _quiet():
        assert _report_view(folder) == want["turns"]
        assert _transcript_view(loaded, folder) == _all_requests_of_turns(loaded)
    if has("opentelemetry.sdk"):
        with _quiet():
            assert _otel_view(folder) == want["turns"]
    with _quiet():
        assert _atif_view(folder, tmp_path / "atif") == want


@_settings(max(1, EXAMPLES // 6))
@given(plan=plans)
def test_the_heavy_views_of_a_session_give_the_same_numbers(tmp_path: Path, plan: Plan) -> None:
    if not (has("duckdb") or has("pyarrow") or has("inspect_ai")):
        pytest.skip(
            "needs the 'export' extra (duckdb, pyarrow, inspect_ai): pip install -e '.[export]'"
        )
    folder, sessions, loaded = _folder(tmp_path, plan)
    want = _frames_view(loaded)
    if has("duckdb"):
        with _quiet():
            assert _frames_view(frames.load(folder, engine="duckdb")) == want
    if has("pyarrow"):
        from boxmaker.export import write_parquet

        with _quiet():
            files = write_parquet(folder, tmp_path / "parquet")
        turns = pd.read_parquet(files["turns"])
        summary = pd.read_parquet(files["summary"])
        parquet = _frames_view(loaded._replace(turns=turns, summary=summary))
        assert parquet == want
    if has("opentelemetry.sdk"):
        with _quiet():
            assert _otel_view(folder) == want["turns"]
    if has("inspect_ai"):
        with _quiet() as told:
            samples = _inspect_view(folder, tmp_path)
        walls = {k: v.pop("wall_us") for k, v in samples.items()}
        sessions_want = {k: dict(v) for k, v in want["sessions"].items()}
        for k, v in sessions_want.items():  # Inspect keeps seconds as a float: 1 us apart
            assert abs(walls[k] - v.pop("wall_us")) <= 1
            if samples[k]["prompt_tokens"] is None:  # no ModelUsage: Inspect's would say 0
                assert v["prompt_tokens"] is None or v["generated_tokens"] is None
                for name in ("prompt_tokens", "cached_tokens", "generated_tokens"):
                    del samples[k][name], v[name]
        assert samples == sessions_want
        if len(sessions) > 1:  # read once: the copy said once, not once per frame
            assert sum("a copy of session" in m for m in told) == 1
