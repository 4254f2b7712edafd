"""``boxmaker export inspect``: a batch (or any logs) as an Inspect AI eval log, through
``inspect_ai``'s own log API (:func:`inspect_ai.log.write_eval_log`).

The logs are read once, by the one source iterator (:func:`boxmaker.session.read_logs`: a
log the session refuses, or a copy of a session, is left out with one warning), so every
sample has its own id. One sample per run (session log): its ``id`` the session id, ``input``
the first user message, ``messages`` the whole conversation as Inspect chat messages (system,
user, assistant with ``tool_calls`` and ``reasoning``, tool results by ``tool_call_id``),
``output`` the last answer, ``model_usage`` the run's tokens (``input_tokens`` = the prompt
tokens, ``output_tokens`` = generated, ``input_tokens_cache_read`` = cached,
``reasoning_tokens``: the frames' ``summary`` totals, a fork's own records only: its copies of
its parent's records are the parent's sample's usage, so summing over a batch of forks counts
each completion once; a total the logs do not hold is never written as 0: without the prompt
or the generated total the sample has no ``model_usage``, and an unknown cached or reasoning
total is left out), ``scores`` from the batch's
``scores.ndjson`` (:func:`boxmaker.batch.read_scores`; the latest value of each scorer), and
boxmaker's facts in ``metadata`` (``boxmaker_*``: outcomes, requests, cache losses, lost tokens,
limit hits, the log file, own records only like the usage; ``boxmaker_inherited_turns`` and
``boxmaker_inherited_requests``: what a fork copied from its parent). The ``messages`` are the
whole conversation, a fork's copied part included. ``inspect_ai.log.read_eval_log`` and
``inspect_ai.analysis.samples_df`` read the file; ``inspect view`` shows it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..session import Log, Session, Source, read_logs
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


def _scores(source: Source) -> dict[str, dict[str, Any]]:
    """The latest score of each (run, scorer) in the ``scores.ndjson`` of the batch folders
    in ``source``."""
    from ..batch import read_scores

    out: dict[str, dict[str, Any]] = {}
    for item in _items(source):
        folder = Path(item)
        for candidate in (folder, folder.parent):
            if candidate.is_dir() and (candidate / "scores.ndjson").exists():
                for line in read_scores(candidate):
                    if line.get("value") is not None:
                        out.setdefault(str(line["run"]), {})[str(line["scorer"])] = line
                break
    return out


def export_inspect(source: Source, out: str | Path, *, task: str = "boxmaker") -> Path:
    """Write an Inspect AI eval log (``.eval``) with one sample per run of ``source``.

    Args:
        source: a batch folder (its ``logs/`` and ``scores.ndjson`` are read), a log, a
            directory of logs, or a list of these.
        out: the ``.eval`` (or ``.json``) file to write.
        task: the eval's task name.

    Returns:
        ``out``.

    Raises:
        SessionError: a path of ``source`` names no log.
        ExportError: ``inspect_ai`` is not installed (``pip install 'boxmaker[inspect]'``).

    Warns:
        LogReadWarning: a log the session refuses is left out.
    """
    try:
        from inspect_ai.log import (
            EvalConfig,
            EvalDataset,
            EvalLog,
            EvalSample,
            EvalSpec,
            EvalStats,
            write_eval_log,
        )
        from inspect_ai.model import ModelOutput, ModelUsage
        from inspect_ai.scorer import Score
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ExportError(
            "Inspect export needs inspect_ai: pip install 'boxmaker[inspect]'"
        ) from exc
    from .. import frames

    logs = list(read_logs(source))  # once: what it leaves out is said once
    scores = _scores(source)
    loaded = frames.load(logs)
    summary = loaded.summary.set_index("session")
    turns = loaded.turns
    samples = []
    model = "llama.cpp/boxmaker"
    started: str | None = None
    finished: str | None = None
    for log in logs:
        row: dict[Any, Any] = summary.loc[log.session].to_dict()
        usage = _usage(row, ModelUsage)
        for rec in log.records:
            if rec["type"] == "capabilities" and rec.get("model"):
                model = f"llama.cpp/{rec['model']}"
        messages = _messages(log)
        answers = [m for m in messages if m.role == "assistant"]
        first = next((m.text for m in messages if m.role == "user"), "")
        mine = turns[(turns.session == log.session) & ~turns.from_parent]
        run_scores = {
            name: Score(
                value=line["value"],
                explanation=line.get("explanation"),
                metadata={"version": line.get("version")},
            )
            for name, line in scores.get(Path(log.path).stem, scores.get(log.session, {})).items()
        }
        begin, end = _text(row["started"]), _text(row["ended"])
        if begin is not None:
            started = begin if started is None else min(started, begin, key=nanos)
        if end is not None:
            finished = end if finished is None else max(finished, end, key=nanos)
        samples.append(
            EvalSample(
                id=log.session,
                epoch=1,
                input=first,
                target="",
                messages=messages,
                output=ModelOutput.from_content(model, answers[-1].text if answers else ""),
                model_usage={model: usage} if usage is not None else {},
                scores=run_scores or None,
                total_time=(nanos(end) - nanos(begin)) / 1e9 if begin and end else None,
                metadata={
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
        )
    evaluated = EvalLog(
        status="success",
        eval=EvalSpec(
            created=started or "",
            task=task,
            dataset=EvalDataset(name=task, samples=len(samples)),
            model=model,
            config=EvalConfig(),
        ),
        stats=EvalStats(started_at=started or "", completed_at=finished or ""),
        samples=samples,
    )
    write_eval_log(evaluated, str(out))
    return Path(out)


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


def _items(source: Source) -> list[str]:
    """The paths among ``source`` (sessions and logs read already name no batch folder)."""
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    if isinstance(source, Log | Session):
        return []
    return [os.fspath(s) for s in source if isinstance(s, str | os.PathLike)]
