"""The session log file: one reader, one locked writer, and the atomic upgrade.

A log is JSON Lines (one JSON object per line, UTF-8, ``\\n``-terminated); the first line is
the baseline with ``"schema"`` and ``"session_id"``, every later line one record (see
:mod:`boxmaker.records`). This module knows the file, not the record types:

- :func:`read_log`: the only reader. Every consumer (:class:`~boxmaker.session.Session`, the
  frames, the widgets) reads through it, so they accept and refuse the same logs: a torn last
  line is dropped with a :class:`LogReadWarning` (and set aside in ``<log>.torn`` when
  repairing), the first line must be a baseline of a schema this version reads, older
  schemas are upgraded in memory by :mod:`boxmaker.session`, every line is checked by the
  records' one rule (:data:`boxmaker.records.RULES`), and a line that repeats an earlier record
  (the same JSON value: a record written twice) is read once, with a warning. The whole file is
  parsed in one call (the frames' speed relies on it): :func:`boxmaker._json.loads`, orjson
  where it reads as :func:`json.loads` does.
- :class:`LogWriter`: the one writer of a log. It holds an exclusive ``flock`` on the file for
  as long as it is open, so a second writer (another process, or the same one) is refused with
  :class:`~boxmaker.errors.SessionError` naming the holder's pid; readers never lock. Each
  append is one ``write`` of the whole line on an unbuffered descriptor, then ``fsync``
  (unless the caller groups appends: ``sync=False``, then one ``fsync`` by :meth:`LogWriter.sync`
  or :meth:`LogWriter.close` makes them all durable); a write that fails (a full disk) is cut
  back with ``ftruncate``, so the file is exactly as before it and no stray bytes land later.
- :func:`upgrade_log`: rewrites an older log in the current schema, atomically (a new file
  beside it, ``fsync``, ``rename``), holding the writer's lock.

What a kill loses: nothing that :meth:`LogWriter.append` returned from (it was written whole
by one ``write``: the kernel holds it whatever becomes of the process; and it was fsynced,
or is by the next :meth:`LogWriter.sync` or :meth:`LogWriter.close` when the caller grouped
it, so a crash of the machine loses none of it after that); a kill in the middle of a write
leaves a torn last line, dropped on the next read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _json
from ..errors import LogBusy, LogReadWarning, SessionError
from ..records import SCHEMA_VERSION, SESSION_ID, RecordError, check_baseline, check_records
from ._groups import GROUP_MARK, GroupError, whole_groups
from ._migrations import upgrade
from ._safe import open_fresh, open_owned

__all__ = ["LogData", "LogReadWarning", "LogWriter", "dumps_line", "read_log", "upgrade_log"]


@dataclass(frozen=True)
class LogData:
    """One log as read by :func:`read_log`.

    Attributes:
        path: the file.
        head: the baseline line's JSON object, as written (its ``schema`` is the file's).
        schema: the schema the file was written in (``head["schema"]``).
        records: the JSON objects of the lines after the baseline, upgraded to the current
            schema and checked by :data:`boxmaker.records.RULES`, each line once:
            ``records[i]`` is line ``i + 2`` of the file unless a duplicated line came before.
        migrated: the names of the :mod:`boxmaker.session` steps run (empty when current).
        session_id: the baseline's ``session_id`` (the file's stem when it has none), safe
            as a file name.
    """

    path: Path
    head: dict[str, Any]
    schema: int
    records: list[Any]
    migrated: tuple[str, ...]
    session_id: str = ""


def read_log(path: str | os.PathLike[str], *, repair: bool = False) -> LogData:
    """Read a session log: torn-tail handling, head and schema checks, migrations.

    A last line without ``\\n`` is kept when it is a whole record (the ``\\n`` is added on disk
    when ``repair``); otherwise it is a torn write, dropped with a :class:`LogReadWarning`
    saying what was dropped, and, when ``repair``, its bytes are appended to ``<log>.torn``
    and the log is cut back to its last whole line. Records written together are framed
    (:mod:`boxmaker.session`'s ``_groups``, schema 3): a group cut short at the end of the
    file is dropped whole the same way, so a reader sees every record of a group or none.

    Args:
        path: the ``.jsonl`` log.
        repair: fix a torn or unterminated last line on disk. Only the log's writer may
            (:class:`LogWriter` holds the lock); ``False`` never touches the file.

    A line that repeats an earlier record (the same JSON value) is a record written twice
    (every record carries its time to the microsecond): it is dropped, with a
    :class:`LogReadWarning` naming its line and the one it repeats, so each record is read once.

    Returns:
        The :class:`LogData`, its records checked by the records' one rule
        (:func:`boxmaker.records.check_records`).

    Raises:
        SessionError: the file cannot be read; it is empty; a line other than a torn last one
            is not JSON or is nested too deeply (the message names file and line); the first
            line is not a baseline object, breaks its rule or has an unsafe session id; its
            schema is not one this version reads; a group marker is malformed, or a group is
            cut short in the middle of the log; a record breaks the rule of
            :data:`boxmaker.records.RULES` (the message names file, line, field and value).
    """
    p = Path(path)
    try:
        raw = on_disk = p.read_bytes()
    except OSError as exc:
        raise SessionError(f"{p}: cannot read session log: {exc}") from exc
    end = raw.rfind(b"\n") + 1
    torn, unterminated = b"", False
    if end < len(raw):
        tail = raw[end:]
        if _whole_record(tail):
            raw += b"\n"
            unterminated = True
        else:
            torn, raw = tail, raw[:end]
    count = raw.count(b"\n")
    if not count:
        raise SessionError(f"{p}: empty session log (no baseline line)")
    # One parse for the whole file: the lines joined into a JSON array. A line that is not one
    # JSON value gives an error or a different count; then each line is parsed alone to name
    # the first bad one.
    lines = loads_lines(raw, count)
    if len(lines) != count:
        lines = [_load_line(p, n, line) for n, line in enumerate(raw.split(b"\n")[:-1], 1)]
    head = lines[0]
    if type(head) is not dict or head.get("type") != "baseline":
        raise SessionError(f"{p}:1: first line is not a baseline record")
    records = lines[1:]
    try:  # no marker's text in the file (older logs, single appends): no group to look at
        whole = whole_groups(records) if GROUP_MARK in raw else len(records)
    except GroupError as exc:
        raise SessionError(f"{p}:{exc.line}: {exc}") from exc
    if whole < len(records):  # a group cut short: dropped whole, with what a torn line left
        cut = _line_start(raw, whole + 2, count)
        _drop_torn(p, on_disk[cut:], cut, repair, f"group of {len(records) - whole} lines")
        records = records[:whole]
    elif torn:
        _drop_torn(p, torn, end, repair, "last line")
    elif unterminated and repair:
        _append_bytes(p, b"\n")
    schema = head.get("schema")
    # repeats found before the upgrade: a step may read a record's neighbours (schema 1's
    # not_run looks ahead), so two copies of one line can differ once upgraded
    twice = _repeats(records)
    try:
        records, migrated = upgrade(schema, records)
        check_baseline(head)
    except ValueError as exc:
        raise SessionError(f"{p}:1: {exc}") from exc
    assert type(schema) is int  # upgrade() checked it
    sid = head.get("session_id", p.stem)
    if not SESSION_ID.fullmatch(sid):  # a str: check_baseline checked the one in the head
        raise SessionError(f"{p}:1: session id {sid!r} is not safe as a file name")
    try:
        check_records(records)
    except RecordError as exc:
        raise SessionError(f"{p}:{exc.index + 2}: {exc}") from exc
    records = _once(p, records, twice)
    return LogData(p, head, schema, records, tuple(migrated), sid)


def loads_lines(raw: bytes, count: int | None = None) -> list[Any]:
    """The JSON values of ``raw``'s ``\n``-terminated lines, in one parse (the lines joined
    into a JSON array), as :func:`read_log` reads a log; ``[]`` when they are not all JSON
    (``count``: the lines, when counted already)."""
    if not raw:
        return []
    try:
        lines: list[Any] = _json.loads(b"[" + raw[:-1].replace(b"\n", b",") + b"]")
    except (ValueError, RecursionError):
        return []
    return lines if len(lines) == (raw.count(b"\n") if count is None else count) else []


def _repeats(records: list[Any]) -> list[tuple[int, int]]:
    """``(record, the earlier record it repeats)`` index pairs of ``records`` as read (before
    any upgrade): the same JSON value, its microsecond ``time`` included (a record written
    twice). Records that are not objects with a string ``type`` and ``time`` are left to
    :func:`check_records`, which refuses them."""
    keys = [
        (r.get("type"), r.get("time"))
        if type(r) is dict and type(r.get("type")) is str and type(r.get("time")) is str
        else None
        for r in records
    ]
    if len(set(keys)) == len(keys):  # the usual case: no two records of a type share a time
        return []
    seen: dict[Any, list[int]] = {}
    twice: list[tuple[int, int]] = []
    for i, key in enumerate(keys):
        if key is None:
            continue
        same = seen.setdefault(key, [])
        earlier = next((j for j in same if records[j] == records[i]), None)
        if earlier is None:
            same.append(i)
        else:
            twice.append((i, earlier))
    return twice


def _once(path: Path, records: list[Any], twice: list[tuple[int, int]]) -> list[Any]:
    """``records`` without the repeats ``twice`` (from :func:`_repeats`, found before the
    upgrade), with a :class:`LogReadWarning` naming their lines."""
    if not twice:
        return records
    shown = ", ".join(f"line {i + 2} (= line {j + 2})" for i, j in twice[:5])
    more = f" and {len(twice) - 5} more" if len(twice) > 5 else ""
    warnings.warn(
        f"{path}: {len(twice)} duplicated line(s) read once: {shown}{more} (a record "
        "written twice: each record is counted once)",
        LogReadWarning,
        stacklevel=3,
    )
    dropped = {i for i, _ in twice}
    return [r for i, r in enumerate(records) if i not in dropped]


def dumps_line(obj: dict[str, Any]) -> bytes:
    """One log line: compact JSON, UTF-8 (lone surrogates kept as ``\\u`` escapes), ``\\n``.

    The text is the one of ``json.dumps(obj, ensure_ascii=False, separators=(",", ":"))``
    in meaning (the same JSON value, keys in the same order), made by orjson when it can
    (:func:`boxmaker._json.dumps`).
    """
    line = _json.dumps(obj)
    if line is not None:
        return line + b"\n"
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode("utf-8") + b"\n"
    except UnicodeEncodeError:
        return json.dumps(obj, ensure_ascii=True, separators=(",", ":")).encode() + b"\n"


class LogWriter:
    """The one writer of a log file: an exclusive lock while open, all-or-nothing appends.

    Args:
        path: the log.
        create: ``True``: make the file (it must not exist); ``False``: open an existing one;
            ``None``: open it, making it when missing (the batch manifest, which two runners
            may make at once).
        what: names the file in error messages (``"session log"``, ``"batch manifest"``).

    Raises:
        SessionError: the file exists (``create``) or does not (``create=False``), cannot be
            opened, is a symbolic link, not a regular file or not owned by this user
            (:mod:`boxmaker.session`'s ``_safe``: nothing is written through a planted link),
            or another writer holds it (:class:`~boxmaker.errors.LogBusy`, naming the log and
            the holder's pid).

    The lock is ``flock(LOCK_EX | LOCK_NB)`` on the log itself, held until :meth:`close`;
    ``<log>.writer`` holds the writer's pid while it is open (information for the error
    message; the lock is the truth, so a stale file is harmless). Holding the lock, the writer
    removes a ``<log>.upgrade`` left by a killed :func:`upgrade_log` (only a lock holder
    writes one, so any found is stale).
    """

    def __init__(
        self, path: Path, *, create: bool | None = False, what: str = "session log"
    ) -> None:
        self.path = path
        self.what = what
        self._unsynced = False  # appends with sync=False not yet fsynced
        flags = os.O_WRONLY | os.O_APPEND
        flags |= {True: os.O_CREAT | os.O_EXCL, False: 0, None: os.O_CREAT}[create]
        try:
            self._fd: int | None = open_owned(path, flags, what=what)
        except FileExistsError as exc:
            raise SessionError(f"{path}: a {what} with this id exists already") from exc
        except FileNotFoundError as exc:
            raise SessionError(f"{path}: cannot read {what}: {exc}") from exc
        except OSError as exc:
            raise SessionError(f"{path}: cannot open {what} for writing: {exc}") from exc
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._fd)
            self._fd = None
            holder = _holder(path)
            raise LogBusy(
                f"{path}: another writer has this {what} open ({holder}); a log has one "
                "writer at a time (open it read-only to look at it)",
                holder,
            ) from exc
        with contextlib.suppress(OSError, SessionError):  # information only
            fd = open_fresh(_info(path), what="writer's pid file")
            try:
                os.write(fd, f"{os.getpid()}\n".encode("ascii"))
            finally:
                os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_aside(path))  # a killed upgrade's copy (unlink never follows a link)

    @property
    def closed(self) -> bool:
        """The writer was closed (the lock released)."""
        return self._fd is None

    def size(self) -> int:
        """The log's size now, bytes.

        Raises:
            SessionError: the writer is closed.
        """
        if self._fd is None:
            raise SessionError(f"{self.path}: the {self.what} was closed")
        return os.fstat(self._fd).st_size

    def append(self, line: bytes, *, sync: bool = True) -> None:
        """Write ``line`` (whole lines, ``\\n``-terminated) and fsync it; all or nothing.

        Args:
            line: the bytes, written by one ``write`` (a process killed after it returned
                loses none of them).
            sync: ``False``: leave the ``fsync`` to the next :meth:`sync`, an append with
                ``sync``, or :meth:`close` (a group of appends, one ``fsync``; until then a
                crash of the machine, not of the process, may lose the line).

        Raises:
            SessionError: the writer is closed, or the write or fsync failed (a full disk,
                an I/O error); the file is then cut back to its size before the call.
        """
        fd = self._fd
        if fd is None:
            raise SessionError(f"{self.path}: the session log was closed")
        size = os.fstat(fd).st_size
        try:
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
            self._unsynced = not sync
        except OSError as exc:
            try:
                os.ftruncate(fd, size)
                os.fsync(fd)
            except OSError as undo:
                raise SessionError(
                    f"{self.path}: cannot append record ({exc}), and cutting the partial write "
                    f"back failed too ({undo}): the last line of the log may be torn"
                ) from exc
            raise SessionError(
                f"{self.path}: cannot append record: {exc}; the log is as it was before"
            ) from exc

    def owe_sync(self) -> None:
        """Have the next :meth:`sync` (or :meth:`close`) fsync the file even if this writer
        appended nothing unsynced (a log written whole before it was opened, not fsynced)."""
        self._unsynced = True

    def sync(self) -> None:
        """fsync what appends with ``sync=False`` wrote (nothing to do when none did).

        Raises:
            SessionError: the writer is closed, or the fsync failed.
        """
        fd = self._fd
        if fd is None:
            raise SessionError(f"{self.path}: the {self.what} was closed")
        if not self._unsynced:
            return
        try:
            os.fsync(fd)
        except OSError as exc:
            raise SessionError(f"{self.path}: cannot make the {self.what} durable: {exc}") from exc
        self._unsynced = False

    def truncate(self, size: int) -> None:
        """Cut the file back to ``size`` bytes (through the locked descriptor) and fsync.

        Raises:
            SessionError: the writer is closed, or the cut failed.
        """
        fd = self._fd
        if fd is None:
            raise SessionError(f"{self.path}: the {self.what} was closed")
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError as exc:
            raise SessionError(f"{self.path}: cannot cut the {self.what} back: {exc}") from exc

    def close(self) -> None:
        """fsync what is not yet (:meth:`sync`), release the lock and close the file
        (idempotent; the file is closed even when the fsync fails).

        Raises:
            SessionError: the fsync or the close failed.
        """
        if self._fd is None:
            return
        try:
            self.sync()
        finally:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):
                _info(self.path).unlink(missing_ok=True)
            try:
                os.close(fd)  # closing the last descriptor releases the flock
            except OSError as exc:
                raise SessionError(f"{self.path}: closing the session log failed: {exc}") from exc

    def __del__(self) -> None:
        # like a file object: a writer dropped without close() releases its lock
        with contextlib.suppress(Exception):
            self.close()


def upgrade_log(path: str | os.PathLike[str]) -> tuple[int, tuple[str, ...]]:
    """Rewrite a log in the current schema, in place and atomically.

    Takes the writer's lock, reads the log (repairing a torn tail), runs the migrations, writes
    the result to ``<log>.upgrade`` beside it (a new file: whatever is at that path, a link or
    a killed upgrade's copy, is removed first), fsyncs, renames it over the log and fsyncs the
    directory. A log already current is left untouched.

    Returns:
        The schema the log had, and the names of the steps run (empty when current).

    Raises:
        SessionError: as :func:`read_log`, a writer holds the log, or it cannot be written
            (the log is then unchanged).
    """
    p = Path(path)
    writer = LogWriter(p)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            data = read_log(p, repair=True)
        if not data.migrated:
            return data.schema, ()
        head = {**data.head, "schema": SCHEMA_VERSION}
        aside = _aside(p)
        try:
            with os.fdopen(open_fresh(aside, what="upgraded copy"), "wb") as fh:
                fh.write(dumps_line(head))
                for rec in data.records:
                    fh.write(dumps_line(rec))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(aside, p)
            dir_fd = os.open(p.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            aside.unlink(missing_ok=True)
            raise SessionError(f"{p}: cannot write the upgraded log: {exc}") from exc
        return data.schema, data.migrated
    finally:
        writer.close()


def _info(path: Path) -> Path:
    return path.with_name(path.name + ".writer")


def _aside(path: Path) -> Path:
    return path.with_name(path.name + ".upgrade")


def _holder(path: Path) -> str:
    try:
        fd = os.open(_info(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        try:
            pid = os.read(fd, 32).decode("ascii").strip()
        finally:
            os.close(fd)
    except (OSError, UnicodeDecodeError):
        return "pid unknown"
    return f"pid {pid}" if pid.isdigit() else "pid unknown"


def _whole_record(tail: bytes) -> bool:
    try:
        data = json.loads(tail)
    except (ValueError, RecursionError):
        return False
    return isinstance(data, dict) and "type" in data and "time" in data


def _append_bytes(path: Path, data: bytes) -> None:
    try:
        with os.fdopen(open_owned(path, os.O_WRONLY | os.O_APPEND, what="session log"), "ab") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise SessionError(f"{path}: cannot repair the last line: {exc}") from exc


def _load_line(path: Path, number: int, line: bytes) -> Any:
    try:
        return json.loads(line)
    except RecursionError:
        raise SessionError(f"{path}:{number}: line nested too deeply: {line[:80]!r}") from None
    except ValueError as exc:
        raise SessionError(f"{path}:{number}: corrupt line ({exc}): {line[:80]!r}") from exc


def _line_start(raw: bytes, number: int, count: int) -> int:
    """The byte offset where line ``number`` (1-based) of ``raw`` (``count`` lines, each
    ``\\n``-terminated) starts; searched from the end (the lines asked for are the last)."""
    index = len(raw) - 1
    for _ in range(count - number + 1):
        index = raw.rfind(b"\n", 0, index)
    return index + 1


def _drop_torn(path: Path, torn: bytes, keep: int, repair: bool, what: str) -> None:
    """Warn of ``torn`` (the file's bytes from ``keep`` on), and when ``repair`` append them to
    ``<log>.torn`` and cut the log back to ``keep`` bytes."""
    side = path.with_name(path.name + ".torn")
    if repair:
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            with os.fdopen(open_owned(side, flags, what="torn-line file"), "ab") as fh:
                fh.write(torn if torn.endswith(b"\n") else torn + b"\n")
            with os.fdopen(open_owned(path, os.O_WRONLY, what="session log"), "wb") as fh:
                fh.truncate(keep)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise SessionError(
                f"{path}: torn last line that could not be set aside: {exc}"
            ) from exc
    kept = f"; the bytes are kept in {side.name}" if repair else " (read-only: file untouched)"
    warnings.warn(
        f"{path}: dropped a torn {what} ({len(torn)} bytes, a write cut short: "
        f"{torn[:60]!r}){kept}",
        LogReadWarning,
        stacklevel=3,
    )
