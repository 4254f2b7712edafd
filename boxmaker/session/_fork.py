"""Forks: a new log that branches from a parent's log at a turn (schema 4).

A fork's log is an ordinary session log whose first record after the baseline is a
:class:`~boxmaker.records.Forked` saying where it came from (the parent's session id and
path, its schema, the turn and the record it branches at, what the fork changed), followed by
the parent's records up to that point, copied as the parent's file holds them (times
included; secrets already hidden there), written with it in one all-or-nothing group. The
fork's own turns are appended after them, so every request of the fork extends the parent's
requests before the fork point and llama.cpp's prompt cache can serve that prefix.

The parent is only read (:func:`~boxmaker.session.read_log`, no lock, the file untouched):
forking a log that another process is writing works, and so does forking a fork.

Fork points (:data:`~boxmaker.records.FORK_POINTS`), for the parent's turn ``k`` (1-based, the
``k``-th user message):

- ``after_turn``: every record of turns 1..k (up to the next user message); the fork's next
  turn is a new one.
- ``before_answer``: the records before turn ``k``'s user message; ``Forked.rerun`` holds that
  message, so the turn can be run again under other settings
  (:func:`boxmaker.turn.continue_fork`).
- ``edited_result``: the records of turn ``k`` up to the result of tool call ``call``, then
  that result with the researcher's text, marked ``source="edited"`` (never passed off as the
  tool's output); the turn goes on from there (the rest of its calls, then the next
  completion).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import SessionError
from ..records import (
    Baseline,
    Forked,
    ForkPoint,
    Record,
    RecordError,
    ToolResult,
    TurnEnd,
    User,
    baseline_from_json,
    records_from_json,
)
from ._file import read_log

__all__ = ["first_difference", "fork_cut", "fork_records", "parent_of", "turn_starts"]


def turn_starts(records: list[Record]) -> list[int]:
    """The index (0-based, in ``records``) of each turn's user message, in order."""
    return [i for i, r in enumerate(records) if isinstance(r, User)]


def fork_cut(
    records: list[Record], at: int | None, point: ForkPoint, call: int | None
) -> tuple[int, int]:
    """Where a fork of ``records`` branches: ``(turn, cut)``, the fork keeps ``records[:cut]``.

    Raises:
        SessionError: no such turn (``at`` outside 1..number of turns), no tool result of call
            ``call`` (in turn ``at`` when given), or ``at`` missing where it is needed.
    """
    starts = turn_starts(records)
    if call is not None:
        where = [i for i, r in enumerate(records) if isinstance(r, ToolResult) and r.call == call]
        if not where:
            raise SessionError(f"no tool result of call {call} to edit")
        turn = sum(1 for s in starts if s < where[0])
        if at is not None and at != turn:
            raise SessionError(f"call {call} is in turn {turn}, not turn {at}")
        return turn, where[0]
    if at is None or not 1 <= at <= len(starts):
        raise SessionError(f"turn {at!r} is not a turn of this log (it has 1 to {len(starts)})")
    if point == "before_answer":
        return at, starts[at - 1]
    if at == len(starts) and not _ended(records[starts[-1] :], records):
        raise SessionError(
            f"turn {at} has not ended (no TurnEnd record: it is still running, or its process "
            "died before the log was reopened): fork after it once it ended, or before its "
            f"answer (fork(at={at}, rerun=True))"
        )
    return at, starts[at] if at < len(starts) else len(records)


def _ended(turn: list[Record], records: list[Record]) -> bool:
    """Whether the last turn of a log ended: it has its ``TurnEnd`` record, or the log holds
    none at all (a log of schema 1, whose turns ended without one)."""
    return any(isinstance(r, TurnEnd) for r in turn) or not any(
        isinstance(r, TurnEnd) for r in records
    )


def fork_records(
    parent_path: Path,
    *,
    at: int | None,
    rerun: bool,
    call: int | None,
    result: str | None,
    settings: Mapping[str, Any] | None,
    folder: Path,
) -> tuple[Baseline, list[Record]]:
    """The baseline and the first records of a fork of the log at ``parent_path``: the
    :class:`Forked` record, the parent's records up to the fork point, and the edited result
    (``call``/``result``). See the module's docstring for the points.

    Raises:
        SessionError: the parent cannot be read, the point does not exist, ``result`` is given
            without ``call`` (or the reverse), ``rerun`` with ``call``.
    """
    if (call is None) != (result is None):
        raise SessionError("an edited result needs both call and result")
    if rerun and call is not None:
        raise SessionError("fork either before a turn's answer (rerun) or at an edited result")
    data = read_log(parent_path, repair=False)
    try:
        baseline = baseline_from_json(data.head)
        records = records_from_json(data.records)
    except RecordError as exc:  # read_log checked both: a line changed under us
        raise SessionError(f"{parent_path}: {exc}") from exc
    point: ForkPoint = "edited_result" if call else "before_answer" if rerun else "after_turn"
    turn, cut = fork_cut(records, at, point, call)
    edited: list[Record] = []
    if call is not None and result is not None:
        old = records[cut]
        assert isinstance(old, ToolResult)
        edited.append(
            ToolResult(
                call=old.call,
                tool_call_id=old.tool_call_id,
                name=old.name,
                content=result,
                data_class=old.data_class,
                untrusted=False,
                source="edited",
            )
        )
    rerun_text = None
    if point == "before_answer":
        user = records[cut]
        rerun_text = user.content if isinstance(user, User) else None
    forked = Forked(
        parent_session=data.session_id,
        parent_path=_relative(parent_path, folder),
        parent_schema=data.schema,
        turn=turn,
        point=point,
        record=cut + 1,
        edited_call=call,
        rerun=rerun_text,
        settings=dict(settings or {}),
    )
    return baseline, [forked, *records[:cut], *edited]


def _relative(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder`` when it lies under it, else absolute (a relative path
    as given would be read against the fork's folder, not the folder it was given in)."""
    try:
        full, base = path.resolve(), folder.resolve()
    except OSError:
        return str(path.absolute())
    return os.path.relpath(full, base) if full.is_relative_to(base) else str(full)


def parent_of(fork_path: Path, forked: Forked) -> Path:
    """The parent's log of a fork at ``fork_path``: ``parent_path`` read against the fork's
    folder when it is relative."""
    given = Path(forked.parent_path)
    return given if given.is_absolute() else fork_path.parent / given


def _plain(record: dict[str, Any]) -> dict[str, Any]:
    """A record's JSON without ``time`` and ``group`` (what makes two runs' records differ
    though they say the same)."""
    return {k: v for k, v in record.items() if k not in ("time", "group")}


def first_difference(mine: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> int | None:
    """The position (0-based, in ``mine``) of the first record of ``mine`` that differs from
    ``theirs`` at the same place (their JSON objects, times aside), or where one of them
    ends first (``len(mine)`` when ``mine`` does); ``None`` when they are equal. A fork's own
    records against its parent's from the fork point on (the frames' ``forks``, the
    ``BranchView``). ``Warmed`` records (what the server's cache did, :data:`BOOKKEEPING`)
    are left out of both, as times are: a fork that does what its parent did differs
    nowhere."""
    kept = [i for i, r in enumerate(mine) if r.get("type") not in BOOKKEEPING]
    other = [r for r in theirs if r.get("type") not in BOOKKEEPING]
    for i, b in zip(kept, other, strict=False):
        if _plain(mine[i]) != _plain(b):
            return i
    if len(kept) == len(other):
        return None
    return kept[len(other)] if len(kept) > len(other) else len(mine)


BOOKKEEPING = ("warmed",)
"""Record types :func:`first_difference` leaves out: what the server's cache did for a
fork's request, not what the fork did."""
