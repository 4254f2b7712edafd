"""The ``forks`` frame: one row per fork among the logs, where it first differs from its
parent and how its answer, usage and limit hits compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import SessionError
from ..session import Session, first_difference, read_log
from ._build import Source, find_logs

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
    "requests": "the fork's own completions (after the copy)",
    "prompt_tokens": "prompt tokens processed by its own completions (timings.prompt_n)",
    "parent_requests": "the parent's completions after the fork point",
    "parent_prompt_tokens": "prompt tokens the parent processed after the fork point",
    "limit_hits": "the fork's own LimitHit records",
    "parent_limit_hits": "the parent's LimitHit records after the fork point",
    "answer": "the fork's last answer (content of its last Assistant without tool calls)",
    "parent_answer": "the parent's last answer after the fork point",
    "same_answer": "answer == parent_answer",
}
"""The columns of :func:`forks`, with what each holds."""


def _answer(records: list[dict[str, Any]]) -> str | None:
    for r in reversed(records):
        if r["type"] == "assistant" and not r.get("tool_calls"):
            return str(r.get("content") or "")
    return None


def _usage(records: list[dict[str, Any]]) -> tuple[int, int, int]:
    usages = [r for r in records if r["type"] == "usage"]
    prompt = sum(int((r.get("timings") or {}).get("prompt_n", 0)) for r in usages)
    return len(usages), prompt, sum(1 for r in records if r["type"] == "limit_hit")


def forks(source: Source) -> pd.DataFrame:
    """One row per fork among the logs of ``source`` (files, folders, sessions); logs that
    are no fork are left out. Columns: :data:`FORK_COLUMNS`. The parent is read from the path
    its fork names; a parent that cannot be read leaves its columns ``<NA>``.

    Raises:
        SessionError: a log of ``source`` cannot be read.
    """
    rows = []
    for item in find_logs(source):
        path = item.path if isinstance(item, Session) else Path(item)
        data = read_log(path, repair=False)
        if not data.records or data.records[0]["type"] != "forked":
            continue
        forked = data.records[0]
        start = int(forked["record"])  # records[start:] are the fork's own
        own = data.records[start:]
        row: dict[str, Any] = {
            "session": data.session_id,
            "parent_session": forked["parent_session"],
            "parent_path": forked["parent_path"],
            "fork_turn": forked["turn"],
            "fork_point": forked["point"],
            "edited_call": forked.get("edited_call"),
            "settings": json.dumps(forked.get("settings") or {}, sort_keys=True),
            "replayed": sum(1 for r in own if r.get("source") == "replayed"),
        }
        row["requests"], row["prompt_tokens"], row["limit_hits"] = _usage(own)
        row["answer"] = _answer(own)
        parent_path = Path(forked["parent_path"])
        parent_path = parent_path if parent_path.is_absolute() else path.parent / parent_path
        try:
            parent = read_log(parent_path, repair=False).records
        except SessionError:
            parent = None
        if parent is not None:
            theirs = parent[start - 1 :]
            # an edited result stands where the parent's own result was
            at = first_difference(own, theirs)
            row["first_difference"] = None if at is None else start + at + 1
            (row["parent_requests"], row["parent_prompt_tokens"],
             row["parent_limit_hits"]) = _usage(theirs)  # fmt: skip
            row["parent_answer"] = _answer(theirs)
        rows.append(row)
    frame = pd.DataFrame(rows, columns=list(FORK_COLUMNS))
    for name in ("fork_turn", "edited_call", "first_difference", "replayed", "requests",
                 "prompt_tokens", "parent_requests", "parent_prompt_tokens", "limit_hits",
                 "parent_limit_hits"):  # fmt: skip
        frame[name] = frame[name].astype("Int64")
    for name in ("session", "parent_session", "parent_path", "fork_point", "settings",
                 "answer", "parent_answer"):  # fmt: skip
        frame[name] = frame[name].astype("string")
    frame["same_answer"] = (frame["answer"] == frame["parent_answer"]).astype("boolean")
    return frame
