"""Batches of forks (``ForkTask``): a session log forked at a turn under every grid setting.

Planning and loading, the fork's own turns counted apart from the parent's copied ones,
resume after a kill at each point (hand-built logs, and a real SIGKILL of a ``boxmaker
batch`` process mid-turn), warm starts (slot, restored, cold), replay, and the frames,
scores and comparison over a batch of forks; against a stand-in llama-server on a real socket.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from boxmaker.batch import (
    ForkTask,
    Task,
    compare,
    frames,
    load_tasks,
    manifest,
    run_batch,
)
from boxmaker.batch import score_batch as score
from boxmaker.batch._manifest import read_manifest
from boxmaker.batch._state import log_state
from boxmaker.batch._tasks import RETRIED_OUTCOMES, expand
from boxmaker.cli import main
from boxmaker.demo import demo_registry
from boxmaker.errors import ConfigError
from boxmaker.records import (
    Assistant,
    Baseline,
    Forked,
    Record,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
)
from boxmaker.session import Session, read_log
from boxmaker.testing import Reply
from boxmaker.turn import Replay

ROOT = Path(__file__).resolve().parents[2]
TOOLS = demo_registry()
PARENT = ("What is the weather in Lisbon?", "What is the weather in Oslo?", "Thanks!")
GRID = {"sampling.temperature": [0.0, 0.5]}


def _last_user(body: dict[str, Any]) -> str:
    return str(next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user"))


def _answer(body: dict[str, Any]) -> Reply:
    """A tool call for a weather question (its city, or Paris when the temperature is not 0:
    the fork's call then differs from its parent's), the tool's text after a result, else an
    echo."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content="noted: " + messages[-1]["content"])
    text = messages[-1]["content"]
    if "weather" in text:
        city = "Paris" if body.get("temperature") else text.rstrip("?").split()[-1]
        call = (f"call-{len(messages)}", "get_weather", json.dumps({"city": city}))
        return Reply(content="", tool_calls=(call,))
    return Reply(content="ok: " + text)


class ForkLlama:
    """llama-server's batch-facing surface on 127.0.0.1: one slot (``/slots``, ``/props``),
    ``/health``, streamed chat answers (:func:`_answer`), and slot restores: HTTP 501 as a
    server without ``--slot-save-path``, or, for the names in ``saved``, restored.

    ``stall_on``: a request whose last user message is this text gets no answer until
    :attr:`release` is set (:attr:`stalled` says one came). ``bodies``: the chat requests;
    ``restores``: the file names asked to be restored. ``reused``: the ``cache_n`` every
    answer's timings report (default 0: nothing reused). ``folder``: a save writes its file
    there (as ``--slot-save-path`` on this machine); ``saves``: the names saved."""

    def __init__(
        self,
        *,
        saved: tuple[str, ...] | None = None,
        stall_on: str | None = None,
        reused: int = 0,
        folder: Path | None = None,
    ):
        self.saved, self.stall_on, self.folder = saved, stall_on, folder
        self.bodies: list[dict[str, Any]] = []
        self.restores: list[str] = []
        self.saves: list[str] = []
        self.stalled, self.release = threading.Event(), threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/slots":
                    self._json(200, [{"id": 0, "is_processing": False}])
                elif self.path == "/props":
                    self._json(200, {"total_slots": 1})
                else:
                    self._json(200, {"status": "ok"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.startswith("/slots/") and "action=save" in self.path:
                    name = body["filename"]
                    if owner.folder is None or "/" in name:
                        self._json(501, {"error": {"code": 501, "message": "no saving"}})
                    else:
                        owner.saves.append(name)
                        (owner.folder / name).write_bytes(b"slot")
                        self._json(200, {"n_saved": 10, "n_written": 100})
                    return
                if self.path.startswith("/slots/"):
                    owner.restores.append(body["filename"])
                    if owner.saved is None:
                        error = {"code": 501, "type": "not_supported_error", "message": "no"}
                        self._json(501, {"error": error})
                    elif body["filename"] in owner.saved:
                        self._json(200, {"n_restored": 42, "timings": {"restore_ms": 1.5}})
                    else:
                        error = {"code": 400, "type": "invalid_request_error", "message": "no"}
                        self._json(400, {"error": error})
                    return
                if self.path != "/v1/chat/completions":
                    self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
                    return
                owner.bodies.append(body)
                if owner.stall_on is not None and _last_user(body) == owner.stall_on:
                    owner.stalled.set()
                    while not owner.release.wait(0.02):
                        pass
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                events = [e for e in _answer(body).events() if isinstance(e, bytes)]
                events = [e.replace(b'"cache_n": 0', b'"cache_n": %d' % reused) for e in events]
                with contextlib.suppress(OSError):  # the runner was killed meanwhile
                    self.wfile.write(b"".join(events))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def llama() -> Iterator[ForkLlama]:
    server = ForkLlama()
    yield server
    server.close()


def _parent(tmp_path: Path, url: str) -> Path:
    """A three-turn parent log, run as a batch of one on ``url`` (temperature 0)."""
    task = Task(id="parent", messages=PARENT)
    progress = run_batch([task], tmp_path / "p", servers=[url], registry=TOOLS)
    assert (progress.done, progress.failed) == (1, 0)
    return tmp_path / "p" / "logs" / "parent.jsonl"


def _records(path: Path) -> list[Any]:
    with Session.open(path, read_only=True) as session:
        return list(session.records)


def _own_finished(path: Path) -> list[str]:
    """The user messages of the fork's own turns that finished (a rerun must not send again)."""
    records = _records(path)
    first = records[0]
    assert isinstance(first, Forked)
    out, current = [], None
    for r in records[first.record :]:
        if isinstance(r, User):
            current = r.content
        elif isinstance(r, TurnEnd) and current is not None:
            if r.outcome not in RETRIED_OUTCOMES:
                out.append(current)
            current = None
    return out


def _by_setting(frame: pd.DataFrame) -> dict[float, dict[Any, Any]]:
    """A batch frame's rows by their ``sampling.temperature``."""
    return {row["sampling.temperature"]: row for row in frame.to_dict("records")}


def _runs(batch: Path) -> list[Path]:
    return sorted((batch / "logs").glob("*.jsonl"))


# --- planning --------------------------------------------------------------------------------


def test_fork_tasks_from_json_lines_read_the_parent_from_the_files_folder(tmp_path: Path) -> None:
    (tmp_path / "tasks").mkdir()
    path = tmp_path / "tasks" / "forks.jsonl"
    lines = [
        {"id": "f1", "fork": "../parent.jsonl", "at": 1},
        {
            "id": "f2",
            "fork": "/abs/p.jsonl",
            "at": 2,
            "rerun": True,
            "replay": "stop",
            "messages": ["more"],
            "config": {"loop.tool_result_cap": 9},
        },
        {"id": "f3", "fork": "p.jsonl", "at": 1, "replay": True},
        {"id": "plain", "messages": ["hi"]},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    f1, f2, f3, plain = load_tasks(path)
    assert isinstance(f1, ForkTask) and isinstance(f2, ForkTask) and isinstance(f3, ForkTask)
    assert Path(f1.parent) == tmp_path / "tasks" / "../parent.jsonl"
    assert (f1.at, f1.rerun, f1.replay, f1.messages) == (1, False, "off", None)
    assert (Path(f2.parent), f2.rerun, f2.replay, f2.messages) == (
        Path("/abs/p.jsonl"),
        True,
        "stop",
        ("more",),
    )
    assert f2.config == {"loop.tool_result_cap": 9}
    assert f3.replay == "on"
    assert isinstance(plain, Task)


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"id": "f", "fork": "p.jsonl"}, "at must be a turn number"),
        ({"id": "f", "fork": "p.jsonl", "at": 0}, "at must be a turn number"),
        ({"id": "f", "fork": "p.jsonl", "at": True}, "at must be a turn number"),
        ({"id": "f", "fork": "p.jsonl", "at": 1, "replay": "maybe"}, "replay must be one of"),
        ({"id": "f", "fork": "p.jsonl", "at": 1, "system": "x"}, "unknown fork task fields"),
        ({"id": "f", "fork": "p.jsonl", "at": 1, "messages": "hi"}, "list of strings"),
        ({"id": "f", "fork": "", "at": 1}, "the parent's log path"),
        ({"id": "../f", "fork": "p.jsonl", "at": 1}, "not safe as a file name"),
    ],
)
def test_malformed_fork_tasks_are_config_errors(row: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        load_tasks([row])


def test_resolve_reads_the_turns_from_the_parent(tmp_path: Path) -> None:
    with Session.create(tmp_path, Baseline(), session_id="p") as s:
        s.extend([User(content="one"), Assistant(content="a"), TurnEnd(outcome="answered")])
        s.extend([User(content="two"), TurnEnd(outcome="cancelled")])  # sent again: once
        s.extend([User(content="two"), Assistant(content="b"), TurnEnd(outcome="answered")])
        s.extend([User(content="three"), Assistant(content="c"), TurnEnd(outcome="answered")])
    parent = tmp_path / "p.jsonl"
    assert ForkTask(id="f", parent=parent, at=1).resolve().turns == ("two", "three")
    assert ForkTask(id="f", parent=parent, at=1, rerun=True).resolve().turns == (
        "one",
        "two",
        "three",
    )
    assert ForkTask(id="f", parent=parent, at=4, rerun=True, messages=()).resolve().turns == (
        "three",
    )
    assert ForkTask(id="f", parent=parent, at=2, messages=("x",)).resolve().turns == ("x",)
    with pytest.raises(ConfigError, match="has 4 turn"):
        ForkTask(id="f", parent=parent, at=5).resolve()
    with pytest.raises(ConfigError, match="nothing to run"):
        ForkTask(id="f", parent=parent, at=4).resolve()
    with pytest.raises(ConfigError, match="cannot read the parent"):
        ForkTask(id="f", parent=tmp_path / "missing.jsonl", at=1).resolve()


def test_log_state_counts_only_the_forks_own_turns(tmp_path: Path) -> None:
    with Session.create(tmp_path, Baseline(), session_id="p") as s:
        for text in ("one", "two"):
            s.extend([User(content=text), Assistant(content="a"), TurnEnd(outcome="answered")])
    with Session.open(tmp_path / "p.jsonl", read_only=True) as parent:
        after = parent.fork(1, session_id="after")
        rerun = parent.fork(2, rerun=True, session_id="rerun")
    with after:
        state = log_state(after.path)
        assert (state.turns_done, state.last_outcome, state.copied) == (0, None, 4)
        assert state.records == 4 and not state.finished(1)
        after.extend([User(content="new"), Assistant(content="b"), TurnEnd(outcome="answered")])
        after.extend([User(content="cut"), TurnEnd(outcome="infer_error")])
        after.append(User(content="killed"))
    state = log_state(after.path)
    assert (state.turns_done, state.last_outcome, state.copied) == (1, "infer_error", 4)
    with rerun:
        rerun.extend([User(content="two"), Assistant(content="c"), TurnEnd(outcome="diverged")])
    state = log_state(rerun.path)
    assert (state.turns_done, state.copied, state.diverged) == (1, 4, True)
    assert state.finished(5)  # a diverged fork (replay stop) is over


def test_replay_of_a_resumed_fork_goes_on_where_its_own_turns_left_off(tmp_path: Path) -> None:
    with Session.create(tmp_path, Baseline(), session_id="p") as s:
        s.extend([User(content="one"), Assistant(content="a"), TurnEnd(outcome="answered")])
        for n, city in ((1, "Oslo"), (2, "Rome")):
            call = _weather(f"c{n}", city)
            s.extend([User(content=city), Assistant(content="", tool_calls=(call,))])
            s.append(ToolResult(call=n, tool_call_id=call.id, name=call.name, content=city))
            s.extend([Assistant(content="ok"), TurnEnd(outcome="answered")])
    with Session.open(tmp_path / "p.jsonl", read_only=True) as parent:
        fork = parent.fork(1, session_id="f")
    with fork:
        assert (Replay.of(fork).position, Replay.of(fork).diverged_at) == (0, None)
        call = _weather("x1", "Oslo")
        cut: list[Record] = [User(content="Oslo"), Assistant(content="", tool_calls=(call,))]
        result = ToolResult(
            call=1, tool_call_id="x1", name=call.name, content="Oslo", source="replayed"
        )
        fork.extend([*cut, result, TurnEnd(outcome="process_died")])  # a turn that did not happen
        assert (Replay.of(fork).position, Replay.of(fork).diverged_at) == (0, None)
        fork.extend([*cut, result, Assistant(content="ok"), TurnEnd(outcome="answered")])
        replay = Replay.of(fork)
        assert (replay.position, replay.diverged_at) == (1, None)
        answered = replay.answer(_weather("x2", "Rome"))  # the parent's second call
        assert answered is not None and answered.source == "replayed"
        assert answered.content == "Rome"
        live = ToolResult(call=3, tool_call_id="x3", name=call.name, content="Paris")
        fork.extend([User(content="Rome"), Assistant(content="", tool_calls=(call,)), live])
        fork.append(TurnEnd(outcome="answered"))
        replay = Replay.of(fork)
        assert (replay.position, replay.diverged_at) == (2, 1)


def _weather(call_id: str, city: str) -> ToolCall:
    return ToolCall(id=call_id, name="get_weather", arguments=json.dumps({"city": city}))


# --- running ---------------------------------------------------------------------------------


def test_each_setting_forks_the_parent_and_runs_the_new_turns_live(
    tmp_path: Path, llama: ForkLlama
) -> None:
    parent = _parent(tmp_path, llama.url)
    before = parent.read_bytes()
    sent = len(llama.bodies)
    task = ForkTask(id="oslo", parent=parent, at=1, target={"answer": {"contains": "Thanks"}})
    batch = tmp_path / "b"
    progress = run_batch([task], batch, servers=[llama.url], registry=TOOLS, grid=GRID)
    assert (progress.done, progress.failed) == (2, 0)
    assert parent.read_bytes() == before  # only read
    parent_records = _records(parent)
    runs = manifest(batch).set_index("run")
    assert sorted(runs["sampling.temperature"]) == [0.0, 0.5]
    assert set(runs["state"]) == {"done"} and set(runs["turns"]) == {2}
    # this process ran the parent on the same slot, but the fake server reused nothing
    # (cache_n 0): the label is what the fork's first request measured, not the slot's claim
    assert set(runs["warm"]) == {"cold"}
    assert all("slot 0 was expected to hold the parent's prefix" in d for d in runs["warm_detail"])
    entries = read_manifest(batch)
    for run, entry in entries.items():
        assert entry["fork"] == {
            "parent": str(parent.resolve()),
            "at": 1,
            "rerun": False,
            "replay": "off",
        }
        assert entry["messages"] == 2
        records = _records(batch / "logs" / f"{run}.jsonl")
        forked = records[0]
        assert isinstance(forked, Forked)
        assert (forked.parent_session, forked.turn, forked.point) == ("parent", 1, "after_turn")
        assert forked.settings == entry["settings"]
        assert records[1 : forked.record] == parent_records[: forked.record - 1]
        assert _own_finished(batch / "logs" / f"{run}.jsonl") == list(PARENT[1:])
    fork_bodies = llama.bodies[sent:]
    assert len(fork_bodies) == 2 * 3  # per fork: the weather call, its answer, "Thanks!"
    cities = {json.loads(r.arguments)["city"] for r in _tool_calls(batch)}
    assert cities == {"Oslo", "Paris"}  # run live under each temperature
    firsts = [
        b for b in fork_bodies if _last_user(b) == PARENT[1] and b["messages"][-1]["role"] == "user"
    ]
    assert len(firsts) == 2
    parent_turn_one = llama.bodies[1]["messages"]  # the parent's second request of turn 1
    for body in firsts:
        assert body["id_slot"] == 0
        assert body["messages"][: len(parent_turn_one)] == parent_turn_one
    # frames, scores and the comparison over the forks of one parent
    summary = frames(batch, "summary")
    assert set(summary["parent_session"]) == {"parent"} and set(summary["fork_turn"]) == {1}
    forks = _by_setting(frames(batch, "forks"))
    assert [forks[t]["requests"] for t in (0.0, 0.5)] == [3, 3]
    assert pd.isna(forks[0.0]["first_difference"])  # temperature 0 makes the parent's turns
    assert forks[0.5]["first_difference"] == 12  # the call for Paris, not Oslo
    assert [forks[t]["replayed"] for t in (0.0, 0.5)] == [0, 0]  # replay off: all ran live
    scored = score(batch)
    assert sorted(scored["value"]) == [1.0, 1.0]
    table = compare(batch, seed=1, resamples=50)
    assert list(table["runs"]) == [1, 1] and list(table["success"]) == [1.0, 1.0]
    # the costs compared are the forks' own: 3 requests of 10 prompt tokens each; the
    # summary counts them only, the parent's 2 copied requests apart; from the fork's making on
    assert list(table["processed_tokens"]) == [30.0, 30.0]
    assert list(summary["processed_tokens"]) == [30, 30]
    assert list(summary["inherited_requests"]) == [2, 2]
    requests = frames(batch, "requests")
    assert requests[~requests["from_parent"]].groupby("run")["processed_tokens"].sum().tolist() == [
        30,
        30,
    ]
    costs = summary.set_index("run")  # the frames start a fork when it was made (issue 34)
    parent_start = pd.Timestamp(read_log(task.parent).head["time"])
    for path in _runs(batch):
        forked = _records(path)[0]
        assert isinstance(forked, Forked)
        started = pd.Timestamp(str(costs.loc[path.stem, "started"]))
        assert started == pd.Timestamp(forked.time) and started > parent_start
    again = run_batch([task], batch, servers=[llama.url], registry=TOOLS, grid=GRID)
    assert (again.done, again.skipped) == (2, 2)
    assert len(llama.bodies) == sent + 6  # a finished batch of forks sends nothing


def _tool_calls(batch: Path) -> list[Any]:
    calls = []
    for path in _runs(batch):
        records = _records(path)
        first = records[0]
        assert isinstance(first, Forked)
        calls += [
            c for r in records[first.record :] if isinstance(r, Assistant) for c in r.tool_calls
        ]
    return calls


def test_a_fork_on_another_server_restores_the_saved_slot_or_runs_cold_and_says_why(
    tmp_path: Path, llama: ForkLlama
) -> None:
    parent = _parent(tmp_path, llama.url)  # this process knows nothing of the others' slots
    task = ForkTask(id="f", parent=parent, at=2)
    saving = ForkLlama(saved=("parent.turn-2.bin",), reused=1000)  # the restore was used
    plain = ForkLlama()
    try:
        run_batch([task], tmp_path / "restored", servers=[saving.url], registry=TOOLS)
        run_batch([task], tmp_path / "cold", servers=[plain.url], registry=TOOLS)
    finally:
        saving.close()
        plain.close()
    restored = read_manifest(tmp_path / "restored")["f"]
    assert (restored["state"], restored["warm"]) == ("done", "restored")
    held = restored["warm_detail"].split(": ")[1].split()[0]  # the parent's prefix, measured
    assert restored["warm_detail"] == (
        f"restored parent.turn-2.bin into slot 0: {held} of {held} prefix tokens reused (1.00)"
    )
    assert saving.restores == ["parent.turn-2.bin"]
    cold = read_manifest(tmp_path / "cold")["f"]
    assert (cold["state"], cold["warm"]) == ("done", "cold")
    assert "--slot-save-path" in cold["warm_detail"]
    assert _own_finished(tmp_path / "cold" / "logs" / "f.jsonl") == ["Thanks!"]


@pytest.mark.parametrize("replay", ["on", "stop"])
def test_replay_follows_the_parent_while_the_calls_match(
    tmp_path: Path, llama: ForkLlama, replay: str
) -> None:
    parent = _parent(tmp_path, llama.url)
    sent = len(llama.bodies)
    task = ForkTask(id="r", parent=parent, at=1, replay=replay)
    progress = run_batch([task], tmp_path / "b", servers=[llama.url], registry=TOOLS, grid=GRID)
    assert (progress.done, progress.failed) == (2, 0)
    runs = _by_setting(manifest(tmp_path / "b"))
    same = _records(tmp_path / "b" / "logs" / f"{runs[0.0]['run']}.jsonl")
    results = [r for r in same[same[0].record :] if isinstance(r, ToolResult)]
    oslo = [r for r in _records(parent) if isinstance(r, ToolResult) and "Oslo" in r.content]
    assert [(r.source, r.content) for r in results] == [("replayed", oslo[0].content)]
    other = _records(tmp_path / "b" / "logs" / f"{runs[0.5]['run']}.jsonl")
    results = [r for r in other[other[0].record :] if isinstance(r, ToolResult)]
    if replay == "on":  # the call for Paris differs: run live, and the run goes on
        assert [(r.source, r.not_run) for r in results] == [(None, None)]
        assert '"Paris"' in results[0].content
        assert (runs[0.5]["turns"], runs[0.5]["outcome"]) == (2, "answered")
    else:  # the fork stops there: its run is over, not failed, not tried again
        assert [(r.source, r.not_run) for r in results] == [(None, "diverged")]
        assert (runs[0.5]["turns"], runs[0.5]["outcome"]) == (1, "diverged")
        assert runs[0.5]["attempts"] == 1
    assert (runs[0.0]["turns"], runs[0.0]["outcome"]) == (2, "answered")
    again = run_batch([task], tmp_path / "b", servers=[llama.url], registry=TOOLS, grid=GRID)
    assert again.skipped == 2
    assert len(llama.bodies) == sent + 3 + (3 if replay == "on" else 1)


# --- resume after a kill at each point -------------------------------------------------------


def _kill_states(tmp_path: Path, parent: Path) -> dict[str, list[str]]:
    """Fork logs as a kill leaves them, each at its own point; returns per run the messages
    its log has finished already."""
    logs = tmp_path / "b" / "logs"
    logs.mkdir(parents=True)
    Session.create(logs, Baseline(), session_id="k-baseline").close()  # before the copy
    with Session.open(parent, read_only=True) as p:
        p.fork(1, directory=logs, session_id="k-copy").close()  # before the first own turn
        with p.fork(1, directory=logs, session_id="k-cut") as fork:
            fork.append(User(content="second"))  # killed inside its first turn
        with p.fork(1, directory=logs, session_id="k-one") as fork:
            fork.extend([User(content="second"), Assistant(content="ok: second")])
            fork.extend([Usage(timings={"cache_n": 0, "prompt_n": 5}), TurnEnd(outcome="answered")])
        with p.fork(1, directory=logs, session_id="k-all") as fork:
            for text in ("second", "third"):
                fork.extend([User(content=text), Assistant(content="ok: " + text)])
                fork.append(TurnEnd(outcome="answered"))
    return {
        "k-baseline": [],
        "k-copy": [],
        "k-cut": [],
        "k-one": ["second"],
        "k-all": ["second", "third"],
    }


def test_resume_after_a_kill_at_each_point_runs_no_turn_twice_and_loses_none(
    tmp_path: Path, llama: ForkLlama
) -> None:
    parent = _parent(tmp_path, llama.url)
    before = _kill_states(tmp_path, parent)
    sent = len(llama.bodies)
    tasks = [ForkTask(id=run, parent=parent, at=1, messages=("second", "third")) for run in before]
    progress = run_batch(tasks, tmp_path / "b", servers=[llama.url], registry=TOOLS)
    assert (progress.done, progress.skipped, progress.failed) == (5, 1, 0)
    bodies = [_last_user(b) for b in llama.bodies[sent:]]
    expected = {m: 0 for m in ("second", "third")}
    for run, finished in before.items():
        path = tmp_path / "b" / "logs" / f"{run}.jsonl"
        assert _own_finished(path) == ["second", "third"], run
        assert isinstance(_records(path)[0], Forked)
        for message in ("second", "third"):
            expected[message] += message not in finished
    assert {m: bodies.count(m) for m in expected} == expected == {"second": 3, "third": 4}
    assert {e["state"] for e in read_manifest(tmp_path / "b").values()} == {"done"}


def test_a_fork_tasks_log_that_is_no_fork_of_it_fails_that_run_only(
    tmp_path: Path, llama: ForkLlama
) -> None:
    parent = _parent(tmp_path, llama.url)
    logs = tmp_path / "b" / "logs"
    logs.mkdir(parents=True)
    with Session.create(logs, Baseline(), session_id="plain") as s:
        s.append(User(content="not a fork"))
    with Session.open(parent, read_only=True) as p:
        p.fork(2, directory=logs, session_id="moved").close()  # the task now says turn 1
    tasks = [
        ForkTask(id=run, parent=parent, at=1, messages=("x",)) for run in ("plain", "moved", "ok")
    ]
    progress = run_batch(tasks, tmp_path / "b", servers=[llama.url], registry=TOOLS, max_tries=1)
    assert (progress.done, progress.failed) == (1, 2)
    reasons = dict(progress.failures)
    assert "is no fork" in reasons["plain"]
    assert "after_turn of turn 2, but task moved forks after_turn of turn 1" in reasons["moved"]


def _command(tasks: Path, directory: Path, url: str) -> list[str]:
    code = "import sys; from boxmaker.cli import main; sys.exit(main(sys.argv[1:]))"
    return [sys.executable, "-c", code, "batch", str(tasks), "--url", url, "--dir", str(directory)]


def test_resume_after_sigkill_of_a_batch_of_forks_mid_turn(tmp_path: Path) -> None:
    server = ForkLlama(stall_on="third")
    try:
        parent = _parent(tmp_path, server.url)
        tasks = tmp_path / "forks.jsonl"
        line = {"id": "f", "fork": str(parent), "at": 1, "messages": ["second", "third"]}
        tasks.write_text(json.dumps(line) + "\n")
        (tmp_path / "grid.json").write_text(json.dumps(GRID))
        directory = tmp_path / "batch"
        command = [*_command(tasks, directory, server.url), "--grid", str(tmp_path / "grid.json")]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        runner = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while not server.stalled.is_set():  # the first fork is inside its second turn
            assert runner.poll() is None, runner.stderr.read() if runner.stderr else ""
            assert time.monotonic() < deadline
            time.sleep(0.01)
        runner.send_signal(signal.SIGKILL)
        runner.communicate()
        killed = read_manifest(directory)
        assert {e["state"] for e in killed.values()} == {"planned", "running"}
        cut = next(run for run, e in killed.items() if e["state"] == "running")
        assert log_state(directory / "logs" / f"{cut}.jsonl").turns_done == 1
        server.release.set()
        again = run_batch(tasks, directory, servers=[server.url], registry=TOOLS, grid=GRID)
        assert (again.done, again.failed) == (2, 0)
    finally:
        server.close()
    for path in _runs(directory):
        assert _own_finished(path) == ["second", "third"]
    turns = [(b["temperature"], _last_user(b)) for b in server.bodies]
    turns = [t for t in turns if t[1] in ("second", "third")]
    cut_at = killed[cut]["settings"]["sampling.temperature"]
    once = [(t, m) for t in (0.0, 0.5) for m in ("second", "third")]
    assert sorted(turns) == sorted([*once, (cut_at, "third")])  # only the cut turn twice
    records = _records(directory / "logs" / f"{cut}.jsonl")
    assert [r.outcome for r in records[records[0].record :] if isinstance(r, TurnEnd)] == [
        "answered",
        "process_died",  # the cut attempt is kept; its message was sent again
        "answered",
    ]


def test_cli_batch_of_forks_says_how_each_found_the_cache(
    tmp_path: Path, llama: ForkLlama, capsys: pytest.CaptureFixture[str]
) -> None:
    other = ForkLlama()
    try:
        parent = _parent(tmp_path, other.url)  # run elsewhere: this server's slot is unknown
        tasks = tmp_path / "forks.jsonl"
        target = {"answer": {"contains": "Thanks"}}
        line = {"id": "f", "fork": str(parent), "at": 2, "target": target}
        tasks.write_text(json.dumps(line) + "\n")
        (tmp_path / "grid.json").write_text(json.dumps(GRID))
        capsys.readouterr()
        batch = str(tmp_path / "b")
        grid = ["--grid", str(tmp_path / "grid.json")]
        code = main(["batch", str(tasks), "--url", llama.url, "--dir", batch, *grid])
    finally:
        other.close()
    out = capsys.readouterr().out
    assert code == 0
    assert "scored 2 run(s) by their targets" in out
    # the first fork found nothing (the server cannot restore); the second found the first's
    # requests, which start with the parent's prefix, in the one slot; the fake server
    # reused nothing for either (cache_n 0): both are measured cold, each says why
    said = "found it in their slot, 0 restored it from a saved slot, 0 found it in the "
    assert said + "server's own cache, 0 partial, 2 cold, 0 not measured" in out
    assert out.count("cold f.") == 2 and "--slot-save-path" in out
    assert "slot 0 was expected to hold the parent's prefix" in out
    for path in _runs(tmp_path / "b"):
        assert _own_finished(path) == ["Thanks!"]
    assert main(["report", batch]) == 0
    report = capsys.readouterr().out
    assert "Forks" in report and report.count("parent") >= 2
    assert main(["compare", batch, "--seed", "1", "--resamples", "50"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split()[0] == "sampling.temperature"  # the setting, a column of its own
    assert [line.split()[0] for line in table[2:]] == ["0.0", "0.5"]


def test_cli_batch_saves_each_runs_slot_at_its_turn_ends_on_a_url_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``boxmaker batch --url URL --slot-save-path DIR``: DIR is where that server saves slots
    (on this machine): every run's slot is saved there at each turn's end, named by run and
    turn, so a later fork of it restores it."""
    slots = tmp_path / "slots"
    slots.mkdir()
    server = ForkLlama(folder=slots)
    try:
        tasks = tmp_path / "tasks.jsonl"
        tasks.write_text(json.dumps({"id": "t", "messages": ["Hi", "Bye"]}) + "\n")
        args = ["batch", str(tasks), "--url", server.url, "--dir", str(tmp_path / "b")]
        assert main([*args, "--slot-save-path", str(slots)]) == 0
        assert main([*args, "--slot-save-path", str(tmp_path / "nowhere")]) == 1
    finally:
        server.close()
    assert server.saves == ["t.turn-1.bin", "t.turn-2.bin"]
    assert sorted(p.name for p in slots.iterdir()) == server.saves
    assert "slot folder" in capsys.readouterr().err


def test_forks_of_one_parent_follow_each_other_on_the_slot_that_ran_its_prefix(
    tmp_path: Path,
) -> None:
    """Cache affinity (issue 39 item 5): a worker takes first a run whose prefix (a fork
    task's parent, or an earlier fork of it) last ran on its slot, then one whose prefix ran
    nowhere yet, then any; the manifest says ``affinity: "slot"`` where it placed one so."""
    from boxmaker.batch._manifest import Manifest
    from boxmaker.batch._queue import BatchState

    llama = ForkLlama()
    try:
        parents = {name: _parent(tmp_path / name, llama.url) for name in ("a", "b")}
    finally:
        llama.close()
    tasks = [ForkTask(id=f"{name}{i}", parent=parents[name], at=1).resolve()
             for i in range(2) for name in ("a", "b")]  # fmt: skip
    logs = tmp_path / "batch" / "logs"
    logs.mkdir(parents=True)
    book = Manifest(tmp_path / "batch")
    batch = BatchState(expand(tasks), logs, book, 1, None, threading.Event())
    taken = [batch.pop("u", slot) for slot in (0, 1, 1, 0)]
    assert [s.task.id if s else None for s in taken] == ["a0", "b0", "b1", "a1"]
    book.close()
    lines = [json.loads(x) for x in (tmp_path / "batch" / "manifest.ndjson").read_text().split()]
    running = {x["run"]: (x["slot"], x.get("affinity")) for x in lines if x["state"] == "running"}
    assert running == {"a0": (0, None), "b0": (1, None), "b1": (1, "slot"), "a1": (0, "slot")}


def test_a_fork_goes_first_to_the_slot_its_parents_batch_ran_it_on(tmp_path: Path) -> None:
    """A parent run in an earlier batch (its log under ``<batch>/logs``): its manifest says
    the server and slot it ran on, where a fork of it looks first."""
    from boxmaker.batch._manifest import Manifest
    from boxmaker.batch._queue import BatchState

    llama = ForkLlama()
    try:
        parents = {name: _parent(tmp_path / name, llama.url) for name in ("a", "b")}
    finally:
        llama.close()
    assert {read_manifest(p.parent.parent)[p.stem]["slot"] for p in parents.values()} == {0}
    tasks = [ForkTask(id=f"{name}{i}", parent=parents[name], at=1).resolve()
             for i in range(2) for name in ("a", "b")]  # fmt: skip
    logs = tmp_path / "batch" / "logs"
    logs.mkdir(parents=True)
    book = Manifest(tmp_path / "batch")
    batch = BatchState(expand(tasks), logs, book, 1, None, threading.Event())
    url = llama.url.rstrip("/")
    taken = [batch.pop(url, slot) for slot in (1, 0, 0, 1)]
    assert [s.task.id if s else None for s in taken] == ["a0", "b0", "b1", "a1"]
    book.close()
    lines = [json.loads(x) for x in (tmp_path / "batch" / "manifest.ndjson").read_text().split()]
    running = {x["run"]: (x["slot"], x.get("affinity")) for x in lines if x["state"] == "running"}
    assert running == {"a0": (1, None), "b0": (0, "slot"), "b1": (0, "slot"), "a1": (1, "slot")}
