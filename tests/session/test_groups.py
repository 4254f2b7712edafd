"""Records written together are read all or nothing: every byte offset of a group write cut.

The write that ends an answered turn (``Assistant`` + ``Usage`` + ``TurnEnd``, one
``Session.extend``) is cut at every byte offset, as a kill can; each cut log must read as the
log before the write or the log after it, never in between, read-only or repaired by a writer.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.errors import SessionError
from boxmaker.records import Assistant, Baseline, Record, ToolCall, TurnEnd, Usage, User
from boxmaker.session import LogReadWarning, Session, read_log

ANSWER: list[Record] = [
    Assistant(content="Sunny, 21 °C in Lisbon.", reasoning="look it up", tool_calls=()),
    Usage(
        timings={"cache_n": 10, "prompt_n": 5, "predicted_n": 7},
        prompt_tokens=15,
        completion_tokens=7,
    ),
    TurnEnd(outcome="answered"),
]


def _logs(folder: Path, group: list[Record]) -> tuple[bytes, bytes]:
    """The bytes of a log before and after one ``extend(group)``."""
    with Session.create(folder, Baseline(system="s"), session_id="g") as s:
        s.append(User(content="Weather in Lisbon?"))
        before = s.path.read_bytes()
        s.extend(group)
        after = s.path.read_bytes()
    return before, after


def _types(session: Session) -> list[str]:
    return [type(r).__name__ for r in session.records]


def test_a_group_write_cut_at_every_byte_reads_as_all_or_nothing(tmp_path: Path) -> None:
    before, after = _logs(tmp_path / "made", ANSWER)
    assert after.count(b"\n") - before.count(b"\n") == 3
    log = tmp_path / "cut.jsonl"
    whole, none = ["User", "Assistant", "Usage", "TurnEnd"], ["User"]
    seen = {"whole": 0, "none": 0}
    for cut in range(len(before), len(after) + 1):
        log.write_bytes(after[:cut])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LogReadWarning)
            got = _types(Session.open(log, read_only=True))
        assert got in (whole, none), (cut, got)
        seen["whole" if got == whole else "none"] += 1
    assert seen["whole"] == 2  # the whole write, or all but its final newline
    assert seen["none"] == len(after) - len(before) - 1


def test_a_writer_cuts_a_torn_group_back_and_sets_its_bytes_aside(tmp_path: Path) -> None:
    before, after = _logs(tmp_path / "made", ANSWER)
    log = tmp_path / "cut.jsonl"
    second = after.index(b"\n", len(before)) + 1  # the Assistant line whole, the rest cut
    for cut in (second, second + 5, len(after) - 2):
        log.write_bytes(after[:cut])
        (tmp_path / "cut.jsonl.torn").unlink(missing_ok=True)
        with (
            pytest.warns(LogReadWarning, match="dropped a torn group of"),
            Session.open(log) as session,
        ):
            assert _types(session) == ["User"] and session.turn_left_open()
        assert log.read_bytes() == before
        aside = (tmp_path / "cut.jsonl.torn").read_bytes()
        assert aside.rstrip(b"\n") == after[len(before) : cut].rstrip(b"\n")
        assert _types(Session.open(log, read_only=True)) == ["User"]


def test_the_marker_is_framing_only_and_a_single_record_has_none(tmp_path: Path) -> None:
    _, after = _logs(tmp_path, ANSWER)
    lines = [json.loads(x) for x in after.splitlines()]
    assert [line.get("group") for line in lines] == [None, None, 3, None, None]
    assert all("group" not in r for r in read_log(tmp_path / "g.jsonl").records)


@pytest.mark.parametrize("marker", ["1", "0", '"3"', "2.0", "true"])
def test_a_malformed_group_marker_names_file_and_line(tmp_path: Path, marker: str) -> None:
    _, after = _logs(tmp_path, ANSWER)
    (tmp_path / "g.jsonl").write_bytes(
        after.replace(b',"group":3}', b',"group":' + marker.encode() + b"}")
    )
    with pytest.raises(SessionError, match=r"g\.jsonl:3: group marker"):
        read_log(tmp_path / "g.jsonl")


def test_a_group_cut_short_in_the_middle_is_refused(tmp_path: Path) -> None:
    """Not a kill (a writer cuts a torn group before writing again): a damaged log."""
    _, after = _logs(tmp_path, ANSWER)
    lines = after.splitlines(keepends=True)
    damaged = b"".join([*lines[:3], *lines[2:]])  # a second group starts inside the first
    (tmp_path / "g.jsonl").write_bytes(damaged)
    with pytest.raises(SessionError, match=r"g\.jsonl:4: a group of 3 lines from line 3"):
        read_log(tmp_path / "g.jsonl")


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 4), min_size=1, max_size=5),
    cut_back=st.integers(0, 400),
)
def test_any_run_of_groups_cut_anywhere_keeps_whole_groups_only(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], cut_back: int
) -> None:
    folder = tmp_path_factory.mktemp("groups")
    with Session.create(folder, session_id="h") as s:
        for n, size in enumerate(sizes):
            s.extend([User(content=f"{n}.{k}") for k in range(size)])
        raw = s.path.read_bytes()
    head = raw.index(b"\n") + 1
    cut = max(head, len(raw) - cut_back)
    (folder / "h.jsonl").write_bytes(raw[:cut])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogReadWarning)
        got = [
            str(getattr(r, "content", ""))
            for r in Session.open(folder / "h.jsonl", read_only=True).records
        ]
    groups: dict[str, int] = {}
    for content in got:
        group = content.split(".")[0]
        groups[group] = groups.get(group, 0) + 1
    assert all(groups[str(n)] == sizes[n] for n in range(len(groups)))  # whole groups, in order
    assert list(groups) == [str(n) for n in range(len(groups))]


def test_an_assistant_cut_from_its_usage_leaves_no_call_to_answer(tmp_path: Path) -> None:
    call = ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}')
    before, after = _logs(
        tmp_path / "made", [Assistant(content=None, tool_calls=(call,)), ANSWER[1]]
    )
    (tmp_path / "g.jsonl").write_bytes(after[: after.index(b"\n", len(before)) + 1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogReadWarning)
        session = Session.open(tmp_path / "g.jsonl", read_only=True)
    assert session.unanswered_calls() == () and _types(session) == ["User"]
