"""``boxmaker report``: the tables of session logs on stdout and, with ``--html``, the
self-contained HTML report; a batch folder among the paths adds its runs with their settings
and, when scored, the comparison of its settings (parts :mod:`boxmaker.frames.report` does not
import)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import BoxmakerError
from ..view import terminal_safe

__all__ = ["run_report"]


def run_report(args: argparse.Namespace) -> int:
    """``report``: the text tables on stdout, what was left out on stderr; exit 1 when there is
    nothing to report or the HTML file cannot be written."""
    from ..frames.report import format_html, format_text, gather  # pandas, matplotlib: here

    if args.html is not None and not Path(args.html).absolute().parent.is_dir():
        print(f"boxmaker report: cannot write {args.html}: no such directory", file=sys.stderr)
        return 1
    found = gather(args.paths)
    for message in found.left_out:  # log text (a tool name, a cause...) is printed inert
        print(terminal_safe(f"boxmaker report: {message}"), file=sys.stderr)
    if found.loaded is None:
        if found.logs or not found.left_out:  # else the paths' own problems said it all
            print(terminal_safe(f"boxmaker report: {found.error}"), file=sys.stderr)
        return 1
    print(f"{len(found.loaded.summary)} session logs, {len(found.loaded.requests)} requests\n")
    print(terminal_safe(format_text(found.loaded)))
    batch_dirs = _batch_dirs(args.paths)
    for batch_dir in batch_dirs:
        print(terminal_safe(_batch_runs(batch_dir)))
        print(terminal_safe(_batch_compare(batch_dir)))
    if args.html is not None:
        sections = [part for where in batch_dirs for part in _batch_sections(where)]
        page = format_html(found.loaded, left_out=list(found.left_out), sections=sections)
        try:
            Path(args.html).write_text(page, encoding="utf-8")
        except OSError as exc:
            print(f"boxmaker report: cannot write {args.html}: {exc}", file=sys.stderr)
            return 1
        print(f"HTML report: {args.html}")
    return 0


def _batch_dirs(paths: Sequence[str]) -> list[Path]:
    """The batch directories among report paths: a path holding a ``manifest.ndjson``, or the
    ``logs`` folder of one (``boxmaker batch --dir DIR`` writes ``DIR/logs/*.jsonl``)."""
    found: list[Path] = []
    for path in map(Path, paths):
        for where in (path, path.parent):
            if (where / "manifest.ndjson").is_file() and where not in found:
                found.append(where)
                break
    return found


def _batch_runs(batch_dir: Path) -> str:
    """The runs of a batch as a text table: each run's id with its task, grid settings, state
    and outcome (the logs' session ids are the run ids, hashes of task and settings)."""
    from ..batch import manifest  # pandas: here
    from ..frames.report import fit_text

    runs = manifest(batch_dir).drop(columns=["server", "slot", "reason"], errors="ignore")
    title = f"Batch runs in {batch_dir}"
    return f"{title}\n{'-' * len(title)}\n{fit_text(runs) if len(runs) else '(none)'}\n"


def _batch_compare(batch_dir: Path) -> str:
    """The comparison of a batch's settings as text (:func:`boxmaker.batch.format_compare`),
    or why there is none (not scored, or what compare refused)."""
    from ..batch import compare, format_compare

    title = f"Settings compared in {batch_dir}"
    head = f"{title}\n{'-' * len(title)}\n"
    if not (batch_dir / "scores.ndjson").is_file():
        return f"{head}not scored: run boxmaker score on the batch\n"
    try:
        return f"{head}{format_compare(compare(batch_dir))}\n"
    except BoxmakerError as exc:
        return f"{head}no comparison: {exc}\n"


def _batch_sections(batch_dir: Path) -> list[Any]:
    """The HTML report's parts of a batch: its runs with their tasks and settings, and, when
    the batch is scored, :func:`boxmaker.batch.compare` of its settings with the
    success-versus-prefill plot (or why there is no comparison)."""
    from ..batch import compare, format_compare, manifest, success_vs_cost
    from ..frames.report import Section

    runs = manifest(batch_dir).drop(columns=["server", "slot", "reason"], errors="ignore")
    parts = [Section(f"Batch runs in {batch_dir}", runs, "" if len(runs) else "(none)")]
    title = f"Settings compared in {batch_dir}"
    if not (batch_dir / "scores.ndjson").is_file():
        parts.append(Section(title, text="not scored: run boxmaker score on the batch"))
        return parts
    try:
        table = compare(batch_dir)
    except BoxmakerError as exc:
        parts.append(Section(title, text=f"no comparison: {exc}"))
        return parts
    header = format_compare(table).splitlines()[0]
    figure = success_vs_cost(table)
    parts.append(Section(title, table.reset_index(drop=True), header, (figure,)))
    return parts
