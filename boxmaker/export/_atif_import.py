"""``boxmaker import atif``: an ATIF trajectory as a session log, so the frames, ``report``,
``replay`` (what-if) and ``cache explain`` read another harness's runs as they read
boxmaker's.

A trajectory boxmaker wrote (:func:`boxmaker.export.export_atif`) comes back as the log it was
made of, record for record (its ``extra.boxmaker`` fields hold what ATIF cannot carry, see
:mod:`boxmaker.export._atif`): the round trip gives the same frames. Any other trajectory is
read by ATIF's own fields:

- the first step, when it is a ``system`` step: the baseline's system prompt;
  ``agent.tool_definitions``: its tools; ``agent.model_name``: a ``Capabilities`` record's
  model;
- a ``user`` step: a ``User`` record;
- an ``agent`` step: an ``Assistant`` record (``message``, ``reasoning_content``,
  ``tool_calls`` with their arguments as JSON text), then, unless ``llm_call_count`` is 0 (no
  model was asked), a ``Usage`` record from ``metrics``: ``cache_n`` = ``cached_tokens``,
  ``prompt_n`` = ``prompt_tokens - cached_tokens``, ``predicted_n`` = ``completion_tokens``
  (as llama.cpp's timings, when prompt and cached tokens are known), and the OpenAI usage
  figures ``prompt_tokens`` and ``completion_tokens``; a figure the step does not give stays
  unknown, ``reasoning_tokens`` too (``metrics.extra.reasoning_tokens``; it was 0 when the
  step gave none, and a round trip turned the log's unknown into 0); then a ``ToolResult``
  per observation result that answers one of the step's calls (call numbers 1, 2, ... in order);
- after each completion the one cache rule (:func:`boxmaker.cache.cache_loss`) adds a
  ``CacheLoss`` where the server reused less than the earlier completion made cacheable, so
  ``boxmaker cache explain LOG --url URL`` can tell why; each turn ends with a ``TurnEnd``
  record whose outcome is read from its records (:func:`boxmaker.session.inferred_outcome`;
  a turn that ends without an answer, ``no_answer``, is an outcome no ``TurnEnd`` says: that
  turn has none, and every reading infers it).
- Times: each step's ``timestamp`` (a time without an offset read as UTC); a step without one
  takes the time before it (the first known time for steps before any). Times then rise: a
  record whose time is not after the one before it is set 1 µs after it (a session log reads
  two equal lines as one record written twice, and second-resolution timestamps repeat).

Left out, and counted in :attr:`AtifImport.left_out`: ``system`` steps after the first step,
the ``is_copied_context`` flag of a step (a log names the parent it copies; the trajectory
names none, so the step is the log's own),
observation results that answer no call of their step (or of no step), image and audio parts
(their text parts are kept), subagent trajectories and references to them, and metrics
boxmaker has no field for (costs, logprobs, token ids).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import RecordError, SessionError
from ..records import (
    SESSION_ID,
    Baseline,
    Usage,
    baseline_from_json,
    format_time,
    parse_time,
    record_from_json,
    record_to_json,
    records_from_json,
    time_problem,
    utc_now,
)
from ..session import Session, inferred_outcome
from ._atif import NATIVE
from ._errors import ExportError

__all__ = ["AtifImport", "atif_log", "import_atif"]


class AtifImport(NamedTuple):
    """What :func:`import_atif` wrote.

    Attributes:
        path: the session log.
        session: its session id.
        left_out: what of the trajectory has no place in a session log, counted by kind
            (empty when nothing was left out).
    """

    path: Path
    session: str
    left_out: dict[str, int]


def _own(item: Any) -> dict[str, Any]:
    """An ATIF object's ``extra.boxmaker`` (``{}`` when it has none)."""
    extra = item.get("extra") if isinstance(item, Mapping) else None
    own = extra.get("boxmaker") if isinstance(extra, Mapping) else None
    return dict(own) if isinstance(own, Mapping) else {}


class _Reader:
    """The records of one trajectory, step by step."""

    def __init__(self, trajectory: Mapping[str, Any], where: str) -> None:
        self.where = where
        self.left: Counter[str] = Counter()
        self.records: list[dict[str, Any]] = []
        self.native = bool(_own(trajectory))  # written by boxmaker: its extra says the rest
        self.next_call = 1
        self.last_time: str | None = None
        times = [s.get("timestamp") for s in trajectory["steps"] if isinstance(s, Mapping)]
        self.first_time = next((t for t in map(self._time, times) if t is not None), None)

    def fail(self, why: str) -> ExportError:
        return ExportError(f"{self.where}: not an ATIF trajectory boxmaker can read: {why}")

    def _time(self, value: Any) -> str | None:
        """A timestamp as a log time (``None``: none, or not a time)."""
        if not isinstance(value, str):
            return None
        if time_problem(value) is None:
            return value
        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        if t.tzinfo is None:
            t = t.replace(tzinfo=UTC)
        text = format_time(t)
        return text if time_problem(text) is None else None

    def step_time(self, step: Mapping[str, Any]) -> str:
        time = self._time(step.get("timestamp"))
        if time is None:
            if step.get("timestamp") is not None:
                self.left["timestamps that are no time"] += 1
            time = self.last_time or self.first_time or format_time(utc_now())
        self.last_time = time
        return time

    def text(self, value: Any, what: str) -> str:
        """A message or a result's content as text: a string, or the text parts of a
        multimodal list (the others counted as left out)."""
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise self.fail(f"{what} is neither a string nor a list of parts")
        parts = []
        for part in value:
            if isinstance(part, Mapping) and part.get("type") == "text":
                parts.append(str(part.get("text") or ""))
            else:
                kind = part.get("type") if isinstance(part, Mapping) else None
                self.left[f"{kind or 'unknown'} parts"] += 1
        return "".join(parts)

    def assistant(self, step: Mapping[str, Any], time: str) -> dict[str, Any]:
        calls = []
        for k, call in enumerate(step.get("tool_calls") or ()):
            if not isinstance(call, Mapping) or not isinstance(call.get("function_name"), str):
                raise self.fail(f"step {step.get('step_id')}: a tool call without function_name")
            text = _own(call).get("arguments")
            if not isinstance(text, str):
                text = json.dumps(call.get("arguments") or {}, ensure_ascii=False)
            made = call.get("tool_call_id")
            calls.append(
                {
                    "id": made if isinstance(made, str) else f"call_{step.get('step_id')}_{k}",
                    "name": call["function_name"],
                    "arguments": text,
                }
            )
        content: str | None = self.text(step.get("message"), "a message")
        if content == "" and calls:
            content = None
        reasoning = step.get("reasoning_content")
        return {
            "type": "assistant",
            "content": content,
            "reasoning": reasoning if isinstance(reasoning, str) else None,
            "tool_calls": calls,
            "time": time,
        }

    def usage(self, step: Mapping[str, Any], time: str) -> dict[str, Any]:
        metrics = step.get("metrics") if isinstance(step.get("metrics"), Mapping) else {}
        assert isinstance(metrics, Mapping)
        extra = metrics.get("extra") if isinstance(metrics.get("extra"), Mapping) else {}
        assert isinstance(extra, Mapping)
        for kind in ("cost_usd", "logprobs", "completion_token_ids", "prompt_token_ids"):
            if metrics.get(kind) is not None:
                self.left[f"metrics {kind}"] += 1
        if self.native and isinstance(extra.get("timings"), Mapping):
            return {
                "type": "usage",
                "timings": dict(extra["timings"]),
                "reasoning_tokens": extra.get("reasoning_tokens"),  # absent: unknown
                "thinking_capped": extra.get("thinking_capped"),
                "prompt_tokens": extra.get("openai_prompt_tokens"),
                "completion_tokens": extra.get("openai_completion_tokens"),
                "finish_reason": extra.get("finish_reason"),
                "time": time,
            }
        prompt, cached, generated = (
            _count(metrics.get(k)) for k in ("prompt_tokens", "cached_tokens", "completion_tokens")
        )
        timings: dict[str, int] = {}
        if prompt is not None and cached is not None and cached <= prompt:
            timings = {"cache_n": cached, "prompt_n": prompt - cached}
            if generated is not None:
                timings["predicted_n"] = generated
        reasoning = _count(extra.get("reasoning_tokens"))
        return {
            "type": "usage",
            "timings": timings,
            "reasoning_tokens": reasoning,  # not given: unknown, not 0
            "prompt_tokens": prompt,
            "completion_tokens": generated,
            "time": time,
        }

    def results(
        self, step: Mapping[str, Any], calls: list[dict[str, Any]], time: str
    ) -> list[dict[str, Any]]:
        observation = step.get("observation")
        items = observation.get("results") if isinstance(observation, Mapping) else None
        names = {c["id"]: c["name"] for c in calls}
        out = []
        for item in items or ():
            if not isinstance(item, Mapping):
                raise self.fail(f"step {step.get('step_id')}: an observation result is no object")
            if item.get("subagent_trajectory_ref"):
                self.left["subagent trajectory references"] += 1
            source = item.get("source_call_id")
            if source not in names:
                self.left["observation results that answer no call of their step"] += 1
                continue
            own = _own(item)
            given = own.get("call")
            call = given if isinstance(given, int) else self.next_call
            self.next_call = max(self.next_call, call + 1)
            result = {
                "type": "tool_result",
                "call": call,
                "tool_call_id": source,
                "name": own.get("name", names[source]),
                "content": self.text(item.get("content"), "a result's content"),
            }
            for key in ("data_class", "untrusted", "truncated", "not_run", "server", "source"):
                if key in own:
                    result[key] = own[key]
            result["time"] = time
            out.append(result)
        return out

    def step(self, step: Mapping[str, Any]) -> None:
        source = step.get("source")
        time = self.step_time(step)
        if step.get("is_copied_context") and not self.native:
            self.left[
                "is_copied_context flags (no parent to name: the steps are the log's own)"
            ] += 1
        made: list[dict[str, Any]]
        if source == "user":
            made = [{"type": "user", "content": self.text(step.get("message"), "a message")}]
        elif source == "agent":
            assistant = self.assistant(step, time)
            made = [assistant]
            if step.get("llm_call_count") != 0:
                made.append(self.usage(step, time))
            made += self.results(step, assistant["tool_calls"], time)
        else:
            raise self.fail(f"step {step.get('step_id')}: source {source!r}")
        layout = _own(step).get("records") if self.native else None
        if not isinstance(layout, list):
            for rec in made:
                rec["time"] = time
            self.records += made
            return
        native = {kind: [r for r in made if r["type"] == kind] for kind in NATIVE}
        for entry in layout:
            if not isinstance(entry, Mapping):
                raise self.fail(f"step {step.get('step_id')}: a record that is no object")
            kind = entry.get("native")
            if kind is None:
                self.records.append(dict(entry))
                continue
            if kind not in native or not native[kind]:
                raise self.fail(f"step {step.get('step_id')}: no {kind} for its record")
            rec = native[kind].pop(0)
            rec["time"] = entry.get("time", time)
            if kind == "assistant" and "content" in entry and entry["content"] is None:
                rec["content"] = None
            self.records.append(rec)


def _count(value: Any) -> int | None:
    """A token count of the trajectory (``None``: absent, or not a count)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def atif_log(
    trajectory: Mapping[str, Any], where: str = "trajectory"
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, int]]:
    """A trajectory's session log: its baseline (JSON), its records (JSON, as a log holds
    them) and what was left out (see the module's docstring).

    Raises:
        ExportError: ``trajectory`` is no ATIF trajectory (no ``steps`` list, a step of an
            unknown source, ...): the message names ``where`` and the step.
    """
    if not isinstance(trajectory, Mapping) or not isinstance(trajectory.get("steps"), list):
        raise ExportError(f"{where}: not an ATIF trajectory: no 'steps' list")
    read = _Reader(trajectory, where)
    own = _own(trajectory)
    agent = trajectory.get("agent") if isinstance(trajectory.get("agent"), Mapping) else {}
    assert isinstance(agent, Mapping)
    steps = trajectory["steps"]
    system = ""
    for position, step in enumerate(steps):
        if not isinstance(step, Mapping):
            raise read.fail(f"step {position + 1} is no object")
        if step.get("source") == "system":
            if position == 0:
                system = read.text(step.get("message"), "the system prompt")
                read.step_time(step)
            else:
                read.left["system steps after the first"] += 1
            continue
        read.step(step)
    if trajectory.get("subagent_trajectories"):
        read.left["subagent trajectories"] += len(trajectory["subagent_trajectories"])
    before = [dict(r) for r in own.get("records") or () if isinstance(r, Mapping)]
    time = own.get("baseline_time") or (steps[0].get("timestamp") if steps else None)
    head: dict[str, Any] = {
        "type": "baseline",
        "system": system,
        "tools": [dict(t) for t in agent.get("tool_definitions") or () if isinstance(t, Mapping)],
        "time": read._time(time) or read.first_time or format_time(utc_now()),
    }
    records = before + read.records
    if not read.native:
        if isinstance(agent.get("model_name"), str):
            caps = {"type": "capabilities", "model": agent["model_name"], "time": head["time"]}
            records.insert(0, caps)
        records = _with_losses_and_ends(records, read)
    return head, records, dict(read.left)


def _with_losses_and_ends(records: list[dict[str, Any]], read: _Reader) -> list[dict[str, Any]]:
    """A foreign trajectory's records with the one cache rule's losses after each completion
    and a ``TurnEnd`` closing each turn."""
    from ..cache import cache_loss

    out: list[dict[str, Any]] = []
    earlier: Usage | None = None
    turn: list[dict[str, Any]] = []

    def end() -> None:
        outcome = inferred_outcome([r["type"] for r in turn], turn) if turn else "no_answer"
        if outcome != "no_answer":  # not an outcome a TurnEnd says: the reading infers it
            time = turn[-1]["time"]
            out.append({"type": "turn_end", "outcome": outcome, "detail": "", "time": time})

    for rec in records:
        if rec["type"] == "user":
            end()
            turn = []
        out.append(rec)
        turn.append(rec)
        if rec["type"] == "usage":
            try:
                usage = record_from_json(rec)
            except RecordError as exc:
                raise read.fail(f"a step's metrics: {exc}") from exc
            assert isinstance(usage, Usage)
            loss = cache_loss(earlier, usage)
            if loss is not None:
                out.append({**record_to_json(loss), "time": rec["time"]})
            earlier = usage
    end()
    return _rising(out)


def _rising(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``records`` with times that rise: a record whose time is not after the one before it
    takes that time plus 1 µs (a session log reads two equal lines as one record written
    twice; a trajectory's timestamps may repeat, in whole seconds, or be missing)."""
    last: datetime | None = None
    for rec in records:
        t = parse_time(rec["time"])
        if last is not None and t <= last:
            t = last + timedelta(microseconds=1)
            rec["time"] = format_time(t)
        last = t
    return records


def import_atif(
    file: str | Path, directory: str | Path, *, session_id: str | None = None
) -> AtifImport:
    """Write the ATIF trajectory in ``file`` as the session log ``<directory>/<id>.jsonl``.

    Args:
        file: a JSON file holding one ATIF trajectory (any version whose fields are read as
            :data:`~boxmaker.export.ATIF_VERSION`'s).
        directory: where the log goes (made when missing).
        session_id: the log's session id; default the trajectory's ``session_id`` (else its
            ``trajectory_id``, else the file's name), when it is safe as a file name.

    Returns:
        The log's path, its session id and what was left out.

    Raises:
        ExportError: the file is no JSON, or no trajectory boxmaker can read (the message
            names the file and the step).
        SessionError: the log exists already, or cannot be written.
    """
    path = Path(file)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ExportError(f"{path}: cannot read an ATIF trajectory: {exc}") from exc
    head, records, left = atif_log(data, str(path))
    sid = session_id
    if sid is None:
        candidates = (data.get("session_id"), data.get("trajectory_id"), path.stem)
        sid = next((c for c in candidates if isinstance(c, str) and SESSION_ID.fullmatch(c)), None)
        if sid is None:
            raise ExportError(f"{path}: no session id safe as a file name; give one")
    try:
        baseline: Baseline = baseline_from_json(head)
        made = records_from_json(records)
    except RecordError as exc:
        raise ExportError(
            f"{path}: a record of the trajectory breaks the log's rule: {exc}"
        ) from exc
    Path(directory).mkdir(parents=True, exist_ok=True)
    with Session.create(directory, baseline, session_id=sid) as session:
        try:
            session.extend(made)
        except SessionError:
            session.close()
            session.path.unlink(missing_ok=True)
            raise
    return AtifImport(session.path, sid, left)
