"""The property the loop keeps whatever ends a turn: :func:`assert_log_well_formed`."""

from __future__ import annotations

from ..records import TurnEnd
from ..session import Session

__all__ = ["assert_log_well_formed"]


def assert_log_well_formed(session: Session) -> None:
    """Check the property the loop keeps whatever ends a turn (SPEC "Limits").

    Every tool call of every assistant message has exactly one tool message after it (matched
    by ``tool_call_id``), and the session's last record is a ``TurnEnd`` (a turn that was not
    cut by a killed process). An empty session (no turn yet) passes.

    Raises:
        AssertionError: naming the call answered 0 or 2+ times, or the last record's type.
    """
    msgs = session.messages()
    for i, m in enumerate(msgs):
        for c in m.get("tool_calls", []):
            answered = [x for x in msgs[i + 1 :] if x.get("tool_call_id") == c["id"]]
            if len(answered) != 1:
                raise AssertionError(f"call {c['id']} has {len(answered)} results, not 1")
    if session.records and not isinstance(session.records[-1], TurnEnd):
        raise AssertionError(
            f"the last record is {type(session.records[-1]).__name__}, not TurnEnd"
        )
