"""The batch folders a source names, and what their manifests and scores say of each run
(:func:`boxmaker.batch.read_manifest`, :func:`boxmaker.batch.read_scores`): an export of a
batch keeps the task, the grid settings, the target and the scores of every run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..session import Log, Session, Source

__all__ = ["batch_folders", "batch_runs", "batch_scores", "source_paths"]


def source_paths(source: Source) -> list[str]:
    """The paths among ``source`` (sessions and logs read already name no batch folder)."""
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    if isinstance(source, Log | Session):
        return []
    return [os.fspath(s) for s in source if isinstance(s, str | os.PathLike)]


def batch_folders(source: Source) -> list[Path]:
    """The batch folders among ``source``: a path that is one (it holds the manifest), its
    ``logs/`` folder, or a log in that folder."""
    from ..batch import MANIFEST

    out: list[Path] = []
    for item in source_paths(source):
        path = Path(item)
        logs = path if path.is_dir() else path.parent
        candidates = [path] + ([logs.parent] if logs.name == "logs" else [])
        for candidate in candidates:
            if (candidate / MANIFEST).is_file():
                if candidate not in out:
                    out.append(candidate)
                break
    return out


def batch_runs(source: Source) -> dict[str, dict[str, Any]]:
    """Each run of the batch folders in ``source``, by run id (a run's session id): its
    ``task``, grid ``settings`` (dotted keys) and ``target`` (when the task has one).

    Raises:
        SessionError: a batch's manifest cannot be read.
    """
    from ..batch import read_manifest

    out: dict[str, dict[str, Any]] = {}
    for folder in batch_folders(source):
        for run, entry in read_manifest(folder).items():
            kept = {"task": entry.get("task"), "settings": dict(entry.get("settings") or {})}
            if isinstance(entry.get("target"), dict):
                kept["target"] = entry["target"]
            out[run] = kept
    return out


def batch_scores(source: Source) -> dict[str, dict[str, dict[str, Any]]]:
    """The latest score of each (run, scorer) in the ``scores.ndjson`` of the batch folders in
    ``source`` (a line without a value, a scorer's error, is left out)."""
    from ..batch import read_scores

    out: dict[str, dict[str, dict[str, Any]]] = {}
    folders = batch_folders(source)
    for item in source_paths(source):  # a folder of logs with a scores file beside them
        folder = Path(item)
        for candidate in (folder, folder.parent):
            if (candidate / "scores.ndjson").is_file() and candidate not in folders:
                folders.append(candidate)
    for folder in folders:
        for line in read_scores(folder):
            if line.get("value") is not None:
                out.setdefault(str(line["run"]), {})[str(line["scorer"])] = line
    return out
