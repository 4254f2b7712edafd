"""A BFCL run: the slice as a batch (:func:`boxmaker.batch.run_batch`), scored by BFCL's checkers.

A bench folder is a batch folder (``manifest.ndjson``, ``logs/``, ``scores.ndjson``: resume,
frames, ``boxmaker report`` and ``compare`` work on it as on any batch) plus ``bench.json``,
the slice it holds (categories, limit, seed, repeats, the entry ids and BFCL's version), so it
can be scored and summarised later without saying the slice again.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..batch import BatchProgress, ProgressHook, run_batch, score_batch
from ..config import Config
from ..errors import BenchError
from ..records import Record
from ..score import Score, Scorer
from ._bfcl import BFCL_VERSION, CATEGORIES, Entry, bfcl_version, load_entries
from ._tasks import BENCH_CONFIG, RunTools, pick, task_of
from ._verdict import model_result, verdict

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BENCH_FILE",
    "RUNS_FILE",
    "SCORER",
    "BenchSlice",
    "bfcl_scorer",
    "read_runs",
    "read_slice",
    "run_bfcl",
    "score_bfcl",
]

RUNS_FILE = "runs.ndjson"
"""A harness folder's runs and their scores, one JSON line each (:mod:`._harness`)."""

BENCH_FILE = "bench.json"
"""The slice a bench folder holds (a JSON object, :class:`BenchSlice`)."""

SCORER = "bfcl"
"""The name of BFCL's scorer in ``scores.ndjson`` (its version: BFCL's, then boxmaker's)."""

_SCORER_VERSION = f"{BFCL_VERSION}+1"


@dataclass(frozen=True, kw_only=True)
class BenchSlice:
    """What a bench folder holds.

    Attributes:
        benchmark: ``"bfcl"``.
        categories: the categories, in order.
        limit: entries per category (``None``: all).
        seed: the seed the entries were drawn with (``None``: the first ``limit``).
        repeats: runs per entry (``sampling.seed`` set to ``seed0, seed0 + 1, ...``).
        entries: the entry ids, in order.
        bfcl_version: the ``bfcl-eval`` the slice was taken from.
    """

    benchmark: str
    categories: tuple[str, ...]
    limit: int | None
    seed: int | None
    repeats: int
    entries: tuple[str, ...]
    bfcl_version: str

    def load(self) -> dict[str, Entry]:
        """The slice's entries by id.

        Raises:
            BenchError: ``bfcl-eval`` is not installed, or an entry is no longer in it.
        """
        known = {e.id: e for c in self.categories for e in load_entries(c)}
        missing = [i for i in self.entries if i not in known]
        if missing:
            raise BenchError(f"entries {missing[:3]} are not in bfcl-eval {bfcl_version()}")
        return {i: known[i] for i in self.entries}


def read_slice(batch_dir: str | os.PathLike[str]) -> BenchSlice:
    """The slice of a bench folder (its ``bench.json``).

    Raises:
        BenchError: the folder has no readable ``bench.json`` (it is not a bench folder).
    """
    path = Path(batch_dir) / BENCH_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return BenchSlice(
            benchmark=data["benchmark"],
            categories=tuple(data["categories"]),
            limit=data["limit"],
            seed=data["seed"],
            repeats=int(data["repeats"]),
            entries=tuple(data["entries"]),
            bfcl_version=data["bfcl_version"],
        )
    except FileNotFoundError:
        raise BenchError(f"{batch_dir}: no {BENCH_FILE}: not a bench folder") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"{path}: cannot read the slice: {exc!r}") from exc


def _keep_slice(batch_dir: Path, wanted: BenchSlice) -> None:
    """Write ``bench.json``, or check that the folder holds this very slice (a rerun resumes)."""
    path = batch_dir / BENCH_FILE
    if path.exists():
        held = read_slice(batch_dir)
        if (held.entries, held.repeats) != (wanted.entries, wanted.repeats):
            raise BenchError(
                f"{batch_dir} holds another slice ({len(held.entries)} entries x "
                f"{held.repeats}); give another --dir, or the same categories, limit, seed "
                "and repeats to resume it"
            )
        return
    batch_dir.mkdir(parents=True, exist_ok=True)
    data = {k: getattr(wanted, k) for k in BenchSlice.__dataclass_fields__}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def run_bfcl(
    batch_dir: str | os.PathLike[str],
    *,
    servers: Sequence[Any],
    categories: Sequence[str] = CATEGORIES,
    limit: int | None = None,
    seed: int | None = None,
    repeats: int = 1,
    grid: Mapping[str, Sequence[Any]] | None = None,
    config: Config | None = None,
    max_tries: int = 3,
    on_progress: ProgressHook | None = None,
    cancel: threading.Event | None = None,
) -> BatchProgress:
    """Run a BFCL slice through boxmaker's loop, as a batch, and score it by BFCL's checkers.

    Args:
        batch_dir: the bench folder (a batch folder with ``bench.json``); the same call again
            resumes it.
        servers: llama-server URLs, or objects with a ``url`` (an embedded server).
        categories: BFCL categories (:data:`~boxmaker.bench.CATEGORIES`).
        limit: entries per category (``None``: all); seed: draw them at random with it.
        repeats: runs per entry, for pass^k (``sampling.seed`` = the config's seed + 0, 1, ...;
            with temperature 0 the repeats are alike).
        grid: more settings to compare (dotted config keys to lists of values).
        config: the base config; BFCL's protocol (:data:`BENCH_CONFIG`) is laid on top, and
            the grid over that.
        max_tries, on_progress, cancel: as :func:`boxmaker.batch.run_batch`.

    Returns:
        The batch's last progress; the scores are in ``scores.ndjson`` (:func:`score_bfcl`).

    Raises:
        BenchError: ``bfcl-eval`` is missing, an unknown category, a bad limit, or the folder
            holds another slice.
        ConfigError, ServerError, SessionError: as :func:`boxmaker.batch.run_batch`.
    """
    if repeats < 1:
        raise BenchError(f"repeats must be 1 or more, not {repeats}")
    entries = pick(categories, limit=limit, seed=seed)
    if not entries:
        raise BenchError("the slice has no entry")
    root = Path(batch_dir)
    held = BenchSlice(
        benchmark="bfcl",
        categories=tuple(dict.fromkeys(categories)),
        limit=limit,
        seed=seed,
        repeats=repeats,
        entries=tuple(e.id for e in entries),
        bfcl_version=bfcl_version(),
    )
    _keep_slice(root, held)
    base = (config or Config()).with_settings(BENCH_CONFIG, source="BFCL's protocol")
    settings = dict(grid or {})
    if repeats > 1:
        first = base.sampling.seed or 0
        settings["sampling.seed"] = [first + i for i in range(repeats)]
    tools = RunTools(entries, root / "logs")
    try:
        progress = run_batch(
            [task_of(e) for e in entries],
            root,
            servers=servers,
            registry=tools,
            grid=settings or None,
            config=base,
            max_tries=max_tries,
            on_progress=on_progress,
            cancel=cancel,
        )
    finally:
        tools.close()
    score_bfcl(root)
    return progress


def bfcl_scorer(entry: Entry) -> Scorer:
    """The scorer of a run of ``entry``: 1 when BFCL's evaluation counts it right, else 0,
    BFCL's error type and message as the explanation (:mod:`boxmaker.bench._verdict`)."""

    def score(records: Sequence[Record]) -> Score:
        judged = verdict(entry, model_result(entry, records))
        if judged.valid:
            return Score(value=1.0, explanation=f"{entry.category}: right")
        why = f"{entry.category}: {judged.error_type}: {judged.error}"
        return Score(value=0.0, explanation=why[:2000])

    return Scorer(name=SCORER, fn=score, version=_SCORER_VERSION)


def score_bfcl(batch_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """Score every run of a bench folder by BFCL's checkers (offline; runs scored already by
    this scorer version are not scored again) and return the scores frame
    (:func:`boxmaker.batch.scores`).

    Raises:
        BenchError: not a bench folder, or ``bfcl-eval`` is missing.
        SessionError: the manifest or the scores file cannot be read.
    """
    entries = read_slice(batch_dir).load()

    def scorers_for(run: str, line: Mapping[str, Any]) -> list[Scorer]:
        entry = entries.get(str(line.get("task")))
        return [] if entry is None else [bfcl_scorer(entry)]

    return score_batch(Path(batch_dir), targets=False, scorers_for=scorers_for)


def read_runs(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The lines of a harness folder's ``runs.ndjson`` (none when it is missing; a torn last
    line skipped)."""
    path = Path(folder) / RUNS_FILE
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append(item)
    return out
