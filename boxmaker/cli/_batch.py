"""``boxmaker batch``, ``score`` and ``compare``: tasks times a grid on every slot, the runs
scored (targets, scorers given as ``MODULE:NAME``), the settings compared
(:mod:`boxmaker.batch`)."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config, load_config
from ..demo import demo_registry
from ..errors import ConfigError
from ..view import terminal_safe
from ._flags import server_ctx

if TYPE_CHECKING:
    from ..score import Scorer

__all__ = ["SavingServer", "run_batch_command", "run_compare", "run_score"]


@dataclass(frozen=True)
class SavingServer:
    """A llama-server at ``url`` that saves slots in ``slot_save_path`` (its
    ``--slot-save-path``, a folder on this machine): the batch saves every run's slot there
    at its turn ends and restores a fork's parent's from it."""

    url: str
    slot_save_path: Path


def run_batch_command(args: argparse.Namespace) -> int:
    from ..batch import (
        TerminalProgress,
        describe_progress,
        load_grid,
        load_tasks,
        pending,
        run_batch,
        score_batch,
    )

    config = load_config(args.config) if args.config else Config()
    grid = load_grid(args.grid) if args.grid else None
    servers: list[object] = list(args.url or [])
    if not servers and not args.embedded:
        print("boxmaker batch: give --url URL (one or more) or --embedded", file=sys.stderr)
        return 2
    tasks = load_tasks(args.tasks)  # a bad file is said before a server starts or tools load
    if args.slot_save_path is not None:  # the URL servers save slots there, on this machine
        from ..cache import SlotStore  # httpx: only when slots are saved

        SlotStore(args.slot_save_path)  # a folder it cannot use is said before anything runs
        servers = [SavingServer(str(url), Path(args.slot_save_path)) for url in servers]
    progress = TerminalProgress()
    if not pending(tasks, args.dir, grid):  # a finished batch, resumed: no server to start
        print(f"batch {args.dir}: every run is done already; nothing to run")
        return 0
    with contextlib.ExitStack() as stack:
        if args.embedded:
            from ..server import EmbeddedServer

            n = args.parallel
            embedded = EmbeddedServer(
                args.model,
                n_ctx=server_ctx(args),
                n_parallel=n,
                n_threads=args.threads,
                slot_save_path=args.slot_save_path,
            )
            servers.append(stack.enter_context(embedded))
        try:
            result = run_batch(
                tasks,
                args.dir,
                servers=servers,  # type: ignore[arg-type]  # URLs and an EmbeddedServer
                registry=demo_registry(),  # the CLI's tools: the demo's, said here
                grid=grid,
                config=config,
                max_tries=args.tries,
                executor="ray" if args.ray else "auto",  # processes where --workers or many slots
                workers=args.workers,
                ray_address=None if args.ray in (None, "local") else args.ray,
                on_progress=progress,
            )
        except KeyboardInterrupt:
            progress.close()
            print(f"\ninterrupted; run the same command again to resume {args.dir}")
            return 130
        finally:
            progress.close()
    print(describe_progress(result))
    for run, reason in result.failures:
        print(terminal_safe(f"failed {run}: {reason}"))  # a server's error body among them
    _say_warm(args.dir)
    print(f"batch {args.dir}: logs in {Path(args.dir) / 'logs'}, manifest.ndjson beside them")
    if any(task.target is not None for task in tasks):
        scored = score_batch(args.dir)
        print(f"scored {len(scored)} run(s) by their targets: {Path(args.dir) / 'scores.ndjson'}")
    return 1 if result.failed else 0


def _say_warm(batch_dir: str) -> None:
    """For a batch of forks: how warm their first requests found the parent's prefix, as
    measured (the manifest's ``warm``: the fork's ``Warmed`` label), and, one line each, what
    those that were not warm reused and why."""
    from ..batch import manifest

    runs = manifest(batch_dir)
    if "warm" not in runs.columns:
        return
    how = list(runs["warm"])
    print(
        f"forks (measured: 0.9 of the parent's prefix reused is warm): {how.count('slot')} "
        f"found it in their slot, {how.count('restored')} restored it from a saved slot, "
        f"{how.count('server')} found it in the server's own cache, {how.count('partial')} "
        f"partial, {how.count('cold')} cold, {how.count('unknown')} not measured"
    )
    for row in runs[runs["warm"].isin(["partial", "cold", "unknown"])].to_dict("records"):
        print(terminal_safe(f"{row['warm']} {row['run']}: {row['warm_detail']}"))


def run_score(args: argparse.Namespace) -> int:
    from ..batch import score_batch

    scorers = [_load_scorer(spec) for spec in args.scorer]
    frame = score_batch(args.batch_dir, scorers)
    if frame.empty:
        print(f"boxmaker score: no run of {args.batch_dir} has a target or a scorer to run")
        return 1
    summary = frame.groupby("scorer")["value"].agg(["count", "mean"])
    for name, row in summary.iterrows():
        print(f"{terminal_safe(str(name))}: {int(row['count'])} run(s), mean {row['mean']:.3f}")
    failed = int(frame["error"].notna().sum())
    if failed:
        print(f"{failed} score(s) failed: see the 'error' column of boxmaker.batch.scores")
    print(f"scores in {Path(args.batch_dir) / 'scores.ndjson'}")
    return 0


def _load_scorer(spec: str) -> Scorer:
    """``MODULE:NAME`` -> a :class:`~boxmaker.score.Scorer` (a bare function is named by its
    ``MODULE:NAME``). ``MODULE`` is found as ``python -m`` finds one: the current folder first
    (a ``graders.py`` beside the batch needs no ``PYTHONPATH=.``)."""
    import importlib
    import sys

    from ..score import Scorer  # numpy: only when a command scores

    module, _, name = spec.partition(":")
    if not module or not name:
        raise ConfigError(f"--scorer {spec!r}: write MODULE:NAME")
    here = os.getcwd()
    added = here not in sys.path
    if added:
        sys.path.insert(0, here)
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--scorer {spec!r}: {exc}") from exc
    finally:
        if added:
            sys.path.remove(here)
    if isinstance(found, Scorer):
        return found
    if callable(found):
        return Scorer(name=spec, fn=found)
    raise ConfigError(f"--scorer {spec!r} is neither a Scorer nor a function")


def run_compare(args: argparse.Namespace) -> int:
    from ..batch import compare, format_compare

    table = compare(
        args.batch_dir,
        args.by,
        scorer=args.scorer,
        baseline=args.baseline,
        confidence=args.confidence,
        resamples=args.resamples,
        seed=args.seed,
    )
    if args.json:
        print(table.to_json(orient="records"))
    else:
        print(terminal_safe(format_compare(table)))
    return 0
