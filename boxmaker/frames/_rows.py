"""The frames' row writers: a log's turns (:func:`boxmaker.session.split_turns`) into the
column lists of every frame.

:mod:`boxmaker.frames` builds the frames; this module fills their columns, one log at a time:

1. The logs come from the one source iterator, :func:`boxmaker.session.read_logs` (read-only,
   one ``json.loads`` per file, older schemas upgraded, copies of a session left out).
2. :func:`boxmaker.session.split_turns` gives each log's turns, completions, tool calls,
   limits, losses, origins and times: the one definition every view of a log reads.
3. One small row writer per frame (``_write_requests``, ``_write_turns``, ...) adds a log's
   rows to its frame's column lists; :class:`Rows` holds the lists, runs the writers the
   wanted frames need and writes the ``summary`` row of each log.
4. Field columns (a record's value read as is, :attr:`boxmaker.frames.Column.field`) are taken
   per log and per column.

Values come from the records' data only (``TurnEnd``, ``ToolResult.not_run``), never from the
texts the loop wrote, and a value the log does not hold stays missing (``<NA>``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple, TypeAlias

from ..session import Log, LogReadWarning, Reading, split_turns
from ._columns import COLUMNS, fork_settings_text

__all__ = ["HIDDEN", "Rows"]

HIDDEN = ("_session_row", "_turn_row", "_request_row")
"""Hidden columns of every frame: the row of its session (summary), turn and latest request."""


class _Place(NamedTuple):
    """Where one log's rows go: its session id and the first row of the log in each frame."""

    session: str
    session_row: int
    first_turn_row: int
    first_request_row: int

    def turn_row(self, number: int | None) -> int:
        """The ``turns`` row of turn ``number`` of this log (-1: before the first turn)."""
        return -1 if number is None else self.first_turn_row + number - 1

    def request_row(self, request: int) -> int:
        """The ``requests`` row of completion ``request`` of this log (-1: none yet)."""
        return self.first_request_row + request - 1 if request else -1


class _Getter(NamedTuple):
    extend: Callable[[Iterable[Any]], None]
    key: str
    sub: str | None
    fallback: str | None


class Rows:
    """Column lists of every frame, filled log by log; hidden ``_*`` columns tie rows together.

    ``taken[frame]`` holds the current log's records of the frame's row type, whose field
    columns :func:`_take` adds once the writers are done with the log.
    """

    def __init__(self, need: set[str]) -> None:
        self.need = need
        self.cols: dict[str, dict[str, list[Any]]] = {}
        self.getters: dict[str, list[_Getter]] = {}
        self.taken: dict[str, list[dict[str, Any]]] = {}
        for frame, specs in COLUMNS.items():
            cols: dict[str, list[Any]] = {}
            getters: list[_Getter] = []
            for c in specs:
                if c.agg is not None or c.derive is not None:
                    continue
                cols[c.name] = []
                if c.field is not None:
                    key, _, sub = c.field.partition(".")
                    getters.append(_Getter(cols[c.name].extend, key, sub or None, c.fallback))
            for hidden in HIDDEN:
                cols[hidden] = []
            self.cols[frame] = cols
            self.getters[frame] = getters
        self.writers = [write for frame, write in _WRITERS if frame in need]

    def sizes(self) -> dict[str, int]:
        return {frame: len(cols["_session_row"]) for frame, cols in self.cols.items()}

    def add(self, log: Log) -> None:
        """Add one log's rows (its records were checked by :func:`read_log`)."""
        sizes = self.sizes()
        place = _Place(log.session, sizes["summary"], sizes["turns"], sizes["requests"])
        self.taken = {frame: [] for frame in self.getters if frame != "summary"}
        reading = split_turns(log)
        for write in self.writers:
            write(self, place, reading)
        for frame, recs in self.taken.items():
            _take(recs, self.getters[frame])
        for problem in reading.problems:
            warnings.warn(problem, LogReadWarning, stacklevel=5)
        forked = reading.forked or {}
        for name, value in (
            ("session", log.session),
            ("path", log.path),
            ("parent_session", forked.get("parent_session")),
            ("fork_turn", forked.get("turn")),
            ("fork_point", forked.get("point")),
            ("fork_settings", fork_settings_text(reading.forked)),
            ("started", reading.started),
            ("ended", reading.ended),
            ("records", len(log.records)),
            ("unknown_records", sum(reading.unknown.values())),
            ("_session_row", place.session_row),
            ("_turn_row", -1),
            ("_request_row", -1),
        ):
            self.cols["summary"][name].append(value)


_Writer: TypeAlias = Callable[[Rows, _Place, Reading], None]
"""A frame's row writer: adds the rows of one log (its reading) to the frame's column lists."""


def _place_rows(
    cols: dict[str, list[Any]],
    place: _Place,
    numbers: list[int | None],
    requests: list[int],
    copied: list[bool],
) -> None:
    """The position columns of a log's rows: session, turn, request (when the frame has it),
    ``from_parent``, hidden; ``numbers`` the turn of each row, ``requests`` the session's
    latest completion, ``copied`` whether the row's record is a copy of the parent's."""
    n = len(requests)
    cols["session"] += [place.session] * n
    cols["from_parent"] += copied
    cols["turn"] += numbers
    if "request" in cols:
        cols["request"] += [r or None for r in requests]
    cols["_session_row"] += [place.session_row] * n
    cols["_turn_row"] += [place.turn_row(number) for number in numbers]
    cols["_request_row"] += [place.request_row(r) for r in requests]


def _write_requests(rows: Rows, place: _Place, reading: Reading) -> None:
    """``requests``: a row per completion (Usage record)."""
    recs = rows.taken["requests"]
    cols = rows.cols["requests"]
    records = reading.records
    numbers: list[int | None] = []
    for turn in reading.turns:
        for c in turn.completions:
            recs.append(records[c.usage])
            numbers.append(turn.number)
            cols["turn_request"].append(c.in_turn)
            cols["tool_calls"].append(c.tool_calls)
            cols["from_parent"].append(c.from_parent)
    n = len(numbers)
    cols["session"] += [place.session] * n
    cols["request"] += range(1, n + 1)
    cols["turn"] += numbers
    cols["_session_row"] += [place.session_row] * n
    cols["_turn_row"] += [place.turn_row(number) for number in numbers]
    cols["_request_row"] += range(place.first_request_row, place.first_request_row + n)


def _write_turns(rows: Rows, place: _Place, reading: Reading) -> None:
    """``turns``: a row per turn, as the reading says."""
    cols = rows.cols["turns"]
    for turn in reading.turns:
        if turn.number is None:
            continue
        for name, value in (
            ("session", place.session),
            ("turn", turn.number),
            ("started", turn.started),
            ("ended", turn.ended),
            ("outcome", turn.outcome),
            ("end_detail", turn.detail),
            ("http_status", turn.status),
            ("iterations", turn.iterations),
            ("from_parent", turn.from_parent),
            ("_session_row", place.session_row),
            ("_turn_row", -1),
            ("_request_row", -1),
        ):
            cols[name].append(value)


def _at_request(frame: str, attribute: str) -> _Writer:
    """The writer of a frame with a row per record of a turn's ``attribute`` (``limits`` or
    ``losses``: ``(index, request)`` pairs), placed at the session's latest completion."""

    def write(rows: Rows, place: _Place, reading: Reading) -> None:
        recs = rows.taken[frame]
        numbers: list[int | None] = []
        requests: list[int] = []
        copied: list[bool] = []
        records = reading.records
        for turn in reading.turns:
            for index, request in getattr(turn, attribute):
                recs.append(records[index])
                numbers.append(turn.number)
                requests.append(request)
                copied.append(index < reading.copied)
        _place_rows(rows.cols[frame], place, numbers, requests, copied)

    return write


def _write_tool_calls(rows: Rows, place: _Place, reading: Reading) -> None:
    """``tool_calls``: a row per answered call (ToolResult record); ``arguments_chars`` from
    the call, the approval columns from its ``Approval`` record, when one was made."""
    recs = rows.taken["tool_calls"]
    cols = rows.cols["tool_calls"]
    records = reading.records
    numbers: list[int | None] = []
    requests: list[int] = []
    copied: list[bool] = []
    for turn in reading.turns:
        for call in turn.calls:
            rec = records[call.result]
            recs.append(rec)
            numbers.append(turn.number)
            requests.append(call.request)
            copied.append(call.from_parent)
            cols["arguments_chars"].append(call.arguments_chars)
            cols["result_chars"].append(len(rec["content"]))
            cols["source"].append(call.source)
            decided = records[call.approval] if call.approval is not None else {}
            for column, key in _APPROVAL_COLUMNS:
                cols[column].append(decided.get(key))
    _place_rows(cols, place, numbers, requests, copied)


_APPROVAL_COLUMNS = (
    ("approval", "decision"),
    ("approved_by", "by"),
    ("approval_reason", "reason"),
    ("approval_wait_ms", "waited_ms"),
)
"""tool_calls column, Approval field."""


_WRITERS: tuple[tuple[str, _Writer], ...] = (
    ("requests", _write_requests),
    ("turns", _write_turns),
    ("cache_losses", _at_request("cache_losses", "losses")),
    ("limit_hits", _at_request("limit_hits", "limits")),
    ("tool_calls", _write_tool_calls),
)
"""The row writer of each frame (``summary`` rows are written per log by :meth:`Rows.add`)."""


def _take(recs: list[dict[str, Any]], getters: list[_Getter]) -> None:
    """Add the field columns of one log's records of a frame (one list per column)."""
    outer: dict[str, list[Any]] = {}  # e.g. every record's "timings", read once
    for extend, key, sub, fallback in getters:
        if sub is None:
            values = [r.get(key) for r in recs]
        else:
            if key not in outer:
                outer[key] = [r.get(key) for r in recs]
            values = [v.get(sub) if v is not None else None for v in outer[key]]
        if fallback is not None:
            values = [
                r.get(fallback) if v is None else v for v, r in zip(values, recs, strict=True)
            ]
        extend(values)
