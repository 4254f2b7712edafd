"""BFCL entries as batch tasks, and the tools each run is given.

A slice (:func:`pick`) takes, per category, ``limit`` entries drawn with a seed (or all, in
BFCL's order). Each entry becomes one :class:`~boxmaker.batch.Task` (:func:`task_of`): its
id is BFCL's, its messages BFCL's user turns, its tools BFCL's functions as an OpenAI
function-calling model is offered them, and its config BFCL's protocol:

- single-turn: ``loop.tool_iterations = 0``: BFCL asks once and checks that answer's calls, so
  the turn ends at the first completion that calls (its calls answered "not run", a
  ``tool_iterations`` limit hit the bench leaves out of its counts);
- multi-turn: ``loop.tool_iterations = 20``: BFCL's ``MAXIMUM_STEP_LIMIT``; a 21st completion
  with calls in one turn ends the entry, as in BFCL.

Tool names differ in schema from one entry to the next (249 of BFCL's 982 single-turn names
do), so each run gets a registry of its own (:class:`RunTools`, the batch's per-run registry):
its entry's functions only; a multi-turn run's calls execute on its own instances of BFCL's
APIs (BFCL's executor, keyed by the run: state per run, a new state for every run), and a run
continued after a stop first replays its log's calls that ran, so its APIs are where they were.
"""

from __future__ import annotations

import random
import re
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ..batch import Task
from ..errors import BenchError, SessionError
from ..records import Assistant, ToolResult
from ..session import Session
from ..tools import Registry
from ._bfcl import CATEGORIES, Entry, load_entries, multi_turn_utils
from ._verdict import call_text, forget_instances

__all__ = [
    "BENCH_CONFIG",
    "STEP_LIMIT",
    "RunTools",
    "pick",
    "task_of",
]

STEP_LIMIT = 20
"""BFCL's ``MAXIMUM_STEP_LIMIT``: completions with calls one multi-turn turn may make."""

BENCH_CONFIG: Mapping[str, Any] = {
    "loop.repeat_detection": False,
    "loop.cycle_length": -1,
    "loop.tool_result_cap": -1,
}
"""The loop settings of a BFCL run (BFCL's harness has neither repeat nor cycle rules, nor a
cap on tool results); a grid or ``--set`` can put boxmaker's own back."""

RECORDED = "The call was recorded."
"""What a single-turn entry's tool answers, were it ever run (BFCL does not run them; the
bench ends the turn at the first call)."""


def pick(
    categories: Sequence[str] = CATEGORIES,
    *,
    limit: int | None = None,
    seed: int | None = None,
) -> list[Entry]:
    """The entries of a slice: per category, all of them, or ``limit`` of them (the first
    ``limit`` in BFCL's order, or, with ``seed``, ``limit`` drawn at random with that seed,
    kept in BFCL's order).

    Raises:
        BenchError: an unknown category, ``limit`` below 1, or ``bfcl-eval`` not installed.
    """
    if limit is not None and limit < 1:
        raise BenchError(f"limit must be 1 or more, not {limit}")
    out: list[Entry] = []
    for category in dict.fromkeys(categories):
        entries = list(load_entries(category))
        if limit is not None and limit < len(entries):
            if seed is None:
                entries = entries[:limit]
            else:
                chosen = set(random.Random(f"{seed}:{category}").sample(range(len(entries)), limit))
                entries = [e for i, e in enumerate(entries) if i in chosen]
        out.extend(entries)
    return out


def task_of(entry: Entry) -> Task:
    """``entry`` as a batch task (see the module docstring)."""
    iterations = STEP_LIMIT if entry.multi_turn else 0
    return Task(
        id=entry.id,
        messages=entry.turns,
        tools=tuple(t["function"]["name"] for t in entry.tools()),
        config={"loop.tool_iterations": iterations},
    )


class RunTools:
    """The batch's per-run registry (``run_batch(registry=RunTools(...))``): for a run of an
    entry, a registry of that entry's tools; a multi-turn run's calls execute on BFCL's APIs,
    a state of the run's own.

    Args:
        entries: the slice's entries (a run's task id is its entry's id).
        logs_dir: the batch's ``logs/``: a run continued after a stop replays the calls its log
            says ran, so its APIs are where the stopped run left them.
    """

    def __init__(self, entries: Iterable[Entry], logs_dir: Path | None = None) -> None:
        self._entries = {e.id: e for e in entries}
        self._logs = logs_dir
        self._lock = threading.Lock()
        self._models: set[str] = set()

    def entry(self, task_id: str) -> Entry:
        """The entry of a task.

        Raises:
            BenchError: no entry of the slice has that id.
        """
        try:
            return self._entries[task_id]
        except KeyError:
            raise BenchError(f"task {task_id!r} is no BFCL entry of this slice") from None

    def __call__(self, run_id: str, task: Any) -> Registry:
        """The registry of one run (``task``: the run's :class:`~boxmaker.batch.Task`)."""
        entry = self.entry(task.id)
        registry = Registry()
        execute = self._executor(run_id, entry) if entry.multi_turn else None
        for tool in entry.tools():
            fn = tool["function"]
            registry.add(
                _tool_function(fn["name"], execute),
                name=fn["name"],
                description=fn["description"],
                parameters=fn["parameters"],
            )
        return registry

    def _executor(self, run_id: str, entry: Entry) -> Callable[[str], str]:
        """A function running one call text on the run's own API instances (made at the first
        call: from the entry's initial state, then the calls the run's log says ran)."""
        model = "boxmaker_run_" + re.sub(r"\W", "_", run_id)
        utils = multi_turn_utils()
        lock = threading.Lock()

        def run(call: str) -> str:
            results, _ = utils.execute_multi_turn_func_call(
                [call], dict(entry.initial_config), list(entry.involved_classes), model, entry.id
            )
            return str(results[0])

        def execute(call: str) -> str:
            with lock:
                with self._lock:
                    fresh = model not in self._models
                    self._models.add(model)
                if fresh:
                    forget_instances(model)  # a state left by an earlier bench in this process
                    for earlier in self._ran_calls(run_id):
                        run(earlier)
                return run(call)

        return execute

    def _ran_calls(self, run_id: str) -> list[str]:
        """The call texts of the calls a run's log says ran, in order (none without a log)."""
        path = None if self._logs is None else self._logs / f"{run_id}.jsonl"
        if path is None or not path.exists():
            return []
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Session.open(path, read_only=True) as session:
                    records = session.records
        except SessionError:
            return []
        calls = {c.id: c for r in records if isinstance(r, Assistant) for c in r.tool_calls}
        out = []
        for record in records:
            if isinstance(record, ToolResult) and record.not_run is None:
                call = calls.get(record.tool_call_id)
                if call is not None:
                    try:
                        out.append(call_text(call.name, call.arguments))
                    except (ValueError, TypeError, AttributeError):
                        continue
        return out

    def close(self) -> None:
        """Drop every run's API instances (BFCL's executor keeps them in its module)."""
        with self._lock:
            models, self._models = self._models, set()
        for model in models:
            forget_instances(model)


def _tool_function(name: str, execute: Callable[[str], str] | None) -> Callable[..., str]:
    """The local function of one tool: a multi-turn call runs on the run's APIs (BFCL's
    result text, an execution error included); a single-turn one is only recorded."""

    def tool(**arguments: Any) -> str:
        if execute is None:
            return RECORDED
        return execute(call_text(name, arguments))

    tool.__name__ = name
    return tool
