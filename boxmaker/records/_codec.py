"""Records to and from the JSON objects of a log's lines (:func:`record_to_json`,
:func:`records_from_json`, :func:`baseline_from_json`), each line checked by the rule first."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ._rules import RULES, check_baseline, check_records
from ._types import (
    NAME_OF,
    TYPE_OF,
    Baseline,
    Record,
    ToolCall,
    Unknown,
    Usage,
    format_time,
    parse_time,
    utc_now,
)

__all__ = [
    "baseline_from_json",
    "record_from_json",
    "record_to_json",
    "records_from_json",
]


def record_to_json(record: Record | Baseline) -> dict[str, Any]:
    """The JSON object of one log line: ``{"type": ..., "time": ..., <fields>}``.

    A :class:`Baseline` gives ``{"type": "baseline", ...}`` without ``schema`` and
    ``session_id`` (the session adds those). An :class:`Unknown` gives back what was read.
    """
    if isinstance(record, Unknown):
        return dict(record.data)
    out: dict[str, Any] = {
        "type": "baseline" if isinstance(record, Baseline) else NAME_OF[type(record)]
    }
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        if f.name == "time":
            out["time"] = format_time(value)
        elif f.name == "tool_calls":
            out["tool_calls"] = [
                {"id": c.id, "name": c.name, "arguments": c.arguments} for c in value
            ]
        elif f.name in ("tools", "timings", "settings"):
            out[f.name] = [dict(t) for t in value] if f.name == "tools" else dict(value)
        elif f.name == "thinking_capped" and value is None:
            continue  # unknown: left out, as another writer's line has it (older readers
            # refuse a null there, and read the absent flag as they always did)
        else:
            out[f.name] = value
    return out


def record_from_json(data: Mapping[str, Any]) -> Record:
    """Build a record from one log line's JSON object, checked by :data:`RULES` first.

    A ``type`` this version does not know gives an :class:`Unknown` record holding the data.

    Raises:
        RecordError: the line breaks the log's rule (a missing or malformed field, a value
            outside its ``Literal``, a bad time; the message says which); a ``ValueError``.
    """
    return records_from_json([data])[0]


def records_from_json(items: Sequence[Any]) -> list[Record]:
    """Build the records of a log's lines after the baseline (JSON values, in file order),
    checked by :func:`check_records` first.

    Raises:
        RecordError: as :func:`check_records` (``index`` is the position in ``items``).
    """
    check_records(items)
    return [_build(item) for item in items]


def _build(data: Mapping[str, Any]) -> Record:
    """The record of a line that :func:`check_records` accepted."""
    time = parse_time(data["time"])
    cls = TYPE_OF.get(data["type"])
    if cls is None:
        return Unknown(type=data["type"], data=dict(data), time=time)
    kwargs: dict[str, Any] = {}
    if cls is Usage:  # absent is unknown (the frames read it so), not the writer's default
        kwargs.update(reasoning_tokens=None, thinking_capped=None)
    for rule in RULES[data["type"]]:
        if rule.name == "time" or rule.name not in data:
            continue
        value = data[rule.name]
        if rule.items is not None and rule.name == "tool_calls":
            value = tuple(ToolCall(**{r.name: c[r.name] for r in rule.items}) for c in value)
        kwargs[rule.name] = value
    record: Record = cls(time=time, **kwargs)
    return record


def baseline_from_json(data: Mapping[str, Any]) -> Baseline:
    """Build the :class:`Baseline` from a log's first line, checked by :func:`check_baseline`.

    A baseline without ``time`` gets the time of reading.

    Raises:
        RecordError: the line is not a baseline, or its fields are malformed (a
            ``ValueError``).
    """
    check_baseline(data)
    time_text = data.get("time")
    time = parse_time(time_text) if isinstance(time_text, str) else utc_now()
    tools = data.get("tools", [])
    return Baseline(system=data.get("system", ""), tools=tuple(dict(t) for t in tools), time=time)
