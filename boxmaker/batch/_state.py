"""What is left of a batch: how far each run's log got, and the progress counters.

Pure bookkeeping for :mod:`boxmaker.batch` (no network, no threads):

- :func:`log_state`: how far a run's session log got (turns done, finished or not), read
  from the log itself, so a rerun knows what to skip and what to continue; in a fork's log
  only the fork's own turns count (the parent's copied ones, read from its ``Forked``
  record, do not). :func:`session_state`: the same of a log open for writing, from its
  records in memory (no read). :func:`pending`: the runs a batch folder has not finished.
- :class:`BatchProgress`: the counters a progress display shows.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import SessionError
from ..records import Forked, TurnEnd, User, record_to_json
from ..session import Session, read_log

if TYPE_CHECKING:
    pass
from ._tasks import RETRIED_OUTCOMES, ForkTask, Task, expand

__all__ = [
    "BatchProgress",
    "LogState",
    "copied_records",
    "log_state",
    "pending",
    "session_state",
]


@dataclass(frozen=True)
class LogState:
    """How far a run's log got.

    Attributes:
        turns_done: finished turns (a ``User`` whose ``TurnEnd``, before the next ``User``,
            has an outcome not in :data:`RETRIED_OUTCOMES`); the run goes on with message
            ``turns_done``. In a fork's log, only the fork's own turns: the parent's records
            copied into it (:func:`copied_records`) are not counted.
        last_outcome: the outcome of the last ``TurnEnd`` (``None``: none yet; in a fork's
            log, of its own turns).
        full: a turn ended ``session_full``: nothing more fits, the run is over.
        diverged: a fork's turn ended ``diverged`` (replay ``stop``): the run is over.
        records: records after the baseline (``0``: the log holds its baseline only).
        copied: of ``records``, those a fork copied from its parent, its ``Forked`` record
            included (``0``: the log is no fork).
    """

    turns_done: int
    last_outcome: str | None
    full: bool
    diverged: bool = False
    records: int = 0
    copied: int = 0

    def finished(self, messages: int) -> bool:
        """Whether a run of ``messages`` user messages has nothing left to send."""
        return self.full or self.diverged or self.turns_done >= messages


def pending(
    tasks: Sequence[Task | ForkTask],
    batch_dir: str | os.PathLike[str],
    grid: Mapping[str, Sequence[Any]] | None = None,
) -> list[str]:
    """The ids of the runs of ``tasks`` x ``grid`` a batch folder has not finished (their log
    missing, unreadable, or with messages left to send): what :func:`run_batch` would run.
    ``[]``: a finished batch, resumed, needs no server (the CLI starts none).

    Raises:
        ConfigError: as :func:`expand`.
    """
    logs = Path(batch_dir) / "logs"
    left = []
    for spec in expand(tasks, grid):
        path = logs / f"{spec.id}.jsonl"
        try:
            done = path.exists() and log_state(path).finished(len(spec.task.turns))
        except SessionError:
            done = False
        if not done:
            left.append(spec.id)
    return left


def copied_records(first: Mapping[str, Any] | None) -> int:
    """How many records at the start of a log (after its baseline) a fork copied from its
    parent, given the log's first record as JSON: its ``Forked`` record (``record`` is the
    parent's record it branches at, 1-based), the parent's records before that one, and the
    edited result of an ``edited_result`` fork; ``0`` when ``first`` is no ``Forked`` record."""
    if not isinstance(first, Mapping) or first.get("type") != "forked":
        return 0
    record = first.get("record")
    n = record if isinstance(record, int) and not isinstance(record, bool) else 1
    return n + (first.get("point") == "edited_result")


def log_state(path: Path) -> LogState:
    """Read ``path`` (read-only, no lock) and count its finished turns (in a fork's log, its
    own: after :func:`copied_records`); a missing or empty log has none. A torn last line is
    ignored (the writer repairs it on open).

    Raises:
        SessionError: the log exists but cannot be read (see :func:`read_log`).
    """
    if not path.exists() or path.stat().st_size == 0:
        return LogState(0, None, False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        data = read_log(path)
    copied = copied_records(data.records[0] if data.records else None)
    steps = (
        (item.get("type"), item.get("outcome")) if isinstance(item, dict) else (None, None)
        for item in data.records[copied:]
    )
    return _state(steps, len(data.records), copied)


def session_state(session: Session) -> LogState:
    """:func:`log_state` of a log open for writing, from its records in memory (they are
    its file's, in order: nothing is read)."""
    records = session.records
    first = records[0] if records else None
    copied = copied_records(record_to_json(first)) if isinstance(first, Forked) else 0
    steps = (
        ("user", None)
        if isinstance(r, User)
        else ("turn_end", r.outcome)
        if isinstance(r, TurnEnd)
        else (None, None)
        for r in records[copied:]
    )
    return _state(steps, len(records), copied)


def _state(steps: Iterable[tuple[Any, Any]], records: int, copied: int) -> LogState:
    """The :class:`LogState` of a log's own records, given as ``(type, outcome)``."""
    done, open_turn, last, full, diverged = 0, False, None, False, False
    for kind, outcome in steps:
        if kind == "user":
            open_turn = True
        elif kind == "turn_end":
            last = outcome
            if open_turn and last not in RETRIED_OUTCOMES:
                done += 1
                full = full or last == "session_full"
                diverged = diverged or last == "diverged"
            open_turn = False
    return LogState(done, last, full, diverged, records, copied)


@dataclass(frozen=True, kw_only=True)
class BatchProgress:
    """A snapshot of a running batch, given to progress displays.

    Attributes:
        total: runs in the batch.
        done: runs finished (in this call or before it).
        skipped: of ``done``, those already finished before this call.
        failed: runs given up on (the reasons in ``failures``).
        running: runs in flight.
        slots: slots in use by the batch, over every server still up.
        servers_down: servers given up on in this call.
        tokens: tokens generated in this call (``predicted_n`` of every completion).
        elapsed_s: seconds since the call started.
        failures: ``(run, reason)`` of each failed run, in order.
        stopped: the call was stopped (Ctrl-C or its ``cancel`` event): in-flight turns were
            cancelled; a rerun picks up.
        finished: the batch call is over (this is the last snapshot).
    """

    total: int
    done: int = 0
    skipped: int = 0
    failed: int = 0
    running: int = 0
    slots: int = 0
    servers_down: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0
    failures: tuple[tuple[str, str], ...] = ()
    stopped: bool = False
    finished: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second over the call so far."""
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0
