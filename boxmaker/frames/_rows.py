"""The frames' reader: a session log's records into the column lists of every frame.

:mod:`boxmaker.frames` builds the frames; this module fills their columns, one log at a time:

1. :func:`file_log` reads a file with :func:`boxmaker.session.read_log` (read-only, one
   ``json.loads`` per file, older schemas upgraded); :func:`session_log` takes an open
   :class:`~boxmaker.session.Session`'s records.
2. :func:`split_turns` cuts the records into :class:`Turn` stretches, numbered (session, turn,
   completions before it).
3. One small row writer per frame (``_write_requests``, ``_write_turns``, ...) adds a log's
   rows, turn by turn, to its frame's column lists; :class:`Rows` holds the lists, runs the
   writers the wanted frames need and writes the ``summary`` row of each log.
4. Field columns (a record's value read as is, :attr:`boxmaker.frames.Column.field`) are taken
   per log and per column.

Values come from the records' data only: how a turn ended from its ``TurnEnd`` record (turns
without one, from logs of schema 1 or a turn still running, from their records' structure),
whether a tool ran from ``ToolResult.not_run``; never from the texts the loop wrote. The values
are not checked here: :func:`~boxmaker.session.read_log` checked every record by the records'
one rule (:data:`boxmaker.records.RULES`), the rule :meth:`Session.open
<boxmaker.session.Session.open>` reads by, so a log the session refuses never gets here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeAlias

from ..records import parse_time, record_to_json
from ..session import LogReadWarning, Session, read_log
from ._columns import COLUMNS, ENDING_LIMITS

__all__ = ["HIDDEN", "Log", "Rows", "Turn", "file_log", "session_log", "split_turns"]

HIDDEN = ("_session_row", "_turn_row", "_request_row")
"""Hidden columns of every frame: the row of its session (summary), turn and latest request."""

_JOINED = frozenset({"prompt_ms_per_token"})
"""Reader-filled columns taken from another frame when the frames are built (see _build)."""

_KNOWN = (
    "assistant",
    "tool_result",
    "usage",
    "user",
    "limit_hit",
    "cache_loss",
    "turn_end",
    "approval",
    "capabilities",
    "forked",
)
"""The record types the frames read (a tuple: ``in`` compares, so any JSON value is safe);
``capabilities`` is known and has no frame of its own; ``forked`` gives the summary's
``parent_session``, ``fork_turn`` and ``fork_point``."""


class Log(NamedTuple):
    """One log as the writers read it: its session id, file, baseline JSON and the JSON
    records after the baseline (current schema)."""

    session: str
    path: str
    head: dict[str, Any]
    records: list[Any]


def file_log(path: Path) -> Log:
    """Read a log file read-only with :func:`boxmaker.session.read_log` (one parse per file).

    Raises:
        SessionError: as :func:`~boxmaker.session.read_log` (the message names file and line).
    """
    data = read_log(path, repair=False)
    return Log(data.session_id, str(path), data.head, data.records)


def session_log(session: Session) -> Log:
    """An open :class:`~boxmaker.session.Session` as a :class:`Log` (its records as JSON)."""
    head = {"type": "baseline", "schema": session.schema, **record_to_json(session.baseline)}
    records = [record_to_json(r) for r in session.records]
    return Log(session.id, str(session.path), head, records)


# -- splitting a log into turns ----------------------------------------------------------------


class Turn(NamedTuple):
    """A stretch of one log's records: a turn, from its ``User`` record up to the next one, or
    the records before the first ``User`` (``number`` is ``None``).

    Attributes:
        number: the turn's number in the session (1, 2, ...), or ``None``.
        start: index of ``records[0]`` among the log's records after the baseline (its line in
            the file is ``start + 2``).
        records: the stretch's records (JSON objects), in log order.
        types: ``records[k]["type"]`` for each record (``None`` where it has none).
        usages: the indexes ``k`` of its ``Usage`` records (its completions), in order.
        requests_before: completions (``Usage`` records) of the session before the stretch:
            the completion of ``records[usages[n]]`` is number ``requests_before + n + 1``.
    """

    number: int | None
    start: int
    records: list[dict[str, Any]]
    types: list[Any]
    usages: list[int]
    requests_before: int


def split_turns(records: list[Any], unknown: dict[str, int]) -> Iterator[Turn]:
    """Cut a log's records (the JSON values after the baseline) into :class:`Turn` stretches.

    Args:
        records: the log's records, as :func:`boxmaker.session.read_log` gives them.
        unknown: filled with the count of records of each type this version does not read.
    """
    # list comprehensions and C-level list methods: this runs over every record of every log
    types = [r["type"] for r in records]  # objects with a "type" string: read_log checked
    if set(types).difference(_KNOWN):
        for t in types:
            if t not in _KNOWN:
                unknown[str(t)] = unknown.get(str(t), 0) + 1
    number: int | None = None
    start = before = 0
    usages: list[int] = []
    for i in [i for i, t in enumerate(types) if t == "usage" or t == "user"]:
        if types[i] == "usage":
            usages.append(i - start)
            continue
        if i > start:
            yield Turn(number, start, records[start:i], types[start:i], usages, before)
        number = 1 if number is None else number + 1
        start, before, usages = i, before + len(usages), []
    if len(records) > start:
        yield Turn(number, start, records[start:], types[start:], usages, before)


def _last_time(records: list[dict[str, Any]], default: Any) -> Any:
    """The ``time`` of the last record of a known type that has one, else ``default``."""
    for rec in reversed(records):
        if rec["type"] in _KNOWN:
            return rec["time"]
    return default


def _call_lengths(rec: dict[str, Any]) -> list[tuple[str, int]]:
    """``(id, len(arguments))`` of each tool call of an assistant record."""
    return [(c["id"], len(c["arguments"])) for c in rec.get("tool_calls") or ()]


def _turn_end(rec: dict[str, Any]) -> tuple[str, str | None, int | None]:
    """``(outcome, detail, status)`` of a turn_end record."""
    return rec["outcome"], rec.get("detail"), rec.get("status")


def _inferred_outcome(turn: Turn) -> str:
    """How a turn without a ``TurnEnd`` record ended, from its records' structure (logs of
    schema 1, or a turn still running): an ending ``LimitHit``; else a last message that is an
    ``Assistant`` without tool calls (``length`` when its completion was cut at
    ``max_tokens``); else ``cancelled`` when a call was answered ``not_run: "cancelled"``;
    else ``no_answer``."""
    ending: str | None = None
    answered = cut = cancelled = False
    for kind, rec in zip(turn.types, turn.records, strict=True):
        if kind == "assistant":
            answered = not rec.get("tool_calls")
        elif kind == "tool_result":
            answered = False
            cancelled = cancelled or rec.get("not_run") == "cancelled"
        elif kind == "usage":
            cut = rec.get("finish_reason") == "length"
        elif kind == "limit_hit" and rec["kind"] in ENDING_LIMITS:
            ending = rec["kind"]
    if ending is not None:
        return ENDING_LIMITS[ending]
    if answered:
        return "length" if cut else "answered"
    return "cancelled" if cancelled else "no_answer"


# -- one row writer per frame: each fills its frame's column lists from a log's turns ---------


class _Place(NamedTuple):
    """Where one log's rows go: its session id and the first row of the log in each frame;
    ``copied``: the log's records before this index (after the baseline) are copies of a
    fork's parent (``Forked.record``; 0: no fork)."""

    session: str
    session_row: int
    first_turn_row: int
    first_request_row: int
    copied: int = 0

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
                if c.agg is not None or c.derive is not None or c.name in _JOINED:
                    continue
                cols[c.name] = []
                if c.field is not None:
                    key, _, sub = c.field.partition(".")
                    getters.append(_Getter(cols[c.name].extend, key, sub or None))
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
        place = _Place(
            log.session, sizes["summary"], sizes["turns"], sizes["requests"], copied_before(log)
        )
        self.taken = {frame: [] for frame in self.getters if frame != "summary"}
        unknown: dict[str, int] = {}
        turns = list(split_turns(log.records, unknown))
        for write in self.writers:
            write(self, place, log, turns)
        for frame, recs in self.taken.items():
            _take(recs, self.getters[frame])
        if unknown:
            warnings.warn(
                f"{log.path}: records of unknown type skipped: {', '.join(sorted(unknown))}",
                LogReadWarning,
                stacklevel=5,
            )
        forked = log.records[0] if log.records and log.records[0]["type"] == "forked" else {}
        for name, value in (
            ("session", log.session),
            ("path", log.path),
            ("parent_session", forked.get("parent_session")),
            ("fork_turn", forked.get("turn")),
            ("fork_point", forked.get("point")),
            ("started", log.head.get("time")),
            ("ended", _last_time(log.records, log.head.get("time"))),
            ("records", len(log.records)),
            ("unknown_records", sum(unknown.values())),
            ("_session_row", place.session_row),
            ("_turn_row", -1),
            ("_request_row", -1),
        ):
            self.cols["summary"][name].append(value)


def copied_before(log: Log) -> int:
    """The records of ``log`` before this index (after the baseline) are copies of its
    parent's: ``Forked.record`` when the log is a fork (its first record a ``forked``; the
    copies are records 1..record-1), else 0. A fork of a fork copies its parent's ``Forked``
    record too, as any other."""
    first = log.records[0] if log.records else None
    return int(first["record"]) if first is not None and first["type"] == "forked" else 0


_Writer: TypeAlias = Callable[[Rows, _Place, Log, list[Turn]], None]
"""A frame's row writer: adds the rows of one log (its turns) to the frame's column lists."""


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


def _write_requests(rows: Rows, place: _Place, log: Log, turns: list[Turn]) -> None:
    """``requests``: a row per Usage record; ``tool_calls`` from the Assistant before it."""
    recs = rows.taken["requests"]
    numbers: list[int | None] = []
    turn_requests: list[int | None] = []
    counts: list[int | None] = []
    copied: list[bool] = []
    for number, start, records, types, usages, _ in turns:
        copied += [start + k < place.copied for k in usages]
        after = -1  # the previous usage: an assistant before it belongs to that one
        for k in usages:
            j = k - 1
            while j > after and types[j] != "assistant":
                j -= 1
            if j <= after:
                counts.append(None)
            else:
                counts.append(len(records[j].get("tool_calls") or ()))
            recs.append(records[k])
            after = k
        n = len(usages)
        numbers += [number] * n
        turn_requests += range(1, n + 1) if number is not None else [None] * n
    n = len(counts)
    cols = rows.cols["requests"]
    cols["session"] += [place.session] * n
    cols["request"] += range(1, n + 1)
    cols["turn"] += numbers
    cols["turn_request"] += turn_requests
    cols["tool_calls"] += counts
    cols["from_parent"] += copied
    cols["_session_row"] += [place.session_row] * n
    cols["_turn_row"] += [place.turn_row(number) for number in numbers]
    cols["_request_row"] += range(place.first_request_row, place.first_request_row + n)


def _write_turns(rows: Rows, place: _Place, log: Log, turns: list[Turn]) -> None:
    """``turns``: a row per turn; the outcome from its ``TurnEnd`` record when it has one."""
    cols = rows.cols["turns"]
    last_time = log.head.get("time")
    for turn in turns:
        last_time = _last_time(turn.records, last_time)
        if turn.number is None:
            continue
        detail = status = None
        iterations = 0
        end: tuple[str, str | None, int | None] | None = None
        from_parent = _last_known(turn) < place.copied
        own = 0 if from_parent else place.copied - turn.start  # count records from this one
        for k, kind in enumerate(turn.types):
            if kind == "assistant" and k >= own and turn.records[k].get("tool_calls"):
                iterations += 1
            elif kind == "turn_end":
                end = _turn_end(turn.records[k])
        if end is not None:
            outcome, detail, status = end
        else:
            outcome = _inferred_outcome(turn)
        started = turn.records[0].get("time")
        if not from_parent and turn.start < place.copied:
            started = _fork_start(log, started)
        for name, value in (
            ("session", place.session),
            ("turn", turn.number),
            ("started", started),
            ("ended", last_time),
            ("outcome", outcome),
            ("end_detail", detail),
            ("http_status", status),
            ("iterations", iterations),
            ("from_parent", from_parent),
            ("_session_row", place.session_row),
            ("_turn_row", -1),
            ("_request_row", -1),
        ):
            cols[name].append(value)


def _fork_start(log: Log, started: Any) -> Any:
    """When a turn a fork continues from copied records (a rerun, an edited tool result)
    started: not before the fork was made (its ``Forked`` record's time), so that the gap
    between the parent's run and the fork's is not counted as the turn's wall time."""
    forked = log.records[0].get("time") if log.records else None
    if not isinstance(forked, str) or not isinstance(started, str):
        return started
    return forked if parse_time(forked) > parse_time(started) else started


def _last_known(turn: Turn) -> int:
    """The index (after the baseline) of the turn's last record of a type the frames read."""
    for k in range(len(turn.types) - 1, -1, -1):
        if turn.types[k] in _KNOWN:
            return turn.start + k
    return turn.start


def _at_request(frame: str, kind: str) -> _Writer:
    """The writer of a frame with a row per ``kind`` record, placed at the latest completion."""

    def write(rows: Rows, place: _Place, log: Log, turns: list[Turn]) -> None:
        recs = rows.taken[frame]
        numbers: list[int | None] = []
        requests: list[int] = []
        copied: list[bool] = []
        for number, start, records, types, _, request in turns:
            if kind not in types:
                continue
            for k, t in enumerate(types):
                if t == "usage":
                    request += 1
                elif t == kind:
                    recs.append(records[k])
                    numbers.append(number)
                    requests.append(request)
                    copied.append(start + k < place.copied)
        _place_rows(rows.cols[frame], place, numbers, requests, copied)

    return write


def _write_tool_calls(rows: Rows, place: _Place, log: Log, turns: list[Turn]) -> None:
    """``tool_calls``: a row per ToolResult; ``arguments_chars`` from the call, by its id; the
    approval columns from the ``Approval`` record of the same call number, when one was made."""
    recs = rows.taken["tool_calls"]
    cols = rows.cols["tool_calls"]
    arguments: dict[str, int] = {}  # tool_call_id -> len(arguments), over the whole log
    approvals: dict[int, dict[str, Any]] = {}  # call number -> its Approval record
    numbers: list[int | None] = []
    requests: list[int] = []
    copied: list[bool] = []
    for number, start, records, types, _, request in turns:
        for k, kind in enumerate(types):
            if kind == "usage":
                request += 1
            elif kind == "assistant":
                arguments.update(_call_lengths(records[k]))
            elif kind == "approval":
                approvals[records[k]["call"]] = records[k]
            elif kind == "tool_result":
                rec = records[k]
                recs.append(rec)
                numbers.append(number)
                requests.append(request)
                copied.append(start + k < place.copied)
                cols["arguments_chars"].append(arguments.get(rec["tool_call_id"]))
                cols["result_chars"].append(len(rec["content"]))
                decided = approvals.pop(rec["call"], None) or {}
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
    ("cache_losses", _at_request("cache_losses", "cache_loss")),
    ("limit_hits", _at_request("limit_hits", "limit_hit")),
    ("tool_calls", _write_tool_calls),
)
"""The row writer of each frame (``summary`` rows are written per log by :meth:`Rows.add`)."""


def _take(recs: list[dict[str, Any]], getters: list[_Getter]) -> None:
    """Add the field columns of one log's records of a frame (one list per column)."""
    outer: dict[str, list[Any]] = {}  # e.g. every record's "timings", read once
    for extend, key, sub in getters:
        if sub is None:
            extend([r.get(key) for r in recs])
            continue
        if key not in outer:
            outer[key] = [r.get(key) for r in recs]
        extend([v.get(sub) if v is not None else None for v in outer[key]])
