"""``run_batch``: tasks x a config grid over every slot of every server (threads or Ray),
resumable, with a fsynced manifest; ``frames(batch_dir, name)`` with the task and setting
columns joined in.
"""

from .._public import publish
from ._plan import BatchProgress, Task, load_grid, load_tasks, manifest
from ._runner import ProgressHook, frames, run_batch
from ._view import TerminalProgress, describe

__all__ = [
    "BatchProgress",
    "ProgressHook",
    "Task",
    "TerminalProgress",
    "describe",
    "frames",
    "load_grid",
    "load_tasks",
    "manifest",
    "run_batch",
]

publish(globals(), __all__)
