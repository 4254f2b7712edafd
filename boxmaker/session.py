"""An append-only session log on disk (JSON Lines), its baseline, and ``messages()``.

File layout: ``<directory>/<session_id>.jsonl``, one JSON object per line (see
:mod:`boxmaker.records`). The first line is the baseline with the log format version::

    {"type": "baseline", "schema": 1, "session_id": "20261130T070102Z-3f9a1c2e", "time": ...,
     "system": "You are ...", "tools": [...]}

Every append writes one whole line, flushes and fsyncs it, so a record that
:meth:`Session.append` returned from survives a killed process. A process killed in the middle
of a write leaves a torn last line (no newline): :meth:`Session.open` drops it with a warning
that says what was dropped, keeps the dropped bytes in ``<log>.torn``, and the earlier records
are intact. A corrupt line anywhere else raises :class:`SessionError` naming file and line.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .errors import SessionError
from .records import (
    SCHEMA_VERSION,
    Assistant,
    Baseline,
    Record,
    ToolResult,
    Unknown,
    Usage,
    User,
    baseline_from_json,
    record_from_json,
    record_to_json,
    utc_now,
)

__all__ = ["Session", "messages", "new_session_id", "wire_arguments"]

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_session_id() -> str:
    """A fresh session id, safe as a file name: ``YYYYmmddTHHMMSSZ-<8 hex digits>``."""
    return f"{utc_now():%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def wire_arguments(arguments: str) -> str:
    """The arguments text to send back to the server for a logged tool call.

    The model's text is kept when it is a JSON object; anything else (not JSON, or JSON that is
    not an object) becomes ``"{}"``: llama.cpp parses the arguments of every tool call in the
    history and answers HTTP 500 to one that is not valid JSON, on every retry.
    """
    try:
        value = json.loads(arguments)
    except ValueError:
        return "{}"
    return arguments if isinstance(value, dict) else "{}"


def messages(baseline: Baseline, records: Iterable[Record]) -> list[dict[str, Any]]:
    """The OpenAI chat-completions ``messages`` for a session's records.

    System prompt from the baseline (when not empty), then ``User`` -> ``{"role": "user"}``,
    ``Assistant`` -> ``{"role": "assistant", "content", "reasoning_content"?, "tool_calls"?}``,
    ``ToolResult`` -> ``{"role": "tool", "tool_call_id", "content"}``; ``Usage``,
    ``CacheLoss``, ``LimitHit`` and unknown records are not messages. The result depends on the
    records only (no time, no state), so a session that grows by appending gives messages that
    extend the previous ones: the prefix property llama.cpp's prompt cache relies on.
    ``reasoning_content`` is sent back because llama.cpp reuses the cache of a follow-up
    request inside a turn only when the template re-renders the same reasoning.
    """
    out: list[dict[str, Any]] = []
    if baseline.system:
        out.append({"role": "system", "content": baseline.system})
    for r in records:
        if isinstance(r, User):
            out.append({"role": "user", "content": r.content})
        elif isinstance(r, Assistant):
            msg: dict[str, Any] = {"role": "assistant", "content": r.content or ""}
            if r.reasoning:
                msg["reasoning_content"] = r.reasoning
            if r.tool_calls:
                msg["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": wire_arguments(c.arguments)},
                    }
                    for c in r.tool_calls
                ]
            out.append(msg)
        elif isinstance(r, ToolResult):
            out.append({"role": "tool", "tool_call_id": r.tool_call_id, "content": r.content})
    return out


class Session:
    """An append-only log of records on disk (JSON Lines); thread-safe appends.

    Create one with :meth:`create` or reopen one with :meth:`open`; use it as a context
    manager (or call :meth:`close`) to release the file.

    Attributes:
        path: the log file.
        id: the session id (the file's stem).
        baseline: the system prompt and tools every request starts with.
        schema: the log format version read from the first line.
    """

    def __init__(
        self, path: Path, session_id: str, baseline: Baseline, records: list[Record], schema: int
    ) -> None:
        """Internal: use :meth:`create` or :meth:`open`."""
        self.path = path
        self.id = session_id
        self.baseline = baseline
        self.schema = schema
        self._records = records
        self._lock = threading.Lock()
        self._fh: Any = None
        self._read_only = False

    # -- creation -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        baseline: Baseline | None = None,
        *,
        session_id: str | None = None,
    ) -> Session:
        """Start a new log ``<directory>/<session_id>.jsonl`` holding the baseline.

        Args:
            directory: where the log goes; created when missing.
            baseline: system prompt and tools (default: empty system prompt, no tools).
            session_id: a name safe as a file name (letters, digits, ``.``, ``_``, ``-``,
                at most 128 characters); default :func:`new_session_id`.

        Raises:
            SessionError: the id is unsafe, the log exists already, or it cannot be written.
        """
        baseline = baseline or Baseline()
        if not isinstance(baseline, Baseline):
            raise SessionError(f"baseline must be a Baseline, not {type(baseline).__name__}")
        sid = new_session_id() if session_id is None else session_id
        if not _SAFE_ID.fullmatch(sid):
            raise SessionError(f"session id {sid!r} is not safe as a file name")
        folder = Path(directory)
        path = folder / f"{sid}.jsonl"
        head = record_to_json(baseline)
        head = {"type": "baseline", "schema": SCHEMA_VERSION, "session_id": sid, **head}
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SessionError(f"{folder}: cannot create the session directory: {exc}") from exc
        try:
            with path.open("x", encoding="utf-8") as fh:
                fh.write(_dumps(head) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        except FileExistsError as exc:
            raise SessionError(f"{path}: a session log with this id exists already") from exc
        except OSError as exc:
            raise SessionError(f"{path}: cannot create session log: {exc}") from exc
        return cls(path, sid, baseline, [], SCHEMA_VERSION)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, repair: bool = True) -> Session:
        """Reopen a log written by :meth:`create` and :meth:`append`.

        A last line without a newline is kept when it is a whole record (the newline is added
        when ``repair``). Otherwise it is a torn line (the process was killed mid-write): it is
        dropped with a :class:`UserWarning` that says what was dropped, and, when ``repair``,
        its bytes are appended to ``<log>.torn`` and the log is cut back to its last whole
        line so later appends stay well formed. Records of unknown type are kept as
        ``Unknown`` with a warning.

        Args:
            path: the ``.jsonl`` log.
            repair: fix a torn or unterminated last line on disk (for a session you will
                append to). ``False`` opens read-only: the file is not touched (safe on a log
                another process is writing) and :meth:`append` raises :class:`SessionError`.

        Raises:
            SessionError: the file cannot be read, its first line is not a baseline, its schema
                or session id is not valid for this version, or a line other than a torn last
                one is corrupt (the message names file and line).
        """
        p = Path(path)
        try:
            raw = p.read_bytes()
        except OSError as exc:
            raise SessionError(f"{p}: cannot read session log: {exc}") from exc
        end = raw.rfind(b"\n") + 1
        if end < len(raw):
            tail = raw[end:]
            if _whole_record(tail):
                raw += b"\n"
                if repair:
                    _append_bytes(p, b"\n")
            else:
                _drop_torn(p, tail, end, repair)
                raw = raw[:end]
        lines = raw.split(b"\n")[:-1] if raw else []
        if not lines:
            raise SessionError(f"{p}: empty session log (no baseline line)")
        head = _load_line(p, 1, lines[0])
        try:
            baseline = baseline_from_json(head)
        except ValueError as exc:
            raise SessionError(f"{p}:1: {exc}") from exc
        schema = head.get("schema")
        if type(schema) is not int or not 1 <= schema <= SCHEMA_VERSION:
            raise SessionError(
                f"{p}:1: log schema {schema!r} is not readable by this version "
                f"(reads 1 to {SCHEMA_VERSION})"
            )
        sid = head.get("session_id", p.stem)
        if not isinstance(sid, str) or not _SAFE_ID.fullmatch(sid):
            raise SessionError(f"{p}:1: session id {sid!r} is not safe as a file name")
        records: list[Record] = []
        unknown: set[str] = set()
        for number, line in enumerate(lines[1:], start=2):
            data = _load_line(p, number, line)
            try:
                record = record_from_json(data)
            except ValueError as exc:
                raise SessionError(f"{p}:{number}: {exc}") from exc
            if isinstance(record, Unknown):
                unknown.add(record.type)
            records.append(record)
        if unknown:
            warnings.warn(
                f"{p}: records of unknown type kept as Unknown: {', '.join(sorted(unknown))}",
                stacklevel=2,
            )
        session = cls(p, sid, baseline, records, schema)
        session._read_only = not repair
        return session

    # -- reading ------------------------------------------------------------------------------

    @property
    def records(self) -> tuple[Record, ...]:
        """The records after the baseline, oldest first (a snapshot)."""
        with self._lock:
            return tuple(self._records)

    def messages(self) -> list[dict[str, Any]]:
        """The OpenAI ``messages`` of the whole session; see :func:`messages`."""
        return messages(self.baseline, self.records)

    def next_call(self) -> int:
        """The next tool-call number of the session (1, 2, ...); stable across reopen."""
        with self._lock:
            calls = [r.call for r in self._records if isinstance(r, ToolResult)]
        return max(calls, default=0) + 1

    def last_usage(self) -> Usage | None:
        """The latest :class:`Usage` record, or ``None`` when there is none."""
        with self._lock:
            for r in reversed(self._records):
                if isinstance(r, Usage):
                    return r
        return None

    # -- writing ------------------------------------------------------------------------------

    def append(self, record: Record) -> Record:
        """Write one record as one line, flushed and fsynced, then keep it in memory.

        Returns the record. Raises:
            SessionError: the log cannot be written (the record is then not kept).
        """
        line = _dumps(record_to_json(record)) + "\n"
        with self._lock:
            if self._read_only:
                raise SessionError(f"{self.path}: opened read-only (repair=False)")
            try:
                if self._fh is None:
                    self._fh = self.path.open("a", encoding="utf-8")
                self._fh.write(line)
                self._fh.flush()
                os.fsync(self._fh.fileno())
            except OSError as exc:
                raise SessionError(f"{self.path}: cannot append record: {exc}") from exc
            self._records.append(record)
        return record

    def extend(self, records: Sequence[Record]) -> None:
        """Append several records in order (each one written as :meth:`append` does)."""
        for r in records:
            self.append(r)

    def close(self) -> None:
        """Close the log file (appending again reopens it)."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, path={str(self.path)!r}, records={len(self._records)})"


def _dumps(obj: dict[str, Any]) -> str:
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: keep them, as JSON escapes
        text = json.dumps(obj, ensure_ascii=True, separators=(",", ":"))
    return text


def _whole_record(tail: bytes) -> bool:
    try:
        data = json.loads(tail)
    except ValueError:
        return False
    return isinstance(data, dict) and "type" in data and "time" in data


def _append_bytes(path: Path, data: bytes) -> None:
    try:
        with path.open("ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise SessionError(f"{path}: cannot repair the last line: {exc}") from exc


def _load_line(path: Path, number: int, line: bytes) -> dict[str, Any]:
    try:
        data = json.loads(line)
    except ValueError as exc:
        raise SessionError(f"{path}:{number}: corrupt line ({exc}): {line[:80]!r}") from exc
    if not isinstance(data, dict):
        raise SessionError(f"{path}:{number}: line is not a JSON object: {line[:80]!r}")
    return data


def _drop_torn(path: Path, torn: bytes, keep: int, repair: bool) -> None:
    side = path.with_name(path.name + ".torn")
    if repair:
        try:
            with side.open("ab") as fh:
                fh.write(torn + b"\n")
            with path.open("r+b") as fh:
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise SessionError(
                f"{path}: torn last line that could not be set aside: {exc}"
            ) from exc
    kept = f"; the bytes are kept in {side.name}" if repair else " (read-only: file untouched)"
    warnings.warn(
        f"{path}: dropped a torn last line ({len(torn)} bytes, a write cut short: "
        f"{torn[:60]!r}){kept}",
        stacklevel=3,
    )
