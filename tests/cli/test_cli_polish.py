"""The command line as a new user meets it (issue 14): defaults and chat's slash commands in
``--help``, exit codes that say what happened, messages before work starts."""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import httpx
import pytest
from fake_llama import Reply, running

from boxmaker import Baseline, Config, Registry, Runtime, Session, run_turn
from boxmaker.cli import main
from boxmaker.cli._flags import server_ctx
from boxmaker.cli._main import _parser
from boxmaker.server import EmbeddedServer
from boxmaker.testing import ScriptedClient, answer, timings
from boxmaker.view import ConsoleView

DATA = Path(__file__).resolve().parents[1] / "data"
BAD_REQUEST = {"code": 400, "message": "bad sampling", "type": "invalid_request_error"}


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


def test_help_of_each_command_shows_its_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    serve = _help("serve", capsys)
    assert "--port N TCP port, 0 picks a free one (0 to 65535; default 8080)" in serve
    assert "default 4096" in serve
    assert "-np N, --parallel N slots (1 to 256; default: 4 slots sharing one unified KV" in serve
    assert "--swa-full" in serve and "--no-reasoning-preserve" in serve  # llama-server's names
    chat = _help("chat", capsys)
    assert "(default: the --config file's, else http://127.0.0.1:8080)" in chat
    assert "/quit" in chat and "/new" in chat
    batch = _help("batch", capsys)
    assert "--ctx N embedded: context size in tokens, all slots together" in batch
    assert "default: 4096 per slot, times --parallel" in batch
    assert "--ctx-per-slot N embedded: context per slot (tokens) (16 to" in batch
    assert "(default: sessions)" not in _help("demo", capsys)  # said once, as ./sessions


@pytest.mark.parametrize(
    ("argv", "n_ctx"),
    [
        (["batch", "t.toml", "--dir", "d", "--embedded", "--parallel", "3"], 3 * 4096),
        (["batch", "t.toml", "--dir", "d", "--embedded", "--parallel", "3", "--ctx", "6000"], 6000),
        (
            [
                "batch",
                "t.toml",
                "--dir",
                "d",
                "--embedded",
                "--parallel",
                "3",
                "--ctx-per-slot",
                "500",
            ],
            1500,
        ),
        (["bench", "bfcl", "--parallel", "2"], 2 * 8192),
        (["bench", "bfcl", "--parallel", "2", "--ctx", "9000"], 9000),
    ],
)
def test_ctx_means_all_slots_together_in_every_command(argv: list[str], n_ctx: int) -> None:
    """``--ctx`` is llama-server's ``-c`` (all slots) in serve, demo, batch and bench alike;
    batch and bench keep a per-slot default (``--ctx-per-slot``)."""
    assert server_ctx(_parser().parse_args(argv)) == n_ctx


def test_ctx_and_ctx_per_slot_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        _parser().parse_args(
            ["batch", "t.toml", "--dir", "d", "--ctx", "6000", "--ctx-per-slot", "500"]
        )
    assert info.value.code == 2
    assert "not allowed with argument --ctx" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "usage"),
    [
        (["log", "upgrade"], "usage: boxmaker log upgrade [-h] paths [paths ...]\n"),
        (["cache", "explain"], "usage: boxmaker cache explain [-h] --url URL"),
    ],
)
def test_log_upgrade_and_cache_explain_have_their_own_help(
    command: list[str], usage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newcomer retrial (issue 21): both printed their parent's help."""
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    assert capsys.readouterr().out.startswith(usage)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["demo", "--foo"], "boxmaker demo: error: unrecognized arguments: --foo"),
        (["demo", "--thread", "1"], "boxmaker demo: error: unrecognized arguments: --thread 1"),
        (["report", "--htm", "x", "logs"], "boxmaker report: error: unrecognized arguments: --htm"),
        (["batch", "t.jsonl", "--dir", "d", "--embedded", "--parallel", "0"], "--parallel: 0 is"),
    ],
)
def test_a_wrong_or_abbreviated_flag_is_refused_by_its_own_command(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newcomer retrial: ``demo --thread 1`` ran as ``--threads``, ``report --htm x`` wrote
    a file named ``x``, and an unknown flag was reported with the top command's usage."""
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_cassette_subcommands_have_their_own_help_and_every_option_says_what_it_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Issue 21: ``cassette show --help`` printed its parent's help; ``--repeat-exempt`` had
    no help text."""
    with pytest.raises(SystemExit):
        main(["cassette", "show", "--help"])
    show = capsys.readouterr().out
    assert show.startswith("usage: boxmaker cassette show [-h] paths [paths ...]\n")
    assert "print each cassette's transcript" in show
    replay = _help("replay", capsys)
    assert "--repeat-exempt NAME loop.repeat_exempt: a tool left out of the repeat" in replay
    assert "default: []" not in replay
    parser = _parser()
    for command in [parser, *_commands(parser)]:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue  # the list of subcommands, each with its own help
            assert action.help, f"{command.prog} {action.option_strings or action.dest}"


def _commands(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand parser under ``parser``, depth first."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += [sub, *_commands(sub)]
    return found


def test_chat_names_its_slash_commands_at_start_and_quits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("/quit\n"))
    with running([Reply(content="ok")]) as fake:
        assert main(["chat", "--url", fake.url, "--dir", str(tmp_path)]) == 0
        assert fake.bodies == []
    banner = capsys.readouterr().out.splitlines()[:2]
    assert "Ctrl-C stops a turn" in banner[0]
    assert banner[1] == (
        "commands: /new starts a new session, /quit (or /exit, Ctrl-D) ends the chat; "
        "boxmaker chat --resume LOG goes on with a session later"
    )
    assert list(tmp_path.rglob("*.jsonl")) == []  # issue 21: no log before the first message


def test_chat_that_reached_the_server_exits_0_even_when_a_turn_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("Hello\n"))
    with running([Reply(status=400, error=BAD_REQUEST)]) as fake:
        assert main(["chat", "--url", fake.url, "--dir", str(tmp_path)]) == 0
    assert "turn ended: TurnInferError" in capsys.readouterr().out


def test_demo_exits_1_when_a_turn_failed_and_runs_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = [Reply(content="sunny"), Reply(status=400, error=BAD_REQUEST), Reply(content="ok")]
    with running(script) as fake:
        assert main(["demo", "--url", fake.url, "--dir", str(tmp_path)]) == 1
        assert len(fake.bodies) == 3
    out = capsys.readouterr().out
    assert out.count("turn ended: TurnInferError") == 1


def test_demo_with_a_missing_model_fails_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "none.gguf"
    assert main(["demo", "--model", str(missing), "--dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"boxmaker: {missing}: no such model file (a GGUF)\n"


def test_replay_of_a_session_log_runs_the_limits_over_its_own_calls(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A session log is no cassette: it was refused; since ``boxmaker tap`` (issue 28) the
    limits are run over the log's own calls (``what_if_log``)."""
    log = DATA / "schema-1.jsonl"
    assert main(["replay", str(log)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"what-if on the log {log}: 2 turn(s)\n")
    assert "turn 1, completion 1: repeat fires" in out


def test_replay_of_other_text_names_the_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.yaml"
    path.write_text("a: b\nc\n")
    assert main(["replay", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"boxmaker: {path}: not a readable cassette: invalid YAML at line 3")
    assert err.count("\n") == 1


def test_report_html_into_a_missing_directory_fails_before_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "nope" / "r.html"
    assert main(["report", str(DATA / "schema-2.jsonl"), "--html", str(target)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"boxmaker report: cannot write {target}: no such directory\n"


@pytest.mark.live
def test_readme_snippet_prints_the_turn_with_console_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    snippet = readme.split("## The API in a dozen lines", 1)[1].split("```python\n", 1)[1]
    snippet = snippet.split("```", 1)[0]
    assert "on_event=view" in snippet and "on_event=print" not in snippet
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), {"__name__": "readme"})
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("model> ") for line in lines)
    assert len(lines) < 30  # a turn in a few lines, not one line per streamed piece
    assert lines[-1].startswith("cached tokens: ")


def test_console_cache_loss_line_comes_after_the_answer_in_a_turn_without_tool_calls(
    tmp_path: Path,
) -> None:
    session = Session.create(tmp_path, Baseline(system="sys"))
    steps = [answer("first", timings=timings(0, 100)), answer("second", timings=timings(2, 200))]
    runtime = Runtime(config=Config(), client=ScriptedClient(steps), registry=Registry())
    out = io.StringIO()
    view = ConsoleView(out)
    for text in ("hi", "again"):
        run_turn(session, runtime, text, view)
        view.end()
    assert out.getvalue().splitlines()[-2:] == [
        "model> second",
        "  [cache loss: 2 of 100 cached prompt tokens reused]",
    ]


@pytest.mark.live
@pytest.mark.skip(
    reason="xllamacpp can deadlock when a server is stopped before it finished starting: "
    "this in-process test hung a CI run once (futex wait); the stop-on-interrupt path is kept "
    "and the CLI's exit is tested below without a real server"
)
def test_ctrl_c_while_the_server_starts_leaves_no_server_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ctrl-C during the health wait: the server is stopped (before, it kept running and the
    process hung at exit after ``boxmaker demo`` was interrupted while starting)."""
    seen: list[str] = []

    def interrupted(self: EmbeddedServer) -> None:
        seen.append(self.url)
        raise KeyboardInterrupt

    monkeypatch.setattr(EmbeddedServer, "_wait_healthy", interrupted)
    server = EmbeddedServer(n_ctx=512, n_threads=1)
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert seen and seen[0].startswith("http://127.0.0.1:")
    assert server.url == ""
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{seen[0]}/health", timeout=5)


def test_ctrl_c_while_the_server_starts_exits_130_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def interrupted(self: EmbeddedServer) -> EmbeddedServer:
        raise KeyboardInterrupt

    monkeypatch.setattr(EmbeddedServer, "start", interrupted)
    assert main(["demo", "--dir", str(tmp_path)]) == 130
    out, err = capsys.readouterr()
    assert out.startswith("starting the embedded llama.cpp server")
    assert err == "boxmaker: interrupted\n"  # one line (issue 21)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["tap", "--upstream", "http://127.0.0.1:8080", "--port", "99999"], "--port: 99999 is out"),
        (["tap", "--upstream", "http://127.0.0.1:8080", "--port", "-1"], "--port: -1 is out"),
        (["compare", "batch", "--resamples", "0"], "--resamples: 0 is out of range"),
        (["compare", "batch", "--confidence", "1.5"], "--confidence: 1.5 is out of range"),
        (["compare", "batch", "--confidence", "0"], "--confidence: 0.0 is out of range"),
        (["compare", "batch", "--confidence", "x"], "--confidence: not a number: 'x'"),
    ],
)
def test_numbers_out_of_range_are_usage_errors_not_tracebacks(
    args: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    assert said in capsys.readouterr().err


def test_the_tap_refuses_an_upstream_that_is_no_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tap", "--upstream", "notaurl", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "the tap's upstream 'notaurl' is not an http(s) URL with a host" in err


def test_doctor_says_a_url_without_its_scheme_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 37: ``doctor --url 127.0.0.1:P`` printed httpx's exception text as a failed check."""
    assert main(["doctor", "--url", "127.0.0.1:9"]) == 1
    err = capsys.readouterr().err
    assert "with its scheme: 'http://127.0.0.1:9'" in err and "UnsupportedProtocol" not in err


def test_the_tap_takes_an_upstream_given_as_an_openai_base_url() -> None:
    from boxmaker.tap import Tap

    assert Tap("http://127.0.0.1:8080/v1/").upstream == "http://127.0.0.1:8080"
