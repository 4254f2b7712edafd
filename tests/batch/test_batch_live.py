"""The batch runner against the embedded llama.cpp server: slots and pinning, resume after a
real SIGKILL of the runner process, and the Ray executor (skipped without ``boxmaker[ray]``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from extras import need

import boxmaker.batch._executors
from boxmaker.batch import BatchProgress, Task, frames, manifest, run_batch
from boxmaker.batch._manifest import MANIFEST, read_manifest
from boxmaker.batch._tasks import RETRIED_OUTCOMES
from boxmaker.client import Client
from boxmaker.demo import demo_registry
from boxmaker.records import CacheLoss, ToolResult, TurnEnd, Usage, User
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session

pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = (
    "What is the weather in Lisbon?",
    "What time is it in Tokyo?",
    "Tell me the weather in Oslo.",
    "What is the weather in Paris?",
)

TOOLS = demo_registry()
"""The tools the batches here run with (the demo's, passed explicitly)."""


def _tasks(n: int) -> list[Task]:
    """``n`` two-turn tasks; the first message tells the tasks apart (for n <= 4)."""
    return [
        Task(id=f"t{i:02d}", messages=(QUESTIONS[i % 4], QUESTIONS[(i + 1) % 4])) for i in range(n)
    ]


def _finished_users(path: Path) -> list[str]:
    """The user messages of a log whose turn finished (``TurnEnd`` not cancelled or failed)."""
    with Session.open(path, read_only=True) as session:
        records = session.records
    out, current = [], None
    for r in records:
        if isinstance(r, User):
            current = r.content
        elif isinstance(r, TurnEnd) and current is not None:
            if r.outcome not in RETRIED_OUTCOMES:
                out.append(current)
            current = None
    return out


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(n_ctx=8192, n_parallel=2, n_threads=1) as s:
        yield s


def test_each_run_stays_on_one_slot_and_keeps_its_cache_inside_a_turn(
    server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, int]] = []  # (first user message, id_slot) of every request

    class Recording(Client):
        def chat_with_retry(self, body: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            first = next(m["content"] for m in body["messages"] if m["role"] == "user")
            sent.append((first, body["id_slot"]))
            return super().chat_with_retry(body, *args, **kwargs)

    monkeypatch.setattr(boxmaker.batch._executors, "Client", Recording)
    tasks = _tasks(4)
    progress = run_batch(tasks, tmp_path, servers=[server], registry=TOOLS)
    assert (progress.done, progress.failed, progress.slots) == (4, 0, 2)
    runs = manifest(tmp_path).set_index("task")
    for task in tasks:
        slots = {slot for first, slot in sent if first == task.messages[0]}
        assert slots == {runs.loc[task.id, "slot"]}
    assert {slot for _, slot in sent} == {0, 1}
    follow_ups = 0
    for task in tasks:
        with Session.open(tmp_path / "logs" / f"{task.id}.jsonl", read_only=True) as s:
            records = s.records
        in_turn, previous = 0, None
        for r in records:
            if isinstance(r, User):
                in_turn = 0
            elif isinstance(r, Usage):
                in_turn += 1
                if in_turn > 1 and previous is not None:
                    follow_ups += 1  # the whole previous prompt is reused
                    expected = previous.timings["cache_n"] + previous.timings["prompt_n"]
                    assert r.timings["cache_n"] >= expected
                previous = r
            elif isinstance(r, CacheLoss):
                assert in_turn == 1, f"{task.id}: a cache loss inside a turn"
        assert any(isinstance(r, ToolResult) for r in records)
    assert follow_ups >= 4


def _batch_command(tasks: Path, directory: Path) -> list[str]:
    code = "import sys; from boxmaker.cli import main; sys.exit(main(sys.argv[1:]))"
    return [
        sys.executable,
        "-c",
        code,
        "batch",
        str(tasks),
        "--embedded",
        "--parallel",
        "2",
        "--threads",
        "1",
        "--dir",
        str(directory),
    ]


def test_resume_after_sigkill_loses_and_repeats_nothing(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    tasks = _tasks(8)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps({"id": t.id, "messages": t.messages}) + "\n" for t in tasks))
    directory = tmp_path / "batch"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    runner = subprocess.Popen(
        _batch_command(path, directory), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    book = directory / MANIFEST
    deadline = time.monotonic() + 60
    while not (book.exists() and book.read_text().count('"state":"done"') >= 2):
        assert runner.poll() is None, runner.stderr.read() if runner.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.01)
    runner.send_signal(signal.SIGKILL)
    runner.communicate()  # waits, and closes the pipes
    killed = read_manifest(directory)
    done_before = {run for run, e in killed.items() if e["state"] == "done"}
    assert 2 <= len(done_before) < len(tasks), "the kill came after the batch ended"
    again = run_batch(path, directory, servers=[server], registry=TOOLS)  # the same batch, resumed
    assert (again.done, again.skipped, again.failed) == (8, len(done_before), 0)
    after = read_manifest(directory)
    assert sorted(after) == [t.id for t in tasks]
    assert {e["state"] for e in after.values()} == {"done"}
    for run in done_before:
        assert after[run]["attempts"] == 1  # finished runs are not run again
    for task in tasks:
        assert _finished_users(directory / "logs" / f"{task.id}.jsonl") == list(task.messages)
    assert sorted(p.stem for p in (directory / "logs").glob("*.jsonl")) == [t.id for t in tasks]


def test_ray_executor_gives_the_same_manifest_and_frames(
    server: EmbeddedServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ray = need("ray")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # Ray's workers import this boxmaker
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    called: list[tuple[str, BatchProgress]] = []

    def broken_display(progress: BatchProgress) -> None:  # the same rule on every executor
        called.append((threading.current_thread().name, progress))
        raise RuntimeError("the display broke")

    try:
        tasks = _tasks(4)
        grid = {"loop.tool_result_cap": [8, 4000]}
        by_ray = run_batch(
            tasks,
            tmp_path / "ray",
            servers=[server],
            registry=TOOLS,
            grid=grid,
            executor="ray",
            on_progress=broken_display,
        )
    finally:
        ray.shutdown()
    by_threads = run_batch(tasks, tmp_path / "threads", servers=[server], registry=TOOLS, grid=grid)
    assert (by_ray.done, by_ray.failed) == (by_threads.done, by_threads.failed) == (8, 0)
    assert {name for name, _ in called} == {threading.current_thread().name}
    assert called[-1][1].finished and called[-1][1].done == 8
    keep = ["run", "task", "loop.tool_result_cap", "state", "turns", "outcome"]
    ray_runs = manifest(tmp_path / "ray")[keep].sort_values("run").reset_index(drop=True)
    thread_runs = manifest(tmp_path / "threads")[keep].sort_values("run").reset_index(drop=True)
    assert ray_runs.equals(thread_runs)
    cols = ["run", "loop.tool_result_cap", "turn", "outcome", "tool_calls", "limit_hits"]
    ray_turns = frames(tmp_path / "ray", "turns")[cols].sort_values(["run", "turn"])
    thread_turns = frames(tmp_path / "threads", "turns")[cols].sort_values(["run", "turn"])
    assert ray_turns.reset_index(drop=True).equals(thread_turns.reset_index(drop=True))
