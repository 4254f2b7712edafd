"""``boxmaker export inspect``: a batch (or any logs) as Inspect AI eval logs, through
``inspect_ai``'s own log API (:func:`inspect_ai.log.write_eval_log`): one log per grid setting,
so ``inspect view`` lists the settings side by side, each with its overall result.

The logs are read once, by the one source iterator (:func:`boxmaker.session.read_logs`: a
log the session refuses, or a copy of a session, is left out with one warning). A batch
folder's manifest (:func:`boxmaker.batch.read_manifest`) gives each run its task, grid
setting and target; its ``scores.ndjson`` (:func:`boxmaker.batch.read_scores`; the latest
value of each scorer) the scores.

Each setting's log: ``eval.task_args`` the setting (dotted config keys; its ``sampling.*``
values also in ``eval.model_args``), ``eval.task_display_name`` the task and the setting,
``results`` per scorer the mean of the scored runs (its metric ``mean``, with the scored and
unscored counts). One sample per run (session log): ``id`` the task (a log outside a batch:
the session id), ``target`` the task's target as JSON, ``input`` the first user message,
``messages`` the whole conversation as Inspect chat messages (system, user, assistant with
``tool_calls`` and ``reasoning``, tool results by ``tool_call_id``; a fork's copied part
included), ``output`` the last answer, ``scores`` by scorer name, each with the run's answer
(:func:`boxmaker.score.answer_of` of the run's own records, as its scorers read it) and the
explanation, ``model_usage`` the run's tokens (``input_tokens`` = the prompt tokens,
``output_tokens`` = generated, ``input_tokens_cache_read`` = cached, ``reasoning_tokens``: the
frames' ``summary`` totals, a fork's own records only: its copies of its parent's records are
the parent's sample's usage, so summing over a batch of forks counts each completion once; a
total the logs do not hold is never written as 0: without the prompt or the generated total
the sample has no ``model_usage``, and an unknown cached or reasoning total is left out), and
boxmaker's facts in ``metadata`` (``boxmaker_*``: the run, its settings and target, outcomes,
requests, cache losses, lost tokens, limit hits, the log file, own records only like the
usage; ``boxmaker_inherited_turns`` and ``boxmaker_inherited_requests``: what a fork copied
from its parent). ``inspect_ai.log.read_eval_log`` and ``inspect_ai.analysis.samples_df``
read the files; ``inspect view`` shows them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

from ..records import records_from_json
from ..session import Log, Source, read_logs, split_turns
from ._batches import batch_runs, batch_scores
from ._errors import ExportError
from ._logs import nanos

__all__ = ["export_inspect"]


def _messages(log: Log) -> list[Any]:
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageSystem,
        ChatMessageTool,
        ChatMessageUser,
        ContentReasoning,
        ContentText,
    )
    from inspect_ai.tool import ToolCall

    out: list[Any] = []
    system = log.head.get("system")
    if system:
        out.append(ChatMessageSystem(content=system))
    for rec in log.records:
        kind = rec["type"]
        if kind == "user":
            out.append(ChatMessageUser(content=rec["content"]))
        elif kind == "assistant":
            calls = [
                ToolCall(id=c["id"], function=c["name"], arguments=_arguments(c["arguments"]))
                for c in rec.get("tool_calls") or ()
            ]
            parts: list[Any] = []
            if rec.get("reasoning"):
                parts.append(ContentReasoning(reasoning=rec["reasoning"]))
            parts.append(ContentText(text=rec.get("content") or ""))
            out.append(ChatMessageAssistant(content=parts, tool_calls=calls or None))
        elif kind == "tool_result":
            out.append(
                ChatMessageTool(
                    content=rec["content"], tool_call_id=rec["tool_call_id"], function=rec["name"]
                )
            )
    return out


MAX_NESTING = 64
"""The deepest arguments an Inspect sample holds parsed: deeper ones (a model that nested
100,000 brackets: a RecursionError inside the exporter) are kept whole as text."""


def _arguments(text: str) -> dict[str, Any]:
    """The model's arguments text as a dict (Inspect's shape); text that is not a JSON object,
    or nests deeper than :data:`MAX_NESTING`, is kept whole under ``"_text"``."""
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return {"_text": text}
    if not isinstance(value, dict) or _depth(value) > MAX_NESTING:
        return {"_text": text}
    return value


def _depth(value: Any) -> int:
    """How deep a JSON value nests (a scalar 0), without recursion."""
    deepest, todo = 0, [(value, 1)] if isinstance(value, dict | list) else []
    while todo:
        item, level = todo.pop()
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        for child in children:
            if isinstance(child, dict | list):
                if level + 1 > MAX_NESTING:
                    return level + 1
                todo.append((child, level + 1))
        deepest = max(deepest, level)
    return deepest


def _label(settings: Mapping[str, Any]) -> str:
    """A grid setting in words: ``loop.thinking_tokens=16, sampling.temperature=0.5``
    (``default`` for none)."""
    if not settings:
        return "default"
    return ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in settings.items())


def _file_name(task: str, settings: Mapping[str, Any], taken: set[str]) -> str:
    """The ``.eval`` file of one setting: the task and the setting, safe as a file name."""
    words = [task] + [f"{k}-{v}" for k, v in settings.items()]
    stem = re.sub(r"[^A-Za-z0-9._=-]+", "_", "_".join(str(w) for w in words))[:120] or "eval"
    name, n = f"{stem}.eval", 1
    while name in taken:
        n += 1
        name = f"{stem}-{n}.eval"
    taken.add(name)
    return name


def _is_folder(out: Path) -> bool:
    """``out`` names a folder to write one log per setting into: an existing directory, or
    a path that is no ``.eval`` or ``.json`` file."""
    return out.is_dir() or out.suffix not in (".eval", ".json")


def export_inspect(
    source: Source,
    out: str | Path,
    *,
    task: str = "boxmaker",
    on_file: Callable[[Path], None] | None = None,
) -> Path:
    """Write Inspect AI eval logs of ``source``: one sample per run, one log per grid setting
    when ``out`` is a folder (or all runs in one ``.eval`` file).

    Each setting's log (the runs of a batch folder with the same grid values; logs outside a
    batch are the setting ``default``) carries the setting in ``eval.task_args`` (its
    ``sampling.*`` values also in ``eval.model_args``) and ``eval.metadata``, its samples
    (``id`` the task, ``target`` the task's target as JSON) the setting in their metadata
    (``boxmaker_settings``, ``boxmaker_run``), their scores (from ``scores.ndjson``, each
    with its scorer's name, the run's answer and the explanation) and ``results``: per
    scorer the mean over the scored runs, the overall result of the setting. In one file for
    several settings a sample's id is ``<task> [<setting>]``.

    Args:
        source: a batch folder (its ``logs/``, ``manifest.ndjson`` and ``scores.ndjson`` are
            read), a log, a directory of logs, or a list of these.
        out: a folder (made when missing; an existing directory, or a path without a
            ``.eval``/``.json`` suffix) to write ``<task>_<setting>.eval`` files into, or the
            ``.eval`` (or ``.json``) file to write every sample into.
        task: the eval's task name.
        on_file: called with each file once it is written.

    Returns:
        ``out``.

    Raises:
        SessionError: a path of ``source`` names no log, or a batch's manifest cannot be read.
        ExportError: ``inspect_ai`` is not installed (``pip install 'boxmaker[inspect]'``).

    Warns:
        LogReadWarning: a log the session refuses is left out.
    """
    try:
        from inspect_ai.log import write_eval_log
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ExportError(
            "Inspect export needs inspect_ai: pip install 'boxmaker[inspect]'"
        ) from exc
    from .. import frames

    logs = list(read_logs(source))  # once: what it leaves out is said once
    runs = batch_runs(source)
    scores = batch_scores(source)
    loaded = frames.load(logs)
    groups: dict[str, list[Log]] = {}
    settings_of: dict[str, dict[str, Any]] = {}
    for log in logs:
        settings = dict(runs.get(log.session, {}).get("settings") or {})
        key = json.dumps(settings, sort_keys=True)
        groups.setdefault(key, []).append(log)
        settings_of[key] = settings
    target = Path(out)
    facts = _Facts(loaded, runs, scores)
    if not _is_folder(target):
        several = len(groups) > 1
        made = facts.eval_log(logs, task, None, label_ids=several)
        write_eval_log(made, str(target))
        if on_file is not None:
            on_file(target)
        return target
    target.mkdir(parents=True, exist_ok=True)
    taken: set[str] = set()
    for key, members in groups.items():
        settings = settings_of[key]
        path = target / _file_name(task, settings, taken)
        write_eval_log(facts.eval_log(members, task, settings, label_ids=False), str(path))
        if on_file is not None:
            on_file(path)
    return target


class _Facts:
    """What the samples are made of: the frames of every log, the batch's runs and scores."""

    def __init__(self, loaded: Any, runs: dict[str, Any], scores: dict[str, Any]) -> None:
        self.summary = loaded.summary.set_index("session")
        self.turns = loaded.turns
        self.runs = runs
        self.scores = scores

    def eval_log(
        self, logs: list[Log], task: str, settings: dict[str, Any] | None, *, label_ids: bool
    ) -> Any:
        """One eval log of ``logs``: ``settings`` the setting they share (``None``: any)."""
        from inspect_ai.log import (
            EvalConfig,
            EvalDataset,
            EvalLog,
            EvalSpec,
            EvalStats,
        )

        model = "llama.cpp/boxmaker"
        for log in logs:
            for rec in log.records:
                if rec["type"] == "capabilities" and rec.get("model"):
                    model = f"llama.cpp/{rec['model']}"
        samples = []
        started: str | None = None
        finished: str | None = None
        epochs: dict[str, int] = {}
        for log in logs:
            sample = self.sample(log, model, label_ids=label_ids)
            epochs[str(sample.id)] = epochs.get(str(sample.id), 0) + 1
            sample.epoch = epochs[str(sample.id)]
            row = self.summary.loc[log.session]
            begin, end = _text(row["started"]), _text(row["ended"])
            if begin is not None:
                started = begin if started is None else min(started, begin, key=nanos)
            if end is not None:
                finished = end if finished is None else max(finished, end, key=nanos)
            samples.append(sample)
        spec_settings = settings or {}
        names = list(dict.fromkeys(n for s in samples for n in (s.scores or {})))
        meta = {"boxmaker_settings": dict(spec_settings)} if settings is not None else None
        return EvalLog(
            status="success",
            eval=EvalSpec(
                created=started or "",
                task=task,
                task_display_name=task if settings is None else f"{task} [{_label(settings)}]",
                task_args=dict(spec_settings),
                model_args={k: v for k, v in spec_settings.items() if k.startswith("sampling.")},
                dataset=EvalDataset(
                    name=task,
                    samples=len(samples),
                    sample_ids=list(dict.fromkeys(str(s.id) for s in samples)),
                ),
                model=model,
                config=EvalConfig(epochs=max(epochs.values(), default=1)),
                metadata=meta,
                # EvalScorer is not in inspect_ai.log's public names: its JSON form, validated
                scorers=cast(Any, [{"name": n} for n in names] or None),
            ),
            stats=EvalStats(
                started_at=started or "",
                completed_at=finished or "",
                model_usage=_total_usage(samples, model),
            ),
            results=_results(samples),
            samples=samples,
        )

    def sample(self, log: Log, model: str, *, label_ids: bool) -> Any:
        """The sample of one run (see :func:`export_inspect`)."""
        from inspect_ai.log import EvalSample
        from inspect_ai.model import ModelOutput, ModelUsage
        from inspect_ai.scorer import Score

        from ..score import answer_of  # numpy: the scores' part, loaded when used

        row: dict[Any, Any] = self.summary.loc[log.session].to_dict()
        usage = _usage(row, ModelUsage)
        messages = _messages(log)
        answers = [m for m in messages if m.role == "assistant"]
        first = next((m.text for m in messages if m.role == "user"), "")
        turns = self.turns
        mine = turns[(turns.session == log.session) & ~turns.from_parent]
        run = self.runs.get(log.session)
        settings = dict(run.get("settings") or {}) if run else {}
        own = records_from_json(log.records[split_turns(log).copied :])
        answer = answer_of(own)  # a fork's own answer, as its scorers read it
        run_scores = {
            name: Score(
                value=line["value"],
                answer=answer,
                explanation=line.get("explanation"),
                metadata={"version": line.get("version")},
            )
            for name, line in self.scores.get(
                Path(log.path).stem, self.scores.get(log.session, {})
            ).items()
        }
        begin, end = _text(row["started"]), _text(row["ended"])
        sample_id = str(run["task"]) if run and run.get("task") else log.session
        if label_ids:
            sample_id = f"{sample_id} [{_label(settings)}]"
        target = run.get("target") if run else None
        return EvalSample(
            id=sample_id,
            epoch=1,
            input=first,
            target=json.dumps(target, ensure_ascii=False) if target is not None else "",
            messages=messages,
            output=ModelOutput.from_content(model, answers[-1].text if answers else ""),
            model_usage={model: usage} if usage is not None else {},
            scores=run_scores or None,
            total_time=(nanos(end) - nanos(begin)) / 1e9 if begin and end else None,
            metadata={
                "boxmaker_run": log.session,
                "boxmaker_settings": settings,
                "boxmaker_target": target,
                "boxmaker_log": Path(log.path).name,
                "boxmaker_schema": log.schema,
                "boxmaker_turns": int(row["turns"]),
                "boxmaker_inherited_turns": int(row["inherited_turns"]),
                "boxmaker_inherited_requests": int(row["inherited_requests"]),
                "boxmaker_outcomes": [str(o) for o in mine.outcome],
                "boxmaker_requests": int(row["requests"]),
                "boxmaker_tool_calls": _count(row["tool_calls"]),
                "boxmaker_cache_losses": int(row["cache_losses"]),
                "boxmaker_lost_tokens": int(row["lost_tokens"]),
                "boxmaker_reprocessed_tokens": _count(row["reprocessed_tokens"]),
                "boxmaker_limit_hits": int(row["limit_hits"]),
                "boxmaker_cache_reuse_ratio": _number(row["cache_reuse_ratio"]),
            },
        )


def _total_usage(samples: list[Any], model: str) -> dict[str, Any]:
    """The tokens of all samples (each a run's own), ``{}`` when a sample's prompt or
    generated total is unknown (a partial sum would read as the total); an unknown cached or
    reasoning part is left out."""
    from inspect_ai.model import ModelUsage

    usages = [next(iter(s.model_usage.values()), None) for s in samples]
    if not usages or any(u is None for u in usages):
        return {}

    def total(name: str) -> int | None:
        values = [getattr(u, name) for u in usages]
        return None if any(v is None for v in values) else sum(values)

    return {
        model: ModelUsage(
            input_tokens=total("input_tokens") or 0,
            output_tokens=total("output_tokens") or 0,
            total_tokens=total("total_tokens") or 0,
            input_tokens_cache_read=total("input_tokens_cache_read"),
            reasoning_tokens=total("reasoning_tokens"),
        )
    }


def _results(samples: list[Any]) -> Any:
    """The overall result of a setting: per scorer, the mean of its scored samples' values
    (``None`` without scores)."""
    from inspect_ai.log import EvalMetric, EvalResults, EvalScore

    names = list(dict.fromkeys(n for s in samples for n in (s.scores or {})))
    if not names:
        return None
    scores = []
    for name in names:
        values = [
            float(s.scores[name].value)
            for s in samples
            if s.scores and name in s.scores and isinstance(s.scores[name].value, int | float)
        ]
        mean = sum(values) / len(values) if values else float("nan")
        scores.append(
            EvalScore(
                name=name,
                scorer=name,
                scored_samples=len(values),
                unscored_samples=len(samples) - len(values),
                metrics={"mean": EvalMetric(name="mean", value=mean)},
            )
        )
    return EvalResults(total_samples=len(samples), completed_samples=len(samples), scores=scores)


def _usage(row: dict[Any, Any], model_usage: Any) -> Any:
    """The sample's ``ModelUsage`` from its summary row, or ``None`` when the prompt or the
    generated total is unknown (Inspect's fields default to 0: an unknown would read as 0);
    an unknown cached or reasoning total is left out (``None`` there)."""
    prompt, generated = _count(row["prompt_tokens"]), _count(row["generated_tokens"])
    if prompt is None or generated is None:
        return None
    return model_usage(
        input_tokens=prompt,
        output_tokens=generated,
        total_tokens=prompt + generated,
        input_tokens_cache_read=_count(row["cached_tokens"]),
        reasoning_tokens=_count(row["reasoning_tokens"]),
    )


def _count(value: Any) -> int | None:
    """A frame's count as an ``int``, ``None`` when it is unknown."""
    return None if _missing(value) else int(value)


def _text(value: Any) -> str | None:
    """A frame's time as ISO 8601 text (``None``: unknown)."""
    return None if _missing(value) else str(value.isoformat())


def _missing(value: Any) -> bool:
    """A frame's missing value (``None``, ``NaN``, ``NaT``, ``<NA>``)."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except TypeError:  # pd.NA: its comparisons are NA
        return True


def _number(value: Any) -> float | None:
    try:
        return None if value is None or value != value else float(value)
    except TypeError:  # pd.NA
        return None
