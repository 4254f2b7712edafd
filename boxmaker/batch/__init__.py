"""``run_batch``: tasks (scripted sessions, or ``ForkTask``: a session log forked at a turn)
x a config grid over every slot of every server (threads or Ray),
resumable, with a fsynced manifest; ``frames(batch_dir, name)`` with the task and setting
columns joined in; ``score_batch`` (scores in ``scores.ndjson``, apart from the logs) and
``compare`` (success rates with paired bootstrap intervals beside the runs' costs; a fork's
costs its own: the frames start a fork when it was made);
``model_graded``, a scorer whose grades a model gives (its requests kept with the scores).
"""

from typing import TYPE_CHECKING

from .._public import publish
from ._calibrate import CALIBRATION_RULES, batch_records, calibrate, rules_fired
from ._compare import (
    COST_COLUMNS,
    compare,
    compare_frame,
    format_compare,
    success_vs_cost,
)
from ._grade import GRADE_TEMPLATE, GRADES, model_graded
from ._manifest import MANIFEST, manifest, read_manifest
from ._runner import PROCESSES_FROM, ProgressHook, frames, pick_executor, run_batch
from ._score import SCORES, SCORES_TORN, read_scores, score_batch, scores
from ._state import BatchProgress, pending
from ._tasks import REPLAY_MODES, ForkTask, Task, load_grid, load_tasks
from ._view import BatchView, TerminalProgress, describe_progress

__all__ = [
    "CALIBRATION_RULES",
    "COST_COLUMNS",
    "GRADES",
    "GRADE_TEMPLATE",
    "MANIFEST",
    "PROCESSES_FROM",
    "REPLAY_MODES",
    "SCORES",
    "SCORES_TORN",
    "BatchProgress",
    "BatchView",
    "CompareView",
    "ForkTask",
    "ProgressHook",
    "Task",
    "TerminalProgress",
    "batch_records",
    "calibrate",
    "compare",
    "compare_frame",
    "describe_progress",
    "format_compare",
    "frames",
    "load_grid",
    "load_tasks",
    "manifest",
    "model_graded",
    "pending",
    "pick_executor",
    "read_manifest",
    "read_scores",
    "rules_fired",
    "run_batch",
    "score_batch",
    "scores",
    "success_vs_cost",
]

if TYPE_CHECKING:
    from ._compare_view import CompareView


def __getattr__(name: str) -> object:
    """``CompareView`` is loaded on first use (it imports ipywidgets), PEP 562.

    Raises:
        AttributeError: ``name`` is not a name of the package.
    """
    if name == "CompareView":
        from ._compare_view import CompareView

        CompareView.__module__ = __name__
        return CompareView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


publish(globals(), [n for n in __all__ if n != "CompareView"])
