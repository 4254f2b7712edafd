"""The batch's manifest: ``manifest.ndjson``, one JSON line per run state change.

- :class:`Manifest`: the file, appended by the one runner of the batch (it holds the file's
  lock), in groups (one ``write`` and one ``fsync`` for all the lines written meanwhile, off
  the caller's thread);
- :func:`read_manifest` folds it into one entry per run; :func:`manifest` is that as a frame.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._secrets import hide_in_json, searchable
from ..errors import LogBusy, SessionError
from ..records import utc_now
from ..session import LogWriter, check_folder, dumps_line

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["MANIFEST", "Manifest", "manifest", "read_manifest"]

MANIFEST = "manifest.ndjson"
"""The manifest's file name in the batch directory. Not ``.jsonl``: the frames and
``boxmaker report`` search a directory for ``*.jsonl`` session logs, and it is not one."""


class Manifest:
    """The batch's manifest, open for appending by the batch's one runner.

    ``<batch_dir>/manifest.ndjson`` holds one JSON object per line, each a run's state change:
    ``{"time", "run", "state", ...}``. States: ``planned`` (with ``task``, ``settings``,
    ``messages``, ``target`` when the task has one, and for a :class:`ForkTask` ``fork``:
    ``{"parent", "at", "rerun", "replay"}``), ``running`` (``server``, ``slot``,
    ``attempt``; ``affinity: "slot"`` when the run was placed on the slot that ran its
    prefix: its fork task's parent, or an earlier fork of it), ``retry`` (``reason``),
    ``done`` (``turns``, ``outcome``; a fork's ``turns`` are its own, and the line of the
    attempt that started the fork adds ``warm`` and ``warm_detail``, measured), ``failed``
    (``reason``: also a run whose log cannot be read, which the others do not wait for),
    ``interrupted``; a
    ``server_down`` line names a server (``server``, ``reason``) instead of a run. Lines are
    only appended. :meth:`write` queues a line and returns at once; a thread of the manifest
    writes the lines queued meanwhile as one group, one ``write`` and one ``fsync``
    (:class:`~boxmaker.session.LogWriter`), so the runner's workers never wait for the disk
    and a batch of 64 slots does not fsync 64 times for 64 lines. :meth:`flush` waits until
    every line written so far is durable; :meth:`close` flushes. A line is a record of what
    the logs hold, not the truth: a run's log is made durable before its ``done`` line is
    written, and a line a kill lost before its group was written is written again on the next
    run of the batch (it reads each run's state from its log). A torn last line left by a
    kill is cut off when the manifest is opened again.

    Args:
        batch_dir: the batch's directory (made when missing).
        secrets: credentials to write as ``<API_KEY>`` (the batch's ``ClientConfig.api_key``).

    Raises:
        SessionError: another runner holds the batch (:class:`~boxmaker.errors.LogBusy`, the
            message names its pid), the file cannot be written, or it or the directory is a
            link planted by someone else.
    """

    def __init__(self, batch_dir: Path, secrets: Sequence[str | None] = ()) -> None:
        self.path = batch_dir / MANIFEST
        self._secrets = searchable(secrets)
        check_folder(batch_dir, what="batch directory")
        try:  # made when missing, in one step: two runners starting at once race on the lock
            self._writer = LogWriter(self.path, create=None, what="batch manifest")
        except LogBusy as exc:
            raise LogBusy(
                f"{batch_dir}: another batch runner holds this batch directory "
                f"({exc.holder}); one runner per batch at a time",
                exc.holder,
            ) from exc
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):
            self._writer.truncate(raw.rfind(b"\n") + 1)
        self._cond = threading.Condition()
        self._queued: list[bytes] = []
        self._written = 0  # lines queued so far
        self._durable = 0  # of them, written and fsynced
        self._error: SessionError | None = None
        self._closing = False
        self._thread: threading.Thread | None = None

    def write(self, run: str | None, state: str, **fields: Any) -> None:
        """Queue one state change (``run`` ``None`` for a line about the batch); the
        manifest's thread writes it with the others queued meanwhile (see the class).

        Secrets are hidden by the cassettes' rule (:mod:`boxmaker.cassettes`): the string of a
        credential-like setting (``client.api_key``, a ``token``) becomes ``<SECRET>``, and each
        of the manifest's ``secrets`` becomes ``<API_KEY>`` wherever it appears (a reason
        quoting a server's answer).

        Raises:
            SessionError: an earlier group could not be written (the disk is full, say), or
                the manifest is closed.
        """
        line: dict[str, Any] = {"time": utc_now().isoformat(), "state": state}
        if run is not None:
            line["run"] = run
        data = dumps_line(hide_in_json({**line, **fields}, self._secrets))
        with self._cond:
            if self._error is not None:
                raise self._error
            if self._closing:
                raise SessionError(f"{self.path}: the batch manifest was closed")
            self._queued.append(data)
            self._written += 1
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._commit, name="boxmaker-manifest", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every line written so far is in the file, fsynced.

        Raises:
            SessionError: a group could not be written.
        """
        with self._cond:
            target = self._written
            while self._durable < target and self._error is None and self._thread is not None:
                self._cond.wait()
            if self._error is not None:
                raise self._error

    def _commit(self) -> None:
        """The manifest's thread: write what is queued as one group, again and again."""
        while True:
            with self._cond:
                while not self._queued and not self._closing:
                    self._cond.wait()
                if not self._queued:
                    return
                lines, self._queued = self._queued, []
                count = self._written
            try:
                self._writer.append(b"".join(lines))
            except SessionError as exc:
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._durable = count
                self._cond.notify_all()

    def close(self) -> None:
        """Write and fsync what is queued, then release the file and its lock (idempotent).

        Raises:
            SessionError: a group could not be written (the lock is released either way).
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        try:
            if thread is not None:
                thread.join()
        finally:
            self._writer.close()
        if self._error is not None:
            raise self._error


def read_manifest(batch_dir: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The manifest folded to one entry per run, in the order runs were planned.

    Each entry holds the last value of every field written for the run (``state`` the last
    state), plus ``attempts`` (its ``running`` lines). A torn last line is skipped.

    Raises:
        SessionError: the manifest is missing (the folder is not a batch's) or unreadable, or a
            line before the last is not a JSON object.
    """
    path = Path(batch_dir) / MANIFEST
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        why = f"no {MANIFEST}; boxmaker batch --dir {batch_dir} makes one"
        raise SessionError(f"{batch_dir}: not a batch folder ({why})") from None
    except OSError as exc:
        raise SessionError(f"{path}: cannot read the batch manifest: {exc}") from exc
    runs: dict[str, dict[str, Any]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            if number == len(lines):
                break  # a torn last line
            raise SessionError(f"{path}:{number}: not a JSON line: {exc}") from exc
        if not isinstance(item, dict):
            raise SessionError(f"{path}:{number}: not a JSON object")
        run = item.get("run")
        if isinstance(run, str):
            entry = runs.setdefault(run, {"attempts": 0})
            entry["attempts"] += item.get("state") == "running"
            entry.update(item)
    return runs


def manifest(batch_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per run of a batch, from its manifest: ``run``, ``task``, one column per grid
    setting (named by its dotted key), ``state``, ``server``, ``slot``, ``attempts``,
    ``turns``, ``outcome``, ``reason``, and, in a batch of :class:`ForkTask` runs, ``warm``
    (how the fork's first request found its parent's prompt cache: ``slot``, ``restored`` or
    ``cold``) and ``warm_detail`` (why a fork ran cold, or what was restored).

    Raises:
        SessionError: the manifest is missing or unreadable.
    """
    import pandas as pd  # only for this frame

    entries = read_manifest(batch_dir)
    keys = ["state", "server", "slot", "attempts", "turns", "outcome", "reason"]
    if any("warm" in entry for entry in entries.values()):
        keys += ["warm", "warm_detail"]
    rows = []
    for run, entry in entries.items():
        row = {"run": run, "task": entry.get("task"), **(entry.get("settings") or {})}
        for key in keys:
            row[key] = entry.get(key)
        rows.append(row)
    return pd.DataFrame(rows)
