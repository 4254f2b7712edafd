"""``boxmaker fork``: a fork made from the command line, its turn run on the shared fake
server (a socket), the settings recorded and applied."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_llama import Reply, running

from boxmaker.cli import main
from boxmaker.cli._fork import parse_settings
from boxmaker.config import Config
from boxmaker.demo import demo_registry
from boxmaker.errors import ConfigError
from boxmaker.records import Baseline, ToolResult, Warmed
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer, call, calls
from boxmaker.turn import Runtime, run_turn


@pytest.fixture
def parent(tmp_path: Path) -> Path:
    registry = demo_registry()
    with Session.create(tmp_path, Baseline(tools=registry.definitions())) as session:
        client = ScriptedClient(
            [calls(call("get_weather", {"city": "Oslo"})), answer("Oslo is fine."), answer("Bye.")]
        )
        runtime = Runtime(config=Config(), client=client, registry=registry)
        run_turn(session, runtime, "Weather in Oslo?")
        run_turn(session, runtime, "Thanks")
        return session.path


def test_parse_settings_reads_toml_values() -> None:
    assert parse_settings(["loop.tool_iterations=2", "sampling.temperature=0.5",
                           "history.reasoning=drop", "slots.main=\"x\""]) == {
        "loop.tool_iterations": 2,
        "sampling.temperature": 0.5,
        "history.reasoning": "drop",
        "slots.main": "x",
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"section\.key=value"):
        parse_settings(["tool_iterations=2"])


def test_fork_makes_the_log_only_without_a_turn_to_run(
    parent: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = parent.read_bytes()
    assert main(["fork", str(parent), "--at", "1", "--set", "loop.tool_iterations=3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("fork ") and "(turn 1)" in out
    (path,) = [p for p in parent.parent.glob("*.jsonl") if p != parent]
    fork = Session.open(path, read_only=True)
    assert fork.forked is not None and dict(fork.forked.settings) == {"loop.tool_iterations": 3}
    assert parent.read_bytes() == before


def test_fork_reruns_a_turn_on_the_fake_server_with_the_tools_replayed(
    parent: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = parent.read_bytes()
    weather = ("c1", "get_weather", json.dumps({"city": "Oslo"}))
    with running([Reply(content="", tool_calls=[weather]), Reply(content="Cold.")]) as server:
        code = main(["fork", str(parent), "--at", "1", "--rerun", "--url", server.url,
                     "--set", "sampling.temperature=0.25"])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "Cold." in out and "replayed 1 tool result; first differing call: none" in out
    # a rerun of turn 1: the parent made no completion before it, nothing to measure
    assert "cache: unknown: reuse not measured: the parent made no completion before" in out
    assert [b.get("temperature") for b in server.bodies] == [0.25, 0.25]
    (path,) = [p for p in parent.parent.glob("*.jsonl") if p != parent]
    results = [r for r in Session.open(path, read_only=True).records if isinstance(r, ToolResult)]
    assert [r.source for r in results] == ["replayed"]
    assert parent.read_bytes() == before


def test_an_unknown_setting_is_refused_before_anything_is_made(
    parent: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fork", str(parent), "--at", "1", "--set", "loop.nonsense=1"]) != 0
    assert "unknown key 'nonsense'" in capsys.readouterr().err
    assert list(parent.parent.glob("*.jsonl")) == [parent]


def measured(content: str, cache_n: int, prompt_n: int) -> Reply:
    """A reply whose ``timings`` say ``cache_n`` prompt tokens were reused (one token a
    character generated)."""
    t = {"cache_n": cache_n, "prompt_n": prompt_n, "predicted_n": len(content)}
    events = [
        {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"content": content}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {"id": "c", "choices": [], "timings": t},
    ]
    return Reply(data=[*(json.dumps(e) for e in events), "[DONE]"])


@pytest.mark.parametrize(
    ("reused", "said"),
    [
        (34, "into slot 0: 34 of 34 prefix tokens reused (1.00)"),
        (0, "cold: 0 of 34 prefix tokens reused (0.00): {file} was restored into slot 0 (40 "
         "tokens), but the server reused only 0 of the 34: a restore accepted and not used"),
    ],
)  # fmt: skip
def test_fork_says_the_cache_reuse_its_first_request_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], reused: int, said: str
) -> None:
    """``--slot-save-path``: the parent's slot saved at the fork's turn is restored before the
    fork's turn runs (a fresh process knows no slot's contents); the line printed is what the
    fork's first request reused of the parent's prefix (30 prompt tokens and a reply of 5,
    held but its last: 34), not what the restore claimed (it printed "restored" while the
    server reused nothing)."""
    from boxmaker.cache import SlotStore
    from boxmaker.client import Client, SlotLeases
    from boxmaker.config import ClientConfig

    saved, locks = tmp_path / "slots", tmp_path / "locks"
    saved.mkdir()
    locks.mkdir()
    with running([measured("Fine.", 0, 30), measured("Again", reused, 40 - reused)]) as server:
        server.slot_files = {}  # the fake server saves slots (as with --slot-save-path)
        config = ClientConfig(url=server.url, retry_attempts=0)
        other = Client(config, leases=SlotLeases(locks))  # as another process
        with other as client, Session.create(tmp_path, Baseline()) as parent:
            runtime = Runtime(config=Config(), client=client, registry=demo_registry())
            run_turn(parent, runtime, "Hello", SlotStore(saved).saver(parent, client))
        for name in server.slot_files:  # the server's folder, on this machine
            (saved / name).write_bytes(b"slot")
        args = ["fork", str(parent.path), "--at", "1", "--say", "Again", "--url", server.url]
        assert main([*args, "--slot-save-path", str(saved)]) == 0
    out = capsys.readouterr().out
    name = f"{parent.id}.turn-1.bin"
    head = f"cache: restored {name} " if reused else "cache: "
    assert head + said.format(file=name) in out
    assert "Again" in out
    (path,) = [p for p in tmp_path.glob("*.jsonl") if p != parent.path]
    warmed = [r for r in Session.open(path, read_only=True).records if isinstance(r, Warmed)]
    assert [(w.how, w.prefix, w.reused, w.found) for w in warmed] == [
        ("restored" if reused else "cold", 34, reused, "restored")]  # fmt: skip


def test_fork_refuses_a_slot_folder_or_a_server_it_cannot_use_before_making_a_log(
    parent: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with running([Reply(content="Fine.")]) as server:
        args = ["fork", str(parent), "--at", "1", "--say", "Hi", "--url", server.url]
        assert main([*args, "--slot-save-path", str(tmp_path / "nowhere")]) == 1
        assert "does not exist" in capsys.readouterr().err
        (tmp_path / "slots").mkdir()
        assert main([*args, "--slot-save-path", str(tmp_path / "slots")]) == 1  # no saving
        assert "cannot save or restore slots" in capsys.readouterr().err
    assert list(parent.parent.glob("*.jsonl")) == [parent]


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("notaurl", "is not an http(s) URL with a host"),
        ("http://127.0.0.1:9", "cannot reach a llama-server at http://127.0.0.1:9"),
    ],
)
def test_a_fork_whose_turn_cannot_run_makes_no_log(
    parent: Path, capsys: pytest.CaptureFixture[str], url: str, said: str
) -> None:
    assert main(["fork", str(parent), "--at", "1", "--rerun", "--url", url]) == 1
    assert said in capsys.readouterr().err
    assert list(parent.parent.glob("*.jsonl")) == [parent]


def test_a_fork_without_a_point_says_how_to_give_one(
    parent: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fork", str(parent)]) == 1
    assert "say where to fork: --at TURN (or --edit CALL TEXT)" in capsys.readouterr().err
    assert list(parent.parent.glob("*.jsonl")) == [parent]


def test_the_tools_are_set_up_before_the_fork_is_made(
    parent: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork's turn is timed from its Forked record: the tools' set-up (seconds of
    jsonschema imports on a cold process) must come before it, not inside the turn."""
    import boxmaker.cli._fork as fork_cli

    logs_then: list[int] = []
    real = fork_cli._tools  # type: ignore[attr-defined]

    def tools(config: Config, stack: Any) -> Any:
        logs_then.append(len(list(parent.parent.glob("*.jsonl"))))
        return real(config, stack)

    monkeypatch.setattr(fork_cli, "_tools", tools)
    with running([Reply(content="Cold.")]) as server:
        code = main(["fork", str(parent), "--at", "2", "--say", "Hi", "--url", server.url])
    assert code == 0 and logs_then == [1]  # only the parent when the tools were made


def test_fork_says_how_its_turn_ended_when_it_did_not_answer(
    parent: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The newcomer trial (issue 37): a fork cut at max_tokens printed its text as if it had
    answered; the log said ``length``."""
    chunk = {"choices": [{"index": 0, "delta": {"content": "It is"}}]}
    cut = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
    with running([Reply(data=[json.dumps(chunk), json.dumps(cut), "[DONE]"])]) as server:
        code = main(["fork", str(parent), "--at", "2", "--rerun", "--url", server.url])
    out = capsys.readouterr().out
    assert code == 0
    assert "the fork's turn ended length; its last text:\nIt is\n" in out
