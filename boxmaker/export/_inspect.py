"""``boxmaker export inspect``: a batch (or any logs) as an Inspect AI eval log, through
``inspect_ai``'s own log API (:func:`inspect_ai.log.write_eval_log`).

One sample per run (session log): its ``id`` the session id, ``input`` the first user
message, ``messages`` the whole conversation as Inspect chat messages (system, user,
assistant with ``tool_calls`` and ``reasoning``, tool results by ``tool_call_id``),
``output`` the last answer, ``model_usage`` the run's tokens (``input_tokens`` = cached +
processed prompt tokens, ``output_tokens`` = generated, ``input_tokens_cache_read`` = cached,
``reasoning_tokens``: the frames' ``summary`` totals, a fork's own records only: its copies of
its parent's records are the parent's sample's usage, so summing over a batch of forks counts
each completion once), ``scores`` from the batch's
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

from ._errors import ExportError
from ._logs import Logs, Run, find, nanos, runs

__all__ = ["export_inspect"]


def _messages(run: Run) -> list[Any]:
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
    system = run.data.head.get("system")
    if system:
        out.append(ChatMessageSystem(content=system))
    for rec in run.records:
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


def _arguments(text: str) -> dict[str, Any]:
    """The model's arguments text as a dict (Inspect's shape); text that is not a JSON object
    is kept whole under ``"_text"``."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"_text": text}
    return value if isinstance(value, dict) else {"_text": text}


def _scores(source: Logs) -> dict[str, dict[str, Any]]:
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


def export_inspect(source: Logs, out: str | Path, *, task: str = "boxmaker") -> Path:
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

    logs = [p.parent if p.name == "logs" else p for p in [Path(s) for s in _items(source)]]
    paths = find([p / "logs" if (p / "manifest.ndjson").exists() else p for p in logs])
    scores = _scores(source)
    summary = frames.summary(paths).set_index("session")
    turns = frames.turns(paths)
    samples = []
    model = "llama.cpp/boxmaker"
    started = finished = None
    for run in runs(paths):
        row: dict[Any, Any] = summary.loc[run.session].to_dict()
        usage = ModelUsage(
            input_tokens=int(row["cached_tokens"] + row["processed_tokens"]),
            output_tokens=int(row["generated_tokens"]),
            total_tokens=int(
                row["cached_tokens"] + row["processed_tokens"] + row["generated_tokens"]
            ),
            input_tokens_cache_read=int(row["cached_tokens"]),
            reasoning_tokens=int(row["reasoning_tokens"]),
        )
        for rec in run.records:
            if rec["type"] == "capabilities" and rec.get("model"):
                model = f"llama.cpp/{rec['model']}"
        messages = _messages(run)
        answers = [m for m in messages if m.role == "assistant"]
        first = next((m.text for m in messages if m.role == "user"), "")
        mine = turns[(turns.session == run.session) & ~turns.from_parent]
        run_scores = {
            name: Score(
                value=line["value"],
                explanation=line.get("explanation"),
                metadata={"version": line.get("version")},
            )
            for name, line in scores.get(run.path.stem, scores.get(run.session, {})).items()
        }
        begin = run.data.head.get("time")
        end = run.records[-1]["time"] if run.records else begin
        started = begin if started is None else min(started, begin)
        finished = end if finished is None else max(finished, end)
        samples.append(
            EvalSample(
                id=run.session,
                epoch=1,
                input=first,
                target="",
                messages=messages,
                output=ModelOutput.from_content(model, answers[-1].text if answers else ""),
                model_usage={model: usage},
                scores=run_scores or None,
                total_time=(nanos(end) - nanos(begin)) / 1e9 if begin and end else None,
                metadata={
                    "boxmaker_log": run.path.name,
                    "boxmaker_schema": run.data.schema,
                    "boxmaker_turns": int(row["turns"]),
                    "boxmaker_inherited_turns": int(row["inherited_turns"]),
                    "boxmaker_inherited_requests": int(row["inherited_requests"]),
                    "boxmaker_outcomes": [str(o) for o in mine.outcome],
                    "boxmaker_requests": int(row["requests"]),
                    "boxmaker_tool_calls": int(row["tool_calls"]),
                    "boxmaker_cache_losses": int(row["cache_losses"]),
                    "boxmaker_lost_tokens": int(row["lost_tokens"]),
                    "boxmaker_limit_hits": int(row["limit_hits"]),
                    "boxmaker_cache_reuse_ratio": _number(row["cache_reuse_ratio"]),
                },
            )
        )
    log = EvalLog(
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
    write_eval_log(log, str(out))
    return Path(out)


def _number(value: Any) -> float | None:
    try:
        return None if value is None or value != value else float(value)
    except TypeError:  # pd.NA
        return None


def _items(source: Logs) -> list[str]:
    if isinstance(source, str | os.PathLike):
        return [os.fspath(source)]
    return [os.fspath(s) for s in source]
