"""The batch runner at a GPU server's rates (issue 38, item 1), on the stand-in server of
boxmaker.testing: settings resolved once per run, one fsync per run's log and manifest lines
written in groups off the workers' threads, one kept connection per slot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from boxmaker.batch import PROCESSES_FROM, Task, manifest, pick_executor, run_batch
from boxmaker.batch._manifest import Manifest, read_manifest
from boxmaker.batch._runner import usable_cpus
from boxmaker.batch._tasks import RunSpec, expand
from boxmaker.cli import main
from boxmaker.client._pool import PooledTransport
from boxmaker.config import Config
from boxmaker.errors import LogBusy, SessionError
from boxmaker.records import ToolResult, TurnEnd
from boxmaker.session import LogWriter, Session
from boxmaker.testing import RateServer, assert_log_well_formed
from boxmaker.tools import Registry


def get_weather(city: str) -> str:
    """Get the weather.

    Args:
        city: The city.
    """
    return json.dumps({"city": city, "temperature": 21})


def tools() -> Registry:
    registry = Registry()
    registry.add(get_weather)
    return registry


@pytest.fixture(scope="module")
def server() -> Iterator[RateServer]:
    with RateServer(slots=4, prefill_s=0.002, tokens_per_s=20_000, answer_tokens=16) as srv:
        yield srv


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    done: list[int] = []
    real: Callable[[int], None] = os.fsync

    def counted(fd: int) -> None:
        done.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return done


def test_a_batch_on_a_gpu_rate_server(
    server: RateServer, tmp_path: Path, fsyncs: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run done (a tool call, its result, an answer), each log well formed; one fsync
    per log (at its close), the manifest's lines in a few groups; one connection per slot."""
    connects: list[Any] = []
    connect = PooledTransport._connect

    def counted(address: tuple[str, int], timeout: float | None, trace: Any) -> Any:
        connects.append(address)
        return connect(address, timeout, trace)

    monkeypatch.setattr(PooledTransport, "_connect", staticmethod(counted))
    tasks = [Task(id=f"t{i:02d}", messages=("Weather in Lisbon?", "And now?")) for i in range(12)]
    progress = run_batch(tasks, tmp_path, servers=[server.url], registry=tools())
    assert progress.done == 12 and not progress.failed
    runs = manifest(tmp_path)
    assert set(runs.state) == {"done"} and set(runs.outcome) == {"answered"}
    logs = sorted((tmp_path / "logs").glob("*.jsonl"))
    assert len(logs) == 12
    for log in logs:
        with Session.open(log, read_only=True) as session:
            assert_log_well_formed(session)
            assert sum(isinstance(r, ToolResult) for r in session.records) == 2
    lines = (tmp_path / "manifest.ndjson").read_bytes().count(b"\n")
    assert lines == 12 * 3  # planned, running, done
    # a log each (at its close, not per record); the manifest's lines share their fsyncs
    # when they come together, which depends on the timing: at most one a line (a CI run
    # under load saw 22 groups for 36 lines)
    assert len(fsyncs) <= 12 + lines
    assert len(connects) <= 4 + 1  # a connection a slot (and the batch's side requests')


def test_a_run_s_settings_are_resolved_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``RunSpec.config`` works out a run's config once per base config (it rebuilt a
    ``Config`` through ``typing.get_type_hints`` three times per run)."""
    built: list[Any] = []
    from_dict = Config.from_dict

    def counted(data: Any, source: str = "config") -> Config:
        built.append(source)
        return from_dict(data, source=source)

    monkeypatch.setattr(Config, "from_dict", staticmethod(counted))
    base = Config()
    (spec,) = expand([Task(id="t", messages=("hi",))], {"loop.tool_result_cap": [9]}, base)
    assert isinstance(spec, RunSpec) and len(built) == 1
    assert spec.config(base) is spec.config(base)
    assert spec.config(base).loop.tool_result_cap == 9 and len(built) == 1
    other = Config()
    assert spec.config(other).loop.tool_result_cap == 9 and len(built) == 2


def test_the_manifest_writes_its_lines_in_groups(tmp_path: Path, fsyncs: list[int]) -> None:
    book = Manifest(tmp_path)
    for i in range(200):
        book.write(f"r{i}", "planned", messages=1)
    book.flush()  # every line written so far is durable now
    assert len(read_manifest(tmp_path)) == 200
    assert 1 <= len(fsyncs) < 200
    book.write("r0", "done", turns=1)
    book.close()
    assert read_manifest(tmp_path)["r0"]["state"] == "done"
    with pytest.raises(SessionError, match="closed"):
        book.write("r1", "done")


def test_a_manifest_that_cannot_be_written_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group that fails (a full disk) fails the next write and the close, as an append
    that failed did."""
    book = Manifest(tmp_path)

    def full(self: LogWriter, line: bytes, *, sync: bool = True) -> None:
        raise SessionError(f"{self.path}: cannot append record: [Errno 28] No space left")

    monkeypatch.setattr(LogWriter, "append", full)
    book.write("r0", "planned")
    with pytest.raises(SessionError, match="No space left"):
        book.flush()
    with pytest.raises(SessionError, match="No space left"):
        book.write("r1", "planned")
    with pytest.raises(SessionError, match="No space left"):
        book.close()


def die(city: str) -> str:
    """Ends the worker process at once (a worker that dies mid-run).

    Args:
        city: The city.
    """
    os._exit(3)


def test_worker_processes_give_the_same_batch(server: RateServer, tmp_path: Path) -> None:
    """``executor="processes"``: the slots shared out among worker processes, this process
    keeping the queue and the manifest; the same logs and manifest as with threads."""
    tasks = [Task(id=f"t{i:02d}", messages=("Weather in Lisbon?",)) for i in range(10)]
    progress = run_batch(
        tasks, tmp_path, servers=[server.url], registry=tools(), executor="processes", workers=2
    )
    assert progress.done == 10 and not progress.failed and progress.tokens > 0
    runs = manifest(tmp_path)
    assert set(runs.state) == {"done"} and set(runs.turns) == {1}
    for log in (tmp_path / "logs").glob("*.jsonl"):
        with Session.open(log, read_only=True) as session:
            assert_log_well_formed(session)
    again = run_batch(tasks, tmp_path, servers=[server.url], registry=tools(), executor="processes")
    assert again.skipped == 10  # resumed: nothing left to run


def test_a_worker_process_that_dies_is_started_again(server: RateServer, tmp_path: Path) -> None:
    registry = tools()
    registry.add(die)
    tasks = [Task(id="dies", messages=("Weather?",), tools=("die",))]
    tasks += [Task(id=f"t{i}", messages=("Weather?",), tools=("get_weather",)) for i in range(6)]
    progress = run_batch(
        tasks,
        tmp_path,
        servers=[server.url],
        registry=registry,
        executor="processes",
        workers=2,
        max_tries=2,
    )
    # a run in flight on the worker that died fails that try too (which run killed it cannot
    # be told); each failure says so, and every run ends done or failed, none lost
    failed = dict(progress.failures)
    assert "worker process died (exit code 3)" in failed["dies"]
    assert all("worker process died (exit code 3)" in why for why in failed.values())
    assert progress.done + len(failed) == 7 and progress.done >= 1  # a new worker ran on
    again = run_batch(
        tasks[1:], tmp_path, servers=[server.url], registry=tools(), executor="processes"
    )
    assert (again.done, again.skipped) == (6, progress.done)  # the failed ones ran on a rerun


def test_a_cancel_ends_the_turns_in_every_worker(tmp_path: Path) -> None:
    """The caller's cancel: each worker's turns in flight end with their TurnEnd, the call
    returns stopped, a rerun picks up."""
    slow = RateServer(slots=2, prefill_s=0.0, tokens_per_s=20, answer_tokens=400)
    cancel = threading.Event()
    tasks = [Task(id=f"t{i}", messages=("Weather?",), tools=()) for i in range(4)]
    with slow:
        threading.Timer(1.5, cancel.set).start()
        progress = run_batch(
            tasks,
            tmp_path,
            servers=[slow.url],
            registry=tools(),
            executor="processes",
            workers=2,
            cancel=cancel,
        )
    assert progress.stopped and progress.done == 0
    runs = read_manifest(tmp_path)
    assert sorted(r["state"] for r in runs.values()) == ["interrupted"] * 2 + ["planned"] * 2
    for log in (tmp_path / "logs").glob("*.jsonl"):
        with Session.open(log, read_only=True) as session:
            last = session.records[-1]
            assert isinstance(last, TurnEnd) and last.outcome == "cancelled"


def test_the_command_line_runs_worker_processes(
    server: RateServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``boxmaker batch --workers N`` is ``executor="processes"``; ``--ray`` excludes it."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"id": f"t{i}", "messages": ["Weather?"]}) + "\n" for i in range(6))
    )
    out = tmp_path / "b"
    argv = ["batch", str(tasks), "--url", server.url, "--dir", str(out), "--workers", "2"]
    assert main(argv) == 0
    runs = manifest(out)
    assert sorted(runs.run) == [f"t{i}" for i in range(6)] and set(runs.state) == {"done"}
    with pytest.raises(SystemExit) as info:
        main([*argv, "--ray", "auto"])
    assert info.value.code == 2
    assert "not allowed with argument --workers" in capsys.readouterr().err


def test_auto_picks_worker_processes_from_32_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """``executor="auto"``: threads below :data:`PROCESSES_FROM` slots (one process keeps up
    there), worker processes from it where workers fork and this process may use more than
    one CPU (its affinity, not the machine's count)."""
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert PROCESSES_FROM == 32
    assert [pick_executor(n) for n in (1, 16, 31, 32, 64)] == [
        "threads",
        "threads",
        "threads",
        "processes",
        "processes",
    ]
    assert pick_executor(1, workers=2) == "processes"  # workers named: processes
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {1})
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert pick_executor(64) == "threads"  # pinned to one CPU of eight: nothing to gain
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    monkeypatch.setattr(sys, "platform", "darwin")
    assert pick_executor(64) == "threads"  # spawned workers: notebook tools would not reach them


def _pid_tools(folder: Path) -> Registry:
    def get_weather(city: str) -> str:
        """Get the weather.

        Args:
            city: The city.
        """
        (folder / f"{os.getpid()}-{threading.get_ident()}").touch()
        return json.dumps({"city": city, "temperature": 21})

    registry = Registry()
    registry.add(get_weather)
    return registry


@pytest.mark.skipif(sys.platform != "linux" or usable_cpus() < 2, reason="forks, 2 CPUs")
def test_auto_runs_32_slots_in_worker_processes_and_threads_say_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``executor="auto"`` runs 32 slots in worker processes (the tools run in processes
    other than this one) and 4 on threads here; the default, threads, on 32 slots runs here
    and says once that worker processes would keep them busier."""
    tasks = [Task(id=f"t{i:02d}", messages=("Weather in Lisbon?",)) for i in range(40)]
    for slots, executor, here in ((32, "auto", False), (4, "auto", True), (32, "threads", True)):
        calls = tmp_path / f"calls-{slots}-{executor}"
        calls.mkdir()
        caplog.clear()
        with RateServer(slots=slots, prefill_s=0.0, tokens_per_s=50_000, answer_tokens=8) as srv:
            done = run_batch(
                tasks,
                tmp_path / f"b{slots}-{executor}",
                servers=[srv.url],
                registry=_pid_tools(calls),
                executor=executor,
            )
        assert done.done == 40 and not done.failed
        pids = {int(p.name.split("-")[0]) for p in calls.iterdir()}
        assert (pids == {os.getpid()}) is here, pids
        said = [r.getMessage() for r in caplog.records if r.name == "boxmaker.batch"]
        assert len(said) == (executor == "threads"), said
        assert all("32 slots on threads" in m and 'executor="auto"' in m for m in said)


_DRIVER = """
import sys, os, time
from boxmaker.batch import Task, run_batch
from boxmaker.testing import RateServer
from boxmaker.tools import Registry

def get_weather(city: str) -> str:
    \"\"\"Get the weather.

    Args:
        city: The city.
    \"\"\"
    time.sleep(30)
    return "sunny"

tools = Registry()
tools.add(get_weather)
tasks = [Task(id=f"t{i:02d}", messages=("Weather in Lisbon?",)) for i in range(8)]
run_batch(tasks, sys.argv[1], servers=[sys.argv[2]], registry=tools, executor="processes",
          workers=2)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG")
def test_a_killed_driver_takes_its_workers_along(tmp_path: Path) -> None:
    """SIGKILL to the driver (the OOM killer, ``kill -9``) ends its worker processes too: a
    worker left behind held the manifest's lock, and the batch could not be run again."""
    with RateServer(slots=4, prefill_s=0.0, tokens_per_s=50_000, answer_tokens=8) as srv:
        driver = subprocess.Popen(
            [sys.executable, "-c", _DRIVER, str(tmp_path / "b"), srv.url],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        )
        deadline = time.monotonic() + 30
        while len(_children(driver.pid)) < 2:
            assert time.monotonic() < deadline and driver.poll() is None
            time.sleep(0.05)
        workers = _children(driver.pid)
        time.sleep(0.5)  # the runs are in their tools
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in workers)
        tools = Registry()
        tools.add(get_weather)
        tasks = [Task(id=f"t{i:02d}", messages=("Weather in Lisbon?",)) for i in range(8)]
        # a worker's pid reads as a zombie once its main thread has exited, before its last
        # thread closed the descriptors (the inherited lock among them): a few ms more
        deadline = time.monotonic() + 10
        while True:
            try:
                again = run_batch(tasks, tmp_path / "b", servers=[srv.url], registry=tools)
                break
            except LogBusy:
                assert time.monotonic() < deadline, "the killed driver's lock is still held"
                time.sleep(0.05)
    assert again.done == 8 and not again.failed


def _children(pid: int) -> list[int]:
    """The child processes of ``pid`` (Linux ``/proc``) that are batch workers."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
