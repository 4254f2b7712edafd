"""A log made whole (``Session.create``, a fork) is not read back from its file: the
session is built from what was written. It must be the session a reader of the file gets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.errors import SessionError
from boxmaker.records import (
    Assistant,
    Baseline,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
)
from boxmaker.session import Session
from boxmaker.session._file import LogWriter

TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "look",
            "description": "Look.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    },
)

texts = st.text(max_size=12)


def _same(made: Session) -> None:
    """``made`` equals the session read from its file, in every view."""
    with Session.open(made.path, read_only=True) as read:
        assert made.baseline == read.baseline
        assert made.records == read.records
        assert list(made.messages()) == list(read.messages())
        assert (made.id, made.schema) == (read.id, read.schema)
        assert made.forked == read.forked


@settings(max_examples=40, deadline=None)
@given(system=texts, turns=st.lists(st.tuples(texts, texts, st.booleans()), max_size=4))
def test_a_made_log_is_the_log_read_back(
    tmp_path_factory: pytest.TempPathFactory,
    system: str,
    turns: list[tuple[str, str, bool]],
) -> None:
    folder = tmp_path_factory.mktemp("logs")
    with Session.create(folder, Baseline(system=system, tools=TOOLS), sync="close") as parent:
        _same(parent)
        for n, (ask, say, calls) in enumerate(turns):
            parent.append(User(content=ask))
            if calls:
                call = ToolCall(id=f"c{n}", name="look", arguments='{"q": "' + str(n) + '"}')
                parent.append(Assistant(content="", tool_calls=(call,)))
                result = ToolResult(call=n + 1, tool_call_id=f"c{n}", name="look", content=say)
                parent.append(result)
            parent.append(Assistant(content=say))
            parent.append(Usage(timings={"cache_n": n, "prompt_n": 10, "predicted_n": 2}))
            parent.append(TurnEnd(outcome="answered"))
    with Session.open(parent.path, read_only=True) as reader:
        for at in range(1, len(turns) + 1):
            with reader.fork(at=at, session_id=f"after-{at}") as fork:
                _same(fork)
            with reader.fork(at=at, rerun=True, session_id=f"before-{at}") as fork:
                _same(fork)


def test_a_writer_between_the_link_and_the_lock_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process appended to the new log before its maker took the lock: the maker's
    session holds what the file holds, not only what it wrote."""
    real = LogWriter.__init__
    added = User(content="slipped in")

    def first_another(self: LogWriter, path: Path, **kwargs: object) -> None:
        if path.name == "s.jsonl" and not kwargs:
            other = LogWriter.__new__(LogWriter)
            real(other, path)
            from boxmaker.records import record_to_json
            from boxmaker.session._file import dumps_line

            other.append(dumps_line(record_to_json(added)))
            other.close()
        real(self, path, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(LogWriter, "__init__", first_another)
    with Session.create(tmp_path, Baseline(), session_id="s") as made:
        assert [type(r).__name__ for r in made.records] == ["User"]
        _same(made)


def test_a_closed_writer_has_no_size(tmp_path: Path) -> None:
    with Session.create(tmp_path, Baseline(), session_id="s") as made:
        pass
    writer = LogWriter(made.path)
    writer.close()
    with pytest.raises(SessionError, match="closed"):
        writer.size()


def test_what_the_caller_gave_is_not_what_the_session_holds(tmp_path: Path) -> None:
    """The made session holds the values a reader gets (lists for the caller's tuples, the
    text of a surrogate pair written as two code points) and shares no object with the
    caller (a tool dict changed after ``create`` changes nothing)."""
    tool: dict[str, Any] = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "required": ("a", "b")}},
    }
    with Session.create(
        tmp_path, Baseline(system="hi \ud83d\ude00", tools=(tool,)), session_id="p", sync="close"
    ) as made:
        tool["function"]["name"] = "changed_after_create"
        _same(made)
        assert made.baseline.tools[0]["function"]["parameters"]["required"] == ["a", "b"]
        assert made.baseline.tools[0]["function"]["name"] == "f"
        made.append(User(content="q"))
        made.append(Assistant(content="a"))
        made.append(TurnEnd(outcome="answered"))
    with Session.open(made.path, read_only=True) as parent:
        fork = parent.fork(at=1, settings={"sampling.stop": ("a", "b")}, session_id="f")
        with fork:
            _same(fork)
            assert fork.forked is not None
            assert fork.forked.settings == {"sampling.stop": ["a", "b"]}
