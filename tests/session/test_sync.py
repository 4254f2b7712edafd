"""When a session's appends are fsynced (issue 38: a group of records per fsync, not one per
append, for the batch runner): ``sync="append"`` (the default) fsyncs each before it returns;
``sync="close"`` writes each whole at once (a killed process loses none: provoked here with
SIGKILL) and fsyncs them together at ``sync()`` and ``close()``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from boxmaker.errors import SessionError
from boxmaker.records import Baseline, User
from boxmaker.session import Session

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The descriptors fsynced from now on."""
    done: list[int] = []
    real: Callable[[int], None] = os.fsync

    def counted(fd: int) -> None:
        done.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counted)
    return done


def test_each_append_is_fsynced_by_default(tmp_path: Path, fsyncs: list[int]) -> None:
    with Session.create(tmp_path, Baseline()) as session:
        session.append(User(content="a"))
        session.extend([User(content="b"), User(content="c")])
        assert len(fsyncs) == 3  # the baseline, the append, the group
    assert len(fsyncs) == 3  # nothing left to fsync at close


def test_a_session_synced_at_close_fsyncs_once(tmp_path: Path, fsyncs: list[int]) -> None:
    session = Session.create(tmp_path, Baseline(), sync="close")
    for i in range(10):
        session.append(User(content=f"{i}"))
    assert fsyncs == []
    seen = Session.open(session.path, read_only=True).records
    assert [r.content for r in seen if isinstance(r, User)] == [f"{i}" for i in range(10)]
    # written at once: another reader sees every record before any fsync
    session.sync()
    assert len(fsyncs) == 1
    session.sync()  # nothing new: no fsync
    session.append(User(content="last"))
    session.close()
    assert len(fsyncs) == 2
    with Session.open(session.path, sync="close") as reopened:
        assert reopened.sync_policy == "close" and len(reopened.records) == 11


def test_an_unknown_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SessionError, match="sync must be one of append, close"):
        Session.create(tmp_path, sync="never")
    with Session.create(tmp_path, Baseline()) as session:
        path = session.path
    with pytest.raises(SessionError, match="sync must be one of"):
        Session.open(path, sync="sometimes")


CHILD = """
import sys
from boxmaker.records import User
from boxmaker.session import Session

round_ = sys.argv[2]
with Session.open(sys.argv[1], sync="close") as session:
    print("open", flush=True)
    i = 0
    while True:
        if i % 2:
            session.extend([User(content=f"{round_}-{i}a"), User(content=f"{round_}-{i}b")])
        else:
            session.append(User(content=f"{round_}-{i}"))
        print(f"ack {round_}-{i}", flush=True)
        i += 1
"""


def test_a_killed_process_loses_no_record_it_appended(tmp_path: Path) -> None:
    """SIGKILL while appending, unsynced: every record an append returned from is in the
    log, and no group is there in part (the kernel holds what each one ``write`` wrote)."""
    with Session.create(tmp_path, Baseline()) as session:
        path = session.path
    acked: set[str] = set()
    for round_ in range(3):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path), str(round_)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "open"
        time.sleep(0.05 + 0.02 * round_)
        os.kill(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        acked.update(line[4:] for line in out.splitlines() if line.startswith("ack "))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a torn last line or group, set aside
        records = Session.open(path, read_only=True).records
    contents = [r.content or "" for r in records if isinstance(r, User)]
    found = {c[:-1] if c[-1] in "ab" else c for c in contents}
    assert acked and acked <= found
    halves = [c[:-1] for c in contents if c[-1] in "ab"]
    assert all(halves.count(h) == 2 for h in halves)
