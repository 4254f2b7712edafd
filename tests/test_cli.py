"""The command line: chat against a running server, serve the shipped model, bad usage."""

from __future__ import annotations

import io
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from boxmaker.cli import main
from boxmaker.session import Session


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["nonsense"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_chat_with_no_server_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[client]\nretry_attempts = 0\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n"))
    code = main(
        ["chat", "--url", "http://127.0.0.1:9", "--config", str(config), "--dir", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "turn ended: TurnInferError" in out and "cannot connect" in out.lower()
    log = next(tmp_path.glob("*.jsonl"))
    kinds = [type(r).__name__ for r in Session.open(log, read_only=True).records]
    assert kinds == ["User", "TurnEnd"]


def test_bad_config_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[loop]\nnope = 1\n")
    assert main(["chat", "--config", str(config), "--dir", str(tmp_path)]) == 1
    assert "unknown key 'nope'" in capsys.readouterr().err


@pytest.mark.live
def test_chat_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from boxmaker.server import EmbeddedServer

    with EmbeddedServer(n_threads=1) as server:
        monkeypatch.setattr(sys, "stdin", io.StringIO("Hello!\n/quit\n"))
        assert main(["chat", "--url", server.url, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"chatting with {server.url}" in out
    log = next(tmp_path.glob("*.jsonl"))
    kinds = [type(r).__name__ for r in Session.open(log, read_only=True).records]
    assert kinds[:3] == ["User", "Assistant", "Usage"]
    assert f"session log: {log}" in out


@pytest.mark.live
def test_serve_prints_url_answers_health_and_stops_on_ctrl_c() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "boxmaker.cli", "serve", "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"at (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        assert httpx.get(match.group(1) + "/health", timeout=10).json() == {"status": "ok"}
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
