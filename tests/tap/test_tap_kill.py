"""The tap's log is durable by design (issue 36): ``boxmaker tap``, a real second process in
front of a stand-in llama-server, killed under 8 agents at random moments
(``scripts/tap_kill_test.py``): after each SIGKILL every exchange answered more than
:data:`boxmaker.tap.LOG_WITHIN_S` before is in the logs and no record group is there in part;
after SIGTERM and SIGHUP nothing answered is missing and the tap exits 0.

Kills: ``BOXMAKER_TAP_KILLS`` (default 2; 30 for the acceptance run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from boxmaker.tap import LOG_WITHIN_S

ROOT = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("BOXMAKER_TAP_KILLS", "2"))


def test_a_killed_tap_lost_nothing_older_than_its_bound_and_a_stopped_one_nothing() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "scripts/tap_kill_test.py", "--kills", str(KILLS),
               "--signals", "SIGTERM,SIGHUP", "--bound", str(LOG_WITHIN_S),
               "--seed", "11"]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=60 + 30 * KILLS
    )
    lines = done.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("answered "), done.stderr
    words = lines[-1].split()
    figures = dict(zip(words[::2], words[1::2], strict=True))
    assert done.returncode == 0, done.stdout + done.stderr
    assert int(figures["answered"]) > 100 * (KILLS + 2)  # the agents really were busy
    assert (figures["lost"], figures["partial"]) == ("0", "0")
    assert float(figures["oldest_unlogged_s"]) < LOG_WITHIN_S
    assert 0 < float(figures["slowest_written_s"]) < LOG_WITHIN_S  # the tap's own figure
    rounds = lines[:-1]
    assert [r.split()[2].rstrip(":") for r in rounds] == ["SIGKILL"] * KILLS + [
        "SIGTERM",
        "SIGHUP",
    ]
    assert all(" unlogged 0 " in r for r in rounds[KILLS:])  # a catchable signal: nothing


def test_a_writer_behind_holds_the_next_request_until_it_catches_up(tmp_path: Path) -> None:
    """The proxy asks :meth:`TapLog.catch_up` before each chat request: at once when the writer
    is not behind; held while it is more than HOLD_S behind, until it catches up."""
    import asyncio
    import threading
    import time

    from boxmaker.tap import HOLD_AT_MOST_S, HOLD_S, TapLog

    log = TapLog(tmp_path, "http://127.0.0.1:9", forensics=False)
    try:
        started = time.monotonic()
        asyncio.run(log.catch_up())
        assert time.monotonic() - started < HOLD_S  # not behind: no wait at all
        log._queued.append(time.monotonic() - 2 * HOLD_S)  # an exchange not written, 0.5 s old
        assert log.behind_s() > HOLD_S
        threading.Timer(0.4, log._queued.popleft).start()  # the writer gets to it
        started = time.monotonic()
        asyncio.run(log.catch_up())
        held = time.monotonic() - started
        assert 0.3 < held < HOLD_AT_MOST_S and log.behind_s() == 0.0
    finally:
        log.close()
