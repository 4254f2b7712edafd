"""boxmaker export atif / import atif: ATIF trajectories (v1.8) that the ``atif`` package's
models accept, a step per completion with llama.cpp's tokens (unknown absent), forks' copied
steps flagged, a batch's settings kept; and the round trips: log -> ATIF -> log gives the
same frames (generated logs, every fork point), ATIF's own fields alone give the same
messages and tokens, and a parent with its forks, filtered for training, counts each
completion once."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from extras import need
from hypothesis import HealthCheck, given, settings
from pandas.testing import assert_frame_equal
from test_agreement import EXAMPLES, Plan, _folder, _quiet, plans

from boxmaker import frames
from boxmaker.cli import main
from boxmaker.errors import ExportError
from boxmaker.export import ATIF_VERSION, atif_log, export_atif, import_atif
from boxmaker.records import Assistant, Baseline, ToolResult, TurnEnd, Usage, User, usage_tokens
from boxmaker.session import Session, read_logs, split_turns
from boxmaker.tap import what_if_log
from boxmaker.testing import call

atif = need("atif")
ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
PLAIN = ROOT / "cassettes" / "demo-turns.session.jsonl"  # recorded from the embedded server
FORK = DATA / "schema-4.jsonl"  # a fork of schema-3.jsonl, before turn 2's answer


def _validated(path: Path) -> Any:
    return atif.Trajectory.model_validate_json(path.read_text())


def _ints(column: pd.Series) -> list[int | None]:
    return [None if pd.isna(v) else int(v) for v in column]


def _requests(source: Any) -> pd.DataFrame:
    return frames.requests(source)


def test_a_plain_session_is_a_step_per_completion_with_the_servers_tokens(tmp_path: Path) -> None:
    (path,) = export_atif(PLAIN, tmp_path)
    assert path == tmp_path / "demo-turns.json"
    trajectory = _validated(path)
    assert trajectory.schema_version == ATIF_VERSION == "ATIF-v1.8"
    assert trajectory.session_id == "demo-turns"
    assert trajectory.agent.name == "boxmaker"
    assert [t["function"]["name"] for t in trajectory.agent.tool_definitions or []] == [
        "get_weather",
        "get_time",
    ]
    agents = [s for s in trajectory.steps if s.source == "agent"]
    (log,) = read_logs(PLAIN)
    usages = [r for r in log.records if r["type"] == "usage"]
    assert len(agents) == len(usages) == len(_requests(PLAIN))
    for step, usage in zip(agents, usages, strict=True):
        timings = usage["timings"]
        assert step.llm_call_count == 1 and step.metrics is not None
        assert step.metrics.cached_tokens == timings["cache_n"]
        assert step.metrics.prompt_tokens == timings["cache_n"] + timings["prompt_n"]
        assert step.metrics.completion_tokens == timings["predicted_n"]
        assert step.metrics.prompt_token_ids is None  # no server given
        assert step.metrics.completion_token_ids is None and step.metrics.logprobs is None
        assert step.metrics.extra is not None and step.metrics.extra["timings"] == timings
    first = agents[0]
    assert first.tool_calls is not None and first.tool_calls[0].arguments == {"city": "Lisbon"}
    assert first.reasoning_content and first.reasoning_content.startswith("The user wants")
    assert first.observation is not None
    (result,) = first.observation.results
    assert result.source_call_id == first.tool_calls[0].tool_call_id
    assert result.content == '{"city": "Lisbon", "temperature": 34, "sky": "clear"}'
    assert agents[1].message == "In Lisbon it is 34 C and clear."
    users = [s.message for s in trajectory.steps if s.source == "user"]
    assert users == ["What is the weather in Lisbon?", "What time is it in Tokyo?"]
    summary = frames.summary(PLAIN).iloc[0]
    final = trajectory.final_metrics
    assert final is not None
    assert final.total_prompt_tokens == summary.prompt_tokens
    assert final.total_cached_tokens == summary.cached_tokens
    assert final.total_completion_tokens == summary.generated_tokens
    assert not any(s.is_copied_context for s in trajectory.steps)
    ends = [r for s in trajectory.steps for r in (s.extra or {})["boxmaker"]["records"]
            if r.get("type") == "turn_end"]  # fmt: skip
    assert [e["outcome"] for e in ends] == ["answered", "answered"]
    losses = [r for s in trajectory.steps for r in (s.extra or {})["boxmaker"]["records"]
              if r.get("type") == "cache_loss"]  # fmt: skip
    assert len(losses) == len(frames.cache_losses(PLAIN))


def test_unknown_tokens_are_absent_never_zero(tmp_path: Path) -> None:
    with Session.create(tmp_path / "logs", Baseline(system="sys"), session_id="s") as session:
        session.extend([User(content="hi"), Assistant(content="a"), Usage()])
        session.extend([Assistant(content="b"), Usage(timings={"prompt_n": 5, "predicted_n": 2})])
        session.extend([Assistant(content="c"), Usage(prompt_tokens=9, completion_tokens=3)])
        session.append(TurnEnd(outcome="answered"))
    (path,) = export_atif(tmp_path / "logs", tmp_path / "out")
    body = json.loads(path.read_text())
    _validated(path)
    assert body["steps"][0]["source"] == "system" and body["steps"][0]["message"] == "sys"
    metrics = [s["metrics"] for s in body["steps"] if s["source"] == "agent"]
    assert [{k: v for k, v in m.items() if k != "extra"} for m in metrics] == [
        {},
        {"completion_tokens": 2},
        {"prompt_tokens": 9, "completion_tokens": 3},
    ]
    assert body["final_metrics"] == {"total_steps": 5, "extra": {"boxmaker": {"completions": 3}}}


def test_a_fork_flags_its_copied_steps_and_names_its_parent(tmp_path: Path) -> None:
    written = export_atif([DATA / "schema-3.jsonl", FORK], tmp_path)
    parent, fork = (_validated(p) for p in written)
    assert not any(s.is_copied_context for s in parent.steps)
    copied = [s for s in fork.steps if s.is_copied_context]
    requests = _requests(FORK)
    assert len([s for s in copied if s.source == "agent"]) == int(requests.from_parent.sum())
    assert fork.steps.index(copied[-1]) == len(copied) - 1  # the copies come first
    assert fork.extra is not None
    own = fork.extra["boxmaker"]
    assert own["parent"] == {
        "trajectory_id": "schema-3",
        "trajectory_path": "schema-3.json",
        "session_id": "schema-3",
    }
    assert (tmp_path / own["parent"]["trajectory_path"]).is_file()
    assert own["settings"] == {"sampling.temperature": 0.5}
    assert own["records"][0]["type"] == "forked"
    assert fork.notes and "final_metrics count this trajectory's own steps" in fork.notes
    summary = frames.summary(FORK).iloc[0]
    assert fork.final_metrics is not None
    assert fork.final_metrics.total_prompt_tokens == summary.prompt_tokens
    assert fork.final_metrics.total_steps == len(fork.steps) - len(copied)


def _batch(tmp_path: Path) -> Path:
    """A 2x1 grid batch folder: two runs of one task, their logs, settings and target."""
    folder = tmp_path / "batch"
    (folder / "logs").mkdir(parents=True)
    runs = {"lisbon.aaaaaaaa": 16, "lisbon.bbbbbbbb": 64}
    lines = []
    for run, tokens in runs.items():
        text = PLAIN.read_text().replace('"session_id":"demo-turns"', f'"session_id":"{run}"')
        (folder / "logs" / f"{run}.jsonl").write_text(text)
        lines.append(
            {
                "time": "2026-12-01T00:00:00+00:00",
                "run": run,
                "state": "planned",
                "task": "lisbon",
                "settings": {"loop.thinking_tokens": tokens},
                "messages": 2,
                "target": {"answer": {"contains": "34"}},
            }
        )
        lines.append({"time": "2026-12-01T00:00:01+00:00", "run": run, "state": "done"})
    (folder / "manifest.ndjson").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return folder


def test_a_batch_keeps_each_runs_task_settings_and_target(tmp_path: Path) -> None:
    folder = _batch(tmp_path)
    for one in (folder / "logs", folder / "logs" / "lisbon.aaaaaaaa.jsonl"):  # also named so
        (path, *_) = export_atif(one, tmp_path / "one")
        assert json.loads(path.read_text())["extra"]["boxmaker"]["run"]["task"] == "lisbon"
    written = export_atif(folder, tmp_path / "out")
    got = {}
    for path in written:
        trajectory = _validated(path)
        assert trajectory.extra is not None
        got[trajectory.session_id] = trajectory.extra["boxmaker"]["run"]
    assert got == {
        "lisbon.aaaaaaaa": {
            "task": "lisbon",
            "settings": {"loop.thinking_tokens": 16},
            "target": {"answer": {"contains": "34"}},
        },
        "lisbon.bbbbbbbb": {
            "task": "lisbon",
            "settings": {"loop.thinking_tokens": 64},
            "target": {"answer": {"contains": "34"}},
        },
    }


def test_arguments_that_are_no_json_object_keep_their_text(tmp_path: Path) -> None:
    texts = ['{"city":"Oslo"}', "not json", "[1, 2]"]
    with Session.create(tmp_path / "logs", session_id="args") as session:
        session.append(User(content="go"))
        made = [call("get_weather", {}, f"c{k}") for k in range(3)]
        made = [
            type(c)(id=c.id, name=c.name, arguments=t) for c, t in zip(made, texts, strict=True)
        ]
        session.extend([Assistant(content=None, tool_calls=tuple(made)), Usage()])
        session.extend(
            [ToolResult(call=k + 1, tool_call_id=c.id, name=c.name, content="x")
             for k, c in enumerate(made)]
        )  # fmt: skip
    (path,) = export_atif(tmp_path / "logs", tmp_path / "out")
    step = next(s for s in _validated(path).steps if s.source == "agent")
    assert [c.arguments for c in step.tool_calls or ()] == [{"city": "Oslo"}, {}, {}]
    assert [(c.extra or {})["boxmaker"]["arguments"] for c in step.tool_calls or ()] == texts
    assert import_atif(path, tmp_path / "back").left_out == {}
    (back,) = read_logs(tmp_path / "back")
    assistant = next(r for r in back.records if r["type"] == "assistant")
    assert [c["arguments"] for c in assistant["tool_calls"]] == texts


# -- prompt token ids, from a server's template and tokenizer ---------------------------------


class _Tokenizer:
    """``/apply-template`` (the messages as text, a generation prompt after them) and
    ``/tokenize`` (one token per character, BOS 1 with ``add_special``)."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        if request.url.path == "/apply-template":
            text = "".join(f"<{m['role']}>{m.get('content') or ''}\n" for m in body["messages"])
            return httpx.Response(200, json={"prompt": text + "<assistant>"})
        assert request.url.path == "/tokenize" and body["with_pieces"]
        head = [{"id": 1, "piece": "<s>"}] if body["add_special"] else []
        tokens = head + [{"id": ord(c), "piece": c} for c in body["content"]]
        return httpx.Response(200, json={"tokens": tokens})


def test_prompt_token_ids_are_the_servers_rendering_of_each_request(tmp_path: Path) -> None:
    server = _Tokenizer()
    transport = httpx.MockTransport(server)
    (path,) = export_atif(PLAIN, tmp_path, url="http://llama", transport=transport)
    agents = [s for s in _validated(path).steps if s.source == "agent"]
    ids = [s.metrics.prompt_token_ids for s in agents if s.metrics is not None]
    assert len(ids) == 4 and all(i is not None and i[0] == 1 for i in ids)
    prompts = ["".join(map(chr, i[1:])) for i in ids if i is not None]
    assert prompts[0] == "<user>What is the weather in Lisbon?\n<assistant>"
    for earlier, later in itertools.pairwise(prompts):  # each request extends
        assert later.startswith(earlier.removesuffix("<assistant>"))
    templates = [b for b in server.bodies if "messages" in b]
    assert all(b["tools"][0]["function"]["name"] == "get_weather" for b in templates)
    assert all(b["chat_template_kwargs"] == {"enable_thinking": True} for b in templates)
    for step in agents:  # the toy tokenizer is not the model's: the counts differ, and say so
        assert step.metrics is not None and step.metrics.extra is not None
        assert step.metrics.extra["prompt_token_ids_match"] is False


def test_a_server_that_cannot_tokenize_fails_the_export_naming_the_completion(
    tmp_path: Path,
) -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(500, json={"error": "boom"}))
    with pytest.raises(ExportError, match="completion 1: the server at http://llama"):
        export_atif(PLAIN, tmp_path, url="http://llama", transport=transport)


# -- the command line ---------------------------------------------------------------------------


def test_the_commands_export_and_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", "atif", str(PLAIN), str(FORK), "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(tmp_path / "t" / "demo-turns.json"), str(tmp_path / "t" / "schema-4.json")]
    logs = tmp_path / "logs"
    assert main(["import", "atif", out[0], "--dir", str(logs)]) == 0
    assert capsys.readouterr().out.strip() == str(logs / "demo-turns.jsonl")
    assert main(["import", "atif", out[0], "--dir", str(logs)]) == 1  # the log exists
    assert "already" in capsys.readouterr().err or (logs / "demo-turns.jsonl").exists()
    assert main(["import", "atif", out[0], out[1], "--session-id", "x"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"steps": [{"step_id": 1, "source": "robot", "message": "?"}]}')
    assert main(["import", "atif", str(bad), "--dir", str(logs)]) == 1
    assert "step 1: source 'robot'" in capsys.readouterr().err


# -- another harness's trajectory ---------------------------------------------------------------

FOREIGN: dict[str, Any] = {
    "schema_version": "ATIF-v1.7",
    "session_id": "harbor-run-1",
    "agent": {"name": "other-agent", "version": "2.0", "model_name": "qwen3-8b"},
    "steps": [
        {"step_id": 1, "source": "system", "message": "You are helpful.",
         "timestamp": "2026-01-15T09:00:00Z"},
        {"step_id": 2, "source": "user", "message": "Weather in Oslo and Rome?",
         "timestamp": "2026-01-15T09:00:01"},
        {"step_id": 3, "source": "agent", "message": "", "timestamp": "2026-01-15T09:00:02Z",
         "reasoning_content": "two calls",
         "tool_calls": [
             {"tool_call_id": "a", "function_name": "get_weather", "arguments": {"city": "Oslo"}},
             {"tool_call_id": "b", "function_name": "get_weather", "arguments": {"city": "Rome"}},
         ],
         "observation": {"results": [
             {"source_call_id": "a", "content": "rain"},
             {"source_call_id": "b", "content": [
                 {"type": "text", "text": "sun"},
                 {"type": "image", "source": {"media_type": "image/png", "path": "x.png"}}]},
             {"source_call_id": None, "content": "a system event"},
         ]},
         "metrics": {"prompt_tokens": 700, "cached_tokens": 0, "completion_tokens": 30,
                     "cost_usd": 0.001}},
        {"step_id": 4, "source": "agent", "message": "Oslo: rain. Rome: sun.",
         "timestamp": "2026-01-15T09:00:04Z",
         "metrics": {"prompt_tokens": 760, "cached_tokens": 500, "completion_tokens": 8}},
        {"step_id": 5, "source": "system", "message": "compacted", "is_copied_context": True},
        {"step_id": 6, "source": "user", "message": "Thanks", "is_copied_context": True},
        {"step_id": 7, "source": "agent", "message": "You're welcome.", "llm_call_count": 1},
    ],
}  # fmt: skip


def test_another_harness_trajectory_reads_as_a_session_log(tmp_path: Path) -> None:
    atif.Trajectory.model_validate(FOREIGN)
    file = tmp_path / "run.json"
    file.write_text(json.dumps(FOREIGN))
    done = import_atif(file, tmp_path / "logs")
    assert done.session == "harbor-run-1"
    assert done.left_out == {
        "image parts": 1,
        "observation results that answer no call of their step": 1,
        "system steps after the first": 1,
        "metrics cost_usd": 1,
        "is_copied_context flags (no parent to name: the steps are the log's own)": 1,
    }
    with Session.open(done.path, read_only=True) as session:
        assert session.baseline.system == "You are helpful."
        assert session.messages()[1:3] == [
            {"role": "user", "content": "Weather in Oslo and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "reasoning_content": "two calls",
                "tool_calls": [
                    {"id": "a", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
                    {"id": "b", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}},
                ],
            },
        ]  # fmt: skip
        results = [r for r in session.records if isinstance(r, ToolResult)]
        assert [(r.call, r.content) for r in results] == [(1, "rain"), (2, "sun")]
    requests = frames.requests(done.path)
    assert _ints(requests.prompt_tokens) == [700, 760, None]
    assert _ints(requests.cached_tokens) == [0, 500, None]
    turns = frames.turns(done.path)
    assert list(turns.outcome) == ["answered", "answered"]
    assert str(turns.started.iloc[0]) == "2026-01-15 09:00:01+00:00"  # no offset: read as UTC
    losses = frames.cache_losses(done.path)  # the one cache rule: 700 cacheable, 500 reused
    assert list(losses.lost_tokens) == [200]
    summary = frames.summary(done.path).iloc[0]
    assert summary.requests == 3 and pd.isna(summary.prompt_tokens)  # the last is unknown
    report = what_if_log(done.path)
    assert "2 turn(s)" in report.lines[0]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(done.path)]) == 0
    assert "harbor-run-1" in out.getvalue()


def test_a_file_that_is_no_trajectory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ExportError, match="no 'steps' list"):
        atif_log({"schema_version": "ATIF-v1.8"})
    file = tmp_path / "x.json"
    file.write_text("{not json")
    with pytest.raises(ExportError, match="cannot read an ATIF trajectory"):
        import_atif(file, tmp_path)


# -- round trips over generated logs --------------------------------------------------------------


def _round_trip(folder: Path, out: Path) -> Path:
    """Export ``folder``'s logs to ATIF and import each trajectory into ``out/logs``."""
    if out.exists():
        shutil.rmtree(out)
    with _quiet():
        files = export_atif(folder, out / "atif")
    for file in files:
        assert import_atif(file, out / "logs").left_out == {}
    return out / "logs"


def _by_session(df: pd.DataFrame) -> pd.DataFrame:
    """Rows ordered by session, each session's rows as they were (the order the logs are read
    in follows their files, and a folder with a copy of a session reads in another order)."""
    order = df.session.astype(str).argsort(kind="stable")
    return df.iloc[order].reset_index(drop=True)


def _same_frames(a: frames.Frames, b: frames.Frames) -> None:
    for name in frames.Frames._fields:
        want, got = _by_session(getattr(a, name)), _by_session(getattr(b, name))
        if name == "summary":  # the logs' files differ, nothing else
            want, got = want.drop(columns="path"), got.drop(columns="path")
        assert_frame_equal(got, want, check_categorical=False, obj=name)


def _strip(value: Any) -> Any:
    """A trajectory without boxmaker's ``extra`` fields: ATIF's own fields only."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "extra"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _tokens(records: Any) -> list[tuple[int | None, ...]]:
    """Each completion's prompt, cached and generated tokens (ATIF's three; ``prompt_n`` is
    their difference, and without ``cache_n`` it is in ``extra`` only)."""
    counted = [usage_tokens(r) for r in records if isinstance(r, Usage)]
    return [(t.prompt, t.cached, t.generated) for t in counted]


def _settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@_settings(max(10, EXAMPLES // 3))
@given(plan=plans)
def test_log_to_atif_to_log_gives_the_same_frames(tmp_path: Path, plan: Plan) -> None:
    folder, _, loaded = _folder(tmp_path, plan)
    logs = _round_trip(folder, tmp_path / "trip")
    _same_frames(loaded, frames.load(logs))
    for path in (tmp_path / "trip" / "atif").iterdir():
        _validated(path)


@_settings(max(10, EXAMPLES // 3))
@given(plan=plans)
def test_atifs_own_fields_alone_give_the_same_messages_and_tokens(
    tmp_path: Path, plan: Plan
) -> None:
    folder, _, _ = _folder(tmp_path, plan)
    out = tmp_path / "own"
    if out.exists():
        shutil.rmtree(out)
    with _quiet():
        files = export_atif(folder, out)
    for file in files:
        stripped = out / "stripped" / file.name
        stripped.parent.mkdir(exist_ok=True)
        stripped.write_text(json.dumps(_strip(json.loads(file.read_text()))))
        atif.Trajectory.model_validate_json(stripped.read_text())
        done = import_atif(stripped, out / "logs")
        original = Session.open(folder / f"{done.session}.jsonl", read_only=True)
        with original as a, Session.open(done.path, read_only=True) as b:
            assert b.messages() == a.messages()
            assert _tokens(b.records) == _tokens(a.records)


@_settings(max(10, EXAMPLES // 3))
@given(plan=plans)
def test_a_parent_and_its_forks_filtered_for_training_count_each_completion_once(
    tmp_path: Path, plan: Plan
) -> None:
    folder, _, loaded = _folder(tmp_path, plan)
    out = tmp_path / "train"
    if out.exists():
        shutil.rmtree(out)
    with _quiet():
        files = export_atif(folder, out)
    kept = []
    for file in files:
        body = json.loads(file.read_text())
        for step in body["steps"]:
            if step["source"] == "agent" and not step.get("is_copied_context"):
                times = tuple(r["time"] for r in step["extra"]["boxmaker"]["records"][:2])
                kept.append((times, step["message"]))
    assert len(kept) == int((~loaded.requests.from_parent).sum())
    every = set()  # each completion of every log: a fork's copies are its parent's, alike
    with _quiet():
        for log in read_logs(folder):
            for turn in split_turns(log).turns:
                for completion in turn.completions:
                    assert completion.assistant is not None
                    a, u = log.records[completion.assistant], log.records[completion.usage]
                    every.add(((a["time"], u["time"]), a.get("content") or ""))
    assert set(kept) == every
