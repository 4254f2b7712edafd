"""Limits picked from evidence: for runs labelled runaway or not, which limit settings would have
stopped the runaways, and how many good runs they would have cut short.

Each run's logged turns are replayed through the loop's own rules (a
:class:`~boxmaker.turn.LoopGuard` per turn, fed the logged calls and results, and the turn's
reasoning tokens against the thinking cap) under each setting of a grid of
:class:`~boxmaker.config.LoopLimits` knobs. A rule *fires* on a run when it would have ended
one of its turns (the thinking cap: when a turn's reasoning reached it). This reads the log as
it is: after a rule fires, the real run would have gone differently, so the counts say which
runs a setting would have touched, not what they would then have done.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import LoopLimits
from ..errors import ConfigError
from ..records import Assistant, Record, ToolResult, Usage, User
from ..session import Session
from ..turn import LoopGuard
from ._manifest import read_manifest

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["CALIBRATION_RULES", "batch_records", "calibrate", "rules_fired"]

CALIBRATION_RULES = (
    "tool_iterations",
    "repeated_call",
    "cycle",
    "stale_result",
    "tool_call_cap",
    "thinking_cap",
)
"""The rules a setting is judged by (the loop guard's ``loop`` rules by name)."""

_RULE = re.compile(r"^rule (\w+):")


def rules_fired(records: Sequence[Record], limits: LoopLimits) -> set[str]:
    """The rules of :data:`CALIBRATION_RULES` that would have ended a turn of ``records``
    under ``limits``."""
    fired: set[str] = set()
    guard = LoopGuard(limits)
    reasoning = 0
    pending: dict[str, Any] = {}
    for record in records:
        if isinstance(record, User):
            guard, reasoning, pending = LoopGuard(limits), 0, {}
        elif isinstance(record, Usage):
            reasoning += record.reasoning_tokens or 0  # None: not counted (a whole answer)
            cap = limits.thinking_tokens
            if cap is not None and reasoning >= cap:
                fired.add("thinking_cap")
        elif isinstance(record, Assistant) and record.tool_calls:
            if (limit := guard.completion()) is not None:
                fired.add(limit.kind)
            for call in record.tool_calls:
                verdict = guard.check(call)
                if verdict.action == "stop" and verdict.limit is not None:
                    found = _RULE.match(verdict.limit.detail or "")
                    fired.add(found.group(1) if found else verdict.limit.kind)
                elif verdict.action == "run":
                    pending[call.id] = call
        elif isinstance(record, ToolResult) and record.tool_call_id in pending:
            guard.ran(pending.pop(record.tool_call_id), record.content)
    return fired


def batch_records(batch_dir: str | Path) -> dict[str, tuple[Record, ...]]:
    """Every run of a batch with a log, and its records (read-only).

    Raises:
        SessionError: the manifest or a log cannot be read.
    """
    folder = Path(batch_dir)
    out: dict[str, tuple[Record, ...]] = {}
    for run in read_manifest(folder):
        log = folder / "logs" / f"{run}.jsonl"
        if log.exists():
            out[run] = Session.open(log, read_only=True).records
    return out


def calibrate(
    runs: Mapping[str, Sequence[Record]],
    runaway: Mapping[str, bool],
    grid: Mapping[str, Sequence[Any]],
    base: LoopLimits | None = None,
) -> pd.DataFrame:
    """For each setting of ``grid`` and each rule, the runaways it stops and the good runs it
    cuts short.

    Args:
        runs: run id -> its records (:func:`batch_records` gives a batch's).
        runaway: run id -> ``True`` for a runaway, ``False`` for a good run (by hand, or from a
            scorer's values); runs without a label are left out.
        grid: :class:`~boxmaker.config.LoopLimits` field names to lists of values
            (``{"tool_iterations": [2, 4, 8]}``); every combination is a setting.
        base: the limits the grid's values are laid on (default ``LoopLimits()``).

    Returns:
        One row per (setting, rule), and a rule ``any`` per setting: the grid's columns,
        ``rule``, ``runaways_stopped`` of ``runaways``, ``good_cut`` of ``good``, and the rates
        ``stop_rate`` and ``cut_rate``.

    Raises:
        ConfigError: an unknown knob or a value :class:`LoopLimits` refuses, no labelled run.
    """
    import pandas as pd

    base = base or LoopLimits()
    known = {f.name for f in dataclasses.fields(LoopLimits)}
    unknown = set(grid) - known
    if unknown:
        raise ConfigError(f"unknown LoopLimits knobs {sorted(unknown)}")
    labelled = {run: bool(runaway[run]) for run in runs if run in runaway}
    if not labelled:
        raise ConfigError("no run has a label")
    bad = sum(labelled.values())
    good = len(labelled) - bad
    keys = sorted(grid)
    rows = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        setting = dict(zip(keys, combo, strict=True))
        limits = dataclasses.replace(base, **setting)
        fired = {run: rules_fired(runs[run], limits) for run in labelled}
        for rule in (*CALIBRATION_RULES, "any"):
            hit = {
                run for run, rules in fired.items() if (rules if rule == "any" else rule in rules)
            }
            stopped = sum(1 for run in hit if labelled[run])
            cut = len(hit) - stopped
            rows.append(
                {
                    **setting,
                    "rule": rule,
                    "runaways_stopped": stopped,
                    "runaways": bad,
                    "good_cut": cut,
                    "good": good,
                    "stop_rate": stopped / bad if bad else float("nan"),
                    "cut_rate": cut / good if good else float("nan"),
                }
            )
    return pd.DataFrame(rows)
