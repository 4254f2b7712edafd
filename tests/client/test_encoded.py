"""A session's messages are written as JSON and hashed once, not at each request (issue 38:
flat per-turn cost): the request body put together from them is the body written whole, the
fingerprints tell prefixes apart as before, and a list that is not a session's is written
anew each time (its dicts may have changed in place)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from boxmaker.client._encoded import fingerprint, request_body
from boxmaker.records import Assistant, Baseline, ToolCall, ToolResult, User
from boxmaker.session import Messages, Session


def whole(payload: dict[str, Any]) -> Any:
    return json.loads(json.dumps(payload, ensure_ascii=False))


def test_a_session_requests_bodies_are_the_whole_bodies(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(system="sys"))
    bodies = []
    for i in range(5):
        session.append(User(content=f"question {i} \u00e9"))
        call = ToolCall(id=f"c{i}", name="f", arguments='{"a": 1}')
        session.extend([Assistant(content=None, reasoning="r", tool_calls=(call,))])
        session.append(ToolResult(call=i + 1, tool_call_id=f"c{i}", name="f", content="x"))
        payload = {"messages": session.messages(), "id_slot": 0, "stream": True}
        body = request_body(payload)
        assert body is not None
        assert json.loads(body) == whole(payload)
        bodies.append(body)
    assert bodies[-1].startswith(b'{"messages":[{"role":"system"')
    session.close()


def test_a_list_that_is_no_sessions_is_written_anew(tmp_path: Path) -> None:
    """A plain list's dicts may change in place between requests: never taken from before."""
    message = {"role": "user", "content": "one"}
    messages = [message]
    assert request_body({"messages": messages}) == b'{"messages":[{"role":"user","content":"one"}]}'
    first = fingerprint(messages)
    message["content"] = "two"
    assert request_body({"messages": messages}) == b'{"messages":[{"role":"user","content":"two"}]}'
    assert not fingerprint(messages).shares(first, 1)


def test_fingerprints_tell_prefixes(tmp_path: Path) -> None:
    session = Session.create(tmp_path, Baseline(system="sys"))
    session.append(User(content="a"))
    short = fingerprint(session.messages())
    session.append(User(content="b"))
    longer = fingerprint(session.messages())
    other = fingerprint(Messages([{"role": "system", "content": "sys"}, {"role": "user"}]))
    assert longer.count == 3 and short.count == 2
    assert longer.shares(short, short.count)  # the longer request extends the shorter
    assert other.shares(longer, 1) and not other.shares(longer, 2)
    session.close()


def test_a_shorter_or_different_list_of_a_session_is_written_right(tmp_path: Path) -> None:
    """A list of the session's messages that is not an extension of the last one seen (a
    request made again without the last messages, or with others) is written from its own
    messages."""
    session = Session.create(tmp_path, Baseline(system="sys"))
    for i in range(3):
        session.append(User(content=f"m{i}"))
    full = session.messages()
    assert request_body({"messages": full}) is not None
    cut = Messages(full[:2])
    body = request_body({"messages": cut})
    assert body is not None and json.loads(body) == whole({"messages": cut})
    swapped = Messages([full[0], {"role": "user", "content": "other"}])
    body = request_body({"messages": swapped})
    assert body is not None and json.loads(body) == whole({"messages": swapped})
    session.close()


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(max_size=8), min_size=1, max_size=8),
    back=st.integers(min_value=0, max_value=3),
)
def test_any_order_of_requests_gives_the_whole_body(
    tmp_path_factory: Any, texts: list[str], back: int
) -> None:
    """Requests of growing and then shorter lists, any text (lone surrogates included: those
    are written whole by json, never put together)."""
    session = Session.create(tmp_path_factory.mktemp("s"), Baseline(system="sys"))
    lists = []
    for text in texts:
        session.append(User(content=text))
        lists.append(session.messages())
    for messages in [*lists, *lists[-1 - back :]]:
        payload = {"messages": messages, "id_slot": 1}
        body = request_body(payload)
        if body is not None:
            assert json.loads(body) == whole(payload)
    session.close()
