"""The batch runner without the embedded server: planning, resume bookkeeping, the manifest,
and faults provoked for real on stand-in llama-servers (real sockets on 127.0.0.1, stopped
mid-batch).
"""

from __future__ import annotations

import _thread
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.batch import (
    BatchProgress,
    BatchView,
    Task,
    frames,
    load_grid,
    load_tasks,
    manifest,
    run_batch,
)
from boxmaker.batch._manifest import MANIFEST, Manifest, read_manifest
from boxmaker.batch._run import discover_slots
from boxmaker.batch._state import log_state
from boxmaker.batch._tasks import expand
from boxmaker.cli import main
from boxmaker.config import ClientConfig, Config, LoopLimits
from boxmaker.demo import demo_registry
from boxmaker.errors import ConfigError, LogBusy, ServerError
from boxmaker.records import Assistant, Baseline, TurnEnd, User
from boxmaker.session import Session
from boxmaker.tools import Registry

FAST = Config(client=ClientConfig(retry_base_delay_s=0.01, retry_max_delay_s=0.02))
TOOLS = demo_registry()
"""The tools the batches here run with (the demo's, passed explicitly)."""

# --- a stand-in llama-server ------------------------------------------------------------------


def _event(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _answer(text: str) -> bytes:
    timings = {
        "cache_n": 0,
        "prompt_n": 10,
        "predicted_n": 2,
        "prompt_ms": 1.0,
        "predicted_ms": 1.0,
    }
    return b"".join(
        [
            _event({"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]}),
            _event({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            _event({"id": "c", "choices": [], "timings": timings}),
            b"data: [DONE]\n\n",
        ]
    )


class FakeLlama:
    """llama-server's batch-facing surface on a real socket: ``/slots`` (or 501 without it),
    ``/props``, ``/health``, and streamed chat completions answering ``"ok"``.

    ``stall``: chat requests instead drip one reasoning token every 20 ms until :meth:`kill`
    (then the connection closes mid-stream) or the client goes away. ``fail``: a body for which
    it answers HTTP 500; ``full``: one it answers llama.cpp's 400 context-full error.
    ``key``: like ``llama-server --api-key``: every endpoint but ``/health`` answers 401
    without ``Authorization: Bearer <key>``.
    ``bodies``: every chat request body received.
    """

    def __init__(
        self,
        slots: int,
        *,
        stall: bool = False,
        slots_endpoint: bool = True,
        fail: Callable[[dict[str, Any]], bool] | None = None,
        full: Callable[[dict[str, Any]], bool] | None = None,
        key: str | None = None,
    ) -> None:
        self.slots, self.stall, self.slots_endpoint, self.fail = slots, stall, slots_endpoint, fail
        self.full, self.key = full, key
        self.bodies: list[dict[str, Any]] = []
        self.killed = threading.Event()
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

            def _refused(self) -> bool:
                if owner.key is None or self.path == "/health":
                    return False
                if self.headers.get("Authorization") == f"Bearer {owner.key}":
                    return False
                error = {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
                self._json(401, {"error": error})
                return True

            def do_GET(self) -> None:
                if self._refused():
                    return
                if self.path == "/slots" and owner.slots_endpoint:
                    self._json(200, [{"id": i, "is_processing": False} for i in range(owner.slots)])
                elif self.path == "/slots":
                    self._json(501, {"error": {"code": 501, "message": "slots disabled"}})
                elif self.path == "/props":
                    self._json(200, {"total_slots": owner.slots})
                else:
                    self._json(200, {"status": "ok"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self._refused():
                    return
                if self.path in ("/apply-template", "/tokenize"):  # cache forensics: not served
                    self._json(404, {"error": {"code": 404, "message": "File Not Found"}})
                    return
                owner.bodies.append(body)
                if owner.fail is not None and owner.fail(body):
                    self._json(500, {"error": {"code": 500, "message": "boom"}})
                    return
                if owner.full is not None and owner.full(body):
                    error = {"code": 400, "type": "exceed_context_size_error", "message": "full"}
                    self._json(400, {"error": error})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                if not owner.stall:
                    self.wfile.write(_answer("ok"))
                    return
                try:
                    while not owner.killed.wait(0.02):
                        delta = {"reasoning_content": "."}
                        self.wfile.write(_event({"id": "c", "choices": [{"delta": delta}]}))
                        self.wfile.flush()
                except OSError:
                    pass  # the client closed the stream

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def kill(self) -> None:
        """Stop for good: streams in flight end mid-answer, new connections are refused."""
        self.killed.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[list[FakeLlama]]:
    made: list[FakeLlama] = []
    yield made
    for server in made:
        if not server.killed.is_set():
            server.kill()


def _wait_for(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 20
    while not check():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def _finished_users(path: Path) -> list[str]:
    """The user messages of a log whose turn finished (what a rerun must not send again)."""
    with Session.open(path, read_only=True) as session:
        records = session.records
    out, current = [], None
    for r in records:
        if isinstance(r, User):
            current = r.content
        elif isinstance(r, TurnEnd) and current is not None:
            if r.outcome not in ("cancelled", "infer_error"):
                out.append(current)
            current = None
    return out


TASKS = [Task(id=f"t{i}", messages=(f"question {i}", f"follow-up {i}")) for i in range(6)]


# --- planning --------------------------------------------------------------------------------


def test_grid_expands_each_task_with_stable_ids_and_configs(tmp_path: Path) -> None:
    grid: dict[str, Any] = {"sampling.seed": [16, 64], "loop": {"tool_result_cap": [40, 4000]}}
    runs = expand(TASKS[:2], grid)
    assert len(runs) == 8
    assert len({r.id for r in runs}) == 8
    assert [r.id for r in runs] == [r.id for r in expand(TASKS[:2], grid)]
    first = runs[0]
    assert first.id.startswith("t0.") and len(first.id) == len("t0.") + 8
    assert first.settings == {"loop.tool_result_cap": 40, "sampling.seed": 16}
    config = first.config(Config())
    assert (config.loop.tool_result_cap, config.sampling.seed) == (40, 16)
    assert [r.id for r in expand(TASKS[:2])] == ["t0", "t1"]
    (tmp_path / "g.toml").write_text("[loop]\nthinking_tokens = [16, 64]\n")
    assert load_grid(tmp_path / "g.toml") == {"loop.thinking_tokens": [16, 64]}


def test_task_overrides_apply_and_the_grid_wins() -> None:
    task = Task(
        id="a", messages=("hi",), config={"loop": {"tool_result_cap": 7, "tool_iterations": 2}}
    )
    (run,) = expand([task], {"loop.tool_result_cap": [9]})
    config = run.config(Config())
    assert (config.loop.tool_result_cap, config.loop.tool_iterations) == (9, 2)
    base = Config(client=ClientConfig(url="http://h:1"), loop=LoopLimits(tool_result_cap=None))
    (plain,) = expand([Task(id="b", messages=("hi",))], {"sampling.seed": [5]})
    config = plain.config(base)  # the base's own values survive the overrides
    assert (config.client.url, config.loop.tool_result_cap, config.sampling.seed) == (
        "http://h:1",
        None,
        5,
    )


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        ([{"id": "a b", "messages": ["x"]}], "not safe"),
        ([{"id": "a", "messages": []}], "non-empty"),
        ([{"id": "a", "message": "x"}, {"id": "a", "message": "y"}], "two tasks"),
        ([{"id": "a", "message": "x", "prompt": "y"}], "unknown task fields"),
        ([{"id": "a", "message": "x", "config": {"loop.nope": 1}}], "unknown"),
    ],
)
def test_malformed_tasks_are_config_errors(rows: list[dict[str, Any]], words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        expand(load_tasks(rows))


def test_tasks_from_json_lines_name_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "message": "hi"}\n\n{"id": "b", "messages": ["x", "y"]}\n{oops\n')
    with pytest.raises(ConfigError, match=r"tasks.jsonl:4"):
        load_tasks(path)
    path.write_text('{"id": "a", "message": "hi"}\n{"id": "b", "messages": ["x", "y"]}\n')
    assert [t.messages for t in load_tasks(path)] == [("hi",), ("x", "y")]


KEYS = ["loop.tool_iterations", "loop.thinking_tokens", "sampling.seed"]


@settings(deadline=None, max_examples=50)
@given(st.dictionaries(st.sampled_from(KEYS), st.lists(st.integers(0, 3), min_size=1, max_size=3)))
def test_run_ids_differ_exactly_when_settings_differ(grid: dict[str, list[int]]) -> None:
    runs = [r for r in expand([Task(id="x", messages=("m",))], grid)]
    assert len({r.id for r in runs}) == len({json.dumps(r.settings, sort_keys=True) for r in runs})


# --- what a log says is done ---------------------------------------------------------------


def test_log_state_counts_finished_turns_only(tmp_path: Path) -> None:
    with Session.create(tmp_path, Baseline(), session_id="r") as s:
        s.extend([User(content="1"), Assistant(content="a"), TurnEnd(outcome="answered")])
        s.extend([User(content="2"), TurnEnd(outcome="cancelled")])  # sent again on a rerun
        s.extend([User(content="2"), TurnEnd(outcome="tool_iterations")])  # a limit: finished
        s.append(User(content="3"))  # killed mid-turn: no TurnEnd
    state = log_state(tmp_path / "r.jsonl")
    assert (state.turns_done, state.last_outcome, state.full) == (2, "tool_iterations", False)
    assert not state.finished(3) and state.finished(2)
    assert log_state(tmp_path / "missing.jsonl").turns_done == 0


def test_manifest_cuts_a_torn_tail_and_folds_per_run(tmp_path: Path) -> None:
    book = Manifest(tmp_path)
    book.write("r1", "planned", task="t", settings={"x.y": 1})
    book.write("r1", "running", server="u", slot=1)
    book.close()
    with open(tmp_path / MANIFEST, "ab") as fh:
        fh.write(b'{"state": "do')  # a kill mid-line
    assert read_manifest(tmp_path)["r1"]["state"] == "running"
    book = Manifest(tmp_path)
    book.write("r1", "done", turns=2)
    book.close()
    entry = read_manifest(tmp_path)["r1"]
    assert (entry["state"], entry["turns"], entry["attempts"], entry["task"]) == ("done", 2, 1, "t")
    assert (tmp_path / MANIFEST).read_bytes().count(b"\n") == 3


def test_one_runner_per_batch_directory(tmp_path: Path) -> None:
    book = Manifest(tmp_path)
    try:
        with pytest.raises(LogBusy, match=f"another batch runner .*pid {os.getpid()}"):
            Manifest(tmp_path)
    finally:
        book.close()


def test_the_loser_of_a_manifest_race_is_told_another_runner_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runners start at once: both find no manifest, the winner makes it first."""
    winner = Manifest(tmp_path)
    real = Path.exists
    monkeypatch.setattr(Path, "exists", lambda p: p.name != MANIFEST and real(p))
    try:
        with pytest.raises(LogBusy, match="another batch runner holds this batch directory"):
            Manifest(tmp_path)
    finally:
        winner.close()


# --- slots -------------------------------------------------------------------------------------


def test_slots_and_health_of_an_http_server_load_no_certificate_store(
    servers: list[FakeLlama], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``http://`` needs no TLS: no certificate store is loaded (about 30 ms each time)."""
    import ssl

    import httpx

    from boxmaker.batch._run import alive

    loads: list[str] = []
    original = ssl.SSLContext.load_verify_locations

    def counted(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append("verify")
        original(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted)
    servers += [FakeLlama(2)]
    assert discover_slots(servers[0].url) == [0, 1]
    assert alive(servers[0].url)
    assert loads == []
    httpx.Client().close()  # httpx's default does load it: the counter counts
    assert loads == ["verify"]


def test_slots_from_slots_endpoint_or_props(servers: list[FakeLlama]) -> None:
    servers += [FakeLlama(3), FakeLlama(2, slots_endpoint=False)]
    assert discover_slots(servers[0].url) == [0, 1, 2]
    assert discover_slots(servers[1].url) == [0, 1]
    servers[0].kill()
    with pytest.raises(ServerError, match="cannot read its slots"):
        discover_slots(servers[0].url, timeout_s=1)


# --- faults, for real ----------------------------------------------------------------------


def test_server_killed_mid_batch_its_runs_move_to_the_other(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    servers += [FakeLlama(2, stall=True), FakeLlama(1)]
    doomed, spare = servers
    result: list[BatchProgress] = []
    worker = threading.Thread(
        target=lambda: result.append(
            run_batch(TASKS, tmp_path, servers=[doomed.url, spare.url], registry=TOOLS, config=FAST)
        )
    )
    worker.start()
    _wait_for(lambda: len(doomed.bodies) == 2, "both slots of the doomed server busy")
    doomed.kill()
    worker.join(30)
    (progress,) = result
    assert (progress.done, progress.failed, progress.servers_down, progress.slots) == (6, 0, 1, 1)
    assert sorted(b["id_slot"] for b in doomed.bodies) == [0, 1]
    assert {b["id_slot"] for b in spare.bodies} == {0}
    runs = manifest(tmp_path).set_index("run")
    moved = runs[runs.attempts == 2]
    assert len(moved) == 2 and set(moved.server) == {spare.url}
    assert set(runs.state) == {"done"}
    for task in TASKS:
        assert _finished_users(tmp_path / "logs" / f"{task.id}.jsonl") == list(task.messages)
    downs = [json.loads(x) for x in (tmp_path / MANIFEST).read_text().splitlines()]
    assert [d["server"] for d in downs if d["state"] == "server_down"] == [doomed.url]


def test_a_run_that_keeps_failing_is_marked_failed_after_its_tries(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    def bad(body: dict[str, Any]) -> bool:
        return any(m.get("content") == "question 1" for m in body["messages"])

    servers.append(FakeLlama(2, fail=bad))
    progress = run_batch(
        TASKS[:3], tmp_path, servers=[servers[0].url], registry=TOOLS, config=FAST, max_tries=2
    )
    assert (progress.done, progress.failed) == (2, 1)
    ((run, reason),) = progress.failures
    assert run == "t1" and "failed 2 times" in reason and "HTTP 500" in reason
    entry = read_manifest(tmp_path)["t1"]
    assert (entry["state"], entry["attempts"]) == ("failed", 2)
    assert sum(bad(b) for b in servers[0].bodies) == 2


def test_an_empty_registry_offers_no_tools_not_the_demo_ones(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    servers.append(FakeLlama(1))
    progress = run_batch(TASKS[:1], tmp_path, servers=[servers[0].url], registry=Registry())
    assert (progress.done, progress.failed) == (1, 0)
    assert servers[0].bodies and all("tools" not in b for b in servers[0].bodies)


def test_a_corrupt_log_fails_its_run_and_the_others_still_run(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    servers.append(FakeLlama(2))
    logs = tmp_path / "logs"
    logs.mkdir()
    with Session.create(logs, Baseline(), session_id="t0") as s:
        s.append(User(content="question 0"))
    with (logs / "t0.jsonl").open("ab") as fh:
        fh.write(
            b"not json\n" + b'{"type": "user", "content": "x", "time": "2026-12-01T00:00:00Z"}\n'
        )
    progress = run_batch(TASKS[:3], tmp_path, servers=[servers[0].url], registry=TOOLS, config=FAST)
    assert (progress.done, progress.failed) == (2, 1)
    ((run, reason),) = progress.failures
    assert run == "t0" and "cannot be read" in reason and "t0.jsonl:3" in reason
    runs = read_manifest(tmp_path)
    assert [runs[t]["state"] for t in ("t0", "t1", "t2")] == ["failed", "done", "done"]


def test_a_server_with_an_api_key_runs_with_the_key_and_says_so_without(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    key = "sk-batch-0123456789"
    servers.append(FakeLlama(2, key=key))
    with pytest.raises(ServerError, match=r"needs an api key .*HTTP 401") as caught:
        run_batch(TASKS[:2], tmp_path / "a", servers=[servers[0].url], registry=TOOLS, config=FAST)
    assert "slots it has" not in str(caught.value)
    keyed = Config(client=ClientConfig(api_key=key, retry_base_delay_s=0.01))
    progress = run_batch(
        TASKS[:2], tmp_path / "b", servers=[servers[0].url], registry=TOOLS, config=keyed
    )
    assert (progress.done, progress.failed) == (2, 0)
    with pytest.raises(ServerError, match="refused the api key given") as caught:
        discover_slots(servers[0].url, api_key="sk-wrong-0123456789")
    assert "sk-wrong" not in str(caught.value)
    # the key of the logs and the manifest: never in plain
    grid: dict[str, list[Any]] = {"client.api_key": [key], "loop.tool_result_cap": [40]}
    progress = run_batch(
        TASKS[:2], tmp_path / "c", servers=[servers[0].url], registry=TOOLS, config=keyed, grid=grid
    )
    assert (progress.done, progress.failed) == (2, 0)
    assert key not in (tmp_path / "c" / MANIFEST).read_text()
    assert set(manifest(tmp_path / "c")["client.api_key"]) == {"<SECRET>"}
    for log in (tmp_path / "c" / "logs").glob("*.jsonl"):
        assert key not in log.read_text()


def test_a_full_context_finishes_the_run_and_a_rerun_skips_it(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    full = lambda body: body["messages"][-1]["content"] == "two"  # noqa: E731
    servers.append(FakeLlama(1, full=full))
    task = Task(id="long", messages=("one", "two", "three"))
    progress = run_batch([task], tmp_path, servers=[servers[0].url], registry=TOOLS, config=FAST)
    assert (progress.done, progress.failed) == (1, 0)
    entry = read_manifest(tmp_path)["long"]
    assert (entry["state"], entry["turns"], entry["outcome"]) == ("done", 2, "session_full")
    assert [b["messages"][-1]["content"] for b in servers[0].bodies] == ["one", "two"]
    again = run_batch([task], tmp_path, servers=[servers[0].url], registry=TOOLS, config=FAST)
    assert (again.done, again.skipped, len(servers[0].bodies)) == (1, 1, 2)


def _run_guarded(tmp_path: Path, url: str, **kw: Any) -> list[Any]:
    """``run_batch`` of :data:`TASKS` on a thread of its own (``boxmaker-caller``): what it
    returned or raised; fails, not hangs, when it has not ended in 60 s."""
    got: list[Any] = []
    kw = {"registry": TOOLS, "config": FAST, **kw}

    def call() -> None:
        try:
            got.append(run_batch(TASKS, tmp_path, servers=[url], **kw))
        except BaseException as exc:  # KeyboardInterrupt too: what a test checks
            got.append(exc)

    runner = threading.Thread(target=call, daemon=True, name="boxmaker-caller")
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "run_batch hung"
    return got


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_a_progress_hook_that_raises_is_said_once_and_the_batch_goes_on(
    tmp_path: Path,
    servers: list[FakeLlama],
    executor: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A broken display must not cost the batch: on threads a hook raising on a worker left
    its run marked running and run_batch waiting for it without end; on processes it ended
    the batch with its runs in flight. The hook is called on the caller's thread alone."""
    servers.append(FakeLlama(2))
    calls: list[tuple[str, BatchProgress]] = []

    def hook(progress: BatchProgress) -> None:
        calls.append((threading.current_thread().name, progress))
        raise RuntimeError("the widget broke")

    workers = 2 if executor == "processes" else None
    with caplog.at_level("WARNING", logger="boxmaker.batch"):
        (progress,) = _run_guarded(
            tmp_path, servers[0].url, executor=executor, workers=workers, on_progress=hook
        )
    assert isinstance(progress, BatchProgress)
    assert (progress.done, progress.failed, progress.running) == (len(TASKS), 0, 0)
    assert {e["state"] for e in read_manifest(tmp_path).values()} == {"done"}
    said = [r for r in caplog.records if "on_progress hook raised" in r.getMessage()]
    assert len(said) == 1 and said[0].exc_info is not None
    assert len(calls) >= 2 and calls[-1][1].finished  # called again after it raised
    assert {name for name, _ in calls} == {"boxmaker-caller"}


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_ctrl_c_inside_the_progress_hook_is_ctrl_c_and_leaves_no_run_marked_running(
    tmp_path: Path, servers: list[FakeLlama], executor: str
) -> None:
    """KeyboardInterrupt raised by the hook (a real Ctrl-C lands there often: it is called
    at every change) stops the batch as Ctrl-C does: the runs in flight are cancelled and
    booked ``interrupted``, none is left ``running`` (on worker processes, a hook called
    while the driver booked outcomes it had read lost the rest, and the driver waited for
    them without end)."""
    servers.append(FakeLlama(2, stall=True))

    def hook(progress: BatchProgress) -> None:
        if progress.running:
            raise KeyboardInterrupt

    workers = 2 if executor == "processes" else None
    (raised,) = _run_guarded(
        tmp_path, servers[0].url, executor=executor, workers=workers, on_progress=hook
    )
    assert isinstance(raised, KeyboardInterrupt)
    states = [e["state"] for e in read_manifest(tmp_path).values()]
    assert "running" not in states and "interrupted" in states, states


@pytest.mark.parametrize("executor", ["threads", "processes"])
def test_system_exit_from_a_runs_tools_on_a_worker_fails_that_run_alone(
    tmp_path: Path, servers: list[FakeLlama], executor: str
) -> None:
    """A run's tools (here its registry, made when the run starts) raising SystemExit on a
    worker: on a thread it exits nothing and, uncaught, left the run marked running and the
    batch waiting without end (on a worker process, the driver waiting for its outcome).
    It is a failed attempt of that run; the others are done."""
    servers.append(FakeLlama(2))

    def registry(run_id: str, task: object) -> Registry:
        if run_id == "t3" and threading.current_thread().name.startswith("boxmaker-batch"):
            raise SystemExit("a tool called sys.exit()")
        return TOOLS

    workers = 2 if executor == "processes" else None
    got = _run_guarded(
        tmp_path, servers[0].url, executor=executor, workers=workers, registry=registry
    )
    (progress,) = got
    assert isinstance(progress, BatchProgress)
    assert (progress.done, progress.failed, progress.running) == (len(TASKS) - 1, 1, 0)
    ((run, reason),) = progress.failures
    assert run == "t3" and "SystemExit: a tool called sys.exit()" in reason
    assert read_manifest(tmp_path)["t3"]["state"] == "failed"


def test_cancel_stops_in_flight_turns_and_a_rerun_sends_each_message_once(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    servers += [FakeLlama(2, stall=True), FakeLlama(2)]
    stalling, answering = servers
    cancel = threading.Event()
    result: list[BatchProgress] = []
    worker = threading.Thread(
        target=lambda: result.append(
            run_batch(
                TASKS[:3],
                tmp_path,
                servers=[stalling.url],
                registry=TOOLS,
                config=FAST,
                cancel=cancel,
            )
        )
    )
    worker.start()
    _wait_for(lambda: len(stalling.bodies) == 2, "two runs in flight")
    cancel.set()
    worker.join(30)
    (stopped,) = result
    assert stopped.stopped and stopped.done == 0
    states = {run: e["state"] for run, e in read_manifest(tmp_path).items()}
    assert sorted(states.values()) == ["interrupted", "interrupted", "planned"]
    for run, state in states.items():
        path = tmp_path / "logs" / f"{run}.jsonl"
        if state == "interrupted":
            assert log_state(path).last_outcome == "cancelled"
    again = run_batch(TASKS[:3], tmp_path, servers=[answering.url], registry=TOOLS, config=FAST)
    assert (again.done, again.skipped, again.failed) == (3, 0, 0)
    for task in TASKS[:3]:
        assert _finished_users(tmp_path / "logs" / f"{task.id}.jsonl") == list(task.messages)
    third = run_batch(TASKS[:3], tmp_path, servers=[answering.url], registry=TOOLS, config=FAST)
    assert (third.done, third.skipped) == (3, 3)
    sent = len(answering.bodies)
    assert sent == 6  # two messages per run, each answered at once: nothing sent twice


def test_frames_join_task_and_settings(tmp_path: Path, servers: list[FakeLlama]) -> None:
    servers.append(FakeLlama(2))
    grid = {"loop.tool_result_cap": [10, 20]}
    url = servers[0].url
    progress = run_batch(
        TASKS[:2], tmp_path, servers=[url, url + "/"], registry=TOOLS, grid=grid, config=FAST
    )
    assert progress.slots == 2  # one server named twice
    turns = frames(tmp_path, "turns")
    assert len(turns) == 8
    counts = turns.groupby(["task", "loop.tool_result_cap"]).size().to_dict()
    assert counts == {("t0", 10): 2, ("t0", 20): 2, ("t1", 10): 2, ("t1", 20): 2}
    with pytest.raises(ConfigError):
        frames(tmp_path, "nope")


# --- the notebook view ---------------------------------------------------------------------


def test_batch_view_redraws_at_most_its_rate_and_always_the_end() -> None:
    view = BatchView(max_updates_per_s=15)
    started = time.monotonic()
    for i in range(2000):
        view(BatchProgress(total=2000, done=i, slots=4, running=4, tokens=i * 10, elapsed_s=1))
    elapsed = time.monotonic() - started
    assert 1 <= view.updates <= 1 + elapsed * 15
    view(
        BatchProgress(total=2000, done=1999, failed=1, failures=(("r", "<b>x</b>"),), finished=True)
    )
    assert view.progress.value == 2000 and view.progress.bar_style == "danger"
    assert "&lt;b&gt;x&lt;/b&gt;" in view.failures.value
    assert "1999/2000 runs done" in view.status.value


def test_ctrl_c_cancels_in_flight_turns_and_raises(
    tmp_path: Path, servers: list[FakeLlama]
) -> None:
    servers.append(FakeLlama(2, stall=True))
    stalling = servers[0]

    def press_ctrl_c() -> None:
        _wait_for(lambda: len(stalling.bodies) == 2, "two runs in flight")
        _thread.interrupt_main()  # what Ctrl-C does: KeyboardInterrupt in the main thread

    threading.Thread(target=press_ctrl_c, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        run_batch(TASKS[:3], tmp_path, servers=[stalling.url], registry=TOOLS, config=FAST)
    entries = read_manifest(tmp_path)
    interrupted = [run for run, e in entries.items() if e["state"] == "interrupted"]
    assert len(interrupted) == 2
    for run in interrupted:
        assert log_state(tmp_path / "logs" / f"{run}.jsonl").last_outcome == "cancelled"
    Manifest(tmp_path).close()  # the runner let go of the batch


def test_cli_batch_runs_tasks_and_exits_by_outcome(
    tmp_path: Path, servers: list[FakeLlama], capsys: pytest.CaptureFixture[str]
) -> None:
    def bad(body: dict[str, Any]) -> bool:
        return bool(body["messages"][0]["content"] == "question 2")

    servers.append(FakeLlama(2, fail=bad))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": t.id, "messages": t.messages}) + "\n" for t in TASKS[:3])
    )
    (tmp_path / "grid.json").write_text('{"loop.tool_result_cap": [10, 20]}')
    (tmp_path / "fast.toml").write_text("[client]\nretry_base_delay_s = 0.01\n")
    args = ["batch", str(tasks), "--url", servers[0].url, "--dir", str(tmp_path / "b")]
    args += ["--grid", str(tmp_path / "grid.json"), "--config", str(tmp_path / "fast.toml")]
    assert main([*args, "--tries", "1"]) == 1
    out, err = capsys.readouterr()
    assert "4/6 runs done" in out and "2 failed" in out and out.count("failed t2.") == 2
    assert "6/6" in err  # the progress bar, on stderr
    assert main(["batch", str(tasks), "--dir", str(tmp_path / "c")]) == 2
    # issue 37: a finished batch, resumed, starts no server (nor asks one): nothing to run
    servers[0].fail = None
    assert main([*args, "--tries", "1"]) == 0
    capsys.readouterr()
    dead = ["batch", str(tasks), "--url", "http://127.0.0.1:9", "--dir", str(tmp_path / "b")]
    dead += ["--grid", str(tmp_path / "grid.json"), "--config", str(tmp_path / "fast.toml")]
    assert main(dead) == 0
    assert "every run is done already; nothing to run" in capsys.readouterr().out


def test_report_of_a_batch_shows_each_run_with_its_task_and_settings(
    tmp_path: Path, servers: list[FakeLlama], capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: ``boxmaker report`` showed a batch's runs as hashes without their settings."""
    servers.append(FakeLlama(2))
    grid = {"loop.tool_result_cap": [10, 20]}
    run_batch(
        TASKS[:2], tmp_path / "b", servers=[servers[0].url], registry=TOOLS, grid=grid, config=FAST
    )
    for path in (tmp_path / "b", tmp_path / "b" / "logs"):
        assert main(["report", str(path)]) == 0
        out = capsys.readouterr().out
        runs = out.split(f"Batch runs in {tmp_path / 'b'}\n", 1)[1]
        table = manifest(tmp_path / "b")
        header = runs.splitlines()[1].split()
        assert header[:3] == ["run", "task", "loop.tool_result_cap"]
        for run, task, cap in zip(
            table.run, table.task, table["loop.tool_result_cap"], strict=True
        ):
            assert re.search(rf"^{run}\s+{task}\s+{cap}\s+done\b", runs, re.M), run
        assert max(len(line) for line in out.splitlines()) <= 100


def test_ray_executor_without_ray_says_how_to_get_it(
    tmp_path: Path, servers: list[FakeLlama], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # as if boxmaker[ray] were not installed
    servers.append(FakeLlama(1))
    with pytest.raises(ConfigError, match=r"boxmaker\[ray\]"):
        run_batch(TASKS[:1], tmp_path, servers=[servers[0].url], registry=TOOLS, executor="ray")
    assert not (tmp_path / MANIFEST).exists()  # refused before anything was planned
    with pytest.raises(ConfigError, match="executor"):
        run_batch(TASKS[:1], tmp_path, servers=[servers[0].url], registry=TOOLS, executor="dask")
