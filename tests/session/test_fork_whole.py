"""A fork is made whole or not at all, and only after a turn that ended (issue 36).

Before: a ``fork`` killed between making its log and copying the parent left a baseline-only
log that ``report`` counted as a session; ``fork(at=k)`` accepted a turn still running.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from boxmaker.errors import SessionError
from boxmaker.records import Assistant, Baseline, TurnEnd, Usage, User
from boxmaker.session import Session, read_log, read_logs

KILLS = int(os.environ.get("BOXMAKER_FORK_KILLS", "12"))


def _parent(folder: Path, turns: int, *, ended: bool = True, text: str = "x") -> Path:
    with Session.create(folder, Baseline(), session_id="parent") as parent:
        for n in range(turns):
            parent.extend([User(content=f"q{n} {text}"), Assistant(content=f"a{n} {text}")])
            parent.append(Usage(timings={"cache_n": 0, "prompt_n": 10, "predicted_n": 2}))
            if ended or n < turns - 1:
                parent.append(TurnEnd(outcome="answered"))
    return parent.path


def test_a_turn_that_has_not_ended_is_no_fork_point(tmp_path: Path) -> None:
    path = _parent(tmp_path, 2, ended=False)
    with Session.open(path, read_only=True) as parent:
        with pytest.raises(SessionError, match=r"turn 2 has not ended .*rerun=True"):
            parent.fork(at=2, session_id="f")
        parent.fork(at=1, session_id="after-1").close()  # ended: a later turn began
        parent.fork(at=2, rerun=True, session_id="before-2").close()  # before its answer
    assert not (tmp_path / "f.jsonl").exists()


_FORK = """
import os, signal, sys
from boxmaker.session import Session
if len(sys.argv) > 2:  # die at the start of the k-th write of the fork (a kill at that moment)
    writes, real = [0], os.write
    def write(fd, data):
        writes[0] += 1
        if writes[0] == int(sys.argv[2]):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(fd, data)
    os.write = write
with Session.open(sys.argv[1], read_only=True) as parent:
    print("ready", flush=True)
    parent.fork(at=len([r for r in parent.records if r.__class__.__name__ == "User"]),
                session_id="fork").close()
print("done", flush=True)
"""


def test_a_fork_killed_while_it_is_made_leaves_a_whole_log_or_none(tmp_path: Path) -> None:
    """A real process killed at random moments while it writes a fork of a big parent (each
    turn a few hundred KB): the folder holds the whole fork or no fork at all, never a
    baseline-only log a reader would count."""
    parent = _parent(tmp_path / "p", 30, text="y" * 200_000)
    copied = len(read_log(parent).records)
    rng = random.Random(7)
    outcomes = []
    for k in range(KILLS):
        folder = tmp_path / f"run{k}"
        folder.mkdir()
        moved = folder / "parent.jsonl"
        moved.write_bytes(parent.read_bytes())
        child = subprocess.Popen([sys.executable, "-c", _FORK, str(moved)], stdout=subprocess.PIPE)
        assert child.stdout is not None and child.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.0, 0.4))  # reading the parent, then writing the fork
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        logs = {Path(log.path).name: log for log in read_logs(folder)}
        if "fork.jsonl" in logs:
            assert len(logs["fork.jsonl"].records) == copied + 1  # Forked and every copy
            outcomes.append("whole")
        else:
            outcomes.append("none")
        assert set(logs) <= {"parent.jsonl", "fork.jsonl"}
    assert len(outcomes) == KILLS


@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_a_fork_killed_at_each_write_leaves_a_whole_log_or_none(
    tmp_path: Path, kill_at: int
) -> None:
    """The same, at each write the fork makes: before, dying at the second (the copies, after
    the baseline's) left a baseline-only fork log."""
    parent = _parent(tmp_path, 3)
    copied = len(read_log(parent).records)
    child = subprocess.run([sys.executable, "-c", _FORK, str(parent), str(kill_at)], check=False)
    logs = {Path(log.path).name: log for log in read_logs(tmp_path)}
    if "fork.jsonl" in logs:  # made before the kill (or no kill): whole
        assert len(logs["fork.jsonl"].records) == copied + 1
    else:
        assert child.returncode == -signal.SIGKILL


_CREATE = """
import os, signal, sys
from boxmaker.records import Baseline, User
from boxmaker.session import Session
writes, real = [0], os.write
def write(fd, data):  # die at the start of the k-th write (a kill at that moment)
    writes[0] += 1
    if writes[0] == int(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(fd, data)
os.write = write
with Session.create(sys.argv[1], Baseline(system="s"), session_id="new", sync=sys.argv[3]) as s:
    s.append(User(content="q"))
"""


@pytest.mark.parametrize("sync", ["append", "close"])
@pytest.mark.parametrize("kill_at", [1, 2, 3])
def test_a_log_killed_while_it_is_created_is_whole_or_absent(
    tmp_path: Path, kill_at: int, sync: str
) -> None:
    """``Session.create`` killed at its first write left an empty log that every reader
    refused (``empty session log``: the tap killed under load); now the log appears with its
    baseline or not at all."""
    child = subprocess.run([sys.executable, "-c", _CREATE, str(tmp_path), str(kill_at), sync])
    path = tmp_path / "new.jsonl"
    if kill_at == 1:
        assert child.returncode == -signal.SIGKILL and not path.exists()
    else:
        log = read_log(path)  # whole: its baseline, and the user message if written
        assert log.head["system"] == "s"
        assert len(log.records) == (0 if child.returncode == -signal.SIGKILL else 1)
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".jsonl"] == (
        [] if kill_at == 1 else ["new.jsonl"]
    )
