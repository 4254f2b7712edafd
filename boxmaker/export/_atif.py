"""``boxmaker export atif``: session logs as trajectories of the Agent Trajectory Interchange
Format (ATIF, Harbor's RFC 0001), version :data:`ATIF_VERSION`, as the ``atif`` package
(1.8.0) models it: one JSON file per session log, ``<out>/<session>.json``.

The log is read by the one source iterator and the one split into turns
(:func:`boxmaker.session.read_logs`, :func:`boxmaker.session.split_turns`); a completion's
tokens are :func:`boxmaker.records.usage_tokens`'s. The trajectory:

- ``session_id`` and ``trajectory_id``: the session id. ``agent``: ``name`` ``"boxmaker"``,
  its version, ``model_name`` (the ``Capabilities`` record's model, when the log has one),
  ``tool_definitions`` (the baseline's tools).
- Steps, in the log's order: a ``system`` step with the baseline's system prompt (when not
  empty); a ``user`` step per ``User`` record; an ``agent`` step per completion (a ``Usage``
  record, ``llm_call_count`` 1): ``message`` (the reply's content, ``""`` for none),
  ``reasoning_content``, ``tool_calls`` (``tool_call_id``, ``function_name``, ``arguments``:
  the model's text as a JSON object) and ``observation`` (one result per ``ToolResult``
  answering a call of that step, ``source_call_id`` its call's id), and ``metrics``:
  ``prompt_tokens`` = llama.cpp's ``cache_n + prompt_n`` (else the OpenAI ``usage`` figure),
  ``cached_tokens`` = ``cache_n``, ``completion_tokens`` = ``predicted_n`` (else the OpenAI
  figure); a figure the server did not send is absent, never 0. With a server
  (``url``), ``prompt_token_ids``: the prompt rebuilt from the log and tokenized by the
  server's own template and tokenizer (:class:`~boxmaker.export._prompts.PromptTokens`), with
  ``metrics.extra.prompt_token_ids_match`` saying whether their count is ``prompt_tokens``.
  ``completion_token_ids`` and ``logprobs`` are never written: the log does not hold them.
  Every step's ``timestamp`` is the time of the record it starts with.
- Forks: the steps of records a fork copied from its parent carry ``is_copied_context:
  true`` (ATIF: consumers must not train on them); ``extra.boxmaker.parent`` names the
  parent's trajectory (``trajectory_id``, ``trajectory_path`` ``<parent>.json`` beside it,
  ``session_id``) and ``extra.boxmaker.settings`` what the fork changed. ``final_metrics``
  sums the trajectory's own agent steps (a fork's copied steps are its parent's: the sums
  over a parent and its forks count each completion once, as the frames' ``summary``);
  ``notes`` says so for a fork.
- A batch folder: ``extra.boxmaker.run`` holds the run's ``task`` and grid ``settings``
  (:func:`boxmaker.batch.manifest`).

boxmaker's own facts are in the ``extra`` fields under ``"boxmaker"``. Each step's
``extra.boxmaker.records`` lists the log's records of the step in order: a record ATIF
carries natively appears as a stub ``{"native": "user"|"assistant"|"usage"|"tool_result",
"time": ...}`` (an assistant's ``"content": null`` kept there), every other record whole, as
the log holds it: ``cache_loss`` (expected, reused, position, cause, windows, re-processed
tokens), ``limit_hit``, ``turn_end`` (the turn's outcome), ``approval``, and a result that
answers no call of its step. In a step that straddles a fork's point (an edited tool result)
``extra.boxmaker.own`` is the position in that list of the first record that is the fork's
own. The records before the first step (``forked``, ``capabilities``) are in the
trajectory's ``extra.boxmaker.records``, with the baseline's ``time`` and ``schema``.
``metrics.extra`` holds llama.cpp's whole ``timings`` object (tokens and ms, as the server
sent it), ``reasoning_tokens``, ``thinking_capped``, ``finish_reason`` and the OpenAI
``usage`` figures (``openai_prompt_tokens``, ``openai_completion_tokens``); an observation
result's ``extra.boxmaker`` the ``ToolResult``'s ``call``, ``name``, ``data_class``,
``untrusted``, ``truncated``, ``not_run``, ``server`` and ``source``; a tool call's
``extra.boxmaker.arguments`` the model's text when it is not ``json.dumps`` of
``arguments`` (``arguments`` is ``{}`` when the text is not a JSON object).

What ATIF cannot carry, and is therefore in ``extra`` (a reader that ignores ``extra`` loses
it; :func:`boxmaker.export.import_atif` reads it back): every record's time but the one that
starts a step; ``CacheLoss``, ``LimitHit``, ``TurnEnd``, ``Approval``, ``Capabilities`` and
``Forked`` records and records of a type this version does not know; an assistant's null
content (``message`` is a string); tool-call arguments that are not a JSON object, or not in
the spacing and key order ``json.dumps`` gives; a tool result's call number, data class,
trust, truncation, not-run reason, server and source, and a result that answers no call of
its step; llama.cpp's timings beyond the three token counts (``prompt_n`` is
``prompt_tokens - cached_tokens``; without ``cache_n`` it is in ``extra`` only), the OpenAI
usage figures beside them, reasoning tokens,
thinking cap and finish reason; a completion without an ``Assistant`` record (its step's
message is ``""``) and an ``Assistant`` without a completion (an agent step without
``llm_call_count`` and ``metrics``); the baseline's time; the log's schema. A log → ATIF →
log round trip gives the same frames (tested over generated logs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..config import Config
from ..records import usage_tokens
from ..session import Reading, Source, read_logs, split_turns
from ._batches import batch_runs
from ._logs import boxmaker_version

__all__ = ["ATIF_VERSION", "atif_trajectory", "export_atif"]

ATIF_VERSION = "ATIF-v1.8"
"""The ATIF version written (``schema_version``), as the ``atif`` package (1.8.0) models it."""

NATIVE = ("user", "assistant", "usage", "tool_result")
"""The record types ATIF carries in its own fields (their stubs in ``extra.boxmaker.records``
say ``native``)."""


def _arguments(text: str) -> tuple[dict[str, Any], str | None]:
    """A tool call's arguments text as ATIF's object, and the text itself when the object
    does not give it back (not a JSON object, or other spacing or key order)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {}, text
    if not isinstance(value, dict):
        return {}, text
    return value, None if json.dumps(value, ensure_ascii=False) == text else text


def _metrics(rec: dict[str, Any], prompt_ids: list[int] | None) -> dict[str, Any]:
    """A ``Usage`` record as ATIF metrics: the one reading of its tokens
    (:func:`boxmaker.records.usage_tokens`), an unknown one absent; the record's own figures
    in ``extra``."""
    counted = usage_tokens(rec)
    metrics: dict[str, Any] = {}
    if counted.prompt is not None:
        metrics["prompt_tokens"] = int(counted.prompt)
    if counted.generated is not None:
        metrics["completion_tokens"] = int(counted.generated)
    if counted.cached is not None:
        metrics["cached_tokens"] = int(counted.cached)
    extra: dict[str, Any] = {"timings": dict(rec.get("timings") or {})}
    for key in ("reasoning_tokens", "thinking_capped", "finish_reason"):
        if key in rec:
            extra[key] = rec[key]
    for key in ("prompt_tokens", "completion_tokens"):
        if rec.get(key) is not None:
            extra[f"openai_{key}"] = rec[key]
    if prompt_ids is not None:
        metrics["prompt_token_ids"] = prompt_ids
        if counted.prompt is not None:
            extra["prompt_token_ids_match"] = len(prompt_ids) == counted.prompt
    metrics["extra"] = extra
    return metrics


def _result(rec: dict[str, Any]) -> dict[str, Any]:
    """A ``ToolResult`` answering a call of its step, as an ATIF observation result."""
    own: dict[str, Any] = {
        key: rec[key]
        for key in ("call", "name", "data_class", "untrusted", "truncated", "not_run")
        if key in rec
    }
    for key in ("server", "source"):
        if rec.get(key) is not None:
            own[key] = rec[key]
    return {
        "source_call_id": rec["tool_call_id"],
        "content": rec["content"],
        "extra": {"boxmaker": own},
    }


class _Builder:
    """The steps of one reading, record by record (see the module's docstring)."""

    def __init__(self, reading: Reading, prompt_ids: Mapping[int, list[int]]) -> None:
        self.reading = reading
        self.prompt_ids = prompt_ids
        self.steps: list[dict[str, Any]] = []
        self.before: list[dict[str, Any]] = []  # records before the first step
        self.open_calls: list[str] = []  # the current agent step's calls not answered yet
        self.usage_of = {c.usage: c for t in reading.turns for c in t.completions}

    @property
    def current(self) -> dict[str, Any] | None:
        return self.steps[-1] if self.steps else None

    def _step(self, source: str, message: str, index: int, stub: dict[str, Any]) -> None:
        rec = self.reading.records[index]
        step: dict[str, Any] = {
            "step_id": len(self.steps) + 1,
            "timestamp": rec["time"],
            "source": source,
            "message": message,
        }
        if index < self.reading.copied:
            step["is_copied_context"] = True
        step["extra"] = {"boxmaker": {"records": [stub]}}
        self.open_calls = []
        self.steps.append(step)

    def _keep(self, entry: dict[str, Any], index: int) -> None:
        """Add a record (or a stub) to the current step's records, or to those before."""
        step = self.current
        if step is None:
            self.before.append(entry)
            return
        own = step["extra"]["boxmaker"]
        if index == self.reading.copied and step.get("is_copied_context"):
            own["own"] = len(own["records"])  # the fork's own records start inside this step
        own["records"].append(entry)

    def add(self, index: int) -> None:
        rec = self.reading.records[index]
        kind, time = rec["type"], rec["time"]
        step = self.current
        if kind == "user":
            self._step("user", rec["content"], index, {"native": "user", "time": time})
        elif kind == "assistant":
            stub: dict[str, Any] = {"native": "assistant", "time": time}
            if rec.get("content") is None:
                stub["content"] = None
            self._step("agent", rec.get("content") or "", index, stub)
            step = self.steps[-1]
            if rec.get("reasoning") is not None:
                step["reasoning_content"] = rec["reasoning"]
            calls = []
            for call in rec.get("tool_calls") or ():
                arguments, text = _arguments(call["arguments"])
                made: dict[str, Any] = {
                    "tool_call_id": call["id"],
                    "function_name": call["name"],
                    "arguments": arguments,
                }
                if text is not None:
                    made["extra"] = {"boxmaker": {"arguments": text}}
                calls.append(made)
            if calls:
                step["tool_calls"] = calls
            self.open_calls = [c["id"] for c in rec.get("tool_calls") or ()]
        elif kind == "usage" and index in self.usage_of:
            completion = self.usage_of[index]
            if completion.assistant is None or step is None:
                self._step("agent", "", index, {"native": "usage", "time": time})
                step = self.steps[-1]
            else:
                self._keep({"native": "usage", "time": time}, index)
            step["llm_call_count"] = 1
            step["metrics"] = _metrics(rec, self.prompt_ids.get(index))
        elif kind == "tool_result" and step is not None and rec["tool_call_id"] in self.open_calls:
            self.open_calls.remove(rec["tool_call_id"])
            step.setdefault("observation", {"results": []})["results"].append(_result(rec))
            self._keep({"native": "tool_result", "time": time}, index)
        else:
            self._keep(dict(rec), index)


def atif_trajectory(
    reading: Reading,
    *,
    prompt_ids: Mapping[int, list[int]] | None = None,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One log as an ATIF trajectory (a JSON object; see the module's docstring).

    Args:
        reading: the log, split into turns (:func:`boxmaker.session.split_turns`).
        prompt_ids: the prompt's token ids of each completion, by the index of its ``Usage``
            record (:class:`~boxmaker.export._prompts.PromptTokens`); ``None``: not written.
        run: the batch run's ``task`` and ``settings``, when the log is a batch's.

    Returns:
        The trajectory, ``atif.Trajectory.model_validate`` accepts it.
    """
    records = reading.records
    head = reading.log.head
    build = _Builder(reading, prompt_ids or {})
    for turn in reading.turns:
        for index in range(turn.start, turn.stop):
            build.add(index)
    steps = build.steps
    if head.get("system"):
        system = {"step_id": 1, "source": "system", "message": head["system"]}
        if head.get("time") is not None:
            system = {"step_id": 1, "timestamp": head["time"], **system}
        steps.insert(0, system)
        for number, step in enumerate(steps, 1):
            step["step_id"] = number
    model = next(
        (str(r["model"]) for r in records if r["type"] == "capabilities" and r.get("model")),
        None,
    )
    agent: dict[str, Any] = {"name": "boxmaker", "version": boxmaker_version()}
    if model is not None:
        agent["model_name"] = model
    if head.get("tools"):
        agent["tool_definitions"] = list(head["tools"])
    own: dict[str, Any] = {"schema": reading.log.schema, "log": Path(reading.log.path).name}
    if head.get("time") is not None:
        own["baseline_time"] = head["time"]
    if build.before:
        own["records"] = build.before
    out: dict[str, Any] = {
        "schema_version": ATIF_VERSION,
        "session_id": reading.session,
        "trajectory_id": reading.session,
        "agent": agent,
        "steps": steps,
    }
    for step in steps:  # extra last, after ATIF's own fields
        if "extra" in step:
            step["extra"] = step.pop("extra")
    copied = sum(bool(s.get("is_copied_context")) for s in steps)
    if reading.forked is not None:
        parent = str(reading.forked["parent_session"])
        own["parent"] = {
            "trajectory_id": parent,
            "trajectory_path": f"{parent}.json",
            "session_id": parent,
        }
        own["settings"] = dict(reading.forked.get("settings") or {})
        out["notes"] = (
            f"A fork of session {parent} (turn {reading.forked['turn']}, "
            f"{reading.forked['point']}): its first {copied} steps are copies of the parent's "
            "(is_copied_context); final_metrics count this trajectory's own steps only."
        )
    if run is not None:
        own["run"] = dict(run)
    out["final_metrics"] = _final(steps)
    out["extra"] = {"boxmaker": own}
    return out


def _final(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The sums over the trajectory's own completions (a total with an unknown part is
    absent, never a partial sum)."""
    mine = [s for s in steps if s.get("llm_call_count") and not s.get("is_copied_context")]
    final: dict[str, Any] = {"total_steps": sum(not s.get("is_copied_context") for s in steps)}
    for name, key in (
        ("total_prompt_tokens", "prompt_tokens"),
        ("total_completion_tokens", "completion_tokens"),
        ("total_cached_tokens", "cached_tokens"),
    ):
        values = [s["metrics"].get(key) for s in mine]
        if all(v is not None for v in values):
            final[name] = sum(values)
    final["extra"] = {"boxmaker": {"completions": len(mine)}}
    return final


def export_atif(
    source: Source,
    out: str | Path,
    *,
    url: str | None = None,
    api_key: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    transport: Any = None,
    on_file: Callable[[Path], None] | None = None,
) -> list[Path]:
    """Write one ATIF trajectory (version :data:`ATIF_VERSION`) per session log of
    ``source`` as ``<out>/<session>.json``.

    Args:
        source: a log, a directory of logs, a batch folder (each run's task and settings go
            into ``extra.boxmaker.run``), or a list of these.
        out: the directory to write (made when missing; files of the same names replaced).
        url: a llama-server with the sessions' model: each completion's ``prompt_token_ids``
            are its template's and tokenizer's (two requests per completion); ``None``: none
            are written.
        api_key: that server's key, if it needs one.
        template_kwargs: the ``chat_template_kwargs`` the sessions ran with (default:
            :meth:`boxmaker.config.Config.template_kwargs` of the default config).
        transport: an httpx transport instead of the network (tests).
        on_file: called with each file once it is written.

    Returns:
        The files written, in the source's order.

    Raises:
        SessionError: a path of ``source`` names no log.
        ExportError: the server could not render or tokenize a prompt.

    Warns:
        LogReadWarning: a log the session refuses, or a copy of a session, is left out.
    """
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    runs = batch_runs(source)
    tokens = None
    if url is not None:
        from ..cache import TemplateServer  # httpx: only when a server is asked
        from ._prompts import PromptTokens

        kwargs = Config().template_kwargs() if template_kwargs is None else template_kwargs
        server = TemplateServer(url, api_key=api_key, transport=transport)
        tokens = PromptTokens(server, kwargs)
    written: list[Path] = []
    try:
        for log in read_logs(source):
            reading = split_turns(log)
            ids = tokens.of(reading) if tokens is not None else None
            body = atif_trajectory(reading, prompt_ids=ids, run=runs.get(reading.session))
            path = folder / f"{reading.session}.json"
            path.write_text(json.dumps(body, ensure_ascii=False, indent=1) + "\n", "utf-8")
            written.append(path)
            if on_file is not None:
                on_file(path)
    finally:
        if tokens is not None:
            tokens.server.close()
    return written
