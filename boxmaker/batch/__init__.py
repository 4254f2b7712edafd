"""``run_batch``: tasks x a config grid over every slot of every server (threads or Ray),
resumable, with a fsynced manifest; ``frames(batch_dir, name)`` with the task and setting
columns joined in; ``score_batch`` (scores in ``scores.ndjson``, apart from the logs) and
``compare`` (success rates with paired bootstrap intervals beside the runs' costs).
"""

from .._public import publish
from ._compare import compare, compare_frame, format_compare
from ._plan import BatchProgress, Task, load_grid, load_tasks, manifest
from ._runner import ProgressHook, frames, run_batch
from ._score import read_scores, score_batch, scores
from ._view import TerminalProgress, describe

__all__ = [
    "BatchProgress",
    "ProgressHook",
    "Task",
    "TerminalProgress",
    "compare",
    "compare_frame",
    "describe",
    "format_compare",
    "frames",
    "load_grid",
    "load_tasks",
    "manifest",
    "read_scores",
    "run_batch",
    "score_batch",
    "scores",
]

publish(globals(), __all__)
