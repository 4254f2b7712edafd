from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker.errors import SessionError
from boxmaker.records import (
    SCHEMA_VERSION,
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    ToolCall,
    ToolResult,
    Unknown,
    Usage,
    User,
)
from boxmaker.session import Session, messages, wire_arguments

TOOLS = ({"type": "function", "function": {"name": "f", "description": "", "parameters": {}}},)


def sample_records() -> list[object]:
    return [
        User(content="hi ☃"),
        Assistant(
            content=None,
            reasoning="think",
            tool_calls=(ToolCall(id="c1", name="f", arguments='{"x": 1}'),),
        ),
        Usage(timings={"cache_n": 0, "prompt_n": 12, "prompt_ms": 3.5}, reasoning_tokens=5),
        ToolResult(call=1, tool_call_id="c1", name="f", content="42"),
        CacheLoss(expected=20, reused=3),
        LimitHit(kind="tool_result_cap", detail="cut"),
        Assistant(content="done"),
    ]


def make(tmp_path: Path) -> Session:
    s = Session.create(tmp_path, Baseline(system="sys", tools=TOOLS))
    for r in sample_records():
        s.append(r)  # type: ignore[arg-type]
    s.close()
    return s


def test_reopen_gives_equal_records(tmp_path: Path) -> None:
    s = make(tmp_path)
    again = Session.open(s.path)
    assert again.records == s.records
    assert again.baseline == s.baseline
    assert again.id == s.id
    assert again.path.name == f"{s.id}.jsonl"
    first = json.loads(s.path.read_text().splitlines()[0])
    assert first["type"] == "baseline" and first["schema"] == SCHEMA_VERSION
    assert first["session_id"] == s.id


def test_every_line_has_utc_time(tmp_path: Path) -> None:
    s = make(tmp_path)
    for line in s.path.read_text().splitlines():
        assert json.loads(line)["time"].endswith("Z")


def test_messages_mapping(tmp_path: Path) -> None:
    s = make(tmp_path)
    msgs = s.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "think",
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
        ],
    }
    assert msgs[3] == {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert "time" not in json.dumps(msgs)


def test_invalid_arguments_kept_raw_but_sent_as_json(tmp_path: Path) -> None:
    s = Session.create(tmp_path)
    s.append(Assistant(content="", tool_calls=(ToolCall(id="a", name="f", arguments="{oops"),)))
    s.close()
    again = Session.open(s.path)
    assert again.records[0].tool_calls[0].arguments == "{oops"  # type: ignore[union-attr]
    assert again.messages()[0]["tool_calls"][0]["function"]["arguments"] == "{}"
    assert wire_arguments("[1]") == "{}"
    assert wire_arguments('{"a":1}') == '{"a":1}'


def test_next_call_and_last_usage_stable_across_reopen(tmp_path: Path) -> None:
    s = make(tmp_path)
    assert s.next_call() == 2
    assert Session.open(s.path).next_call() == 2
    last = Session.open(s.path).last_usage()
    assert last is not None and last.reasoning_tokens == 5
    assert Session.create(tmp_path / "other").last_usage() is None


def test_torn_last_line_is_recovered_with_warning(tmp_path: Path) -> None:
    s = make(tmp_path)
    whole = s.path.read_bytes()
    torn = b'{"type":"user","time":"2026-11-30T00:00:00Z","cont'
    s.path.write_bytes(whole + torn)
    with pytest.warns(UserWarning, match=rf"torn last line \({len(torn)} bytes"):
        again = Session.open(s.path)
    assert again.records == s.records
    assert s.path.read_bytes() == whole
    assert s.path.with_name(s.path.name + ".torn").read_bytes().startswith(b'{"type":"user"')
    again.append(User(content="after"))
    assert Session.open(s.path, read_only=True).records[-1] == again.records[-1]


def test_torn_multibyte_character_is_recovered(tmp_path: Path) -> None:
    s = make(tmp_path)
    line = json.dumps({"type": "user", "time": "2026-11-30T00:00:00Z", "content": "☃"}).encode()
    s.path.write_bytes(s.path.read_bytes() + "☃".encode()[:2])
    with pytest.warns(UserWarning):
        assert len(Session.open(s.path).records) == len(s.records)
    assert line  # the line itself is valid when whole


def test_corrupt_line_in_the_middle_names_file_and_line(tmp_path: Path) -> None:
    s = make(tmp_path)
    lines = s.path.read_text().splitlines(keepends=True)
    lines[3] = "{not json\n"
    s.path.write_text("".join(lines))
    with pytest.raises(SessionError, match=rf"{s.path.name}:4: corrupt line"):
        Session.open(s.path)


def test_unknown_record_type_is_kept_with_warning(tmp_path: Path) -> None:
    s = make(tmp_path)
    with s.path.open("a") as fh:
        fh.write('{"type":"future_thing","time":"2026-11-30T00:00:00Z","x":1}\n')
    with pytest.warns(UserWarning, match="future_thing"):
        again = Session.open(s.path)
    assert isinstance(again.records[-1], Unknown)
    assert again.records[-1].data["x"] == 1
    assert len(again.messages()) == len(s.messages())


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text('{"type":"baseline","schema":99,"session_id":"x","system":"","tools":[]}\n')
    with pytest.raises(SessionError, match="schema 99"):
        Session.open(p)


def test_empty_or_missing_log(tmp_path: Path) -> None:
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(SessionError, match="empty"):
        Session.open(tmp_path / "e.jsonl")
    with pytest.raises(SessionError, match="cannot read"):
        Session.open(tmp_path / "missing.jsonl")


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "", "x" * 200, "a b"])
def test_unsafe_session_ids_are_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SessionError, match="not safe"):
        Session.create(tmp_path, session_id=bad)


def test_existing_session_is_not_overwritten(tmp_path: Path) -> None:
    Session.create(tmp_path, session_id="same")
    with pytest.raises(SessionError, match="exists already"):
        Session.create(tmp_path, session_id="same")


def test_generated_ids_are_file_safe_and_distinct(tmp_path: Path) -> None:
    ids = {Session.create(tmp_path).id for _ in range(20)}
    assert len(ids) == 20
    assert all(i.replace("-", "").isalnum() for i in ids)


@given(st.lists(st.text(max_size=30), max_size=8))
def test_messages_of_a_growing_log_extend_the_previous(contents: list[str]) -> None:
    base = Baseline(system="s")
    records: list[User] = []
    before = json.dumps(messages(base, records))
    for c in contents:
        records.append(User(content=c))
        after = json.dumps(messages(base, records))
        assert after.startswith(before[:-1])
        before = after


def test_appends_are_whole_lines_on_disk_before_append_returns(tmp_path: Path) -> None:
    s = Session.create(tmp_path)
    s.append(User(content="x"))
    # read through another handle while the session's own is still open
    assert s.path.read_text().count("\n") == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert Session.open(s.path, read_only=True).records[0] == s.records[0]


def test_record_without_time_or_with_wrong_type_is_refused(tmp_path: Path) -> None:
    s = make(tmp_path)
    base = s.path.read_text()
    for bad, why in [
        ('{"type":"user","content":"x"}', "user record without 'time'"),
        ('{"type":"user","time":"2026-11-30T00:00:00Z","content":5}', "content = 5 is not str"),
        (
            '{"type":"tool_result","time":"2026-11-30T00:00:00Z","call":true,'
            '"tool_call_id":"a","name":"n","content":"c"}',
            "call = True is not int",
        ),
    ]:
        s.path.write_text(base + bad + "\n")
        with pytest.raises(SessionError, match=f":{len(base.splitlines()) + 1}: .*{why}"):
            Session.open(s.path)


def test_whole_last_record_without_newline_is_kept(tmp_path: Path) -> None:
    s = make(tmp_path)
    line = '{"type":"user","time":"2026-11-30T00:00:00Z","content":"edited"}'
    s.path.write_text(s.path.read_text() + line)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = Session.open(s.path)
    assert again.records[-1] == User(content="edited", time=again.records[-1].time)
    assert s.path.read_text().endswith(line + "\n")


def test_read_only_open_leaves_a_live_log_untouched(tmp_path: Path) -> None:
    s = make(tmp_path)
    half = b'{"type":"user","time":"2026-11-30T00:00:00Z","con'
    s.path.write_bytes(s.path.read_bytes() + half)
    before = s.path.read_bytes()
    with pytest.warns(UserWarning, match="read-only: file untouched"):
        view = Session.open(s.path, repair=False)
    assert view.records == s.records
    assert s.path.read_bytes() == before
    assert not s.path.with_name(s.path.name + ".torn").exists()
    with pytest.raises(SessionError, match="read-only"):
        view.append(User(content="no"))


def test_lone_surrogate_round_trips(tmp_path: Path) -> None:
    s = Session.create(tmp_path)
    s.append(User(content="bad \ud800 end"))
    assert Session.open(s.path, read_only=True).records[0].content == "bad \ud800 end"  # type: ignore[union-attr]


@pytest.mark.parametrize("schema", ["0", "-5", "true", '"1"'])
def test_invalid_schema_is_refused(tmp_path: Path, schema: str) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text(
        f'{{"type":"baseline","schema":{schema},"session_id":"x","system":"","tools":[]}}\n'
    )
    with pytest.raises(SessionError, match="schema"):
        Session.open(p)


def test_unsafe_session_id_inside_a_log_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.jsonl"
    p.write_text(
        '{"type":"baseline","schema":1,"session_id":"../../etc/x","system":"","tools":[]}\n'
    )
    with pytest.raises(SessionError, match="not safe"):
        Session.open(p)


def test_directory_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(SessionError, match="cannot create the session directory"):
        Session.create(tmp_path / "f")
    with pytest.raises(SessionError, match="must be a Baseline"):
        Session.create(tmp_path, "system prompt")  # type: ignore[arg-type]
