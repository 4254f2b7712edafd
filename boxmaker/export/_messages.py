"""The conversations of session logs as a Parquet table for training: one row per session,
its ``messages`` in the OpenAI chat shape that chat templates and trainers read (what the
session sent, :func:`boxmaker.session.message_of`), each flagged ``from_parent`` where a fork
copied it from its parent, and the ``tools`` offered (JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..records import baseline_from_json, records_from_json
from ..session import Log, message_of, split_turns

__all__ = ["MESSAGE_COLUMNS", "MessagesWriter", "message_row"]

MESSAGE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("session", "string", "the session id"),
    (
        "messages",
        "list of {role, content, reasoning_content, tool_calls, tool_call_id, from_parent}",
        "the conversation as sent to the server (OpenAI chat shape; tool_calls as "
        "{id, type, function: {name, arguments}}, arguments the model's text); the system "
        "prompt first when there is one; from_parent: a fork's copy of its parent's message",
    ),
    ("tools", "string", "the tools offered, as the request's JSON list"),
    ("parent_session", "string", "the session a fork branched from (null: no fork)"),
    ("copied_messages", "int64", "messages a fork copied from its parent (0: no fork)"),
)
"""The columns of ``messages.parquet``: name, type, meaning."""


def message_row(log: Log) -> dict[str, Any]:
    """One session's row of ``messages.parquet`` (see :data:`MESSAGE_COLUMNS`)."""
    baseline = baseline_from_json(log.head)
    records = records_from_json(log.records)
    copied = split_turns(log).copied
    out: list[dict[str, Any]] = []
    if baseline.system:
        out.append(_message({"role": "system", "content": baseline.system}, False))
    for index, record in enumerate(records):
        message = message_of(record)
        if message is not None:
            out.append(_message(message, index < copied))
    first = log.records[0] if log.records else None
    parent = first["parent_session"] if copied and first is not None else None
    return {
        "session": log.session,
        "messages": out,
        "tools": json.dumps([dict(t) for t in baseline.tools], ensure_ascii=False),
        "parent_session": parent,
        "copied_messages": sum(m["from_parent"] for m in out),
    }


def _message(message: dict[str, Any], from_parent: bool) -> dict[str, Any]:
    return {
        "role": message["role"],
        "content": message.get("content"),
        "reasoning_content": message.get("reasoning_content"),
        "tool_calls": message.get("tool_calls"),
        "tool_call_id": message.get("tool_call_id"),
        "from_parent": from_parent,
    }


def _schema() -> Any:
    import pyarrow as pa

    call = pa.struct(
        [
            ("id", pa.string()),
            ("type", pa.string()),
            ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("reasoning_content", pa.string()),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", pa.string()),
            ("from_parent", pa.bool_()),
        ]
    )
    fields = [
        pa.field("session", pa.string()),
        pa.field("messages", pa.list_(message)),
        pa.field("tools", pa.string()),
        pa.field("parent_session", pa.string()),
        pa.field("copied_messages", pa.int64()),
    ]
    docs = {name: doc for name, _, doc in MESSAGE_COLUMNS}
    return pa.schema(
        [f.with_metadata({"doc": docs[f.name]}) for f in fields],
        metadata={b"boxmaker.table": b"messages"},
    )


class MessagesWriter:
    """``messages.parquet``, written a row group of ``batch`` sessions at a time (the logs
    are read one at a time); a context manager.

    Args:
        path: the file to write.
        batch: sessions per row group.
    """

    def __init__(self, path: Path, *, batch: int = 256) -> None:
        import pyarrow.parquet as pq

        self.schema = _schema()
        self.batch = batch
        self.rows: list[dict[str, Any]] = []
        self.written = 0
        self._writer = pq.ParquetWriter(path, self.schema)

    def add(self, row: dict[str, Any]) -> None:
        """One session's row (:func:`message_row`)."""
        self.rows.append(row)
        if len(self.rows) >= self.batch:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa

        self._writer.write_table(pa.Table.from_pylist(self.rows, schema=self.schema))
        self.written, self.rows = self.written + len(self.rows), []

    def close(self) -> None:
        """Write what is left (an empty table when no session came) and close the file."""
        if self.rows or not self.written:
            self._flush()
        self._writer.close()

    def __enter__(self) -> MessagesWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
