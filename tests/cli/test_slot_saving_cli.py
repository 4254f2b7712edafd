"""``--slot-save-path`` on every command that runs a session (issue 39 item 4): ``chat`` and
``demo`` save the session's slot at each turn's end (before, only ``serve`` and ``batch`` took
the flag, and nothing saved), so a later ``boxmaker fork --slot-save-path`` finds it; a folder
or a server that cannot save is said at once, before any turn."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
from fake_llama import FakeLlama, Reply, running

from boxmaker.cli import main
from boxmaker.records import Warmed
from boxmaker.session import Session


def saving(fake: FakeLlama, folder: Path) -> FakeLlama:
    fake.slot_files, fake.slot_folder = {}, folder  # as llama-server --slot-save-path folder
    return fake


def test_chat_saves_the_slot_at_each_turn_end_and_a_fork_saves_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    slots = tmp_path / "slots"
    slots.mkdir()
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\nsecond\n"))
    with running([Reply(content="one"), Reply(content="two"), Reply(content="three")]) as fake:
        saving(fake, slots)
        chat = ["chat", "--url", fake.url, "--dir", str(tmp_path), "--slot-save-path", str(slots)]
        assert main(chat) == 0
        (log,) = tmp_path.glob("*.jsonl")
        session_id = Session.open(log, read_only=True).id
        assert sorted(p.name for p in slots.iterdir()) == [
            f"{session_id}.turn-1.bin", f"{session_id}.turn-2.bin"]  # fmt: skip
        assert f"the slot is saved at each turn's end in {slots}" in capsys.readouterr().out
        fork = ["fork", str(log), "--at", "1", "--say", "again", "--url", fake.url]
        assert main([*fork, "--slot-save-path", str(slots)]) == 0
    out = capsys.readouterr().out
    # this process's slot leases know slot 0 held the parent's prefix (the chat ran here);
    # the fake reuses nothing: measured cold, and said so
    assert "cache: cold: 0 of 12 prefix tokens reused (0.00): slot 0 was expected" in out
    (path,) = [p for p in tmp_path.glob("*.jsonl") if p != log]
    fork_session = Session.open(path, read_only=True)
    (warmed,) = [r for r in fork_session.records if isinstance(r, Warmed)]
    assert (warmed.how, warmed.found, warmed.slot) == ("cold", "slot", 0)
    assert (slots / f"{fork_session.id}.turn-2.bin").is_file()  # the fork's own turn saved


def test_demo_against_a_server_saves_the_slot_at_each_turn_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slots = tmp_path / "slots"
    slots.mkdir()
    with running([Reply(content="sunny")]) as fake:
        saving(fake, slots)
        args = ["demo", "--url", fake.url, "--dir", str(tmp_path), "--slot-save-path", str(slots)]
        assert main(args) == 0
    (log,) = tmp_path.glob("*.jsonl")
    session_id = Session.open(log, read_only=True).id
    assert sorted(p.name for p in slots.iterdir()) == [
        f"{session_id}.turn-{k}.bin" for k in (1, 2, 3)]  # fmt: skip


@pytest.mark.parametrize("command", ["chat", "demo"])
def test_a_folder_or_a_server_that_cannot_save_is_said_before_any_turn(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("first\n"))
    with running([Reply(content="one")]) as fake:  # no --slot-save-path: HTTP 501
        base = [command, "--url", fake.url, "--dir", str(tmp_path / "logs")]
        assert main([*base, "--slot-save-path", str(tmp_path / "nowhere")]) == 1
        err = capsys.readouterr().err
        assert "slot folder" in err and "does not exist" in err
        assert main([*base, "--slot-save-path", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert "cannot save or restore slots" in err and "--slot-save-path" in err
        assert fake.bodies == []  # no turn ran
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").glob("*.jsonl"))
