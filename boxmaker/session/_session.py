"""An append-only session log on disk (JSON Lines), its baseline, and ``messages()``.

File layout: ``<directory>/<session_id>.jsonl``, one JSON object per line (see
:mod:`boxmaker.records`). The first line is the baseline with the log format version::

    {"type": "baseline", "schema": 2, "session_id": "20261130T070102Z-3f9a1c2e", "time": ...,
     "system": "You are ...", "tools": [...]}

The file itself (reading, torn last lines, the writer's lock, all-or-nothing fsynced appends,
upgrades of older schemas) is :mod:`boxmaker.session`'s. Guarantees:

- one writer per log: a :class:`Session` created or opened for writing holds an exclusive lock
  until :meth:`Session.close`; a second writer gets :class:`SessionError` naming the holder's
  pid. ``Session.open(path, read_only=True)`` never locks and never touches the file.
- one turn at a time per session: :meth:`Session.turn` refuses a second turn.
- a record :meth:`Session.append` returned from survives a killed process (it was written
  whole, by one ``write``); a failed append (a full disk) leaves the file as it was, and the
  record is not kept.
- when a crash of the machine can lose it: never, once it is fsynced. A session made with
  ``sync="append"`` (the default) fsyncs every append before it returns; one made with
  ``sync="close"`` (the batch runner's: one ``fsync`` for a run's records, not one per
  record) fsyncs them all at :meth:`Session.sync` and :meth:`Session.close`, so a record is
  acknowledged to survive the machine once either returned.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._secrets import hide_in_json, searchable
from ..errors import SessionError
from ..records import (
    SCHEMA_VERSION,
    SESSION_ID,
    Assistant,
    Baseline,
    Capabilities,
    Forked,
    Record,
    RecordError,
    ToolCall,
    ToolResult,
    TurnEnd,
    Unknown,
    Usage,
    User,
    baseline_from_json,
    check_records,
    record_to_json,
    records_from_json,
    utc_now,
)
from ._file import LogReadWarning, LogWriter, dumps_line, loads_lines, read_log
from ._fork import fork_records, parent_of
from ._groups import dumps_group, whole_groups
from ._safe import check_folder, open_fresh

__all__ = [
    "SYNC_POLICIES",
    "Messages",
    "Session",
    "message_of",
    "messages",
    "new_session_id",
    "wire_arguments",
]

SYNC_POLICIES = ("append", "close")
"""When a session's appends are fsynced: each before it returns (``append``), or all together
at :meth:`Session.sync` and :meth:`Session.close` (``close``)."""


class Messages(list[dict[str, Any]]):
    """The list :meth:`Session.messages` gives: a new list each time, of the session's own
    message dicts, which never change once made (do not change them). So a client may keep
    what it wrote of a session's messages and write only those a request adds
    (:mod:`boxmaker.client`); a list of other dicts is written whole at each request."""

    __slots__ = ()


def _check_sync(sync: str) -> None:
    if sync not in SYNC_POLICIES:
        raise SessionError(f"sync must be one of {', '.join(SYNC_POLICIES)}, not {sync!r}")


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
    except (ValueError, RecursionError):
        return "{}"
    return arguments if isinstance(value, dict) else "{}"


def messages(baseline: Baseline, records: Iterable[Record]) -> list[dict[str, Any]]:
    """The OpenAI chat-completions ``messages`` for a session's records.

    System prompt from the baseline (when not empty), then each record's :func:`message_of`
    (``Usage``, ``CacheLoss``, ``LimitHit``, ``TurnEnd`` and unknown records are not
    messages). The result depends on the records only (no time, no state), so a session that
    grows by appending gives messages that extend the previous ones: the prefix property
    llama.cpp's prompt cache relies on. :class:`Session` keeps the same list incrementally.
    """
    out: list[dict[str, Any]] = []
    if baseline.system:
        out.append({"role": "system", "content": baseline.system})
    for r in records:
        message = message_of(r)
        if message is not None:
            out.append(message)
    return out


def message_of(record: Record) -> dict[str, Any] | None:
    """One record's OpenAI chat-completions message, or ``None`` for a record that is none.

    ``User`` -> ``{"role": "user", "content"}``; ``Assistant`` -> ``{"role": "assistant",
    "content", "reasoning_content"?, "tool_calls"?}`` (arguments through
    :func:`wire_arguments`); ``ToolResult`` -> ``{"role": "tool", "tool_call_id", "content"}``.
    ``reasoning_content`` is sent back because llama.cpp reuses the cache of a follow-up
    request inside a turn only when the template re-renders the same reasoning.
    """
    if isinstance(record, User):
        return {"role": "user", "content": record.content}
    if isinstance(record, Assistant):
        msg: dict[str, Any] = {"role": "assistant", "content": record.content or ""}
        if record.reasoning:
            msg["reasoning_content"] = record.reasoning
        if record.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": wire_arguments(c.arguments)},
                }
                for c in record.tool_calls
            ]
        return msg
    if isinstance(record, ToolResult):
        return {"role": "tool", "tool_call_id": record.tool_call_id, "content": record.content}
    return None


class Session:
    """An append-only log of records on disk (JSON Lines); thread-safe appends.

    Create one with :meth:`create` or reopen one with :meth:`open`; use it as a context
    manager (or call :meth:`close`) to release the file and its writer's lock.

    Attributes:
        path: the log file.
        id: the session id (the file's stem).
        baseline: the system prompt and tools every request starts with.
        schema: the log format version of the file (older ones are upgraded in memory on read;
            ``boxmaker log upgrade`` rewrites the file).
        read_only: opened with ``read_only=True``: :meth:`append` raises.
        sync: when appends are fsynced (:data:`SYNC_POLICIES`).
    """

    def __init__(
        self,
        path: Path,
        session_id: str,
        baseline: Baseline,
        records: list[Record],
        schema: int,
        writer: LogWriter | None,
        sync: str = "append",
    ) -> None:
        """Internal: use :meth:`create` or :meth:`open`."""
        self.path = path
        self.sync_policy = sync
        self._sync_each = sync == "append"
        self.id = session_id
        self.baseline = baseline
        self.schema = schema
        self.read_only = writer is None
        self._records: list[Record] = []
        self._messages = messages(baseline, ())
        self._next_call = 1
        self._last_usage: Usage | None = None
        self._capabilities: Capabilities | None = None
        self._open_turn = False  # a User record with no TurnEnd after it (yet)
        self._turn_ends = schema >= 2  # this log writes TurnEnd records
        self._lock = threading.Lock()
        self._writer = writer
        self._in_turn = False
        self._secrets: tuple[str, ...] = ()
        for record in records:
            self._track(record)

    # -- creation -----------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        directory: str | os.PathLike[str],
        baseline: Baseline | None = None,
        *,
        session_id: str | None = None,
        sync: str = "append",
    ) -> Session:
        """Start a new log ``<directory>/<session_id>.jsonl`` holding the baseline, open for
        writing (the writer's lock is held until :meth:`close`).

        Args:
            directory: where the log goes; created when missing.
            baseline: system prompt and tools (default: empty system prompt, no tools).
            session_id: a name safe as a file name (letters, digits, ``.``, ``_``, ``-``,
                at most 128 characters); default :func:`new_session_id`.
            sync: when appends are fsynced (:data:`SYNC_POLICIES`; the module says what
                each keeps).

        Raises:
            SessionError: the id is unsafe, the log exists already (a planted link too: the
                log is made with ``O_EXCL``), the directory is another user's link, the log
                cannot be written, or ``sync`` is no policy.
        """
        _check_sync(sync)
        baseline = baseline or Baseline()
        if not isinstance(baseline, Baseline):
            raise SessionError(f"baseline must be a Baseline, not {type(baseline).__name__}")
        # made whole or not at all: a process killed while creating it left an empty log
        # (the tap killed under load, issue 36), which every reader refuses
        return cls._create_whole(Path(directory), baseline, [], session_id=session_id, sync=sync)

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        read_only: bool = False,
        repair: bool | None = None,
        sync: str = "append",
    ) -> Session:
        """Reopen a log written by :meth:`create` and :meth:`append`.

        Reading follows :func:`boxmaker.session.read_log` (the one reader, shared with the
        frames and widgets): a torn last line is dropped with a
        :class:`~boxmaker.session.LogReadWarning` (and, when writing, set aside in
        ``<log>.torn``), older schemas are upgraded in memory, every line is checked by the
        records' one rule (:data:`boxmaker.records.RULES`), and a duplicated line is read once
        with a warning. Records of unknown type are kept as ``Unknown`` with a warning.

        Args:
            path: the ``.jsonl`` log.
            read_only: look only: no lock is taken (safe while another process writes), the
                file is never touched, and :meth:`append` raises :class:`SessionError`.
                Otherwise the session is this log's writer until :meth:`close`.
            repair: the former spelling of ``not read_only`` (``repair=False`` is
                ``read_only=True``).
            sync: when appends are fsynced (:data:`SYNC_POLICIES`).

        Raises:
            SessionError: another writer holds the log (the message names its pid); the file
                cannot be read; its first line is not a baseline; its schema or session id is
                not valid for this version; a line other than a torn last one is corrupt or
                breaks the records' rule (the message names file, line, field and value);
                ``sync`` is no policy.
        """
        _check_sync(sync)
        p = Path(path)
        if repair is not None:
            read_only = read_only or not repair
        writer = None if read_only else LogWriter(p)
        try:
            data = read_log(p, repair=writer is not None)
            session = cls._from_data(data, writer, sync)
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        return session

    @classmethod
    def _from_data(cls, data: Any, writer: LogWriter | None, sync: str = "append") -> Session:
        """The session of a log :func:`read_log` read (and checked by the records' rule)."""
        p = data.path
        try:
            baseline = baseline_from_json(data.head)
            records = records_from_json(data.records)
        except RecordError as exc:  # read_log checked both: a line changed under us
            raise SessionError(f"{p}: {exc}") from exc
        unknown = {r.type for r in records if isinstance(r, Unknown)}
        if unknown:
            warnings.warn(
                f"{p}: records of unknown type kept as Unknown: {', '.join(sorted(unknown))}",
                LogReadWarning,
                stacklevel=3,
            )
        return cls(p, data.session_id, baseline, records, data.schema, writer, sync)

    def fork(
        self,
        at: int | None = None,
        *,
        rerun: bool = False,
        call: int | None = None,
        result: str | None = None,
        settings: Mapping[str, Any] | None = None,
        directory: str | os.PathLike[str] | None = None,
        session_id: str | None = None,
        baseline: Baseline | None = None,
    ) -> Session:
        """Branch this log at turn ``at`` into a new log, open for writing; this log is only
        read (its file is never touched, byte for byte).

        The new log starts with a :class:`~boxmaker.records.Forked` record (this session's id
        and path, the turn and record, ``settings``), then this log's records up to the fork
        point as its file holds them, all in one all-or-nothing write
        (:mod:`boxmaker.session`'s fork points):

        - ``fork(at=k)``: after turn ``k`` ended (a turn without its ``TurnEnd`` record, still
          running or cut by a dead process, is refused); the fork's next turn is a new one;
        - ``fork(at=k, rerun=True)``: before turn ``k``'s answer (the records before its user
          message; :func:`boxmaker.turn.continue_fork` runs that message again);
        - ``fork(call=n, result="...")``: at tool call ``n``'s result, replaced by ``result``
          and marked ``source="edited"``; the turn goes on from there
          (:func:`boxmaker.turn.continue_fork`).

        Args:
            at: the turn (1-based: the ``at``-th user message); optional with ``call``.
            rerun: branch before turn ``at``'s answer.
            call: the session's tool-call number whose result is edited.
            result: the edited result text (with ``call``).
            settings: what the fork changes, recorded as given (``{"loop.tool_iterations":
                2}``); the caller runs the fork's turns with them.
            directory: where the fork's log goes (default: this log's folder).
            session_id: the fork's id (default: :func:`new_session_id`).
            baseline: the fork's system prompt and tools (default: this log's; another one
                re-renders the whole prompt, so the cache is cold from its first token).

        The fork's log is made whole or not at all (see :meth:`_create_whole`): a process
        killed while making it leaves no log behind.

        Raises:
            SessionError: no such turn or call, turn ``at`` has not ended, a bad combination of
                arguments, the parent cannot be read, or the fork's log cannot be written.
        """
        folder = Path(directory) if directory is not None else self.path.parent
        head, records = fork_records(
            self.path,
            at=at,
            rerun=rerun,
            call=call,
            result=result,
            settings=settings,
            folder=folder,
        )
        return Session._create_whole(folder, baseline or head, records, session_id=session_id)

    @classmethod
    def _create_whole(
        cls,
        directory: Path,
        baseline: Baseline,
        records: Sequence[Record],
        *,
        session_id: str | None,
        sync: str = "append",
    ) -> Session:
        """A new log holding ``baseline`` and ``records`` from the start, made whole or not at
        all: written to a side file (``.<id>.jsonl.part``, no reader lists it), fsynced, then
        linked into place (never over a file that is there), so a process killed while making
        a log leaves no empty log, and none while making a fork a baseline-only log that
        readers would count as a session. Open for writing, as :meth:`create` returns it
        (``sync="close"``: the side file is not fsynced before it is linked; closing fsyncs
        the log).

        Raises:
            SessionError: as :meth:`create`, or a record breaks the log's rule.
        """
        sid = new_session_id() if session_id is None else session_id
        if not SESSION_ID.fullmatch(sid):
            raise SessionError(f"session id {sid!r} is not safe as a file name")
        folder = Path(directory)
        path = folder / f"{sid}.jsonl"
        head = {"type": "baseline", "schema": SCHEMA_VERSION, "session_id": sid,
                **record_to_json(baseline)}  # fmt: skip
        objects = [record_to_json(r) for r in records]
        try:
            check_records(objects)
        except RecordError as exc:
            raise SessionError(f"{path}: not written: {exc}") from exc
        data = dumps_line(head) + (dumps_group(objects, dumps_line) if objects else b"")
        check_folder(folder, what="session directory")
        part = folder / f".{sid}.jsonl.part"
        try:
            fd = open_fresh(part, what="fork's side file")
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if sync == "append":
                    os.fsync(fd)
            finally:
                os.close(fd)
            os.link(part, path)  # fails on a file (or a planted link) already there
        except FileExistsError as exc:
            raise SessionError(f"{path}: cannot create session log: it exists already") from exc
        except OSError as exc:
            raise SessionError(f"{path}: cannot create session log: {exc}") from exc
        finally:
            with contextlib.suppress(OSError):
                os.unlink(part)
        writer = LogWriter(path)
        try:
            # as a reader of the file would get it, from the bytes written (no read): the same
            # JSON values (lists, not the caller's tuples; no object shared with the caller)
            lines = loads_lines(data) if writer.size() == len(data) else []
            if lines:
                written = lines[1:]
                if objects:
                    whole_groups(written)  # the group's markers out, as the reader takes them
                ours = records_from_json(written)
                first = baseline_from_json(lines[0])
                session = cls(path, sid, first, ours, SCHEMA_VERSION, writer, sync)
            else:  # another writer came between the link and the lock: read what is there
                session = cls._from_data(read_log(path, repair=True), writer, sync)
        except BaseException:
            writer.close()
            raise
        if sync != "append":
            writer.owe_sync()  # the side file was not fsynced: closing does it
        return session

    @property
    def forked(self) -> Forked | None:
        """The log's :class:`~boxmaker.records.Forked` record (where this fork came from), or
        ``None`` when the log is no fork."""
        with self._lock:
            first = self._records[0] if self._records else None
        return first if isinstance(first, Forked) else None

    def parent_path(self) -> Path | None:
        """The parent's log of a fork (``Forked.parent_path`` read against this log's folder
        when relative), ``None`` when the log is no fork."""
        forked = self.forked
        return None if forked is None else parent_of(self.path, forked)

    # -- reading ------------------------------------------------------------------------------

    @property
    def records(self) -> tuple[Record, ...]:
        """The records after the baseline, oldest first (a snapshot)."""
        with self._lock:
            return tuple(self._records)

    def messages(self) -> Messages:
        """The OpenAI ``messages`` of the whole session, equal to
        ``messages(self.baseline, self.records)`` but kept as records are appended, so a
        request costs no rebuild (a new :class:`Messages` list; the message dicts are
        shared and never change: do not change them)."""
        with self._lock:
            return Messages(self._messages)

    def next_call(self) -> int:
        """The next tool-call number of the session (1, 2, ...); stable across reopen. O(1)."""
        with self._lock:
            return self._next_call

    def last_usage(self) -> Usage | None:
        """The latest :class:`Usage` record, or ``None`` when there is none. O(1)."""
        with self._lock:
            return self._last_usage

    def capabilities(self) -> Capabilities | None:
        """The log's first :class:`~boxmaker.records.Capabilities` record (what the server
        said it could do at the session's first request), or ``None`` when there is none.
        O(1)."""
        with self._lock:
            return self._capabilities

    def _track(self, record: Record) -> None:
        """Keep ``record`` and what is derived from it (the caller holds the lock or owns the
        session alone)."""
        self._records.append(record)
        message = message_of(record)
        if message is not None:
            self._messages.append(message)
        if isinstance(record, ToolResult):
            self._next_call = max(self._next_call, record.call + 1)
        elif isinstance(record, Usage):
            self._last_usage = record
        elif isinstance(record, User):
            self._open_turn = True
        elif isinstance(record, TurnEnd):
            self._open_turn, self._turn_ends = False, True
        elif isinstance(record, Capabilities) and self._capabilities is None:
            self._capabilities = record

    def turn_left_open(self) -> bool:
        """Whether the last turn has no ``TurnEnd``: the process that ran it stopped inside it
        (a turn of a schema-1 log, which wrote none, never counts as open). O(1)."""
        with self._lock:
            return self._open_turn and self._turn_ends

    def unanswered_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls of the last ``Assistant`` record that have no ``ToolResult`` yet.

        Results are matched to calls by position (the loop answers calls in order), so calls
        that share one ``id`` are counted right. Empty when the last assistant made no calls
        or all were answered.
        """
        with self._lock:
            answered = 0
            for r in reversed(self._records):
                if isinstance(r, Assistant):
                    return r.tool_calls[answered:]
                if isinstance(r, ToolResult):
                    answered += 1
        return ()

    # -- writing ------------------------------------------------------------------------------

    @contextmanager
    def turn(self) -> Iterator[None]:
        """Mark the session as inside a turn for the ``with`` block (the loop uses it).

        Raises:
            SessionError: a turn is already running on this session (one turn at a time), or
                the session is read-only.
        """
        with self._lock:
            if self._writer is None:
                raise SessionError(f"{self.path}: opened read-only; a turn cannot run on it")
            if self._in_turn:
                raise SessionError(
                    f"{self.path}: a turn is already running on this session (one at a time)"
                )
            self._in_turn = True
        try:
            yield
        finally:
            with self._lock:
                self._in_turn = False

    def hide(self, *secrets: str | None) -> None:
        """Write each of ``secrets`` (an api key) as ``<API_KEY>`` in every record appended from
        now on, by the cassettes' rule (:mod:`boxmaker.cassettes`: also URL-encoded and
        JSON-escaped; ``None``, empty and shorter than 8 characters are ignored); the string
        under a credential-like key (``api_key``, ``token``, ...) is always ``<SECRET>``.

        The records kept in memory are not changed (the running session's requests keep their
        bytes); a log reopened later reads the placeholders. :func:`~boxmaker.turn.run_turn`
        calls it with the client's api key.
        """
        with self._lock:
            self._secrets = searchable((*self._secrets, *secrets))

    def append(self, record: Record) -> Record:
        """Write one record as one line, fsynced (``sync="close"``: at :meth:`sync` or
        :meth:`close`), then keep it in memory.

        Returns the record. Raises:
            SessionError: read-only, closed, or the log cannot be written (the file is then
                as it was before and the record is not kept).
        """
        self.extend((record,))
        return record

    def extend(self, records: Sequence[Record]) -> None:
        """Append records that belong together (an assistant message and its usage) as one
        all-or-nothing write with one fsync (``sync="close"``: the session's one fsync at
        :meth:`sync` or :meth:`close`): after a crash or a failed write, either all of
        them are in the log or none. Two or more are framed as a group (its first line
        carries ``"group": n``): a kill that cuts the write at any byte leaves a group that
        every reader drops whole (and a writer sets aside in ``<log>.torn`` on open).
        Secrets are hidden as :meth:`hide` says.

        Each record is checked by the rule the log is read by
        (:func:`boxmaker.records.check_records`) before anything is written, so the log never
        holds a line its readers refuse.

        Raises:
            SessionError: as :meth:`append`, or a record breaks the log's rule (a value
                outside its ``Literal``, a negative token count: the message says which);
                then none of the records is written or kept.
        """
        objects = [hide_in_json(record_to_json(r), self._secrets) for r in records]
        try:
            check_records(objects)
        except RecordError as exc:
            raise SessionError(
                f"{self.path}: not written: record {exc.index + 1} of {len(objects)} breaks "
                f"the log's rule ({exc})"
            ) from exc
        data = dumps_group(objects, dumps_line)
        with self._lock:
            if self._writer is None:
                raise SessionError(f"{self.path}: opened read-only")
            self._writer.append(data, sync=self._sync_each)
            for record in records:
                self._track(record)

    def sync(self) -> None:
        """Make every record appended so far durable (fsync; nothing to do with
        ``sync="append"``, where each append was).

        Raises:
            SessionError: read-only, closed, or the fsync failed.
        """
        with self._lock:
            if self._writer is None:
                raise SessionError(f"{self.path}: opened read-only")
            self._writer.sync()

    def close(self) -> None:
        """Make the records durable (as :meth:`sync`), close the log and release the writer's
        lock (idempotent); appending afterwards raises :class:`SessionError`.

        Raises:
            SessionError: the operating system reported an error making the records durable
                or closing the file (the lock is released either way).
        """
        with self._lock:
            if self._writer is not None:
                self._writer.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(id={self.id!r}, path={str(self.path)!r}, records={len(self._records)})"
