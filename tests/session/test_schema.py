"""One log of each schema ever written (tests/data/schema-N.jsonl) is read by every reader, and
``boxmaker log upgrade`` rewrites the old ones atomically."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from boxmaker.cli import main
from boxmaker.errors import SessionError
from boxmaker.records import SCHEMA_VERSION, LimitHit, ToolResult, TurnEnd, record_to_json
from boxmaker.session import Session, read_log, upgrade_log
from boxmaker.session._migrations import MIGRATIONS

DATA = Path(__file__).resolve().parents[1] / "data"


def test_there_is_a_log_of_every_schema_and_a_step_between_each() -> None:
    assert sorted(p.name for p in DATA.glob("schema-*.jsonl")) == [
        f"schema-{n}.jsonl" for n in range(1, SCHEMA_VERSION + 1)
    ]
    assert [m.source for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION))


@pytest.mark.parametrize("schema", range(1, SCHEMA_VERSION + 1))
def test_every_schema_reads_to_the_same_not_run_reasons(schema: int) -> None:
    session = Session.open(DATA / f"schema-{schema}.jsonl", read_only=True)
    assert session.schema == schema
    results = [r for r in session.records if isinstance(r, ToolResult)]
    assert [r.not_run for r in results] == [None, "repeat", "tool_iterations"]
    assert [r.kind for r in session.records if isinstance(r, LimitHit)] == ["tool_iterations"]


def test_schema_1_is_upgraded_on_read_only_in_memory(tmp_path: Path) -> None:
    log = tmp_path / "old.jsonl"
    shutil.copy(DATA / "schema-1.jsonl", log)
    before = log.read_bytes()
    data = read_log(log)
    assert (data.schema, data.migrated) == (
        1,
        ("tool_result_not_run", "group_framing", "fork_origin"),
    )
    assert log.read_bytes() == before


def test_log_upgrade_rewrites_in_place_and_keeps_every_record(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "old.jsonl"
    shutil.copy(DATA / "schema-1.jsonl", log)
    old = Session.open(log, read_only=True)
    assert main(["log", "upgrade", str(log)]) == 0
    assert (
        "schema 1 -> 4 (tool_result_not_run, group_framing, fork_origin)" in capsys.readouterr().out
    )
    new = Session.open(log, read_only=True)
    assert new.schema == SCHEMA_VERSION
    assert [record_to_json(r) for r in new.records] == [record_to_json(r) for r in old.records]
    assert not list(tmp_path.glob("*.upgrade"))
    assert upgrade_log(log) == (SCHEMA_VERSION, ())  # current: left as it is
    assert main(["log", "upgrade", str(log)]) == 0
    assert "already current" in capsys.readouterr().out


def test_log_upgrade_refuses_a_log_with_a_writer(tmp_path: Path) -> None:
    log = tmp_path / "old.jsonl"
    shutil.copy(DATA / "schema-1.jsonl", log)
    before = log.read_bytes()
    with Session.open(log), pytest.raises(SessionError, match="another writer"):
        upgrade_log(log)
    assert log.read_bytes() == before


def test_a_schema_1_log_reopened_for_writing_takes_schema_2_records(tmp_path: Path) -> None:
    log = tmp_path / "old.jsonl"
    shutil.copy(DATA / "schema-1.jsonl", log)
    with Session.open(log) as session:
        session.append(TurnEnd(outcome="answered"))
    again = Session.open(log, read_only=True)
    assert isinstance(again.records[-1], TurnEnd) and again.schema == 1


@pytest.mark.parametrize("schema", ["0", str(SCHEMA_VERSION + 1), "null"])
def test_schemas_this_version_cannot_read_are_refused_by_the_one_reader(
    tmp_path: Path, schema: str
) -> None:
    log = tmp_path / "x.jsonl"
    log.write_text(f'{{"type":"baseline","schema":{schema},"time":"2026-11-30T00:00:00Z"}}\n')
    with pytest.raises(SessionError, match="not readable by this version"):
        read_log(log)
