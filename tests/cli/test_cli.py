"""The command line: chat against a running server, serve the shipped model, bad usage."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fake_llama import Reply, context_full, running

import boxmaker
from boxmaker.cli import main
from boxmaker.records import Assistant, Baseline, Usage, User
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["nonsense"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_chat_with_no_server_fails_clearly_before_the_prompt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: the server is checked once before the prompt (before: the first question
    waited through 7.5 s of retries, left a log and printed an empty usage table)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n"))
    code = main(["chat", "--url", "http://127.0.0.1:9", "--dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("boxmaker: cannot reach a llama-server at http://127.0.0.1:9 (")
    assert err.count("\n") == 1 and "Connection refused" in err
    assert out == "" and "you> " not in out
    assert list(tmp_path.rglob("*.jsonl")) == []  # no log


def test_chat_turns_that_never_reach_the_server_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The server answered /health, then went away: the turns end, the chat exits 1."""
    config = tmp_path / "c.toml"
    config.write_text("[client]\nretry_attempts = 0\n")
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n"))
    with running([]) as fake:
        url = fake.url
        monkeypatch.setattr("boxmaker.cli._terminal.check_server", lambda config: None)
    code = main(["chat", "--url", url, "--config", str(config), "--dir", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 1  # issue 14: chat exits non-zero when it never reached the server
    assert f"never reached {url}" in err
    assert "turn ended: TurnInferError" in out and "cannot connect" in out.lower()
    log = next(tmp_path.glob("*.jsonl"))
    kinds = [type(r).__name__ for r in Session.open(log, read_only=True).records]
    assert kinds == ["User", "TurnEnd"]


def test_chat_resume_goes_on_with_a_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 21: ``chat --resume LOG`` reopens a session that a chat ended (before: nothing
    reopened it); the next request carries the earlier turn, the log grows in place."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\n"))
    with running([Reply(content="one"), Reply(content="two")]) as fake:
        assert main(["chat", "--url", fake.url, "--dir", str(tmp_path), "--system", "S"]) == 0
        log = next(tmp_path.glob("*.jsonl"))
        assert f"chat --resume {log} goes on with it" in capsys.readouterr().out
        monkeypatch.setattr(sys, "stdin", io.StringIO("second\n"))
        assert main(["chat", "--url", fake.url, "--resume", str(log)]) == 0
    out = capsys.readouterr().out
    assert f"resuming {log} (" in out
    assert list(tmp_path.glob("*.jsonl")) == [log]
    sent = [(m["role"], m["content"]) for m in fake.bodies[1]["messages"]]
    assert sent == [("system", "S"), ("user", "first"), ("assistant", "one"), ("user", "second")]
    assert [getattr(r, "content", None) for r in Session.open(log).records if _said(r)] == [
        "first",
        "one",
        "second",
        "two",
    ]


def test_chat_new_after_resume_stays_in_the_resumed_logs_folder_and_ctrl_c_keeps_the_chat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37: after ``--resume``, ``/new`` wrote into ./sessions, not beside the resumed
    log; Ctrl-C at the prompt ended the chat; no ``--api-key``, no way to offer no tools."""
    folder = tmp_path / "runs"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\n"))
    with running([Reply(content="one"), Reply(content="two"), Reply(content="three")]) as fake:
        assert main(["chat", "--url", fake.url, "--dir", str(folder)]) == 0
        (log,) = folder.glob("*.jsonl")
        said: Iterator[str | BaseException] = iter([KeyboardInterrupt(), "/new", "again"])

        def typed(prompt: str = "") -> str:
            item = next(said, None)
            if item is None:
                raise EOFError
            if isinstance(item, BaseException):
                raise item
            return item

        monkeypatch.setattr("builtins.input", typed)
        args = ["chat", "--url", fake.url, "--resume", str(log), "--api-key", "k-123"]
        assert main([*args, "--no-tools"]) == 0
    out = capsys.readouterr().out
    assert "[Ctrl-C: the line is dropped; /quit or Ctrl-D ends the chat]" in out
    assert "tools: none" in out
    assert not (tmp_path / "sessions").exists()
    assert len(list(folder.glob("*.jsonl"))) == 2  # the new session beside the resumed one
    assert "tools" not in fake.bodies[-1]
    chats = [r for r in fake.requests if b"/chat/completions" in r.split(b"\r\n", 1)[0]]
    assert b"authorization: bearer k-123" in chats[-1].lower()


def _said(record: object) -> bool:
    return type(record).__name__ in ("User", "Assistant")


def test_chat_resume_of_a_missing_log_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("x\n"))
    with running([Reply(content="one")]) as fake:
        code = main(["chat", "--url", fake.url, "--resume", str(tmp_path / "nope.jsonl")])
        assert fake.bodies == []
    err = capsys.readouterr().err
    assert (code, err) == (
        1,
        f"boxmaker: {tmp_path / 'nope.jsonl'}: no such session log "
        "(give the .jsonl path chat printed)\n",
    )


def test_chat_resume_and_system_together_are_bad_usage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(["chat", "--resume", str(tmp_path / "a.jsonl"), "--system", "S"])
    assert info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_bad_config_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.toml"
    config.write_text("[loop]\nnope = 1\n")
    assert main(["chat", "--config", str(config), "--dir", str(tmp_path)]) == 1
    assert "unknown key 'nope'" in capsys.readouterr().err


@pytest.mark.live
def test_chat_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with EmbeddedServer(n_threads=1) as server:
        monkeypatch.setattr(sys, "stdin", io.StringIO("Hello!\n/quit\n"))
        assert main(["chat", "--url", server.url, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"chatting with {server.url}" in out
    log = next(tmp_path.glob("*.jsonl"))
    kinds = [type(r).__name__ for r in Session.open(log, read_only=True).records]
    assert kinds[:4] == ["Capabilities", "User", "Assistant", "Usage"]
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
        assert proc.stdout.readline() == "4 slot(s), unified KV, n_ctx 4096\n"  # llama-server's
        assert httpx.get(match.group(1) + "/health", timeout=10).json() == {"status": "ok"}
        assert len(httpx.get(match.group(1) + "/slots", timeout=10).json()) == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()  # the pipes closed (warnings are errors)


def _kinds(log: Path) -> list[str]:
    return [type(r).__name__ for r in Session.open(log).records if type(r).__name__ != "TurnEnd"]


def test_a_full_session_gets_nothing_more_in_chat_and_new_starts_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nagain\n/new\nthird\n"))
    with running([context_full(), Reply(content="ok")]) as fake:
        assert main(["chat", "--url", fake.url, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(fake.bodies) == 2  # "again" was not sent
    assert out.count("nothing more is sent to it. Type /new to start a new session") == 2
    assert "[session full: the session no longer fits the context" in out
    first, second = sorted(tmp_path.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)
    assert out.index(f"session log: {first}") < out.index("[new session: its log is made at")
    assert _kinds(first) == ["User", "LimitHit"]
    assert _kinds(second) == ["User", "Assistant", "Usage"]
    assert [m["content"] for m in fake.bodies[1]["messages"]] == ["third"]


def test_a_full_session_ends_the_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with running([context_full()]) as fake:
        assert main(["demo", "--url", fake.url, "--dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert len(fake.bodies) == 1  # the other demo prompts were not sent
    assert "the demo stops here. Run it again with a larger --ctx (tokens)." in out
    log = next(tmp_path.glob("*.jsonl"))
    assert out.rstrip().endswith(f"session log: {log}")


def test_demo_against_a_server_runs_every_prompt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running([Reply(content="sunny")]) as fake:
        assert main(["demo", "--url", fake.url, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert len(fake.bodies) == 3 and out.count("model> sunny") == 3
    kinds = _kinds(next(tmp_path.glob("*.jsonl")))
    assert [kinds.count(k) for k in ("User", "Assistant", "Usage")] == [3, 3, 3]


def test_a_failed_close_is_one_line_on_stderr_after_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def close(self: Session) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Session, "close", close)
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    with running([Reply(content="hi")]) as fake:
        assert main(["chat", "--url", fake.url, "--dir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.err == "boxmaker: [Errno 28] No space left on device\n"
    assert f"session log: {next(tmp_path.glob('*.jsonl'))}" in captured.out


def test_an_os_error_in_a_turn_is_one_line_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def extend(self: Session, records: object) -> None:  # every append of the loop
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(Session, "extend", extend)
    with running([Reply(content="hi")]) as fake:
        assert main(["demo", "--url", fake.url, "--dir", str(tmp_path)]) == 1
    assert capsys.readouterr().err == "boxmaker: [Errno 5] Input/output error\n"
    assert fake.bodies == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["serve", "--threads", "0"], "argument -t/--threads: 0 is out of range: it must be"),
        (["serve", "--threads", "-2"], "argument -t/--threads: -2 is out of range"),
        (["serve", "-t", "99999"], "argument -t/--threads: 99999 is out of range"),
        (["serve", "--threads", "two"], "argument -t/--threads: not an integer: 'two'"),
        (["serve", "--ctx", "1"], "argument -c/--ctx/--ctx-size: 1 is out of range: it must"),
        (["serve", "-np", "0"], "argument -np/--parallel: 0 is out of range"),
        (["serve", "--cache-ram", "-2"], "argument -cram/--cache-ram: -2 is out of range"),
        (["serve", "--port", "70000"], "argument --port: 70000 is out of range"),
        (["demo", "--threads", "0"], "argument --threads: 0 is out of range"),
        (["demo", "--ctx", "-5"], "argument --ctx: -5 is out of range"),
    ],
)
def test_numeric_flags_out_of_range_are_usage_errors(
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def start(self: EmbeddedServer) -> EmbeddedServer:
        raise AssertionError("llama.cpp would have been started (and aborted)")

    monkeypatch.setattr(EmbeddedServer, "start", start)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_report_into_a_pipe_closed_early_exits_141_without_a_traceback(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(system=""))
    session.extend(
        [
            User(content="hi"),
            Assistant(content="hello", reasoning=None, tool_calls=()),
            Usage(timings={"cache_n": 0, "prompt_n": 5, "predicted_n": 2}),
        ]
    )
    session.close()
    root = Path(boxmaker.__file__).resolve().parent.parent
    proc = subprocess.Popen(
        [sys.executable, "-m", "boxmaker.cli", "report", str(session.path)],
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -1` gone before the report is written
    with proc.stderr:
        err = proc.stderr.read().decode()
    assert (proc.wait(60), err) == (141, "")


HOSTILE = "\x1b]0;PWNED\x07\x1b[2J"
"""A server's error text that would retitle the window and clear the screen (issue 23)."""


def test_chat_prints_a_server_error_body_without_its_control_characters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\n"))
    error = {"error": {"code": 500, "message": HOSTILE, "type": "server_error"}}
    config = tmp_path / "c.toml"
    config.write_text("[client]\nretry_attempts = 0\n")
    with running([Reply(status=500, error=error)]) as fake:
        main(["chat", "--url", fake.url, "--dir", str(tmp_path), "--config", str(config)])
    out, err = capsys.readouterr()
    assert "PWNED" in out  # the message is shown ...
    assert "\x1b" not in out + err and "\x07" not in out + err  # ... but inert
    assert "\\x1b]0;PWNED\\x07\\x1b[2J" in out


def test_one_line_errors_on_stderr_are_inert_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / f"{HOSTILE}.toml"
    config.write_text("[nope]\n")
    assert main(["chat", "--config", str(config), "--dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("boxmaker: ") and "PWNED" in err and "\x1b" not in err
