"""Scoring a batch folder: ``scores.ndjson``, kept apart from the session logs.

``<batch_dir>/scores.ndjson`` holds one JSON line per (run, scorer, version)::

    {"time": "...Z", "run": "lisbon.1a2b3c4d", "task": "lisbon", "scorer": "target",
     "version": "1", "value": 1.0, "explanation": "answer contains 'Lisbon'"}

(``value`` ``null`` and an ``error`` when the scorer failed.) A run already scored by a
scorer of the same name and version is not scored again, so scoring a batch twice, offline,
leaves the file as it was. Scores are read from the logs alone (no server): the target of each
run is the one its ``planned`` manifest line recorded. A fork's run is scored on its own
records (those after the parent's copied ones).

The file has the session log's guarantees (issue 36: a torn last line glued to the next
run's line made every later ``score`` and ``compare`` fail):

- one writer at a time: :func:`score_batch` holds an exclusive lock on it while it scores
  (:class:`~boxmaker.session.LogWriter`; a second one gets :class:`~boxmaker.errors.LogBusy`
  naming the holder's pid);
- whole lines or nothing: each run's lines are one fsynced append, cut back on a failed write;
- a torn tail (a kill in the middle of a write) is set aside, appended to
  ``scores.ndjson.torn``, before the next append, and said in a
  :class:`~boxmaker.session.LogReadWarning`;
- every line is checked when read (:func:`read_scores`): one that is not a JSON object, is
  nested too deeply, or holds a value a score cannot (``value`` outside ``[0, 1]``, a run or
  scorer that is not a text, a time that is not ISO 8601) is skipped, and the lines skipped
  are reported by number in one warning; none is a traceback. The scores of a run the
  manifest does not know are left out of :func:`scores` (and so of ``compare``), with a
  warning.
- written through the one scrubbing rule (``boxmaker._secrets``): a model grader's key
  (:attr:`~boxmaker.score.Scorer.secrets`) is ``<API_KEY>`` wherever it appears.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._secrets import hide_in_json, searchable
from ..errors import ConfigError, SessionError
from ..records import Forked, utc_now
from ..score import Scorer, apply, parse_target, target_scorer
from ..session import LogReadWarning, LogWriter, Session, dumps_line
from ._manifest import read_manifest

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SCORES", "SCORES_TORN", "read_scores", "score_batch", "scores"]

SCORES = "scores.ndjson"
"""The scores' file name in the batch directory (not ``.jsonl``: it is not a session log)."""


SCORES_TORN = SCORES + ".torn"
"""Where a torn tail of ``scores.ndjson`` is set aside (appended) before the next append."""

_SHOWN = 5
"""Bad lines named in the one warning of a read (the rest counted)."""


def read_scores(batch_dir: str | Path) -> list[dict[str, Any]]:
    """Every well-formed line of ``scores.ndjson``, in file order (none if the file is
    missing).

    A line is kept when it is a JSON object whose ``run``, ``scorer`` and ``version`` are
    texts, ``value`` a number in ``[0, 1]`` or ``null``, ``time`` an ISO 8601 text,
    ``explanation`` and ``error`` texts (each of these three may be absent or ``null``). A
    torn last line (no newline: a write cut short) and every other line are skipped with one
    :class:`~boxmaker.session.LogReadWarning` naming the file and each line's number and why
    (the first five; the rest counted).

    Raises:
        SessionError: the file cannot be read.
    """
    path = Path(batch_dir) / SCORES
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SessionError(f"{path}: cannot read the scores: {exc}") from exc
    lines = raw.split(b"\n")
    torn = lines.pop()  # b"" when the file ends with a newline
    out: list[dict[str, Any]] = []
    bad: list[str] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        item, why = _score_line(line)
        if item is None:
            bad.append(f"line {number} ({why})")
        else:
            out.append(item)
    if torn.strip():
        bad.append(f"line {len(lines) + 1} (torn: {len(torn)} bytes without a newline)")
    if bad:
        shown = "; ".join(bad[:_SHOWN]) + (
            f"; and {len(bad) - _SHOWN} more" if bad[_SHOWN:] else ""
        )
        warnings.warn(
            f"{path}: skipped {len(bad)} line(s) that are not scores: {shown}",
            LogReadWarning,
            stacklevel=2,
        )
    return out


def _score_line(line: bytes) -> tuple[dict[str, Any] | None, str]:
    """One line as a score (``None`` and why when it is not one)."""
    try:
        item = json.loads(line)
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:
        return None, f"not JSON: {str(exc)[:80]}"
    if not isinstance(item, dict):
        return None, f"a JSON {type(item).__name__}, not an object"
    for key in ("run", "scorer", "version"):
        if not isinstance(item.get(key), str):
            return None, f"{key} is not a text"
    value = item.get("value")
    if value is not None and not (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0.0 <= value <= 1.0
    ):
        return None, f"value {str(value)[:40]!r} is not a number in [0, 1]"
    for key in ("explanation", "error"):
        if item.get(key) is not None and not isinstance(item[key], str):
            return None, f"{key} is not a text"
    time = item.get("time")
    if time is not None:
        try:
            datetime.fromisoformat(time) if isinstance(time, str) else None
        except ValueError:
            time = None
        if not isinstance(time, str):
            return None, "time is not an ISO 8601 text"
    return item, ""


def _set_aside_torn(writer: LogWriter) -> None:
    """Holding the file's lock: move a torn tail (the bytes after its last newline) to
    :data:`SCORES_TORN` and cut the file back, so that the next line starts on a line of its own.

    Raises:
        SessionError: the tail cannot be set aside or cut off.
    """
    raw = writer.path.read_bytes()
    if not raw or raw.endswith(b"\n"):
        return
    keep = raw.rfind(b"\n") + 1
    side = LogWriter(writer.path.with_name(SCORES_TORN), create=None, what="torn scores file")
    try:
        side.append(raw[keep:] + b"\n")
    finally:
        side.close()
    writer.truncate(keep)
    warnings.warn(
        f"{writer.path}: a torn last line ({len(raw) - keep} bytes, a write cut short) was set "
        f"aside in {SCORES_TORN}",
        LogReadWarning,
        stacklevel=3,
    )


def score_batch(
    batch_dir: str | Path,
    scorers: Iterable[Scorer] = (),
    *,
    targets: bool = True,
    scorers_for: Callable[[str, Mapping[str, Any]], Iterable[Scorer]] | None = None,
    secrets: Sequence[str | None] = (),
) -> pd.DataFrame:
    """Score every run of a batch whose log exists, append the new scores to
    ``scores.ndjson``, and return the :func:`scores` frame.

    Args:
        batch_dir: the batch's folder (``manifest.ndjson``, ``logs/``).
        scorers: more scorers, run on every run.
        targets: also run each task's target scorer (``"target"``), where it has one.
        scorers_for: scorers of one run's own, given its id and manifest entry (``task``,
            ``settings``...): a benchmark whose scorer needs to know the task (BFCL's checkers
            need the entry's functions and answers, :mod:`boxmaker.bench`).
        secrets: credentials to write as ``<API_KEY>`` wherever they appear in a line, with
            each scorer's own (:attr:`~boxmaker.score.Scorer.secrets`: a model grader's key);
            the string under a credential-like key (``api_key`` in a grader's request) is
            ``<SECRET>`` (``boxmaker._secrets``, the rule of the logs and cassettes).

    Raises:
        SessionError: the manifest or the scores file cannot be read or written, or another
            process holds the scores file (:class:`~boxmaker.errors.LogBusy`).
        ConfigError: two scorers share a name and version.
        boxmaker.errors.LogReadWarning: (a warning) a torn tail set aside, or lines of the
            file skipped.

    A scorer that raises gives a score with ``value`` NaN (``null`` in the file) and the error;
    a run whose log cannot be read is skipped with a warning naming it.
    """
    folder = Path(batch_dir)
    extra = list(scorers)
    keys = [(s.name, s.version) for s in extra]
    if len(set(keys)) != len(keys):
        raise ConfigError("two scorers share a name and version")
    hidden = searchable([*secrets, *(key for s in extra for key in s.secrets)])
    entries = read_manifest(folder)  # first: a folder that is no batch's gets no scores file
    writer = LogWriter(folder / SCORES, create=None, what="scores file")  # made in one step
    try:
        _set_aside_torn(writer)  # before anything is read or appended, holding the lock
        done = {(s["run"], s["scorer"], s["version"]) for s in read_scores(folder)}
        for run, entry in entries.items():
            log = folder / "logs" / f"{run}.jsonl"
            mine = list(extra) + list(scorers_for(run, entry) if scorers_for else ())
            if targets and isinstance(entry.get("target"), dict):
                target = parse_target(entry["target"], f"run {run}")
                mine.insert(0, target_scorer(target))
            todo = [s for s in mine if (run, s.name, s.version) not in done]
            if not todo or not log.exists():
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    records = _own(Session.open(log, read_only=True).records)
            except SessionError as exc:
                warnings.warn(f"run {run}: not scored: {exc}", stacklevel=2)
                continue
            lines = [_line(run, entry.get("task"), s, records) for s in todo]
            writer.append(b"".join(dumps_line(hide_in_json(line, hidden)) for line in lines))
    finally:
        writer.close()
    return scores(folder)


def _own(records: Sequence[Any]) -> Sequence[Any]:
    """The records a run made: a fork's after the parent's copied ones (its ``Forked`` record,
    the copy and an edited result), so a target's calls are the fork's own; all of them
    otherwise."""
    first = records[0] if records else None
    if not isinstance(first, Forked):
        return records
    return records[first.record + (first.point == "edited_result") :]


def _line(run: str, task: Any, scorer: Scorer, records: Sequence[Any]) -> dict[str, Any]:
    score = apply(scorer, records)
    line: dict[str, Any] = {
        "time": utc_now().isoformat(),
        "run": run,
        "task": task,
        "scorer": scorer.name,
        "version": scorer.version,
        "value": None if math.isnan(score.value) else score.value,
        "explanation": score.explanation,
    }
    if score.error is not None:
        line["error"] = score.error
    if score.request is not None:  # a model-graded score: what was asked and answered
        line["request"] = dict(score.request)
        line["reply"] = score.reply
    return line


def scores(batch_dir: str | Path) -> pd.DataFrame:
    """One row per (run, scorer, version) of ``scores.ndjson`` (the last line of each), with
    the run's task and grid settings joined in: ``run``, ``task``, one column per setting,
    ``scorer``, ``version``, ``value`` (Float64, NA for a failed scorer), ``explanation``,
    ``error``, ``time`` (UTC; NaT for a time pandas cannot hold). Lines that are not scores
    are skipped as :func:`read_scores` says, and so are the scores of runs the manifest does
    not know (no task, no settings to join), each with a
    :class:`~boxmaker.session.LogReadWarning`.

    Raises:
        SessionError: the manifest or the scores file cannot be read.
    """
    import pandas as pd  # only for this frame

    runs = read_manifest(batch_dir)
    latest: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for item in read_scores(batch_dir):
        latest[(item.get("run"), item.get("scorer"), item.get("version"))] = item
    rows = []
    unknown = sorted({run for run, _, _ in latest if run not in runs})
    if unknown:
        shown = ", ".join(unknown[:_SHOWN]) + (" ..." if len(unknown) > _SHOWN else "")
        warnings.warn(
            f"{Path(batch_dir) / SCORES}: scores of {len(unknown)} run(s) the manifest does not "
            f"know left out: {shown}",
            LogReadWarning,
            stacklevel=2,
        )
    for (run, scorer, version), item in latest.items():
        if run not in runs:
            continue
        entry = runs[run]
        settings = entry.get("settings")
        rows.append(
            {
                "run": run,
                "task": entry.get("task", item.get("task")),
                **(settings if isinstance(settings, dict) else {}),
                "scorer": scorer,
                "version": version,
                "value": item.get("value"),
                "explanation": item.get("explanation", ""),
                "error": item.get("error"),
                "time": item.get("time"),
            }
        )
    columns = ["run", "task", "scorer", "version", "value", "explanation", "error", "time"]
    frame = pd.DataFrame(rows, columns=None if rows else columns)
    frame["value"] = frame["value"].astype("Float64")
    # a time pandas cannot hold (before 1677, after 2262) is NaT, not an error
    frame["time"] = pd.to_datetime(frame["time"], utc=True, format="ISO8601", errors="coerce")
    return frame
