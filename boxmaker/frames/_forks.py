"""The ``forks`` frame: one row per fork among the logs, where it first differs from its
parent and how its answer, usage and limit hits compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SessionError
from ..records import Warmed, record_from_json
from ..session import Log, Reading, Source, first_difference, open_log, read_logs, split_turns
from ._columns import fork_settings_text

__all__ = ["FORK_COLUMNS", "forks"]

FORK_COLUMNS: dict[str, str] = {
    "session": "the fork's session id",
    "parent_session": "the session it was forked from (Forked.parent_session)",
    "parent_path": "the parent's log as the fork names it (relative to the fork's folder)",
    "fork_turn": "the parent's turn the fork branches at (1-based)",
    "fork_point": "after_turn, before_answer or edited_result (boxmaker.records.FORK_POINTS)",
    "edited_call": "the tool call whose result was edited (<NA>: none)",
    "settings": "what the fork changed, as JSON ({} when nothing was said)",
    "first_difference": "the first of the fork's own records (1-based, after the baseline) "
    "that differs from the parent's record at the same place, times aside (<NA>: none "
    "differs and the fork is no longer than its parent)",
    "replayed": "tool results the fork took from its parent (source=replayed)",
    "warm": "how warm its first request found the parent's prefix, measured (Warmed.how: slot, "
    "restored, server, partial, cold, unknown; <NA>: no Warmed record, an older log or no "
    "completion yet)",
    "warm_prefix": "the parent's prefix in tokens (Warmed.prefix: what its slot held after the "
    "fork point's last completion, prompt and reply)",
    "warm_reused": "of it, the tokens the fork's first request reused (its cache_n)",
    "warm_share": "warm_reused / warm_prefix, at most 1 (warm at 0.9 or more)",
    "warm_prefilled": "prompt tokens a prefill request processed before the fork's first "
    "request (a sliding-window model's prefix sent once into the slot; <NA>: none)",
    "warm_detail": "why the fork was not warm (or warm though nothing was done for it)",
    "requests": "the fork's own completions (after the copy)",
    "processed_tokens": "prompt tokens processed by its own completions (timings.prompt_n, "
    "the requests frame's processed_tokens; <NA> when one is unknown)",
    "parent_requests": "the parent's completions after the fork point, in the turns the fork "
    "ran (the same turn numbers: the fork's own turns are compared with the parent's)",
    "parent_processed_tokens": "prompt tokens the parent processed in those completions",
    "limit_hits": "the fork's own LimitHit records",
    "parent_limit_hits": "the parent's LimitHit records after the fork point, in those turns",
    "answer": "the fork's last answer (content of its last Assistant without tool calls)",
    "parent_answer": "the parent's last answer after the fork point, in those turns",
    "same_answer": "answer == parent_answer",
}
"""The columns of :func:`forks`, with what each holds."""


def _answer(records: list[dict[str, Any]], start: int, stop: int | None = None) -> str | None:
    """The last answer in ``records[start:stop]``: the content of the last ``Assistant``
    without tool calls (``None``: none)."""
    for r in reversed(records[start:stop]):
        if r["type"] == "assistant" and not r.get("tool_calls"):
            return str(r.get("content") or "")
    return None


def _costs(reading: Reading, start: int, stop: int | None = None) -> tuple[int, int | None, int]:
    """``(completions, prompt tokens processed, limit hits)`` of ``reading`` in record indexes
    ``start`` to ``stop``; the tokens ``None`` (unknown) when a completion's ``prompt_n`` is
    unknown."""
    end = len(reading.records) if stop is None else stop
    usages = [c.usage for t in reading.turns for c in t.completions if start <= c.usage < end]
    processed = [(reading.records[u].get("timings") or {}).get("prompt_n") for u in usages]
    known = None if None in processed else sum(int(v) for v in processed if v is not None)
    hits = sum(1 for t in reading.turns for i, _ in t.limits if start <= i < end)
    return len(usages), known, hits


def _warmth(own: list[dict[str, Any]]) -> dict[str, Any]:
    """The fork's ``Warmed`` record as the ``warm*`` columns (all ``<NA>`` without one)."""
    found = next((r for r in own if r["type"] == "warmed"), None)
    record = None if found is None else record_from_json(found)  # read_log checked it
    if not isinstance(record, Warmed):
        return {}
    return {
        "warm": record.how,
        "warm_prefix": record.prefix,
        "warm_reused": record.reused,
        "warm_share": record.share,
        "warm_prefilled": record.prefilled,
        "warm_detail": record.detail,
    }


def _replayed(reading: Reading) -> int:
    """The fork's own tool results taken from its parent (``source`` replayed)."""
    own = [c for t in reading.turns for c in t.calls if not c.from_parent]
    return sum(1 for c in own if c.source == "replayed")


def forks(source: Source) -> pd.DataFrame:
    """One row per fork among the logs of ``source`` (files, folders, sessions, logs read),
    read by the one source iterator (:func:`boxmaker.session.read_logs`: a log the session
    refuses, or a copy of a session, is left out with one warning); logs that are no fork are
    left out. Columns: :data:`FORK_COLUMNS`. The parent is the log of its session among
    ``source``, else read from the path its fork names; a parent that cannot be read leaves
    its columns ``<NA>``. A figure a log does not hold (a completion without ``prompt_n``)
    makes its total ``<NA>``.

    Raises:
        SessionError: a path of ``source`` names no log.
    """
    logs = list(read_logs(source))
    by_session = {log.session: log for log in logs}
    rows = []
    for log in logs:
        reading = split_turns(log)
        forked = reading.forked
        if forked is None:
            continue
        start = reading.copied  # records[start:] are the fork's own
        own = log.records[start:]
        row: dict[str, Any] = {
            "session": log.session,
            "parent_session": forked["parent_session"],
            "parent_path": forked["parent_path"],
            "fork_turn": forked["turn"],
            "fork_point": forked["point"],
            "edited_call": forked.get("edited_call"),
            "settings": fork_settings_text(forked),
            "replayed": _replayed(reading),
        }
        row.update(_warmth(own))
        row["requests"], row["processed_tokens"], row["limit_hits"] = _costs(reading, start)
        row["answer"] = _answer(log.records, start)
        parent = _parent(log, forked, by_session)
        if parent is not None:
            theirs = parent.records[start - 1 :]
            # an edited result stands where the parent's own result was
            at = first_difference(own, theirs)
            row["first_difference"] = None if at is None else start + at + 1
            # the parent's turns the fork ran again (by number), not all after the fork point
            theirs_read = split_turns(parent)
            stop = _stop_of(theirs_read, _last_turn(reading))
            (row["parent_requests"], row["parent_processed_tokens"],
             row["parent_limit_hits"]) = _costs(theirs_read, start - 1, stop)  # fmt: skip
            row["parent_answer"] = _answer(parent.records, start - 1, stop)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(FORK_COLUMNS))
    for name in ("fork_turn", "edited_call", "first_difference", "replayed", "requests",
                 "processed_tokens", "parent_requests", "parent_processed_tokens", "limit_hits",
                 "parent_limit_hits", "warm_prefix", "warm_reused",
                 "warm_prefilled"):  # fmt: skip
        frame[name] = frame[name].astype("Int64")
    frame["warm_share"] = frame["warm_share"].astype("Float64")
    for name in ("session", "parent_session", "parent_path", "fork_point", "settings",
                 "answer", "parent_answer", "warm", "warm_detail"):  # fmt: skip
        frame[name] = frame[name].astype("string")
    frame["same_answer"] = (frame["answer"] == frame["parent_answer"]).astype("boolean")
    return frame


def _last_turn(reading: Reading) -> int | None:
    """The number of the fork's last turn of its own (``None``: it ran none yet)."""
    numbers = [t.number for t in reading.turns if t.number is not None and not t.from_parent]
    return max(numbers, default=None)


def _stop_of(reading: Reading, number: int | None) -> int | None:
    """The index after the last record of turn ``number`` of ``reading`` (``None``: the end:
    the fork ran no turn of its own, or more turns than the parent has)."""
    for turn in reading.turns:
        if turn.number == number:
            return turn.stop
    return None


def _parent(log: Log, forked: dict[str, Any], logs: dict[str, Log]) -> Log | None:
    """A fork's parent: the log of its session among those read, else the file its fork
    names (read against the fork's folder), ``None`` when it cannot be read."""
    known = logs.get(forked["parent_session"])
    if known is not None:
        return known
    path = Path(forked["parent_path"])
    path = path if path.is_absolute() else Path(log.path).parent / path
    try:
        return open_log(path)  # the one source iterator's reading of a file
    except SessionError:
        return None
