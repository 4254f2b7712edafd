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

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ..cache import WARM_SHARE, held_tokens
from ..client import LEASES, StreamDecoder, capabilities_of, send_once_more
from ..config import ClientConfig, server_base_url
from ..demo import DEMO_PROMPTS, demo_registry
from ..errors import InferError
from ..records import Capabilities
from ..tools import TextToolCall, find_text_tool_call

__all__ = ["Check", "DoctorReport", "Probe", "diagnose"]

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
_BUDGET = 5  # thinking_budget_tokens of the budget probe
_CONTROL_AFTER = 3  # reasoning deltas before the reasoning-control probe sends reasoning_end
_MIN_SLOT_CTX = 4096  # tokens per slot below which an agent loop soon runs out of context
_PAIRS = 6  # pairs of requests pinned to one slot sent at once by the slot-sharing probe


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
        tool_call_text: ``content`` held a tool call written as text (the server did not
            parse it), ``None`` if not: its format, tool and fix
            (:func:`boxmaker.tools.find_text_tool_call` of the whole content, so markup split
            across deltas is found).
        progress: a ``prompt_progress`` object came.
        timings: the last ``timings`` object (``{}`` if none).
        completion_id: the stream's ``id``.
        control: the reasoning-control answer's ``success`` (``None`` if none was sent).
        control_status: the reasoning-control answer's HTTP status (0 if none was sent).
        reasoning_after_control: reasoning deltas after ``reasoning_end`` was accepted.
        text: the reply's content, joined; reasoning: its ``reasoning_content``, joined.
    """

    status: int
    reasoning_field: bool = False
    reasoning_deltas: int = 0
    think_tags: bool = False
    tool_call_deltas: bool = False
    tool_call_text: TextToolCall | None = None
    progress: bool = False
    timings: dict[str, Any] = field(default_factory=dict)
    completion_id: str = ""
    control: bool | None = None
    control_status: int = 0
    reasoning_after_control: int = 0
    text: str = ""
    reasoning: str = ""


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


PROBE_EVENTS_GRACE = 64
"""Data events a probe reads past its ``max_tokens`` before it gives up on the server (one
token an event, plus the role, progress, finish and usage events)."""


PROBE_MEASURE_EVENTS = 8
"""Data events a probe reads before its own pace sets its deadline (see :func:`_stream`)."""


class ProbeOverrun(Exception):
    """A probe's stream never ends: it went past its bound of events (the server ignores
    ``max_tokens``), or sent no data event for the probe's deadline (``: ping`` comments
    only); it was closed."""


class ProbeSlow(Exception):
    """A probe's stream went on within its bound of events but ran past the time its own
    pace allows (:func:`_stream`): the server is slow, not endless; it was closed.

    Attributes:
        elapsed_s: seconds the probe ran; events: data events read; allowed_s: its deadline.
    """

    def __init__(self, elapsed_s: float, events: int, allowed_s: float) -> None:
        super().__init__(
            f"{events} events in {elapsed_s:.0f} s, past the {allowed_s:.0f} s its pace allowed"
        )
        self.elapsed_s, self.events, self.allowed_s = elapsed_s, events, allowed_s


class AnswerTooLarge(ProbeOverrun, httpx.HTTPError):
    """An answer (one SSE event, or a whole JSON body) larger than the client's cap on one
    event, :data:`ANSWER_CAP`: read no further (a ``ProbeOverrun``, and an ``httpx``
    error where the doctor handles those)."""


ANSWER_CAP = ClientConfig().max_event_bytes or 16 * 1024 * 1024
"""The most bytes the doctor reads of one SSE event or one JSON answer: the client's cap on
one event (:attr:`boxmaker.config.ClientConfig.max_event_bytes`, 16 MiB). Issue 36: a
300 MB line took 178 s and 3.4 GB (httpx's ``iter_lines`` holds a line whole)."""


def _request(
    http: httpx.Client, method: str, url: str, body: dict[str, Any] | None = None
) -> httpx.Response:
    """One request, sent once more when it failed before any byte of an answer on a reused
    connection (llama.cpp closes a connection after a stream; see
    :func:`~boxmaker.client.send_once_more`), its body read to :data:`ANSWER_CAP` bytes at
    most (:class:`AnswerTooLarge` beyond)."""

    def send(trace: Any) -> httpx.Response:
        request = http.build_request(method, url, json=body, extensions={"trace": trace})
        return http.send(request, stream=True)

    response = send_once_more(send)
    try:
        parts, size = [], 0
        for part in response.iter_bytes():
            size += len(part)
            if size > ANSWER_CAP:
                raise AnswerTooLarge(
                    f"the answer to {method} {url} is larger than {ANSWER_CAP} bytes (the "
                    "client's cap on one event); not read further"
                )
            parts.append(part)
    finally:
        response.close()
    return httpx.Response(
        response.status_code,
        headers=[
            (k, v)
            for k, v in response.headers.multi_items()
            if k not in ("content-encoding", "content-length")  # the body is read decoded
        ],
        content=b"".join(parts),
        request=response.request,
    )


def _data(response: httpx.Response, check: Callable[[], None]) -> Iterator[str]:
    """The ``data`` of each SSE event of a streamed answer, ``[DONE]`` left out, read by the
    client's own SSE decoder under its cap on one event (:data:`ANSWER_CAP`; a longer event,
    or a line that never ends, is :class:`AnswerTooLarge` once it has grown past it, not
    after it is whole); ``check`` is called at each read (``: ping`` comments count) and
    raises to end the probe (its deadlines)."""
    sse = StreamDecoder(max_event_bytes=ANSWER_CAP).sse
    for raw in response.iter_bytes():
        check()
        try:
            events = sse.feed(raw)
        except InferError as exc:
            raise AnswerTooLarge(str(exc)) from exc
        for name, data in events:
            if name == "data" and data != "[DONE]":
                yield data


@contextlib.contextmanager
def _open(http: httpx.Client, url: str, body: dict[str, Any]) -> Iterator[httpx.Response]:
    """A streamed ``POST``, open for the block, sent once more as :func:`_request`."""
    response = send_once_more(
        lambda trace: http.send(
            http.build_request("POST", url, json=body, extensions={"trace": trace}), stream=True
        )
    )
    try:
        yield response
    finally:
        response.close()


def _stream(
    http: httpx.Client,
    url: str,
    body: dict[str, Any],
    control_after: int | None,
    deadline_s: float = 60.0,
) -> Probe:
    """One streamed completion, read raw; with ``control_after``, ``reasoning_end`` is sent
    after that many reasoning deltas.

    Bounded, checked at each line (``: ping`` comments too; a silent server meets the read
    timeout): more than ``max_tokens`` + :data:`PROBE_EVENTS_GRACE` data events, or no data
    event for ``deadline_s`` seconds, raise :class:`ProbeOverrun` (it never ends). The time
    it may take in all scales with the server's measured speed: ``deadline_s``, or, once
    :data:`PROBE_MEASURE_EVENTS` data events came, twice the time its pace so far needs for
    the whole bound of events, whichever is longer; past it, :class:`ProbeSlow` (a slow
    server: 160 tokens at 2.3 tokens/s under load take 70 s, past a fixed 60 s)."""
    bound = int(body.get("max_tokens") or 0) + PROBE_EVENTS_GRACE
    started = last = time.monotonic()
    allowed = deadline_s
    events = 0
    seen: dict[str, Any] = {"timings": {}}
    deltas = after = 0
    control: bool | None = None
    status = 0
    in_think = False
    cid = ""
    content: list[str] = []  # every content delta: a call written as text may span several
    thought: list[str] = []
    with _open(http, f"{url}/v1/chat/completions", body) as response:
        if response.status_code != 200:
            response.read()
            return Probe(status=response.status_code)

        def check() -> None:  # at each read: the deadlines, on the server's own pace
            now = time.monotonic()
            if now - last > deadline_s:
                raise ProbeOverrun(
                    f"the server sent no data event for {deadline_s:g} s (its deadline)"
                )
            if now - started > allowed:
                raise ProbeSlow(now - started, events, allowed)

        for data in _data(response, check):
            now = time.monotonic()
            events += 1
            last = now
            if events > bound:
                raise ProbeOverrun(
                    f"the server streamed more than {bound} events for max_tokens "
                    f"{body.get('max_tokens')}"
                )
            if events >= PROBE_MEASURE_EVENTS:  # its own pace: the whole bound, twice over
                allowed = max(deadline_s, 2 * (now - started) / events * bound)
            obj = json.loads(data)
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
                    thought.append(str(delta.get("reasoning_content") or delta.get("reasoning")))
                text = delta.get("content") or ""
                if _THINK_OPEN in text or _THINK_CLOSE in text:
                    seen["think_tags"] = True
                    in_think = _THINK_OPEN in text and _THINK_CLOSE not in text
                elif in_think and text:
                    reasoned = True
                content.append(text)
                if delta.get("tool_calls"):
                    seen["tool_call_deltas"] = True
                if reasoned:
                    deltas += 1
                    if control:
                        after += 1
                if control_after is not None and control is None and deltas >= control_after:
                    answer = _request(
                        http,
                        "POST",
                        f"{url}/v1/chat/completions/control",
                        {"id": cid, "action": "reasoning_end"},
                    )
                    status = answer.status_code
                    control = status == 200 and answer.json().get("success") is True
    return Probe(
        status=200,
        tool_call_text=find_text_tool_call("".join(content)),
        reasoning_deltas=deltas,
        completion_id=cid,
        control=control,
        control_status=status,
        reasoning_after_control=after,
        text="".join(content),
        reasoning="".join(thought),
        **seen,
    )


def diagnose(
    url: str,
    *,
    api_key: str | None = None,
    timeout_s: float = 120.0,
    probe_deadline_s: float = 60.0,
    probe_tokens: int = 160,
    transport: httpx.BaseTransport | None = None,
) -> DoctorReport:
    """Probe the llama-server at ``url`` and say what is set up right for agent loops.

    Requests (all small: the demo prompt, at most ``probe_tokens`` generated tokens each): ``GET
    /health``, ``GET /props`` (without a key first: HTTP 401 means a key is needed),
    ``GET /slots``, three streamed chat completions on slot 0 (plain, then again to see the
    cache reused, with ``thinking_budget_tokens`` 5) and one with ``reasoning_control`` whose
    reasoning is ended after 3 reasoning deltas.

    Args:
        url: the server's base URL (a trailing ``/v1`` is dropped).
        api_key: sent as ``Authorization: Bearer`` after the key check; ``None``: none.
        timeout_s: seconds per request (read timeout per chunk).
        probe_deadline_s: seconds a streamed probe may go without a data event, and the
            least it may take in all (more when the server's measured pace needs it, see
            :func:`_stream`). A server that streams past the probe's ``max_tokens`` (plus
            :data:`PROBE_EVENTS_GRACE` events) or sends nothing but pings ends the report with
            a failed check ``"bounded"`` (the stream closed); one slower than its own pace
            allows ends it with a check ``"speed"`` (slow, not endless).
        probe_tokens: ``max_tokens`` of each probe (160: room for the shipped model's
            reasoning and tool call; fewer for a model that rambles, whose reply then ends by
            length: its tool-call and reasoning verdicts need a reply that gets there).
        transport: an httpx transport instead of the network (tests).

    Returns:
        The :class:`DoctorReport`. A server that cannot be reached gives one failed check
        ``"reachable"``; an answer that is not what llama-server sends (not JSON, a broken
        stream) ends the report with a failed check ``"answers"``; nothing is raised for
        what the server answers; so a server that never stops streaming cannot hang it.
    """
    base = server_base_url(url)  # a URL ending in /v1 is accepted: the endpoints are above it
    checks: list[Check] = []
    with httpx.Client(timeout=timeout_s, transport=transport) as bare:
        try:
            health = _request(bare, "GET", f"{base}/health")
        except httpx.HTTPError as exc:
            fix = "start llama-server, or pass the right --url (host and port)"
            return DoctorReport(base, (Check("reachable", False, f"{exc!r}", fix),))
        dropped = " (the URL's /v1 dropped: boxmaker adds it)" if base != url.rstrip("/") else ""
        seen = f"/health: {health.text[:80]}{dropped}"
        checks.append(Check("reachable", health.status_code == 200, seen))
        props = _request(bare, "GET", f"{base}/props")
    needs_key = props.status_code == 401
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if needs_key and not api_key:
        fix = "pass --api-key KEY (ClientConfig.api_key), the key llama-server has in --api-key"
        checks.append(Check("api key", False, "HTTP 401 without a key", fix))
        return DoctorReport(base, tuple(checks))
    checks.append(Check("api key", None, "needed (HTTP 401 without)" if needs_key else "none"))
    with (
        httpx.Client(timeout=timeout_s, transport=transport, headers=headers) as http,
        LEASES.lease(base, 0, [], count=lambda: None, on_wait=lambda slot: None),
    ):  # the probes pin slot 0: no other boxmaker request of this machine runs there meanwhile
        try:
            if needs_key:
                props = _request(http, "GET", f"{base}/props")
            checks += _props_checks(props)
            checks += _slot_checks(http, base, props)
            saving = _slot_saving(http, base)
            checks.append(saving)
            d = probe_deadline_s
            n = probe_tokens
            first = _stream(http, base, _body(n), None, d)
            if first.status != 200:
                fix = "see the server's log (a template that cannot render the demo's tools?)"
                checks.append(Check("chat completion", False, f"HTTP {first.status}", fix))
                return DoctorReport(base, tuple(checks))
            again = _stream(http, base, _body(n), None, d)
            budget = _stream(http, base, _body(n, thinking_budget_tokens=_BUDGET), None, d)
            control = _stream(http, base, _body(n, reasoning_control=True), _CONTROL_AFTER, d)
            pinned = _pinned_twice(
                lambda: httpx.Client(timeout=timeout_s, transport=transport, headers=headers),
                base,
                n,
            )
            cache = _warm_checks(http, base, props, saving.ok is True, min(n, 48), d)
        except ProbeOverrun as exc:
            fix = "the server ignores max_tokens or never ends its stream: see its log"
            checks.append(Check("bounded", False, f"{exc}; stream closed", fix))
            return DoctorReport(base, tuple(checks))
        except ProbeSlow as exc:
            seen = f"slow, not endless: {exc}; stream closed"
            fix = (
                "the server slowed down mid-probe (under load?): try again, or fewer --probe-tokens"
            )
            checks.append(Check("speed", None, seen, fix))
            return DoctorReport(base, tuple(checks))
        except (httpx.HTTPError, ValueError, AttributeError, TypeError) as exc:
            fix = "is this a llama-server (llama.cpp tools/server)? see its log"
            checks.append(Check("answers", False, f"unexpected answer: {exc!r}"[:300], fix))
            return DoctorReport(base, tuple(checks))
    checks += _stream_checks(first, again, budget, control)
    checks.append(pinned)
    checks += cache
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
    slots = _request(http, "GET", f"{base}/slots")
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
    # a pool shared by the slots holds a session per slot at once: each gets its share
    room = per_slot // n_slots if unified and n_slots > 1 else per_slot
    ok = room >= _MIN_SLOT_CTX
    return [Check("slots and context", ok, seen, "" if ok else fix)]


def _slot_saving(http: httpx.Client, base: str) -> Check:
    """Whether the server saves slots to files (``--slot-save-path``), which keeps forks of a
    session warm once its slot was reused (:func:`boxmaker.cache.warm_fork`). Asked without
    side effects: a save to an invalid file name is refused HTTP 400 ``Invalid filename`` by a
    server that saves, HTTP 501 by one that cannot."""
    with _open(http, f"{base}/slots/0?action=save", {"filename": "../boxmaker-doctor"}) as answer:
        text = b""  # at most 4 KiB: a server that streams for ever cannot hold the doctor
        for piece in answer.iter_bytes():
            text += piece
            if len(text) >= 4096:
                break
    if answer.status_code == 501:
        seen = "off (no --slot-save-path): a fork runs cold once its parent's slot was reused"
        return Check("slot saving", None, seen + "; start llama-server with --slot-save-path DIR")
    words = text[:200].decode("utf-8", "replace")
    if answer.status_code == 400 and "filename" in words.lower():
        return Check("slot saving", True, "on (--slot-save-path): forks can restore saved slots")
    return Check("slot saving", None, f"unknown: HTTP {answer.status_code} {words[:80]}")


_PROBE_FILE = "boxmaker-doctor-probe.bin"
"""The file the warm-fork probe saves slot 0 to (in the server's ``--slot-save-path``; left
there, overwritten by the next doctor)."""


def _warm_checks(
    http: httpx.Client, base: str, props: httpx.Response, saving: bool, tokens: int, d: float
) -> list[Check]:
    """Does a fork find its parent's prefix, and does a session keep its slot? Pinned
    probes (slot 0 leased by the doctor; slot 1 leased here when there is one):

    - ``fork from a slot``: a reply, then a follow-up that extends it in the same slot: the
      share of what the slot held (prompt and reply, :func:`boxmaker.cache.held_tokens`)
      reused; a sliding-window model without ``--swa-full`` reuses only up to its last
      context checkpoint;
    - ``fork from a saved slot`` (with ``--slot-save-path``): the slot saved, another prompt
      run in it, the file restored, then the follow-up: was the restore used?
    - ``idle slot kept`` (two slots or more): another prompt on slot 1, then the follow-up on
      slot 0: llama-server's ``--cache-idle-slots`` (on by default with a unified KV cache)
      clears an idle slot when another starts a task, and a pinned request is not reloaded
      from the RAM cache: nothing reused.
    """
    data = props.json() if props.status_code == 200 else {}
    caps = capabilities_of(data)
    n_swa, n_slots = (caps.n_swa, caps.slots) if caps is not None else (None, None)
    ask = "In one sentence: what is a prompt cache for?"
    other = {"role": "user", "content": "Name three rivers of Europe, one per line."}

    def probe(messages: list[dict[str, Any]], slot: int = 0) -> Probe:
        body = _body(tokens, messages=messages, id_slot=slot)
        body.pop("tools")
        return _stream(http, base, body, None, d)

    def follow(first: Probe) -> list[dict[str, Any]]:
        reply: dict[str, Any] = {"role": "assistant", "content": first.text}
        if first.reasoning:
            reply["reasoning_content"] = first.reasoning
        return [{"role": "user", "content": ask}, reply, {"role": "user", "content": "Why?"}]

    def judged(name: str, first: Probe, then: Probe, how: str) -> Check:
        held, reused = held_tokens(first.timings), _tokens(then.timings, "cache_n")
        if held is None or reused is None or held <= 0:
            return Check(name, None, "the timings do not say cache_n and predicted_n")
        share = min(reused, held) / held
        seen = f"{how}: {min(reused, held)} of {held} held tokens reused ({share:.2f})"
        if share >= WARM_SHARE:
            return Check(name, True, seen)
        if n_swa:
            fix = (
                f"a sliding-window model (n_swa {n_swa}): start llama-server with --swa-full "
                "(boxmaker serve --swa-full); without it boxmaker's warm_fork prefills the "
                "slot (the parent's reply processed once more)"
            )
        elif reused == 0:
            fix = "the restore was accepted and not used (ggml-org/llama.cpp#26676): another build"
        else:
            fix = "see the server's log: the follow-up did not extend the slot's prompt"
        return Check(name, False, seen, fix)

    first = probe([{"role": "user", "content": ask}])
    checks = [judged("fork from a slot", first, probe(follow(first)), "the follow-up at once")]
    if saving:
        first = probe([{"role": "user", "content": ask}])
        _request(http, "POST", f"{base}/slots/0?action=save", {"filename": _PROBE_FILE})
        probe([other])
        _request(http, "POST", f"{base}/slots/0?action=restore", {"filename": _PROBE_FILE})
        how = "saved, another prompt run, restored, then the follow-up"
        checks.append(judged("fork from a saved slot", first, probe(follow(first)), how))
    if isinstance(n_slots, int) and n_slots > 1:
        first = probe([{"role": "user", "content": ask}])
        with LEASES.lease(base, 1, [], count=lambda: None, on_wait=lambda slot: None):
            probe([other], slot=1)
        then = probe(follow(first))
        reused = _tokens(then.timings, "cache_n")
        name = "idle slot kept"
        if reused is None:
            checks.append(Check(name, None, "the timings do not say cache_n"))
        elif reused == 0:
            seen = "slot 0 held nothing once slot 1 started a task: the idle slot was cleared"
            fix = (
                "start llama-server with --no-cache-idle-slots (or --no-kv-unified): a pinned "
                "request is not reloaded from the RAM cache; boxmaker's client lets such a "
                "server pick the slots once it saw one emptied (client.slot_choice), and then "
                "cannot save a session's slot"
            )
            checks.append(Check(name, False, seen, fix))
        else:
            seen = f"slot 0 kept its prompt while slot 1 ran ({reused} tokens reused)"
            checks.append(Check(name, True, seen))
    return checks


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
        seen = (
            f"{n_slots} slot(s) sharing one pool of {per_slot} tokens (unified KV): {n_slots} "
            f"sessions at once hold {per_slot // n_slots} tokens each before llama.cpp fails "
            'every running request ("Context size has been exceeded"; boxmaker waits and '
            "retries)"
        )
        pool = (
            f"give each session room: -np N for the N sessions run at once and -c N x "
            f"{_MIN_SLOT_CTX} or more (e.g. -np {n_slots} -c {n_slots * _MIN_SLOT_CTX}), or "
            "fewer slots"
        )
        return seen, pool
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
    elif first.tool_call_text is not None:
        found = first.tool_call_text
        checks.append(Check("tool calls parsed", False, found.describe(), found.fix))
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
        # accepted is what counts: a fast model may have ended its reasoning by itself before
        # the request arrived (the server still accepts it while the completion runs)
        late = "" if control.reasoning_deltas < first.reasoning_deltas else ", arrived late"
        # refused as too late (HTTP 200, success false): the completion had ended, unknown
        too_late = not control.control and late and control.control_status == 200
        verdict = None if too_late else control.control
        seen = (
            f"reasoning_end after {_CONTROL_AFTER} deltas accepted={control.control}: "
            f"{control.reasoning_deltas} reasoning deltas (uncapped: {first.reasoning_deltas})"
            f"{late}"
        )
        fix = (
            ""
            if verdict is not False
            else "use a llama-server build with reasoning control (reasoning_control)"
        )
        checks.append(Check("reasoning_control", verdict, seen, fix))
    t1, t2 = first.timings, again.timings
    checks.append(_cache_check(t1, t2))
    fix = "" if first.progress else "a newer llama-server build (return_progress)"
    checks.append(Check("return_progress", first.progress, "prompt_progress events", fix))
    fix = "" if t1 else "a llama-server build that sends timings (stream_options.include_usage)"
    checks.append(Check("timings", bool(t1), ", ".join(sorted(t1)[:4]) or "none", fix))
    return checks


def _cache_check(t1: dict[str, Any], t2: dict[str, Any]) -> Check:
    """Whether the same prompt sent again reused the slot's cache (``t1``, ``t2``: the two
    probes' ``timings``). From ``cache_n`` (prompt tokens reused) where the server reports
    it; else from ``prompt_n`` (prompt tokens processed: a reused prompt is processed only
    past what the cache held, at least its last token); "cannot tell" when neither says. A
    figure the server did not send is never taken as 0."""
    name = "cache reused"
    fix = "keep cache_prompt on; start llama-server without --no-cache-prompt"
    first_n, again_n = _tokens(t1, "prompt_n"), _tokens(t2, "prompt_n")
    total = None if first_n is None else first_n + (_tokens(t1, "cache_n") or 0)
    reused = _tokens(t2, "cache_n")
    if total is not None and reused is not None:
        ok = reused >= total // 2
        seen = f"same prompt again: cache_n {reused} of {total} prompt tokens"
        return Check(name, ok, seen, "" if ok else fix)
    if total is not None and again_n is not None:  # a build whose timings have no cache_n
        ok = again_n <= total // 2
        how = "reused" if ok else "processed again"
        seen = (
            f"same prompt again: no cache_n in the timings; prompt_n {again_n} of {total} "
            f"prompt tokens processed ({how})"
        )
        return Check(name, ok, seen, "" if ok else fix)
    if not t1 or not t2:
        return Check(
            name, None, "no timings: cannot tell", "a llama-server build that sends timings"
        )
    seen = "the timings report neither cache_n nor prompt_n: cannot tell"
    return Check(name, None, seen, "a llama-server build whose timings have cache_n")


def _tokens(timings: dict[str, Any], key: str) -> int | None:
    """A token count of ``timings`` (an int >= 0), ``None`` when the server did not send one."""
    value = timings.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _timed(http: httpx.Client, url: str, body: dict[str, Any]) -> tuple[str, float, float]:
    """One streamed completion: its text (reasoning, content and tool-call arguments, in
    order), the ``time.monotonic()`` of its first generated text and of its end."""
    parts: list[str] = []
    first = 0.0
    with _open(http, f"{url}/v1/chat/completions", body) as response:
        for data in _data(response, lambda: None):  # the read timeout bounds it
            for choice in json.loads(data).get("choices") or []:
                delta = choice.get("delta") or {}
                text = str(delta.get("reasoning_content") or delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    text += str((call.get("function") or {}).get("arguments") or "")
                if text and not first:
                    first = time.monotonic()
                parts.append(text)
    return "".join(parts), first, time.monotonic()


def _pinned_twice(make: Callable[[], httpx.Client], base: str, max_tokens: int) -> Check:
    """Two requests pinned to slot 0 at once, :data:`_PAIRS` times (the two demo prompts,
    each also sent alone): does the server queue the second, or run both in the slot
    together (their answers cross)? Each request has a client (``make()``) of its own.

    A pair ran together when each generated before the other ended (both streams' first
    generated text before the other's end: an overlap in time). An answer that differs from
    the answer alone without that overlap is no crossing: a model's answers at temperature 0
    differ with the cache's state (seen on SmolLM2: 0 of 6 pairs overlapped, answers
    differed), said apart. Seen on llama.cpp: a request that arrives while the slot is
    generating is queued, but two that arrive together may both run in it."""
    bodies = [
        _body(max_tokens) | {"messages": [{"role": "user", "content": p}]} for p in DEMO_PROMPTS[:2]
    ]
    alone = []
    for body in bodies:
        with make() as http:
            alone.append(_timed(http, base, body)[0])
    together = differed = 0
    for _ in range(_PAIRS):
        (a, a0, a1), (b, b0, b1) = _pair(make, base, bodies)
        overlap = bool(a0 and b0) and a0 < b1 and b0 < a1
        together += overlap
        differed += not overlap and (a != alone[0] or b != alone[1])
    does = "boxmaker never sends two requests to one slot (a lease per slot; a lock file"
    does += " across processes)"
    if together:
        seen = (
            f"two requests pinned to one slot ran in it together ({together} of {_PAIRS} "
            f"pairs generated at the same time; llama.cpp does not always queue them, and "
            f"their answers cross): {does}"
        )
        return Check("slot shared", None, seen)
    seen = f"two requests pinned to one slot were queued ({_PAIRS} of {_PAIRS} pairs): {does}"
    if differed:
        seen += (
            f"; in {differed} pair(s) an answer differed from the answer alone without "
            "running together: not crossing, the model's answers vary with the cache's state "
            "at temperature 0"
        )
    return Check("slot shared", None, seen)  # information: llama.cpp queues them only at times


def _pair(
    make: Callable[[], httpx.Client], base: str, bodies: list[dict[str, Any]]
) -> list[tuple[str, float, float]]:
    """``bodies[0]`` and ``bodies[1]`` sent at once, each on a client of its own."""
    out: list[tuple[str, float, float]] = [("", 0.0, 0.0)] * 2
    failed: list[Exception] = []
    start = threading.Barrier(2)

    def send(i: int) -> None:
        with make() as http:
            start.wait()
            try:
                out[i] = _timed(http, base, bodies[i])
            except Exception as exc:  # raised on the doctor's thread below
                failed.append(exc)

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failed:
        raise failed[0]
    return out
