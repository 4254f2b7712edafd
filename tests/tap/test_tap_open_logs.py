"""The tap holds at most :data:`boxmaker.tap.OPEN_LOGS` conversations' logs open (at most a
quarter of its open-file limit): before, every log stayed open for the tap's life, and under
a limit of 128 open files the tap stopped answering after about 100 conversations."""

from __future__ import annotations

import os
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import running
from test_tap import ANSWER, ASK, CALL, CHAT, _echo, _post, _sessions

from boxmaker.records import ToolResult, User
from boxmaker.tap import Tap, _log
from boxmaker.testing import RateServer

ROOT = Path(__file__).resolve().parents[2]


def test_a_closed_log_is_opened_again_with_its_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one log open at a time, two interleaved conversations each go on in their own
    log, and a key a conversation showed earlier is still hidden after its log was closed
    and opened again."""
    monkeypatch.setattr(_log, "_open_logs_cap", lambda: 1)
    key = "sk-tap-0123456789abcdef"
    other = {"role": "user", "content": "What is the weather in Rome?"}
    with running([CALL, CALL, ANSWER, ANSWER]) as up, Tap(up.url, directory=tmp_path) as tap:
        body = {"messages": [ASK], "stream": True}
        httpx.post(tap.url + CHAT, json=body, headers={"Authorization": f"Bearer {key}"})
        _post(tap.url, [other])
        *call, result = _echo()
        leaked = {**result, "content": f'{{"sky": "sunny", "seen": "{key}"}}'}
        _post(tap.url, [ASK, *call, leaked])  # no key header now: the earlier one is known
        _post(tap.url, [other, *_echo()])
        assert tap.log is not None and tap.log.wait(10)
        assert len(tap.log._open_logs) == 1
    first, second = _sessions(tap)
    assert [r.content for r in first.records if isinstance(r, User)] == [ASK["content"]]
    assert [r.content for r in second.records if isinstance(r, User)] == [other["content"]]
    (shown,) = [r for r in first.records if isinstance(r, ToolResult)]
    assert key not in shown.content and "sunny" in shown.content
    assert key not in first.path.read_text()
    assert [type(r).__name__ for r in second.records][-1] == "TurnEnd"


def _limit(files: int) -> Any:
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))


def test_a_tap_under_128_open_files_logs_300_conversations(tmp_path: Path) -> None:
    """``boxmaker tap`` in a process of its own, its open files limited to 128: 300
    conversations one after another are all answered and all logged."""
    with RateServer(slots=2, tokens_per_s=100_000, answer_tokens=4) as server:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "boxmaker.cli", "tap", "--upstream", server.url]
        argv += ["--port", str(port), "--dir", str(tmp_path), "--no-forensics"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        tap = subprocess.Popen(
            argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_limit(128)
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(url + "/health", timeout=2)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and tap.poll() is None
                    time.sleep(0.05)
            statuses = []
            for n in range(300):
                body = {"messages": [{"role": "user", "content": f"question {n}"}], "stream": True}
                statuses.append(httpx.post(url + CHAT, json=body, timeout=10).status_code)
        finally:
            tap.send_signal(signal.SIGINT)
            out = tap.communicate(timeout=60)[0].decode()
    assert statuses == [200] * 300
    assert tap.returncode == 0, out
    assert len(list(tmp_path.glob("*.jsonl"))) == 300, out
