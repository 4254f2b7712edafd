"""``boxmaker chat`` and ``demo`` as their own processes against a fake llama-server on a
socket: SIGINT while a turn streams or at the prompt, and stdout closed in the middle of a
turn."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fake_llama import FakeLlama, Reply, running

import boxmaker
from boxmaker.session import Session

ROOT = Path(boxmaker.__file__).resolve().parent.parent
WAIT_S = 60.0  # an upper bound for a stuck child, never reached when things work


class Child:
    """``python -m boxmaker.cli ARGS`` with its stdout read as it comes."""

    def __init__(self, args: Sequence[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "boxmaker.cli", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        self._out = bytearray()
        self._grew = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert isinstance(self.proc.stdout, io.BufferedReader)  # bufsize -1: read1 exists
        while data := self.proc.stdout.read1(4096):
            with self._grew:
                self._out += data
                self._grew.notify_all()

    @property
    def out(self) -> str:
        with self._grew:
            return self._out.decode()

    def wait_for(self, text: str, count: int = 1) -> None:
        """Wait until ``text`` has appeared ``count`` times in stdout."""
        with self._grew:
            ok = self._grew.wait_for(lambda: self._out.decode().count(text) >= count, WAIT_S)
        assert ok, f"{text!r} x{count} never came; stdout so far:\n{self.out}"

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str, str]:
        """Close stdin (Ctrl-D), wait; return the exit code, stdout and stderr."""
        assert self.proc.stdin is not None and self.proc.stderr is not None
        self.proc.stdin.close()
        code = self.proc.wait(WAIT_S)
        self._reader.join(WAIT_S)
        with self.proc.stderr:
            return code, self.out, self.proc.stderr.read().decode()

    def kill(self) -> None:
        """Kill the child if it still runs; close its pipes (else a ResourceWarning)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(WAIT_S)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def stalling() -> Iterator[FakeLlama]:
    """The first reply streams 3 characters, then waits for ``release``; the next answer
    "ok"."""
    with running([Reply(content="abcLATE", stall_after=3), Reply(content="ok")]) as fake:
        yield fake


def _kinds(log: Path) -> list[str]:
    """Record kinds of a log, without the turn-end records of newer schemas; every line is
    checked to be whole JSON."""
    lines = log.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the log ends mid-line"
    for line in lines[:-1]:
        json.loads(line)
    return [type(r).__name__ for r in Session.open(log, repair=False).records if _counted(r)]


def _counted(record: object) -> bool:
    return type(record).__name__ != "TurnEnd"


def test_ctrl_c_in_a_chat_turn_stops_it_before_the_prompt_comes_back(
    tmp_path: Path, stalling: FakeLlama
) -> None:
    child = Child(["chat", "--url", stalling.url, "--dir", str(tmp_path)], tmp_path)
    try:
        child.wait_for("you> ")
        child.send("first")
        assert stalling.chunks_sent.wait(WAIT_S)
        child.wait_for("model> abc")
        # The stream has stalled: Ctrl-C, pressed three times, must wait for the turn to end
        # and is acknowledged before the stream goes on (so the cancel is seen in it).
        for _ in range(3):
            os.kill(child.proc.pid, signal.SIGINT)
        child.wait_for("  [stopping the turn]\n")
        stalling.release.set()
        child.wait_for("you> ", count=2)
        child.send("second")
        child.wait_for("model> ok")
        code, out, err = child.finish()
    finally:
        child.kill()
    assert code == 0, err
    assert "Traceback" not in err
    cancelled = out.index("[turn cancelled]")
    prompt = out.index("you> ", out.index("you> ") + 1)
    assert out.index("model> abc") < out.index("  [stopping the turn]\n") < cancelled
    assert cancelled < prompt < out.index("model> ok")
    assert "abc" not in out[cancelled:] and "LATE" not in out[cancelled:]
    assert len(stalling.bodies) == 2
    log = next(tmp_path.glob("*.jsonl"))
    assert _kinds(log) == ["User", "User", "Assistant", "Usage"]
    records = [r for r in Session.open(log, repair=False).records if _counted(r)]
    assert [getattr(r, "content", None) for r in records[:3]] == ["first", "second", "ok"]
    assert f"session log: {log}" in out


def test_ctrl_c_at_the_chat_prompt_ends_it_like_ctrl_d(tmp_path: Path) -> None:
    with running([Reply(content="ok")]) as fake:
        child = Child(["chat", "--url", fake.url, "--dir", str(tmp_path)], tmp_path)
        try:
            child.wait_for("you> ")
            os.kill(child.proc.pid, signal.SIGINT)
            code, out, err = child.finish()
        finally:
            child.kill()
    assert (code, err) == (0, "")
    assert list(tmp_path.glob("*.jsonl")) == []  # issue 21: nothing asked, no log, no table
    assert "request  prompt_n" not in out and "session log" not in out
    assert fake.bodies == []


def test_ctrl_c_in_the_demo_cancels_the_turn_and_ends_the_demo(
    tmp_path: Path, stalling: FakeLlama
) -> None:
    child = Child(["demo", "--url", stalling.url, "--dir", str(tmp_path)], tmp_path)
    try:
        assert stalling.chunks_sent.wait(WAIT_S)
        child.wait_for("model> abc")
        os.kill(child.proc.pid, signal.SIGINT)
        child.wait_for("[stopping the turn]")
        stalling.release.set()
        code, out, err = child.finish()
    finally:
        child.kill()
    assert code == 130, err
    assert "Traceback" not in err
    log = next(tmp_path.glob("*.jsonl"))
    assert out.index("[turn cancelled]") < out.index("request  prompt_n")
    assert out.rstrip().endswith(f"session log: {log}")
    assert "LATE" not in out
    assert len(stalling.bodies) == 1  # no other demo prompt was sent
    assert _kinds(log) == ["User"]


def test_stdout_closed_in_a_demo_turn_cancels_it_and_exits_141_quietly(
    tmp_path: Path, stalling: FakeLlama
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "boxmaker.cli", "demo", "--url", stalling.url, "--dir", "."],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert isinstance(proc.stdout, io.BufferedReader) and proc.stderr is not None
        seen = b""
        while b"model> abc" not in seen:  # the reply stalls after "abc": no more comes
            data = proc.stdout.read1(4096)
            assert data, seen
            seen += data
        proc.stdout.close()  # like `| head -3` going away in the middle of the turn
        stalling.release.set()
        err = proc.stderr.read().decode()
        assert (proc.wait(WAIT_S), err) == (141, "")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
    assert len(stalling.bodies) == 1
    assert _kinds(next(tmp_path.glob("*.jsonl"))) == ["User"]


def test_ctrl_c_while_chat_checks_the_server_is_one_line(tmp_path: Path) -> None:
    """Issue 21: Ctrl-C during start-up (here: a server that accepts and never answers
    /health) prints one line and exits 130, without a traceback."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(WAIT_S)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        child = Child(["chat", "--url", url, "--dir", str(tmp_path)], tmp_path)
        try:
            connection, _ = listener.accept()  # the child waits for the /health answer now
            with connection:
                os.kill(child.proc.pid, signal.SIGINT)
                code, out, err = child.finish()
        finally:
            child.kill()
    assert (code, out, err) == (130, "", "boxmaker: interrupted\n")
    assert list(tmp_path.rglob("*.jsonl")) == []
