"""Scoring a batch folder: ``scores.ndjson``, kept apart from the session logs.

``<batch_dir>/scores.ndjson`` holds one JSON line per (run, scorer, version)::

    {"time": "...Z", "run": "lisbon.1a2b3c4d", "task": "lisbon", "scorer": "target",
     "version": "1", "value": 1.0, "explanation": "answer contains 'Lisbon'"}

(``value`` ``null`` and an ``error`` when the scorer failed.) Lines are only appended, each one
fsynced (:class:`~boxmaker.session.LogWriter`); a run already scored by a scorer of the same
name and version is not scored again, so scoring a batch twice, offline, leaves the file as it
was. Scores are read from the logs alone (no server): the target of each run is the one its
``planned`` manifest line recorded. A fork's run is scored on its own records (those after
the parent's copied ones).
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._secrets import hide_in_json, searchable
from ..errors import ConfigError, SessionError
from ..records import Forked, utc_now
from ..score import Scorer, apply, parse_target, target_scorer
from ..session import LogWriter, Session, dumps_line
from ._plan import read_manifest

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SCORES", "read_scores", "score_batch", "scores"]

SCORES = "scores.ndjson"
"""The scores' file name in the batch directory (not ``.jsonl``: it is not a session log)."""


def read_scores(batch_dir: str | Path) -> list[dict[str, Any]]:
    """Every line of ``scores.ndjson`` (none if the file is missing); a torn last line is
    skipped.

    Raises:
        SessionError: a line before the last is not a JSON object.
    """
    path = Path(batch_dir) / SCORES
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    out: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            if number == len(lines):
                break
            raise SessionError(f"{path}:{number}: not a JSON line: {exc}") from exc
        if not isinstance(item, dict):
            raise SessionError(f"{path}:{number}: not a JSON object")
        out.append(item)
    return out


def score_batch(
    batch_dir: str | Path,
    scorers: Iterable[Scorer] = (),
    *,
    targets: bool = True,
    secrets: Sequence[str | None] = (),
) -> pd.DataFrame:
    """Score every run of a batch whose log exists, append the new scores to
    ``scores.ndjson``, and return the :func:`scores` frame.

    Args:
        batch_dir: the batch's folder (``manifest.ndjson``, ``logs/``).
        scorers: more scorers, run on every run.
        targets: also run each task's target scorer (``"target"``), where it has one.
        secrets: credentials to write as ``<API_KEY>`` wherever they appear in a line, with
            each scorer's own (:attr:`~boxmaker.score.Scorer.secrets`: a model grader's key);
            the string under a credential-like key (``api_key`` in a grader's request) is
            ``<SECRET>`` (``boxmaker._secrets``, the rule of the logs and cassettes).

    Raises:
        SessionError: the manifest or the scores file cannot be read, or another process holds
            the scores file.
        ConfigError: two scorers share a name and version.

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
    done = {(s.get("run"), s.get("scorer"), s.get("version")) for s in read_scores(folder)}
    path = folder / SCORES
    writer = LogWriter(path, create=not path.exists())
    try:
        for run, entry in entries.items():
            log = folder / "logs" / f"{run}.jsonl"
            mine = list(extra)
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
    ``error``, ``time`` (UTC).

    Raises:
        SessionError: the manifest or the scores file cannot be read.
    """
    import pandas as pd  # only for this frame

    runs = read_manifest(batch_dir)
    latest: dict[tuple[Any, Any, Any], dict[str, Any]] = {}
    for item in read_scores(batch_dir):
        latest[(item.get("run"), item.get("scorer"), item.get("version"))] = item
    rows = []
    for (run, scorer, version), item in latest.items():
        entry = runs.get(run, {})
        rows.append(
            {
                "run": run,
                "task": entry.get("task", item.get("task")),
                **(entry.get("settings") or {}),
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
    frame["time"] = pd.to_datetime(frame["time"], utc=True, format="ISO8601")
    return frame
