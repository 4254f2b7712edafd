"""Named, ordered upgrade steps of the session log format (after simonw/llm's ``migrations.py``).

A log's first line (the baseline) carries ``"schema"``: the format version it was written in.
Readers (:func:`boxmaker.session.read_log`, and through it :class:`~boxmaker.session.Session`,
the frames and the widgets) bring every older log up to
:data:`~boxmaker.records.SCHEMA_VERSION` on read, in memory, by running the steps below in
order; ``boxmaker log upgrade PATH`` writes the result back. Each step takes the record
objects of one schema (the JSON objects after the baseline, as read) and returns those of the
next; a step never drops or adds a record, so line numbers stay those of the file.

Steps::

    1 -> 2  tool_result_not_run   ToolResult.not_run from the texts schema 1 wrote
    2 -> 3  group_framing         none to change: older logs have no groups (each line
                                  stands alone); from 3 on, ``"group": n`` frames a write
    3 -> 4  fork_origin           none to change: older logs are no forks (no ``forked``
                                  record) and their tool results all came from their tools
                                  (``ToolResult.source`` reads as ``None``)

Adding a format change: bump ``SCHEMA_VERSION`` in :mod:`boxmaker.records`, append one step
here, and keep a log of the old schema in ``tests/data/`` (the tests read each one).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..records import SCHEMA_VERSION

__all__ = ["MIGRATIONS", "Migration", "upgrade"]

Records = list[dict[str, Any]]


@dataclass(frozen=True)
class Migration:
    """One upgrade step: records of schema ``source`` -> records of schema ``source + 1``.

    Attributes:
        source: the schema the step reads.
        name: a short name (``snake_case``) shown by ``boxmaker log upgrade``.
        upgrade: the step; takes and returns the records after the baseline (JSON objects),
            as many as it was given, in the same order; it may change them in place.
    """

    source: int
    name: str
    upgrade: Callable[[Records], Records]


# -- schema 1 -> 2 -------------------------------------------------------------------------------

_V1_ALREADY_MADE = (
    "This call was already made with these arguments in this turn, so it was not run again. "
    "Use the earlier result."
)
_V1_NOT_RUN = "This call was not run: the turn ended ("


def _v1_reason(content: str, limit: str | None) -> str | None:
    """Why schema 1 answered a call without running it, from the text it wrote then (the only
    place the loop's words are read back: schema 2 records the reason as data)."""
    if content == _V1_ALREADY_MADE:
        return "repeat"
    if not content.startswith(_V1_NOT_RUN):
        return None
    if limit in ("tool_iterations", "repeated_call"):
        return limit
    return "cancelled"


def _tool_result_not_run(records: Records) -> Records:
    """Schema 1 said "not run" only in the result text; schema 2 has ``not_run``.

    A call answered without running gets the reason: ``repeat`` for the first repeat, the limit
    of the ``LimitHit`` that follows it in the same turn (``tool_iterations``,
    ``repeated_call``), else ``cancelled``. Every other tool result gets ``not_run: null``.
    """
    for i, rec in enumerate(records):
        if type(rec) is not dict or rec.get("type") != "tool_result" or "not_run" in rec:
            continue
        content = rec.get("content")
        if not isinstance(content, str):
            rec["not_run"] = None
            continue
        # only a result that was not run needs the look ahead (the frames read every log
        # through this step: no copy of the rest of the log per tool result)
        limit = _limit_after(records, i) if content.startswith(_V1_NOT_RUN) else None
        rec["not_run"] = _v1_reason(content, limit)
    return records


def _limit_after(records: Records, i: int) -> str | None:
    """The kind of the ``LimitHit`` after ``records[i]`` and before the next message."""
    for j in range(i + 1, len(records)):
        later = records[j]
        kind = later.get("type") if type(later) is dict else None
        if kind in ("user", "assistant"):
            break
        if kind == "limit_hit":
            found = later.get("kind")
            return found if isinstance(found, str) else None
    return None


# -- schema 2 -> 3 -------------------------------------------------------------------------------


def _group_framing(records: Records) -> Records:
    """Schema 3 frames records written together (``"group": n`` on the first line of a
    group, read by the reader and removed); a log of schema 2 or older has no group, each
    line a record of its own, which schema 3 reads the same way: nothing to change."""
    return records


# -- schema 3 -> 4 -------------------------------------------------------------------------------


def _fork_origin(records: Records) -> Records:
    """Schema 4 adds forks: a ``forked`` record first in a fork's log, ``ToolResult.source``
    (``replayed``, ``edited``) and the outcome and reason ``diverged``. A log of schema 3 or
    older is no fork and holds none of them: its results read with ``source: None`` (the
    tool's own), so nothing changes."""
    return records


MIGRATIONS: tuple[Migration, ...] = (
    Migration(source=1, name="tool_result_not_run", upgrade=_tool_result_not_run),
    Migration(source=2, name="group_framing", upgrade=_group_framing),
    Migration(source=3, name="fork_origin", upgrade=_fork_origin),
)
"""Every step, in order; ``MIGRATIONS[k].source == k + 1``."""


def upgrade(schema: object, records: Records) -> tuple[Records, list[str]]:
    """Bring the records of a log written in ``schema`` up to the current schema.

    Args:
        schema: the log's ``schema`` (1 to :data:`~boxmaker.records.SCHEMA_VERSION`).
        records: the JSON objects after the baseline; changed in place.

    Returns:
        The upgraded records and the names of the steps run (empty for a current log).

    Raises:
        ValueError: ``schema`` is not one this version can read (the message says which it
            reads).
    """
    if type(schema) is not int or not 1 <= schema <= SCHEMA_VERSION:
        raise ValueError(
            f"log schema {schema!r} is not readable by this version (reads 1 to {SCHEMA_VERSION})"
        )
    done: list[str] = []
    for step in MIGRATIONS[schema - 1 :]:
        records = step.upgrade(records)
        done.append(step.name)
    return records, done
