"""The log under real faults: a second writer (another process, the same one), a second turn,
a full disk (a real tmpfs, as root), SIGKILLs, a process that died inside a turn, calls that
share an id, and hostile log lines."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from boxmaker.config import Config, LoopLimits
from boxmaker.errors import SessionError, TurnLimit
from boxmaker.frames import _build as frames
from boxmaker.records import Assistant, Baseline, ToolCall, ToolResult, TurnEnd, User
from boxmaker.session import Session, wire_arguments
from boxmaker.testing import ScriptedClient, answer, call, calls
from boxmaker.tools import Registry, canonical_arguments, dispatch
from boxmaker.turn import Runtime, run_turn

ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import sys, time
from boxmaker.session import Session
s = Session.open(sys.argv[1])
print("holding", flush=True)
time.sleep(60)
"""


@contextlib.contextmanager
def writer_process(path: Path) -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "holding"
        yield child
    finally:
        child.kill()
        child.wait()
        if child.stdout is not None:
            child.stdout.close()


def test_a_second_writer_in_another_process_is_refused_naming_the_pid(tmp_path: Path) -> None:
    with Session.create(tmp_path) as s:
        path = s.path
    with writer_process(path) as child:
        with pytest.raises(SessionError, match=rf"another writer .*pid {child.pid}"):
            Session.open(path)
        view = Session.open(path, read_only=True)  # readers never lock
        assert view.records == ()
    # the kill released the lock
    with Session.open(path) as again:
        again.append(User(content="mine now"))


def test_a_second_writer_in_the_same_process_is_refused(tmp_path: Path) -> None:
    first = Session.create(tmp_path)
    with pytest.raises(SessionError, match=f"pid {os.getpid()}"):
        Session.open(first.path)
    first.append(User(content="still fine"))
    first.close()
    with Session.open(first.path) as second:
        assert [r.content for r in second.records] == ["still fine"]  # type: ignore[union-attr]
    with pytest.raises(SessionError, match="closed"):
        first.append(User(content="after close"))


def test_a_second_turn_on_a_session_inside_a_turn_is_refused(tmp_path: Path) -> None:
    release = threading.Event()
    inside = threading.Event()

    def slow(_: int) -> None:
        inside.set()
        release.wait(10)

    client = ScriptedClient([answer("one")])
    client.before_each = slow
    session = Session.create(tmp_path)
    runtime = Runtime(config=Config(), client=client, registry=Registry())
    worker = threading.Thread(target=run_turn, args=(session, runtime, "first"))
    worker.start()
    assert inside.wait(10)
    with pytest.raises(SessionError, match="a turn is already running"):
        run_turn(session, runtime, "second")
    release.set()
    worker.join(10)
    assert [type(r).__name__ for r in session.records] == [
        "User",
        "Assistant",
        "Usage",
        "TurnEnd",
    ]


def test_calls_sharing_one_id_each_get_a_result_when_a_limit_ends_the_turn(
    tmp_path: Path,
) -> None:
    same = [call("weather", {"city": c}, "dup") for c in ("A", "B", "C")]
    session = Session.create(tmp_path)
    config = Config(loop=LoopLimits(tool_iterations=0))
    runtime = Runtime(config=config, client=ScriptedClient([calls(*same)]), registry=Registry())
    with pytest.raises(TurnLimit):
        run_turn(session, runtime, "go")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert len(results) == 3 and {r.not_run for r in results} == {"tool_iterations"}
    assert session.unanswered_calls() == ()


def test_a_log_left_inside_a_tool_is_made_whole_before_the_next_request(tmp_path: Path) -> None:
    with Session.create(tmp_path) as s:
        s.append(User(content="go"))
        pending = (
            ToolCall(id="a", name="f", arguments="{}"),
            ToolCall(id="b", name="g", arguments="{}"),
        )
        s.append(Assistant(content=None, tool_calls=pending))
        s.append(ToolResult(call=1, tool_call_id="a", name="f", content="ran"))
        path = s.path  # the process "dies" here: call b has no result
    client = ScriptedClient([answer("fine")])
    with Session.open(path) as session:
        assert [c.id for c in session.unanswered_calls()] == ["b"]
        run_turn(session, Runtime(config=Config(), client=client, registry=Registry()), "again")
    records = Session.open(path, read_only=True).records
    orphan = records[3]
    assert isinstance(orphan, ToolResult) and orphan.tool_call_id == "b"
    assert orphan.not_run == "process_died" and orphan.call == 2
    dead_end = records[4]  # the dead turn is closed, so frames count it as what it was
    assert isinstance(dead_end, TurnEnd) and dead_end.outcome == "process_died"
    assert isinstance(records[5], User)
    # the request that followed carried a result for every call
    sent = client.bodies[0]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert isinstance(records[-1], TurnEnd) and records[-1].outcome == "answered"


# -- hostile input ---------------------------------------------------------------------------

DEEP = "[" * 1000 + "]" * 1000


def test_deeply_nested_arguments_are_invalid_json_and_poison_nothing(tmp_path: Path) -> None:
    deep_args = '{"a":' + DEEP + "}"
    assert wire_arguments(deep_args) == "{}"
    assert canonical_arguments(deep_args) == deep_args
    registry = Registry()
    registry.add(lambda a: "x", name="f", description="f", parameters={"type": "object"})
    assert "not valid JSON" in dispatch(registry, "f", deep_args).content
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    steps = [calls(call("f", deep_args, "d1")), answer("ok"), answer("later")]
    runtime = Runtime(config=Config(), client=ScriptedClient(steps), registry=registry)
    assert run_turn(session, runtime, "go").content == "ok"
    session.close()
    with Session.open(session.path) as again:  # reopening: later turns still work
        runtime = Runtime(
            config=Config(), client=ScriptedClient([answer("later")]), registry=registry
        )
        assert run_turn(again, runtime, "again").content == "later"


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (
            '{"type":"user","time":"2026-11-30T00:00:00Z","content":' + DEEP + "}",
            "nested too deeply",
        ),
        ('{"type":"user","time":"0001-01-01T00:00:00+05:00","content":"x"}', "out of range"),
        (
            '{"type":"usage","time":"2026-11-30T00:00:00Z","timings":{"cache_n":"many"}}',
            "not a finite number >= 0",
        ),
    ],
)
def test_hostile_log_lines_give_a_clear_error_naming_file_and_line(
    tmp_path: Path, line: str, words: str
) -> None:
    with Session.create(tmp_path) as s:
        path = s.path
    with path.open("a") as fh:
        fh.write(line + "\n")
    with pytest.raises(SessionError, match=rf"{path.name}:2: .*{words}"):
        Session.open(path, read_only=True)


def test_a_baseline_whose_tools_are_not_objects_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    head = {"type": "baseline", "schema": 2, "time": "2026-11-30T00:00:00Z", "tools": [1]}
    p.write_text(json.dumps(head) + "\n")
    with pytest.raises(
        SessionError, match=r"x.jsonl:1: baseline record: tools\[0\] = 1 is not a JSON object"
    ):
        Session.open(p, read_only=True)


# -- a full disk, for real -------------------------------------------------------------------


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_leaves_the_log_exactly_as_before_the_failed_append(tiny_tmpfs: Path) -> None:
    session = Session.create(tiny_tmpfs)
    session.append(User(content="first"))
    filler = tiny_tmpfs / "filler"
    with filler.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:  # fill the disk to the last block
            fh.write(b"x" * 512)
    before = session.path.read_bytes()
    with pytest.raises(SessionError, match=r"cannot append record.*as it was before"):
        session.append(User(content="y" * 20_000))
    assert session.path.read_bytes() == before
    assert [r.content for r in session.records] == ["first"]  # type: ignore[union-attr]
    filler.unlink()  # space frees: nothing held back lands now
    session.append(User(content="second"))
    session.close()
    again = Session.open(session.path, read_only=True)
    assert [r.content for r in again.records] == ["first", "second"]  # type: ignore[union-attr]


def test_crash_script_loses_nothing_acknowledged_and_reads_no_group_in_part() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/crash_test.py", "--kills", "5", "--seed", "7"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    last = done.stdout.strip().splitlines()[-1]
    words = last.split()
    acked, lost, partial = int(words[1]), int(words[3]), int(words[5])
    assert done.returncode == 0 and last.startswith("acked ") and acked > 0, done.stderr
    assert (lost, partial) == (0, 0), last


def test_calls_that_cannot_run_are_marked_not_run_and_the_loop_s_words_are_never_capped(
    tmp_path: Path,
) -> None:
    """An unknown tool or arguments that do not fit are ``not_run="invalid_call"`` (frames
    count them as not run); the result cap cuts a tool's own text only."""
    registry = Registry()
    registry.add(lambda city: "x" * 500, name="f", description="f", parameters=SCHEMA_CITY)
    session = Session.create(tmp_path, Baseline(tools=registry.definitions()))
    steps = [
        calls(
            call("nope", {}, "u1"),
            call("f", {"city": 5}, "u2"),
            call("f", {"city": "Oslo"}, "u3"),
            call("f", {"city": "Oslo"}, "u4"),
        ),
        answer("ok"),
    ]
    config = Config(loop=LoopLimits(tool_result_cap=40))
    run_turn(session, Runtime(config=config, client=ScriptedClient(steps), registry=registry), "go")
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.not_run for r in results] == ["invalid_call", "invalid_call", None, "repeat"]
    assert [r.truncated for r in results] == [False, False, True, False]
    assert (
        results[3].content.startswith("This call was already made") and len(results[3].content) > 40
    )
    assert frames.tool_calls(session.path).ran.tolist() == [False, False, True, False]


SCHEMA_CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def test_integers_beyond_64_bits_and_copied_logs_are_left_out_with_a_warning(
    tmp_path: Path,
) -> None:
    """Every reader refuses a number the analysis cannot hold; a copy of a log (the same
    session id twice) is read once, so nothing counts twice."""
    head = (
        (Path(__file__).resolve().parents[1] / "data" / "schema-2.jsonl")
        .read_text()
        .splitlines()[0]
    )
    usage = {"type": "usage", "timings": {"cache_n": 10**23, "prompt_n": 5}}
    big = tmp_path / "big.jsonl"
    big.write_text(f"{head}\n{json.dumps({**usage, 'time': '2026-11-30T00:00:00Z'})}\n")
    with pytest.raises(SessionError, match=r"big.jsonl:2: .*out of range"):
        Session.open(big, read_only=True)
    with pytest.warns(UserWarning, match=r"big.jsonl:2: .*out of range"):
        assert frames.requests(big).empty
    good = tmp_path / "logs" / "a.jsonl"
    good.parent.mkdir()
    good.write_text((Path(__file__).resolve().parents[1] / "data" / "schema-2.jsonl").read_text())
    copy = good.with_name("b.jsonl")
    copy.write_bytes(good.read_bytes())
    copied = r"b.jsonl: a copy of session schema-2, which is read from .*a.jsonl"
    with pytest.warns(UserWarning, match=copied):
        summary = frames.summary(good.parent)
    assert summary.session.tolist() == ["schema-2"]
