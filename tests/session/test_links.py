"""Planted links and other users' files: nothing boxmaker writes goes through a link.

Each test plants a symbolic link where boxmaker writes (``<log>.writer``, ``<log>.upgrade``,
``<log>.torn``, the log itself, ``manifest.ndjson``, a batch's ``logs/<run>.jsonl``, the
folders) pointing at a "victim" file, and checks the victim keeps its bytes. As root, files
and links of another user are made with ``chown``.
"""

from __future__ import annotations

import os
import shutil
import threading
import warnings
from pathlib import Path

import pytest
from fakes import ScriptedClient

from boxmaker.batch._manifest import MANIFEST, Manifest
from boxmaker.batch._run import run_one
from boxmaker.batch._tasks import Task, expand
from boxmaker.config import Config
from boxmaker.errors import SessionError
from boxmaker.records import Baseline, User
from boxmaker.session import LogReadWarning, Session, check_folder, upgrade_log
from boxmaker.tools import Registry

DATA = Path(__file__).resolve().parents[1] / "data"
VICTIM = b"the user's own file\nsecond line"
OTHER_UID = 4242


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_bytes(VICTIM)
    return path


def _log(folder: Path, sid: str = "s") -> Path:
    with Session.create(folder, Baseline(system="sys"), session_id=sid) as s:
        s.append(User(content="hello"))
    return folder / f"{sid}.jsonl"


def test_a_link_at_writer_file_is_replaced_not_followed(tmp_path: Path, victim: Path) -> None:
    log = _log(tmp_path / "logs")
    info = log.with_name(log.name + ".writer")
    info.symlink_to(victim)
    with Session.open(log) as s:
        assert not info.is_symlink() and info.read_text().strip() == str(os.getpid())
        s.append(User(content="again"))
    assert victim.read_bytes() == VICTIM


def test_a_link_at_upgrade_copy_never_receives_the_log(tmp_path: Path, victim: Path) -> None:
    log = tmp_path / "old.jsonl"
    shutil.copy(DATA / "schema-1.jsonl", log)
    aside = log.with_name(log.name + ".upgrade")
    aside.symlink_to(victim)
    schema, steps = upgrade_log(log)
    assert schema == 1 and steps
    assert victim.read_bytes() == VICTIM
    assert not log.is_symlink() and not aside.exists() and not aside.is_symlink()
    assert Session.open(log, read_only=True).schema >= 2


def test_a_stale_upgrade_copy_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    log = _log(tmp_path)
    aside = log.with_name(log.name + ".upgrade")
    aside.write_bytes(b"x" * 10_000)  # what a killed `boxmaker log upgrade` leaves
    Session.open(log, read_only=True).close()
    assert aside.exists()  # a reader touches nothing
    with Session.open(log):
        assert not aside.exists()


def test_a_link_at_torn_file_is_refused(tmp_path: Path, victim: Path) -> None:
    log = _log(tmp_path)
    with log.open("ab") as fh:
        fh.write(b'{"type": "user", "cont')
    (tmp_path / "s.jsonl.torn").symlink_to(victim)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogReadWarning)
        with pytest.raises(SessionError, match="symbolic link"):
            Session.open(log)
    assert victim.read_bytes() == VICTIM


def test_the_log_itself_as_a_link_is_refused_for_writing(tmp_path: Path, victim: Path) -> None:
    real = _log(tmp_path / "a")
    link = tmp_path / "b" / "s.jsonl"
    link.parent.mkdir()
    link.symlink_to(real)
    before = real.read_bytes()
    with pytest.raises(SessionError, match="symbolic link"):
        Session.open(link)
    assert real.read_bytes() == before
    with pytest.raises(SessionError, match="exists already"):  # O_EXCL: a link is never made
        Session.create(tmp_path / "b", session_id="s")
    (tmp_path / "b" / "v.jsonl").symlink_to(tmp_path / "b" / "dangling")
    with pytest.raises(SessionError, match="exists already"):
        Session.create(tmp_path / "b", session_id="v")
    assert not (tmp_path / "b" / "dangling").exists()


def test_a_log_of_another_user_is_refused_for_writing(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    log = _log(tmp_path)
    os.chown(log, OTHER_UID, OTHER_UID)
    with pytest.raises(SessionError, match=f"owned by uid {OTHER_UID}"):
        Session.open(log)
    assert Session.open(log, read_only=True).records  # reading is fine


def test_a_folder_link_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    target = tmp_path / "victim-folder"
    target.mkdir()
    link = tmp_path / "shared"
    link.symlink_to(target)
    os.lchown(link, OTHER_UID, OTHER_UID)
    with pytest.raises(SessionError, match="symbolic link owned by uid"):
        Session.create(link, session_id="s")
    with pytest.raises(SessionError, match="symbolic link owned by uid"):
        Manifest(link)
    assert list(target.iterdir()) == []
    mine = tmp_path / "mine"
    mine.symlink_to(target)  # the user's own link is theirs to use
    check_folder(mine)


def test_a_link_at_the_manifest_is_refused(tmp_path: Path, victim: Path) -> None:
    (tmp_path / MANIFEST).symlink_to(victim)
    with pytest.raises(SessionError, match="symbolic link"):
        Manifest(tmp_path)
    assert victim.read_bytes() == VICTIM
    (tmp_path / MANIFEST).unlink()
    (tmp_path / MANIFEST).symlink_to(tmp_path / "dangling")
    with pytest.raises(SessionError, match="symbolic link"):
        Manifest(tmp_path)
    assert not (tmp_path / "dangling").exists()


def test_a_link_at_a_batch_run_log_fails_that_run_only(tmp_path: Path) -> None:
    victim = _log(tmp_path / "elsewhere", "t")  # a log of the user's, unfinished
    before = victim.read_bytes()
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "t.jsonl").symlink_to(victim)
    (spec,) = expand([Task(id="t", messages=("hi",))])
    outcome = run_one(
        spec,
        logs,
        "http://127.0.0.1:9",
        0,
        base=Config(),
        registry=Registry(),
        client=ScriptedClient([]),
        cancel=threading.Event(),
    )
    assert outcome.state == "failed" and "symbolic link" in outcome.reason
    assert victim.read_bytes() == before
