"""The harness tax: the same BFCL tasks through other agent loops, pointed at ``boxmaker tap``.

Each harness runs every entry of the slice against one server through a tap of its own (one
:class:`boxmaker.tap.Tap` per run, so each run's log is its own session log, whatever the
harness sends), with the same model, tools (the functions of :class:`RunTools`: BFCL's APIs,
a state per run), sampling (temperature, seed, ``max_tokens``) and BFCL's protocol: one
completion for a single-turn entry, at most :data:`STEP_LIMIT` completions with calls per
multi-turn turn. A run is scored by the same checker on the calls the tap recorded
(:func:`bfcl_scorer`). What each harness does between the model and the tools (history it
sends back, arguments it validates, retries it makes) is what is measured.

A harness folder (``<dir>/<harness>/``) holds ``bench.json`` (the slice), ``logs/<run>/``
(the tap's log of that run) and ``runs.ndjson``, one line per run: ``run``, ``task``,
``harness``, ``log``, ``value``, ``explanation``, ``error`` (what the harness raised, if it
stopped). :func:`compare_harnesses` reads boxmaker's batch folder and these the same way.

Harnesses (:data:`HARNESSES`): ``boxmaker`` (the batch, :func:`run_bfcl`), ``pydantic-ai``
(``pydantic_ai.Agent``), ``openai-agents`` (the OpenAI Agents SDK's ``Runner``); both from
the ``tap-agents`` extra.
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import Config
from ..errors import BenchError, SessionError
from ..records import utc_now
from ..session import Session
from ..tap import Tap
from ..tools import Registry
from ._bfcl import CATEGORIES, Entry, bfcl_version
from ._run import RUNS_FILE, SCORER, BenchSlice, _keep_slice, bfcl_scorer, read_runs
from ._summary import load_runs
from ._tasks import STEP_LIMIT, RunTools, pick, task_of

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["HARNESSES", "compare_harnesses", "format_harnesses", "run_harness"]

_EXTRA = "pip install 'boxmaker[tap-agents]'"


def _url(server: Any) -> str:
    return str(server if isinstance(server, str) else server.url).rstrip("/")


async def _pydantic_ai(url: str, entry: Entry, tools: Registry, config: Config) -> str | None:
    """One entry through pydantic-ai's ``Agent``: one ``run`` per user turn, the history
    carried as pydantic-ai keeps it. Returns what stopped it (``None``: it ran to the end)."""
    try:
        from pydantic_ai import Agent, Tool
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
        from pydantic_ai.usage import UsageLimits
    except ImportError as exc:
        raise BenchError(f"the pydantic-ai harness needs pydantic-ai ({exc}): {_EXTRA}") from exc
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="none")
    provider = OpenAIProvider(openai_client=client)
    agent_tools = [
        Tool.from_schema(
            _sync(tools, name),
            name=name,
            description=tool.description,
            json_schema=dict(tool.parameters),
        )
        for name in tools.names
        if (tool := tools.get(name)) is not None
    ]
    make: Any = Agent  # its overloads name every hosted model
    agent = make(
        OpenAIChatModel("local", provider=provider),
        tools=agent_tools,
        model_settings=_settings(config),
    )
    limit = UsageLimits(request_limit=STEP_LIMIT + 1 if entry.multi_turn else 1)
    history: list[Any] = []
    try:
        for message in entry.turns:
            try:
                result = await agent.run(message, message_history=history, usage_limits=limit)
            except Exception as exc:  # its limit, or what it cannot take from the model
                return f"{type(exc).__name__}: {exc}"
            history = result.all_messages()
    finally:
        await client.close()
    return None


async def _openai_agents(url: str, entry: Entry, tools: Registry, config: Config) -> str | None:
    """One entry through the OpenAI Agents SDK's ``Runner``: one ``run`` per user turn, the
    input list it gives back carried to the next. Returns what stopped it (``None``: none)."""
    try:
        from agents import (
            Agent,
            FunctionTool,
            ModelSettings,
            OpenAIChatCompletionsModel,
            Runner,
            set_tracing_disabled,
        )
        from openai import AsyncOpenAI
    except ImportError as exc:
        raise BenchError(f"the openai-agents harness needs it ({exc}): {_EXTRA}") from exc
    set_tracing_disabled(True)  # no traces sent anywhere
    client = AsyncOpenAI(base_url=url + "/v1", api_key="none")
    agent_tools: list[Any] = []
    for name in tools.names:
        tool = tools.get(name)
        assert tool is not None
        agent_tools.append(
            FunctionTool(
                name=name,
                description=tool.description,
                params_json_schema=dict(tool.parameters),
                on_invoke_tool=_async(tools, name),
                strict_json_schema=False,
            )
        )
    sampling = config.sampling
    agent: Any = Agent(
        name="bfcl",
        model=OpenAIChatCompletionsModel(model="local", openai_client=client),
        tools=agent_tools,
        model_settings=ModelSettings(
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            extra_args={"seed": sampling.seed} if sampling.seed is not None else None,
        ),
    )
    turns = STEP_LIMIT + 1 if entry.multi_turn else 1
    items: list[Any] = []
    try:
        for message in entry.turns:
            try:
                result = await Runner.run(
                    agent, [*items, {"role": "user", "content": message}], max_turns=turns
                )
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"
            items = result.to_input_list()
    finally:
        await client.close()
    return None


HARNESSES: dict[str, Callable[..., Any] | None] = {
    "boxmaker": None,
    "pydantic-ai": _pydantic_ai,
    "openai-agents": _openai_agents,
}
"""The agent loops a bench can run (``boxmaker``: its own loop, as a batch)."""


def _settings(config: Config) -> dict[str, Any]:
    sampling = config.sampling
    out: dict[str, Any] = {"temperature": sampling.temperature}
    if sampling.max_tokens is not None:
        out["max_tokens"] = sampling.max_tokens
    if sampling.seed is not None:
        out["seed"] = sampling.seed
    return out


def _sync(tools: Registry, name: str) -> Callable[..., str]:
    tool = tools.get(name)
    assert tool is not None and tool.function is not None
    function = tool.function

    def call(**arguments: Any) -> str:
        return str(function(**arguments))

    return call


def _async(tools: Registry, name: str) -> Callable[[Any, str], Any]:
    call = _sync(tools, name)

    async def invoke(context: Any, arguments: str) -> str:
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return f"Error: the arguments are not JSON: {exc}"
        return call(**args) if isinstance(args, dict) else "Error: arguments must be an object"

    return invoke


def run_harness(
    harness: str,
    folder: str | os.PathLike[str],
    *,
    server: Any,
    categories: Sequence[str] = CATEGORIES,
    limit: int | None = None,
    seed: int | None = None,
    repeats: int = 1,
    config: Config | None = None,
    cassette_dir: str | os.PathLike[str] | None = None,
) -> list[dict[str, Any]]:
    """Run a BFCL slice through ``harness`` (one of :data:`HARNESSES` but ``boxmaker``),
    each run through a tap of its own in front of ``server``, and score it by BFCL's checker.

    Args:
        harness: the harness's name.
        folder: its folder (``bench.json``, ``logs/<run>/``, ``runs.ndjson``); runs already in
            ``runs.ndjson`` are not run again.
        server: a llama-server URL, or an object with a ``url``.
        categories, limit, seed, repeats: the slice, as :func:`run_bfcl`'s (repeats run with
            ``seed`` = the config's seed + 0, 1, ...).
        config: the sampling settings (temperature, max_tokens, seed) the harness sends.
        cassette_dir: also record each run's traffic into ``<cassette_dir>/<run>.yaml`` (the
            tap's cassette).

    Returns:
        The lines of ``runs.ndjson``.

    Raises:
        BenchError: an unknown harness, its package missing, a bad slice, or the folder holds
            another slice.
    """
    drive = HARNESSES.get(harness)
    if drive is None:
        known = ", ".join(h for h in HARNESSES if h != "boxmaker")
        raise BenchError(f"harness {harness!r} is none of {known} (boxmaker's is run_bfcl)")
    entries = pick(categories, limit=limit, seed=seed)
    root = Path(folder)
    _keep_slice(
        root,
        BenchSlice(
            benchmark="bfcl",
            categories=tuple(dict.fromkeys(categories)),
            limit=limit,
            seed=seed,
            repeats=repeats,
            entries=tuple(e.id for e in entries),
            bfcl_version=bfcl_version(),
        ),
    )
    base = config or Config()
    done = {line["run"]: line for line in read_runs(root)}
    url = _url(server)
    out = list(done.values())
    tools = RunTools(entries)
    try:
        for repeat in range(repeats):
            for entry in entries:
                run = entry.id if repeats == 1 else f"{entry.id}.r{repeat}"
                if run in done:
                    continue
                seeded = base
                if repeats > 1:
                    first = base.sampling.seed or 0
                    seeded = base.with_settings({"sampling.seed": first + repeat})
                registry = tools(run, task_of(entry))
                logs = root / "logs" / run
                cassette = None if cassette_dir is None else Path(cassette_dir) / f"{run}.yaml"
                with Tap(url, directory=logs, cassette=cassette) as tap:
                    stopped = asyncio.run(drive(tap.url, entry, registry, seeded))
                    assert tap.log is not None
                    tap.log.wait()
                line = _scored(harness, run, entry, logs, stopped)
                _append(root, line)
                out.append(line)
    finally:
        tools.close()
    return out


def _scored(
    harness: str, run: str, entry: Entry, logs: Path, stopped: str | None
) -> dict[str, Any]:
    """The ``runs.ndjson`` line of one run: its log, and BFCL's verdict on it."""
    paths = sorted(logs.glob("*.jsonl"))
    line: dict[str, Any] = {
        "time": utc_now().isoformat(),
        "run": run,
        "task": entry.id,
        "harness": harness,
        "log": str(paths[0].relative_to(logs.parent.parent)) if paths else None,
        "error": stopped,
    }
    records: Sequence[Any] = ()
    if paths:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with Session.open(paths[0], read_only=True) as session:
                    records = session.records
        except SessionError as exc:
            line["error"] = f"{stopped or ''} the log cannot be read: {exc}".strip()
    score = bfcl_scorer(entry).fn(records)
    assert not isinstance(score, bool | float)
    line["value"], line["explanation"] = score.value, score.explanation
    if len(paths) > 1:
        line["note"] = f"the tap saw {len(paths)} conversations (the first is scored)"
    return line


def _append(folder: Path, line: Mapping[str, Any]) -> None:
    with open(folder / RUNS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, ensure_ascii=False) + "\n")
        f.flush()
        os.fsync(f.fileno())


def compare_harnesses(
    root: str | os.PathLike[str],
    harnesses: Sequence[str],
    *,
    baseline: str = "boxmaker",
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> pd.DataFrame:
    """The harnesses of one bench (``<root>/<harness>/`` each) side by side, on the same
    tasks: accuracy with a paired bootstrap interval and its difference to ``baseline``
    (:func:`boxmaker.batch.compare_frame`, by ``harness``), the costs per run (prefill,
    processed, lost and re-processed tokens: :func:`boxmaker.cache.reprocessed`'s count, a
    harness that drops the reply's reasoning shows here without a cache loss), and the
    re-processed tokens per task with their own bootstrap interval.

    Raises:
        BenchError: a harness folder without runs.
    """
    import numpy as np
    import pandas as pd

    from ..batch import compare_frame
    from ..score import paired_bootstrap

    parts = []
    for harness in harnesses:
        scored, costs = load_runs(Path(root) / harness)
        tag = harness + "/"
        parts.append(
            (
                scored.assign(run=tag + scored["run"].astype(str), harness=harness),
                costs.assign(run=tag + costs["run"].astype(str)),
            )
        )
    scored = pd.concat([p[0] for p in parts], ignore_index=True)
    if scored.empty:
        raise BenchError(f"{root}: no scored runs of {', '.join(harnesses)}")
    costs = pd.concat([p[1] for p in parts], ignore_index=True)
    table = compare_frame(
        scored,
        costs,
        "harness",
        scorer=SCORER,
        baseline=f"harness={baseline}" if baseline in harnesses else None,
        confidence=confidence,
        resamples=resamples,
        seed=seed,
    )
    merged = scored[["run", "task", "harness"]].merge(
        costs[["run", "reprocessed_tokens"]], on="run", how="left"
    )
    per_task = merged.groupby(["harness", "task"])["reprocessed_tokens"].mean().unstack("task")
    order = list(table["harness"])
    matrix = per_task.reindex(order).to_numpy(dtype=float)
    scale = np.nanmax(matrix) if np.isfinite(matrix).any() and np.nanmax(matrix) > 0 else 1.0
    boot = paired_bootstrap(matrix / scale, resamples=resamples, confidence=confidence, seed=seed)
    table["reprocessed_per_task"] = boot.mean * scale
    table["reprocessed_low"] = boot.low * scale
    table["reprocessed_high"] = boot.high * scale
    return table


def format_harnesses(table: pd.DataFrame) -> str:
    """``table`` (from :func:`compare_harnesses`) as text: per harness, runs, accuracy with
    its interval and difference to the baseline, re-processed tokens per task with their
    interval, prefill ms and processed tokens per run."""
    attrs = table.attrs
    lines = [
        f"paired bootstrap over tasks: {attrs.get('resamples')} resamples, seed "
        f"{attrs.get('seed')}, {float(attrs.get('confidence', 0.95)):.0%} intervals; "
        f"baseline {attrs.get('baseline')}",
        f"{'harness':<14} {'runs':>5} {'accuracy':>17} {'diff':>21} "
        f"{'reprocessed/task':>24} {'prefill ms':>10} {'processed':>9}",
    ]
    for row in table.to_dict("records"):
        acc = f"{row['success']:.2f} [{row['success_low']:.2f},{row['success_high']:.2f}]"
        diff = f"{row['diff']:+.2f} [{row['diff_low']:+.2f},{row['diff_high']:+.2f}]"
        again = (
            f"{row['reprocessed_per_task']:.0f} [{row['reprocessed_low']:.0f},"
            f"{row['reprocessed_high']:.0f}]"
        )
        lines.append(
            f"{row['harness']:<14} {int(row['runs']):>5} {acc:>17} {diff:>21} {again:>24} "
            f"{_num(row.get('prefill_ms')):>10} {_num(row.get('processed_tokens')):>9}"
        )
    return "\n".join(lines)


def _num(value: Any) -> str:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if number != number else f"{number:.0f}"
