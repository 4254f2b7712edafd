"""One reader, one rule: the frames accept exactly the logs ``Session.open`` accepts, and count
each record once (issue 23); both read by the records' one rule table (issue 21).

Each defect the issues name has a case here that failed before: the session accepted
``"kind": 123`` (and values outside the ``Literal`` types, negative token counts) that the
frames dropped; the frames read unsafe ids, bad times (as NaT), missing fields and wrong
types that the session refuses; a duplicated line counted twice in both; a year-9999 time
crashed the frames and ``boxmaker report``. The property at the end mutates real logs (the
shipped ones of each schema and logs the loop wrote) and checks both readers agree
(``BOXMAKER_MUTANTS=N``: N mutated logs instead of 40).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from fakes import ScriptedClient, Step, answer, calls, context_full
from fakes import call as fake_call
from fakes import timings as fake_timings
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from boxmaker.cli import main
from boxmaker.config import Config, LoopLimits
from boxmaker.errors import InferError, SessionError, TurnError
from boxmaker.frames import LogReadWarning, load
from boxmaker.records import (
    RULES,
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    Record,
    ToolResult,
    Usage,
    User,
)
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

DATA = Path(__file__).resolve().parents[1] / "data"


def lines_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write(path: Path, objects: list[Any], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(o) + "\n" for o in objects) + tail, encoding="utf-8")
    return path


def session_reads(path: Path) -> tuple[Session | None, str, list[str]]:
    """``Session.open(path, read_only=True)``: the session (None when refused), the error's
    words, the warnings' words."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            session: Session | None = Session.open(path, read_only=True)
            error = ""
        except SessionError as exc:
            session, error = None, str(exc)
    return session, error, [str(w.message) for w in seen]


def frames_read(path: Path) -> tuple[Any, list[str]]:
    """``frames.load(path)`` and its warnings' words."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        loaded = load(path)
    return loaded, [str(w.message) for w in seen if issubclass(w.category, LogReadWarning)]


def assert_read_alike(path: Path) -> Session | None:
    """Both readers accept the log, or both refuse it with the same words; what they accept
    they count alike, each record once."""
    session, error, session_warned = session_reads(path)
    loaded, frames_warned = frames_read(path)
    if session is None:
        assert loaded.summary.empty and loaded.requests.empty and loaded.turns.empty
        assert [w for w in frames_warned if error in w], (error, frames_warned)
        return None
    assert len(loaded.summary) == 1, frames_warned
    records = session.records
    assert loaded.summary.records.tolist() == [len(records)]
    assert len(loaded.requests) == sum(isinstance(r, Usage) for r in records)
    assert len(loaded.turns) == sum(isinstance(r, User) for r in records)
    assert len(loaded.tool_calls) == sum(isinstance(r, ToolResult) for r in records)
    assert len(loaded.limit_hits) == sum(isinstance(r, LimitHit) for r in records)
    assert len(loaded.cache_losses) == sum(isinstance(r, CacheLoss) for r in records)
    twice = [w for w in session_warned if "duplicated line" in w]
    assert twice == [w for w in frames_warned if "duplicated line" in w]
    return session


# -- each defect named in the issues -----------------------------------------------------------

HEAD = {
    "type": "baseline",
    "schema": 2,
    "session_id": "s",
    "system": "",
    "tools": [],
    "time": "2026-11-30T07:00:00Z",
}
USER = {"type": "user", "content": "x", "time": "2026-11-30T07:00:01Z"}
ASSISTANT = {
    "type": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "name": "f", "arguments": "{}"}],
    "time": "2026-11-30T07:00:02Z",
}
USAGE = {"type": "usage", "timings": {"cache_n": 0, "prompt_n": 9}, "time": "2026-11-30T07:00:03Z"}
RESULT = {
    "type": "tool_result",
    "call": 1,
    "tool_call_id": "c1",
    "name": "f",
    "content": "ok",
    "not_run": None,
    "time": "2026-11-30T07:00:04Z",
}
APPROVAL = {
    "type": "approval",
    "call": 1,
    "name": "f",
    "decision": "approved",
    "by": "code",
    "time": "2026-11-30T07:00:04Z",
}
HIT = {
    "type": "limit_hit",
    "kind": "thinking_cap",
    "detail": "capped",
    "time": "2026-11-30T07:00:05Z",
}
END = {"type": "turn_end", "outcome": "answered", "time": "2026-11-30T07:00:06Z"}
LOG: list[dict[str, Any]] = [HEAD, USER, ASSISTANT, USAGE, APPROVAL, RESULT, HIT, END]


def changed(index: int, **fields: Any) -> list[dict[str, Any]]:
    """:data:`LOG` with ``fields`` set in line ``index`` (0: the baseline); ``...`` deletes."""
    out = copy.deepcopy(LOG)
    for key, value in fields.items():
        if value is ...:
            del out[index][key]
        else:
            out[index][key] = value
    return out


REFUSED = {
    "limit kind 123": (changed(6, kind=123), ":7: limit_hit record: kind = 123 is not one of"),
    "limit kind outside LimitKind": (
        changed(6, kind="mystery"),
        ":7: limit_hit record: kind = 'mystery' is not one of tool_iterations,",
    ),
    "turn outcome outside TurnEndOutcome": (
        changed(7, outcome="won"),
        ":8: turn_end record: outcome = 'won' is not one of answered,",
    ),
    "not_run outside NotRunReason": (
        changed(5, not_run="lazy"),
        ":6: tool_result record: not_run = 'lazy' is not one of repeat,",
    ),
    "approval decision outside ApprovalDecision": (
        changed(4, decision="maybe"),
        ":5: approval record: decision = 'maybe' is not one of approved, denied",
    ),
    "negative reasoning tokens": (
        changed(3, reasoning_tokens=-3),
        ":4: usage record: reasoning_tokens = -3 is not a count (>= 0)",
    ),
    "negative prompt tokens": (
        changed(3, prompt_tokens=-1),
        ":4: usage record: prompt_tokens = -1 is not a count (>= 0)",
    ),
    "unsafe session id": (
        changed(0, session_id="../../etc/x"),
        ":1: baseline record: session_id = '../../etc/x' is not safe as a file name",
    ),
    "session id not a string": (
        changed(0, session_id=5),
        ":1: baseline record: session_id = 5 is not safe as a file name",
    ),
    "bad time read as NaT": (
        changed(3, time="2026-13-45T00:00:00Z"),
        ":4: usage record: time = '2026-13-45T00:00:00Z' is not an ISO 8601 time",
    ),
    "time without offset": (
        changed(1, time="2026-11-30T07:00:01"),
        ":2: user record: time = '2026-11-30T07:00:01' has no UTC offset",
    ),
    "year 9999": (
        changed(1, time="9999-12-31T23:59:59Z"),
        ":2: user record: time = '9999-12-31T23:59:59Z' is out of range (1677-09-21 to",
    ),
    "year 1600": (changed(2, time="1600-01-01T00:00:00Z"), ":3: assistant record: time = "),
    "a bad baseline time": (
        changed(0, time="yesterday"),
        ":1: baseline record: time = 'yesterday' is not an ISO 8601 time",
    ),
    "missing field": (changed(5, content=...), ":6: tool_result record without 'content'"),
    "missing time": (changed(6, time=...), ":7: limit_hit record without 'time'"),
    "missing type": (changed(6, type=...), ":7: record without a 'type' string"),
    "wrong type": (changed(5, call="1"), ":6: tool_result record: call = '1' is not int"),
    "bool for a number": (changed(3, reasoning_tokens=True), ":4: usage record: reasoning_"),
    "tool call id not a string": (
        changed(2, tool_calls=[{"id": 5, "name": "f", "arguments": "{}"}]),
        ":3: assistant record: tool_calls[0].id = 5 is not str",
    ),
    "tool call without arguments": (
        changed(2, tool_calls=[{"id": "c1", "name": "f"}]),
        ":3: assistant record: tool_calls[0] without 'arguments'",
    ),
    "timing not a measurement": (
        changed(3, timings={"cache_n": 0, "prompt_n": -9}),
        ":4: usage record: timings.prompt_n = -9 is not a finite number >= 0",
    ),
    "waited_ms not finite": (
        changed(4, waited_ms=float("nan")),
        ":5: approval record: waited_ms = nan is not a finite number >= 0",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_log_the_session_refuses_the_frames_leave_out_with_the_same_words(
    tmp_path: Path, case: str
) -> None:
    objects, words = REFUSED[case]
    path = write(tmp_path / "log.jsonl", objects)
    with pytest.raises(SessionError, match=re.escape(f"log.jsonl{words}")):
        Session.open(path, read_only=True)
    with pytest.warns(LogReadWarning, match=re.escape(f"log.jsonl{words}") + ".*left out"):
        loaded = load(path)
    assert all(getattr(loaded, name).empty for name in loaded._fields)
    assert_read_alike(path)


def test_the_unchanged_log_is_read_by_both(tmp_path: Path) -> None:
    path = write(tmp_path / "log.jsonl", LOG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        session = Session.open(path, read_only=True)
        loaded = load(path)
    assert [type(r).__name__ for r in session.records] == [
        "User",
        "Assistant",
        "Usage",
        "Approval",
        "ToolResult",
        "LimitHit",
        "TurnEnd",
    ]
    assert loaded.limit_hits.kind.tolist() == ["thinking_cap"]
    assert loaded.tool_calls.approval.tolist() == ["approved"]


def test_iso_8601_times_pandas_does_not_parse_read_as_the_session_reads_them(
    tmp_path: Path,
) -> None:
    """A week date, a decimal comma and an offset with seconds are ISO 8601 (the session reads
    them); pandas reads them as NaT: the frames take the session's reading instead."""
    times = ["2026-W48-1T07:00:00Z", "2026-11-30T07:00:00,5Z", "2026-11-30T07:00:00+05:30:15"]
    objects = [HEAD, *({**USER, "time": t} for t in times)]
    path = write(tmp_path / "log.jsonl", objects)
    session = Session.open(path, read_only=True)
    started = load(path).turns.started.tolist()
    assert [t.to_pydatetime() for t in started] == [r.time for r in session.records]
    assert [str(t) for t in started] == [
        "2026-11-23 07:00:00+00:00",
        "2026-11-30 07:00:00.500000+00:00",
        "2026-11-30 01:29:45+00:00",
    ]


@pytest.mark.parametrize("where", ["next to it", "later"])
def test_a_duplicated_line_is_counted_once_by_both_with_the_same_warning(
    tmp_path: Path, where: str
) -> None:
    objects = copy.deepcopy(LOG)
    objects.insert(4 if where == "next to it" else 8, copy.deepcopy(USAGE))
    path = write(tmp_path / "log.jsonl", objects)
    words = r"log\.jsonl: 1 duplicated line\(s\) read once: line (5|9) \(= line 4\)"
    with pytest.warns(LogReadWarning, match=words) as session_seen:
        session = Session.open(path, read_only=True)
    with pytest.warns(LogReadWarning, match=words) as frames_seen:
        loaded = load(path)
    assert sum(isinstance(r, Usage) for r in session.records) == 1
    assert len(session.records) == len(LOG) - 1
    assert len(loaded.requests) == 1 and loaded.summary.records.tolist() == [len(LOG) - 1]
    assert loaded.summary.processed_tokens.tolist() == [9]
    assert [str(w.message) for w in session_seen] == [str(w.message) for w in frames_seen]


def test_records_equal_but_for_their_time_are_two_records(tmp_path: Path) -> None:
    objects = [*LOG, {**USAGE, "time": "2026-11-30T07:00:07Z"}]
    path = write(tmp_path / "log.jsonl", objects)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load(path).requests) == 2
        assert sum(isinstance(r, Usage) for r in Session.open(path, read_only=True).records) == 2


def test_report_leaves_out_a_year_9999_log_and_reports_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "logs"
    folder.mkdir()
    write(folder / "good.jsonl", LOG)
    write(folder / "far.jsonl", changed(0, session_id="far", time="9999-12-31T23:59:59Z"))
    assert main(["report", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert "far.jsonl:1: baseline record: time = '9999-12-31T23:59:59Z' is out of range" in err
    assert "the log is left out" in err
    assert " s " in out or "s" in out.split()


def test_a_record_the_rule_refuses_is_never_written(tmp_path: Path) -> None:
    """The writer checks each record by the readers' rule: the log never holds a line that
    would make both readers refuse the whole session."""
    with Session.create(tmp_path, session_id="w") as session:
        session.append(User(content="x"))
        before = session.path.read_bytes()
        bad: Record = LimitHit(kind="mystery", detail="?")  # type: ignore[arg-type]
        with pytest.raises(SessionError, match=r"not written: record 2 of 2 breaks .* kind"):
            session.extend([Assistant(content="a"), bad])
        assert session.path.read_bytes() == before and len(session.records) == 1
    assert_read_alike(session.path)


def test_the_rule_table_follows_the_record_hints() -> None:
    kind = {r.name: r for r in RULES["limit_hit"]}["kind"]
    assert kind.values is not None and "tool_iterations" in kind.values and kind.required
    tokens = {r.name: r for r in RULES["usage"]}
    assert tokens["reasoning_tokens"].minimum == 0 and not tokens["reasoning_tokens"].required
    assert tokens["prompt_tokens"].types == {int, type(None)}
    assert {r.name for r in RULES["assistant"]} == {"content", "reasoning", "tool_calls", "time"}


# -- the property: mutated logs, both readers alike ---------------------------------------------


@pytest.fixture(scope="module")
def real_logs(tmp_path_factory: pytest.TempPathFactory) -> list[list[dict[str, Any]]]:
    """The lines of the shipped logs of each schema and of logs the loop wrote: tool calls, a
    repeat, a tool-iteration limit, a context-full turn, a cancel, an inference error, a
    cache loss, a capped tool result."""
    folder = tmp_path_factory.mktemp("loop")
    box: dict[str, Runtime] = {}

    def weather(city: str) -> str:
        """Weather for a city; "stop" sets the runtime's cancel switch."""
        if city == "stop":
            box["rt"].cancel.set()
        return '{"sky": "clear"}' * (20 if city == "long" else 1)

    registry = Registry()
    registry.add(weather)
    oslo = {"city": "Oslo"}
    steps: list[Step] = [
        calls(fake_call("weather", oslo, "a"), timings=fake_timings(0, 50)),
        answer("clear", timings=fake_timings(50, 20)),
        *(
            calls(fake_call("weather", oslo, f"r{i}"), timings=fake_timings(3, 10))
            for i in range(3)
        ),
        *(calls(fake_call("weather", {"city": f"c{i}"}, f"t{i}")) for i in range(4)),
        context_full(),
        calls(fake_call("weather", {"city": "long"}, "l1"), reasoning="think"),
        answer("long", timings=fake_timings(0, 5)),
        calls(fake_call("weather", {"city": "stop"}, "s1"), fake_call("weather", oslo, "s2")),
        Step(error=InferError("HTTP 500", status=500, body="boom")),
    ]
    session = Session.create(folder, Baseline(system="be brief", tools=registry.definitions()))
    config = Config(loop=LoopLimits(tool_iterations=3, tool_result_cap=40))
    runtime = Runtime(config=config, client=ScriptedClient(steps), registry=registry)
    box["rt"] = runtime
    for text in ("1", "2", "3", "4", "5", "6", "7"):
        with contextlib.suppress(TurnError):
            run_turn(session, runtime, text)
    session.close()
    logs = [lines_of(DATA / "schema-1.jsonl"), lines_of(DATA / "schema-2.jsonl")]
    return [*logs, lines_of(session.path), copy.deepcopy(LOG)]


ODD_VALUES = [123, -5, 0, 1.5, float("nan"), "x", "", None, True, [], {}, [1], {"a": 1}, 2**70]
TIMES = [
    "9999-12-31T23:59:59Z",
    "0001-01-01T00:00:00+05:00",
    "1600-01-01T00:00:00Z",
    "2262-04-12T00:00:00Z",
    "1677-09-21T00:12:43Z",
    "2026-13-45T00:00:00Z",
    "2026-11-30T07:00:00",
    "not a time",
    "2026-W48-1T07:00:00Z",
    "2026-11-30T07:00:00,5Z",
    "2026-11-30T07:00:00+05:30",
    "2026-11-30T07:00:00.1234567Z",
]
IDS = ["../../etc/x", "", ".hidden", "a b", "x" * 200, 5, None, "fine-id_2.x"]
LITERALS = {"kind": "mystery", "outcome": "won", "not_run": "lazy", "decision": "maybe"}


Mutation = Callable[[st.DataObject, list[Any]], None]


def _line(data: st.DataObject, objects: list[Any], first: int = 0) -> int:
    return data.draw(st.integers(first, len(objects) - 1))


def _delete_field(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects)]
    if type(obj) is dict and obj:
        del obj[data.draw(st.sampled_from(sorted(obj)))]


def _retype_field(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects)]
    if type(obj) is dict and obj:
        obj[data.draw(st.sampled_from(sorted(obj)))] = data.draw(st.sampled_from(ODD_VALUES))


def _bad_time(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects)]
    if type(obj) is dict:
        obj["time"] = data.draw(st.sampled_from(TIMES))


def _unsafe_id(data: st.DataObject, objects: list[Any]) -> None:
    if type(objects[0]) is dict:
        objects[0]["session_id"] = data.draw(st.sampled_from(IDS))


def _literal(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects)]
    keys = sorted(set(LITERALS) & set(obj)) if type(obj) is dict else []
    if keys:
        key = data.draw(st.sampled_from(keys))
        obj[key] = LITERALS[key]


def _negative(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects)]
    keys = [k for k, v in obj.items() if type(v) is int] if type(obj) is dict else []
    if keys:
        obj[data.draw(st.sampled_from(sorted(keys)))] = -1
    elif type(obj) is dict and type(obj.get("timings")) is dict and obj["timings"]:
        obj["timings"][data.draw(st.sampled_from(sorted(obj["timings"])))] = -1


def _inner(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects)]
    if type(obj) is dict and type(obj.get("tool_calls")) is list and obj["tool_calls"]:
        one = obj["tool_calls"][0]
        if data.draw(st.booleans()):
            one.pop(data.draw(st.sampled_from(sorted(one) or ["id"])), None)
        else:
            one["id"] = data.draw(st.sampled_from(ODD_VALUES))


def _record_type(data: st.DataObject, objects: list[Any]) -> None:
    obj = objects[_line(data, objects, 1)] if len(objects) > 1 else None
    if type(obj) is dict:
        obj["type"] = data.draw(st.sampled_from(["future_thing", 5, None, "baseline", "user"]))


def _duplicate_line(data: st.DataObject, objects: list[Any]) -> None:
    if len(objects) > 1:
        source = objects[_line(data, objects, 1)]
        objects.insert(data.draw(st.integers(1, len(objects))), copy.deepcopy(source))


def _not_an_object(data: st.DataObject, objects: list[Any]) -> None:
    if len(objects) > 1:
        objects[_line(data, objects, 1)] = data.draw(st.sampled_from([[1, 2], "x", 5, None]))


MUTATIONS: list[Mutation] = [
    _delete_field,
    _retype_field,
    _bad_time,
    _unsafe_id,
    _literal,
    _negative,
    _inner,
    _record_type,
    _duplicate_line,
    _duplicate_line,
    _not_an_object,
]


@settings(
    max_examples=int(os.environ.get("BOXMAKER_MUTANTS", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.data())
def test_the_frames_accept_exactly_the_logs_the_session_accepts_and_count_each_record_once(
    real_logs: list[list[dict[str, Any]]], data: st.DataObject
) -> None:
    objects = copy.deepcopy(data.draw(st.sampled_from(real_logs)))
    for mutation in data.draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=3)):
        mutation(data, objects)
    tail = data.draw(st.sampled_from(["", '{"type": "us']))  # and sometimes a torn last line
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder) / "log.jsonl", objects, tail)
        session = assert_read_alike(path)
        event("both refuse" if session is None else "both accept")
        if session is not None:  # each distinct record once, however often it was written
            distinct: list[Any] = []
            for obj in objects[1:]:
                if obj not in distinct:
                    distinct.append(obj)
            assert len(session.records) == len(distinct)
