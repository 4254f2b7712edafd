"""``boxmaker doctor``: is a llama-server set up right for agent loops? Small probes, one report.

:func:`diagnose` sends a handful of small requests to a llama-server (llama.cpp's
``tools/server``: ``GET /health``, ``GET /props``, ``GET /slots``, streamed ``POST
/v1/chat/completions`` with the shipped model's demo prompt and tools, ``POST
/v1/chat/completions/control``) and returns a :class:`DoctorReport`: one :class:`Check` per
question, each with what was seen and, when it failed, what to change (a server flag or a
request option). The demo prompt and tools are used whatever the model: a model that does
not call the demo tool or does not reason leaves those checks unknown (``ok`` ``None``),
not failed.

Printing is the CLI's (``boxmaker doctor --url URL [--json]``); this module returns data.

Example::

    from boxmaker.cli.doctor import diagnose

    report = diagnose("http://127.0.0.1:8080")
    for check in report.checks:
        print(check.name, check.ok, check.seen, check.fix)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ..client import capabilities_of
from ..demo import DEMO_PROMPTS, demo_registry
from ..records import Capabilities

__all__ = ["Check", "DoctorReport", "Probe", "diagnose"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_BUDGET = 5  # thinking_budget_tokens of the budget probe
_CONTROL_AFTER = 3  # reasoning deltas before the reasoning-control probe sends reasoning_end
_MIN_SLOT_CTX = 4096  # tokens per slot below which an agent loop soon runs out of context


@dataclass(frozen=True)
class Check:
    """One answer of the doctor.

    Attributes:
        name: what was checked (``"tool calls parsed"``...).
        ok: ``True`` fine, ``False`` needs a change, ``None`` unknown or for information.
        seen: what the server showed (one line).
        fix: what to change when ``ok`` is ``False`` (server flag or request option);
            ``""`` otherwise.
    """

    name: str
    ok: bool | None
    seen: str
    fix: str = ""


@dataclass(frozen=True)
class Probe:
    """What one streamed chat completion showed (from its raw SSE ``data:`` events).

    Attributes:
        status: HTTP status of the response.
        reasoning_field: ``delta.reasoning_content`` or ``delta.reasoning`` came.
        reasoning_deltas: number of deltas carrying reasoning (fields, or content inside
            ``<think>...</think>``).
        think_tags: ``<think>`` or ``</think>`` came in ``content``.
        tool_call_deltas: ``delta.tool_calls`` came.
        tool_call_text: ``content`` held ``<tool_call>`` (tool calls left as text).
        progress: a ``prompt_progress`` object came.
        timings: the last ``timings`` object (``{}`` if none).
        completion_id: the stream's ``id``.
        control: the reasoning-control answer's ``success`` (``None`` if none was sent).
        reasoning_after_control: reasoning deltas after ``reasoning_end`` was accepted.
    """

    status: int
    reasoning_field: bool = False
    reasoning_deltas: int = 0
    think_tags: bool = False
    tool_call_deltas: bool = False
    tool_call_text: bool = False
    progress: bool = False
    timings: dict[str, Any] = field(default_factory=dict)
    completion_id: str = ""
    control: bool | None = None
    reasoning_after_control: int = 0


@dataclass(frozen=True)
class DoctorReport:
    """The doctor's answers for one server.

    Attributes:
        url: the server's base URL.
        checks: the checks in the order they were made.
    """

    url: str
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        """No check failed (unknown ones do not count)."""
        return all(c.ok is not False for c in self.checks)

    def check(self, name: str) -> Check:
        """The check called ``name``.

        Raises:
            KeyError: no check has that name.
        """
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_json(self) -> dict[str, Any]:
        """``{"url", "ok", "checks": [{"name", "ok", "seen", "fix"}, ...]}``."""
        return {"url": self.url, "ok": self.ok, "checks": [asdict(c) for c in self.checks]}


def _body(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "messages": [{"role": "user", "content": DEMO_PROMPTS[0]}],
        "tools": demo_registry().definitions(),
        "stream": True,
        "return_progress": True,
        "cache_prompt": True,
        "id_slot": 0,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream_options": {"include_usage": True},
        **extra,
    }


def _stream(http: httpx.Client, url: str, body: dict[str, Any], control_after: int | None) -> Probe:
    """One streamed completion, read raw; with ``control_after``, ``reasoning_end`` is sent
    after that many reasoning deltas."""
    seen: dict[str, Any] = {"timings": {}}
    deltas = after = 0
    control: bool | None = None
    in_think = False
    cid = ""
    with http.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            return Probe(status=response.status_code)
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            cid = cid or str(obj.get("id") or "")
            if obj.get("prompt_progress") is not None:
                seen["progress"] = True
            if obj.get("timings"):
                seen["timings"] = obj["timings"]
            for choice in obj.get("choices") or []:
                delta = choice.get("delta") or {}
                reasoned = False
                if delta.get("reasoning_content") or delta.get("reasoning"):
                    seen["reasoning_field"] = reasoned = True
                text = delta.get("content") or ""
                if _THINK_OPEN in text or _THINK_CLOSE in text:
                    seen["think_tags"] = True
                    in_think = _THINK_OPEN in text and _THINK_CLOSE not in text
                elif in_think and text:
                    reasoned = True
                if "<tool_call>" in text:
                    seen["tool_call_text"] = True
                if delta.get("tool_calls"):
                    seen["tool_call_deltas"] = True
                if reasoned:
                    deltas += 1
                    if control:
                        after += 1
                if control_after is not None and control is None and deltas >= control_after:
                    answer = http.post(
                        f"{url}/v1/chat/completions/control",
                        json={"id": cid, "action": "reasoning_end"},
                    )
                    control = answer.status_code == 200 and answer.json().get("success") is True
    return Probe(
        status=200,
        reasoning_deltas=deltas,
        completion_id=cid,
        control=control,
        reasoning_after_control=after,
        **seen,
    )


def diagnose(
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    transport: httpx.BaseTransport | None = None,
) -> DoctorReport:
    """Probe the llama-server at ``url`` and say what is set up right for agent loops.

    Requests (all small: the demo prompt, at most 160 generated tokens each): ``GET
    /health``, ``GET /props`` (without a key first: HTTP 401 means a key is needed),
    ``GET /slots``, three streamed chat completions on slot 0 (plain, then again to see the
    cache reused, with ``thinking_budget_tokens`` 5) and one with ``reasoning_control`` whose
    reasoning is ended after 3 reasoning deltas.

    Args:
        url: the server's base URL (no ``/v1``).
        api_key: sent as ``Authorization: Bearer`` after the key check; ``None``: none.
        timeout_s: seconds per request (read timeout per chunk).
        transport: an httpx transport instead of the network (tests).

    Returns:
        The :class:`DoctorReport`. A server that cannot be reached gives one failed check
        ``"reachable"``; an answer that is not what llama-server sends (not JSON, a broken
        stream) ends the report with a failed check ``"answers"``; nothing is raised for
        what the server answers.
    """
    base = url.rstrip("/")
    checks: list[Check] = []
    with httpx.Client(timeout=timeout_s, transport=transport) as bare:
        try:
            health = bare.get(f"{base}/health")
        except httpx.HTTPError as exc:
            fix = "start llama-server, or pass the right --url (host and port)"
            return DoctorReport(base, (Check("reachable", False, f"{exc!r}", fix),))
        checks.append(Check("reachable", health.status_code == 200, f"/health: {health.text[:80]}"))
        props = bare.get(f"{base}/props")
    needs_key = props.status_code == 401
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if needs_key and not api_key:
        fix = "pass --api-key KEY (ClientConfig.api_key), the key llama-server has in --api-key"
        checks.append(Check("api key", False, "HTTP 401 without a key", fix))
        return DoctorReport(base, tuple(checks))
    checks.append(Check("api key", None, "needed (HTTP 401 without)" if needs_key else "none"))
    with httpx.Client(timeout=timeout_s, transport=transport, headers=headers) as http:
        try:
            if needs_key:
                props = http.get(f"{base}/props")
            checks += _props_checks(props)
            checks += _slot_checks(http, base, props)
            first = _stream(http, base, _body(160), None)
            if first.status != 200:
                fix = "see the server's log (a template that cannot render the demo's tools?)"
                checks.append(Check("chat completion", False, f"HTTP {first.status}", fix))
                return DoctorReport(base, tuple(checks))
            again = _stream(http, base, _body(160), None)
            budget = _stream(http, base, _body(160, thinking_budget_tokens=_BUDGET), None)
            control = _stream(http, base, _body(160, reasoning_control=True), _CONTROL_AFTER)
        except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
            fix = "is this a llama-server (llama.cpp tools/server)? see its log"
            checks.append(Check("answers", False, f"unexpected answer: {exc!r}"[:300], fix))
            return DoctorReport(base, tuple(checks))
    checks += _stream_checks(first, again, budget, control)
    return DoctorReport(base, tuple(checks))


def _props_checks(props: httpx.Response) -> list[Check]:
    if props.status_code != 200:
        return [Check("props", None, f"GET /props: HTTP {props.status_code}")]
    data = props.json()
    model = str(data.get("model_alias") or data.get("model_path") or "?")
    caps = data.get("chat_template_caps") or {}
    tools = caps.get("supports_tool_calls")
    has = [k.removeprefix("supports_") for k, v in sorted(caps.items()) if v is True]
    seen = "supports " + ", ".join(has) if has else "no chat_template_caps"
    if tools is not False:
        fix = ""
    else:  # --jinja is on by default: the template itself takes no tools
        fix = (
            "this model's chat template takes no tools (llama.cpp drops them from the prompt "
            "without a word): use a model whose template does, or --chat-template-file with one"
        )
    read = capabilities_of(data)
    checks = [
        Check("model", None, model),
        Check("chat template", None if tools is None else bool(tools), seen, fix),
    ]
    if read is not None:
        checks.append(Check("capabilities", None, _capabilities_seen(read)))
    return checks


def _capabilities_seen(caps: Capabilities) -> str:
    """One line of what a session's ``Capabilities`` record will hold."""

    def said(value: object) -> str:
        return (
            "?"
            if value is None
            else ("yes" if value is True else "no" if value is False else str(value))
        )

    parts = [
        f"tools {said(caps.supports_tools)}",
        f"tool calls {said(caps.supports_tool_calls)}",
        f"parallel calls {said(caps.supports_parallel_tool_calls)}",
        f"system role {said(caps.supports_system_role)}",
        f"reasoning {said(caps.reasoning)}",
        f"kv_unified {said(caps.kv_unified)}",
        f"n_swa {said(caps.n_swa)}",
    ]
    return ", ".join(parts) + " (? : /props does not say)"


def _slot_checks(http: httpx.Client, base: str, props: httpx.Response) -> list[Check]:
    data = props.json() if props.status_code == 200 else {}
    n_slots = data.get("total_slots")
    per_slot = (data.get("default_generation_settings") or {}).get("n_ctx")
    slots = http.get(f"{base}/slots")
    if slots.status_code == 200 and isinstance(slots.json(), list):
        listed = slots.json()
        n_slots = len(listed)
        per_slot = listed[0].get("n_ctx", per_slot) if listed else per_slot
    if not isinstance(n_slots, int) or not isinstance(per_slot, int):
        fix = "start llama-server with --slots (GET /slots) to see slots and context"
        return [Check("slots and context", None, f"GET /slots: HTTP {slots.status_code}", fix)]
    read = capabilities_of(data)
    unified = read.kv_unified if read is not None else None
    seen, fix = _slots_seen(n_slots, per_slot, unified)
    ok = per_slot >= _MIN_SLOT_CTX
    return [Check("slots and context", ok, seen, "" if ok else fix)]


def _slots_seen(n_slots: int, per_slot: int, unified: bool | None) -> tuple[str, str]:
    """What the slots are and what to change when a slot is small. ``per_slot`` is the
    ``n_ctx`` llama.cpp reports for one slot: with a unified KV cache (llama-server's default
    when ``-np`` is not given) every slot may use all of ``-c`` and all share it; without,
    each has ``-c / -np`` of its own. ``unified`` is ``None`` when ``/props`` does not say."""
    split = f"each slot gets -c / -np tokens: raise -c to {_MIN_SLOT_CTX * n_slots} or more, "
    split += "or lower -np"
    shared = f"the slots share -c tokens: raise -c to {_MIN_SLOT_CTX} or more"
    if n_slots == 1:
        return f"1 slot(s) x {per_slot} tokens (n_ctx {per_slot})", shared
    if unified is True:
        return f"{n_slots} slot(s) sharing {per_slot} tokens (unified KV, n_ctx {per_slot})", shared
    if unified is False:
        return f"{n_slots} slot(s) x {per_slot} tokens (n_ctx {n_slots * per_slot} in all)", split
    seen = (
        f"{n_slots} slot(s), each up to {per_slot} tokens: n_ctx {per_slot} shared if the KV "
        f"cache is unified (llama-server's default without -np), else {n_slots * per_slot} in "
        "all (/props does not say which)"
    )
    return seen, f"{split} (with a unified KV: {shared})"


def _stream_checks(first: Probe, again: Probe, budget: Probe, control: Probe) -> list[Check]:
    checks = []
    if first.tool_call_deltas:
        checks.append(Check("tool calls parsed", True, "delta.tool_calls"))
    elif first.tool_call_text:
        fix = (
            "llama.cpp did not parse the model's tool-call text: check llama-server was not "
            "started with --no-jinja (--jinja is the default), and that the chat template "
            "declares tools in a format llama.cpp knows"
        )
        checks.append(Check("tool calls parsed", False, "<tool_call> left in content", fix))
    else:
        checks.append(Check("tool calls parsed", None, "the model called no tool on the demo"))
    if first.reasoning_field:
        checks.append(Check("reasoning separated", True, "delta.reasoning_content / reasoning"))
    elif first.think_tags:
        fix = (
            "start llama-server with --reasoning-format deepseek (boxmaker reads the tags, "
            "but other clients show them)"
        )
        checks.append(Check("reasoning separated", False, "<think> tags in content", fix))
    else:
        checks.append(Check("reasoning separated", None, "no reasoning seen on the demo prompt"))
    if first.reasoning_deltas == 0:
        checks.append(Check("thinking_budget_tokens", None, "no reasoning to cap"))
    else:
        n = budget.reasoning_deltas
        ok = n <= _BUDGET
        fix = "" if ok else "use a llama-server build with thinking_budget_tokens (newer)"
        seen = f"budget {_BUDGET}: {n} reasoning deltas (uncapped: {first.reasoning_deltas})"
        checks.append(Check("thinking_budget_tokens", ok, seen, fix))
    if control.control is None:
        checks.append(Check("reasoning_control", None, "no reasoning to end"))
    else:
        ok = control.control and control.reasoning_deltas < first.reasoning_deltas
        seen = (
            f"reasoning_end after {_CONTROL_AFTER} deltas accepted={control.control}: "
            f"{control.reasoning_deltas} reasoning deltas (uncapped: {first.reasoning_deltas})"
        )
        fix = "" if ok else "use a llama-server build with reasoning control (reasoning_control)"
        checks.append(Check("reasoning_control", ok, seen, fix))
    t1, t2 = first.timings, again.timings
    if t1 and t2:
        reused = int(t2.get("cache_n", 0))
        total = int(t1.get("cache_n", 0)) + int(t1.get("prompt_n", 0))
        ok = reused >= total // 2
        fix = "" if ok else "keep cache_prompt on; start llama-server without --no-cache-prompt"
        seen = f"same prompt again: cache_n {reused} of {total} prompt tokens"
        checks.append(Check("cache reused", ok, seen, fix))
    else:
        fix = "a llama-server build that sends timings"
        checks.append(Check("cache reused", None, "no timings: cannot tell", fix))
    fix = "" if first.progress else "a newer llama-server build (return_progress)"
    checks.append(Check("return_progress", first.progress, "prompt_progress events", fix))
    fix = "" if t1 else "a llama-server build that sends timings (stream_options.include_usage)"
    checks.append(Check("timings", bool(t1), ", ".join(sorted(t1)[:4]) or "none", fix))
    return checks
