"""Benchmarks researchers cite, run on a local model and scored as their authors score them.

BFCL (the Berkeley Function Calling Leaderboard, v4, from the ``bfcl-eval`` package installed
without its dependencies: ``boxmaker bench setup``): its categories as batch tasks
(:func:`run_bfcl`: ``simple_python``, ``multiple``, ``parallel``, ``parallel_multiple``,
``irrelevance``, and ``multi_turn_base`` with BFCL's executable APIs as tools, a state per
run), run through :func:`boxmaker.batch.run_batch` on any llama-server, scored by BFCL's own
checkers on the calls boxmaker recorded (:func:`score_bfcl`), summarised per category with
intervals beside boxmaker's costs (:func:`bfcl_summary`).

Private modules by role: ``_bfcl`` (BFCL's package: data, checkers, tools), ``_verdict`` (a
run's records as BFCL's model result, and BFCL's verdict on it), ``_tasks`` (entries as tasks,
each run's tools), ``_run`` (the batch and its scores), ``_summary`` (the tables),
``_harness`` (the same tasks through other agent loops pointed at ``boxmaker tap``:
:func:`run_harness`, :func:`compare_harnesses`).
"""

from .._public import publish
from ._bfcl import (
    BFCL_VERSION,
    CATEGORIES,
    MULTI_TURN,
    SETUP_COMMAND,
    SINGLE_TURN,
    Entry,
    bfcl_version,
    compile_tools,
    load_entries,
)
from ._harness import HARNESSES, compare_harnesses, format_harnesses, run_harness
from ._run import (
    BENCH_FILE,
    RUNS_FILE,
    SCORER,
    BenchSlice,
    bfcl_scorer,
    read_slice,
    run_bfcl,
    score_bfcl,
)
from ._summary import bfcl_overall, bfcl_summary, format_summary, load_runs, reprocessed_in
from ._tasks import BENCH_CONFIG, STEP_LIMIT, RunTools, pick, task_of
from ._verdict import Verdict, model_result, verdict

__all__ = [
    "BENCH_CONFIG",
    "BENCH_FILE",
    "BFCL_VERSION",
    "CATEGORIES",
    "HARNESSES",
    "MULTI_TURN",
    "RUNS_FILE",
    "SCORER",
    "SETUP_COMMAND",
    "SINGLE_TURN",
    "STEP_LIMIT",
    "BenchSlice",
    "Entry",
    "RunTools",
    "Verdict",
    "bfcl_overall",
    "bfcl_scorer",
    "bfcl_summary",
    "bfcl_version",
    "compare_harnesses",
    "compile_tools",
    "format_harnesses",
    "format_summary",
    "load_entries",
    "load_runs",
    "model_result",
    "pick",
    "read_slice",
    "reprocessed_in",
    "run_bfcl",
    "run_harness",
    "score_bfcl",
    "task_of",
    "verdict",
]

publish(globals(), __all__)
