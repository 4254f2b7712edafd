"""``boxmaker report``: the tables of session logs on stdout and, with ``--html``, the
self-contained HTML report; a batch folder among the paths adds its runs with their settings
and, when scored, the comparison of its settings (parts :mod:`boxmaker.frames.report` does not
import)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BoxmakerError
from ..view import terminal_safe

__all__ = ["run_report"]


def run_report(args: argparse.Namespace) -> int:
    """``report``: the text tables on stdout, what was left out on stderr; exit 1 when there is
    nothing to report or the HTML file cannot be written."""
    from ..frames.report import format_html, format_json, format_text, gather  # pandas: here

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
    if args.json:
        print(format_json(found.loaded, left_out=found.left_out))
        return 0
    copied = int(found.loaded.requests["from_parent"].sum())
    own = len(found.loaded.requests) - copied
    inherited = f" (and {copied} a fork copied from its parent)" if copied else ""
    print(f"{len(found.loaded.summary)} session logs, {own} requests{inherited}\n")
    print(terminal_safe(format_text(found.loaded)))
    batches = [_Batch.read(where) for where in _batch_dirs(args.paths)]
    for batch in batches:
        print(terminal_safe(batch.text()))
    if args.html is not None:
        sections = [part for batch in batches for part in batch.sections()]
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


@dataclass(frozen=True)
class _Batch:
    """What a report shows of one batch, read once for the text and the HTML: its runs (the
    manifest without server, slot and reason: task, settings, state, outcome), and the
    comparison of its settings (``None``, with ``why``: not scored, or what compare refused)."""

    folder: Path
    runs: Any
    compared: Any = None
    why: str = ""

    @classmethod
    def read(cls, folder: Path) -> _Batch:
        from ..batch import compare, manifest  # pandas: here

        runs = manifest(folder).drop(columns=["server", "slot", "reason"], errors="ignore")
        if not (folder / "scores.ndjson").is_file():
            return cls(folder, runs, why="not scored: run boxmaker score on the batch")
        try:
            return cls(folder, runs, compare(folder))
        except BoxmakerError as exc:
            return cls(folder, runs, why=f"no comparison: {exc}")

    def text(self) -> str:
        """The runs and the comparison, each under its title."""
        from ..batch import format_compare
        from ..frames.report import fit_text

        runs = fit_text(self.runs) if len(self.runs) else "(none)"
        compared = format_compare(self.compared) if self.compared is not None else self.why
        return "\n".join(
            f"{title}\n{'-' * len(title)}\n{body}\n"
            for title, body in ((self._runs_title, runs), (self._compared_title, compared))
        )

    def sections(self) -> list[Any]:
        """The HTML report's parts: the runs, and the comparison with the success-versus-
        prefill plot (or why there is none)."""
        from ..batch import format_compare, success_vs_cost
        from ..frames.report import Section

        runs = Section(self._runs_title, self.runs, "" if len(self.runs) else "(none)")
        if self.compared is None:
            return [runs, Section(self._compared_title, text=self.why)]
        header = format_compare(self.compared).splitlines()[0]
        figure = success_vs_cost(self.compared)
        table = self.compared.reset_index(drop=True)
        return [runs, Section(self._compared_title, table, header, (figure,))]

    @property
    def _runs_title(self) -> str:
        return f"Batch runs in {self.folder}"

    @property
    def _compared_title(self) -> str:
        return f"Settings compared in {self.folder}"
