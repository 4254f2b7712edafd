"""``boxmaker export otel``: session logs as OpenTelemetry spans of the GenAI semantic
conventions, sent over OTLP/HTTP (protobuf) or written as an OTLP JSON file.

Conventions followed: OpenTelemetry semantic conventions **1.44.0** (:data:`SEMCONV`; the GenAI
ones are of "development" status there), as the ``opentelemetry-semantic-conventions``
package (0.66b2) names them: every ``gen_ai.*`` and ``server.*`` key below is that package's
constant, and the tracer carries the version's schema URL.

The spans of one session (one trace per turn, linked by ``gen_ai.conversation.id``, the
session id):

- ``invoke_agent boxmaker``: a turn, from its ``User`` record to its last record;
  ``boxmaker.turn``, ``boxmaker.outcome`` (the ``TurnEnd`` record's), ``boxmaker.end_detail``,
  ``boxmaker.http_status``; events ``boxmaker.limit_hit`` (kind, detail) and
  ``boxmaker.cache_loss`` (expected, reused, reprocessed tokens, cause, position).
- ``chat <model>``: a completion (``Usage`` record), a child of its turn, ending at the
  record's time and starting ``prompt_ms + predicted_ms`` before (not before the turn;
  without timings, at the previous record); ``gen_ai.request.model`` (the ``Capabilities``
  record's model, else ``"llama.cpp"``), ``gen_ai.usage.input_tokens`` (``cache_n +
  prompt_n``, the frames' ``prompt_tokens``), ``gen_ai.usage.output_tokens`` (``predicted_n``),
  ``gen_ai.usage.cache_read_input_tokens`` (``cache_n``), ``gen_ai.response.finish_reasons``,
  ``server.address`` / ``server.port`` when given, and llama.cpp's own numbers as
  ``boxmaker.cache_n``, ``boxmaker.prompt_n``, ``boxmaker.predicted_n`` (tokens),
  ``boxmaker.prompt_ms``, ``boxmaker.predicted_ms`` (ms), ``boxmaker.request``.
- ``execute_tool <name>``: a ``ToolResult``, a child of its turn, from the record before it;
  ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``gen_ai.tool.type`` (``function``),
  ``boxmaker.not_run``, ``boxmaker.truncated``, ``boxmaker.server``, ``boxmaker.data_class``;
  an event ``boxmaker.approval`` (decision, by, reason, waited_ms) when one was asked, and
  ``boxmaker.nudge`` when the loop guard answered instead of the tool (``not_run: "loop"``).

Message content is off by default (it may be private): with ``content=True``,
``gen_ai.input.messages`` / ``gen_ai.output.messages`` (JSON text) on chat spans and
``gen_ai.tool.call.arguments`` / ``gen_ai.tool.call.result`` on tool spans. Every text is an
attribute value (data, never markup): a receiver shows it as the string it is.

A fork's log (:meth:`boxmaker.session.Session.fork`) holds its parent's records before its
own: spans are emitted for the fork's own records only, so a backend that sums
``gen_ai.usage.*`` over a parent and its forks counts each completion once, as the frames'
``summary`` does (rows with ``from_parent`` left out). A turn copied whole gives no span (the
parent's export has it); a turn that straddles the fork point (an edited tool result) gives
its turn span (from its copied ``User`` record's time) with only its own chat and tool spans
and events. The turns keep their numbers (``boxmaker.turn``), so a fork's first span says
where it branched.

The exporter reads finished logs: it is never on a turn's hot path.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ..records import is_measurement, usage_tokens
from ..session import KNOWN_TYPES, Call, Reading, Source, Turn
from ._errors import ExportError
from ._logs import nanos, readings

__all__ = ["SEMCONV", "export_otel", "session_spans"]

SEMCONV = "1.44.0"
"""The OpenTelemetry semantic-conventions version the spans follow (schema URL
``https://opentelemetry.io/schemas/1.44.0``)."""


def _sdk() -> Any:
    try:
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ExportError(
            "OpenTelemetry export needs the SDK: pip install 'boxmaker[otel]'"
        ) from exc
    return TracerProvider


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _message(rec: dict[str, Any]) -> dict[str, Any]:
    """A log message as a GenAI message (``role`` and ``parts``)."""
    kind = rec["type"]
    if kind == "tool_result":
        return {
            "role": "tool",
            "parts": [
                {
                    "type": "tool_call_response",
                    "id": rec["tool_call_id"],
                    "response": rec["content"],
                }
            ],
        }
    parts: list[dict[str, Any]] = []
    if rec.get("reasoning"):
        parts.append({"type": "reasoning", "content": rec["reasoning"]})
    if rec.get("content"):
        parts.append({"type": "text", "content": rec["content"]})
    for call in rec.get("tool_calls") or ():
        parts.append(
            {
                "type": "tool_call",
                "id": call["id"],
                "name": call["name"],
                "arguments": call["arguments"],
            }
        )
    return {"role": "user" if kind == "user" else "assistant", "parts": parts}


def session_spans(
    reading: Reading, tracer: Any, *, content: bool = False, server: str | None = None
) -> int:
    """Emit the spans of one log, split into turns (:func:`boxmaker.session.split_turns`),
    through an OpenTelemetry ``tracer``.

    Args:
        reading: the log and its turns.
        tracer: an ``opentelemetry.trace.Tracer`` (the SDK's).
        content: also export message texts (off by default).
        server: the llama.cpp server's URL (``server.address`` and ``server.port``), if known.

    Returns:
        The number of spans emitted.
    """
    from opentelemetry import trace
    from opentelemetry.semconv.attributes import server_attributes as sa

    where: dict[str, Any] = {}
    if server:
        parts = urlsplit(server if "//" in server else f"//{server}")
        if parts.hostname:
            where[sa.SERVER_ADDRESS] = parts.hostname
        if parts.port:
            where[sa.SERVER_PORT] = parts.port
    records = reading.records
    model = next(
        (str(r["model"]) for r in records if r["type"] == "capabilities" and r.get("model")),
        "llama.cpp",
    )
    head = reading.log.head
    history: list[dict[str, Any]] = []
    if head.get("system"):
        history.append({"role": "system", "parts": [{"type": "text", "content": head["system"]}]})
    spans = 0
    for turn in reading.turns:
        turn_history = [_message(records[i]) for i in range(turn.start, turn.stop)
                        if records[i]["type"] in _MESSAGES]  # fmt: skip
        if turn.number is None or turn.from_parent:  # copied whole: the parent's spans
            history += turn_history
            continue
        spans += _turn_spans(reading, turn, tracer, trace, model, where, history, content=content)
    return spans


def _turn_spans(
    reading: Reading,
    turn: Turn,
    tracer: Any,
    trace: Any,
    model: str,
    where: dict[str, Any],
    history: list[dict[str, Any]],
    *,
    content: bool,
) -> int:
    """The spans of one of the log's own turns (its copied records, when it straddles a fork
    point, give no span of their own); ``history`` grows by the turn's messages."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga

    records = reading.records
    attrs: dict[str, Any] = {
        ga.GEN_AI_OPERATION_NAME: "invoke_agent",
        ga.GEN_AI_AGENT_NAME: "boxmaker",
        ga.GEN_AI_CONVERSATION_ID: reading.session,
        ga.GEN_AI_PROVIDER_NAME: "llama.cpp",
        "boxmaker.turn": turn.number,
        "boxmaker.log": Path(reading.log.path).name,
        "boxmaker.outcome": turn.outcome,
    }
    if turn.detail is not None:
        attrs["boxmaker.end_detail"] = turn.detail
    if turn.status is not None:
        attrs["boxmaker.http_status"] = turn.status
    begin = nanos(turn.started)
    root = tracer.start_span(
        "invoke_agent boxmaker",
        kind=trace.SpanKind.INTERNAL,
        attributes=attrs,
        start_time=begin,
        context=trace.set_span_in_context(trace.INVALID_SPAN),
    )
    inside = trace.set_span_in_context(root)
    own_completions = {c.usage: c for c in turn.completions if not c.from_parent}
    own_calls = {c.result: c for c in turn.calls if not c.from_parent}
    spans = 1
    previous = asked = begin  # asked: the record before the latest reply (the request sent)
    for index in range(turn.start, turn.stop):
        rec = records[index]
        kind = rec["type"]
        if kind in _MESSAGES:
            history.append(_message(rec))
        if kind not in KNOWN_TYPES:
            continue
        t = max(begin, nanos(rec["time"]))
        completion = own_completions.get(index)
        call = own_calls.get(index)
        if completion is not None:
            _chat_span(
                tracer, trace, inside, rec, completion.number, model, where, reading.session,
                history if content else None, begin=begin, previous=asked, end=t,
            )  # fmt: skip
            spans += 1
        elif call is not None:
            _tool_span(tracer, trace, inside, records, turn, call, content, start=previous, end=t)
            spans += 1
        elif index >= turn.own and kind == "limit_hit":
            root.add_event(
                "boxmaker.limit_hit",
                {"boxmaker.kind": rec["kind"], "boxmaker.detail": rec["detail"]},
                timestamp=t,
            )
        elif index >= turn.own and kind == "cache_loss":
            request = next(r for i, r in turn.losses if i == index)
            root.add_event("boxmaker.cache_loss", _loss(rec, request), timestamp=t)
        if kind == "assistant":  # a completion without its server's times runs from the
            asked = previous  # record before its reply (the request sent), not from the reply
        previous = t
    root.end(end_time=max(begin, nanos(turn.ended)))
    return spans


def _chat_span(
    tracer: Any,
    trace: Any,
    inside: Any,
    rec: dict[str, Any],
    request: int,
    model: str,
    where: dict[str, Any],
    session: str,
    history: list[dict[str, Any]] | None,
    *,
    begin: int,
    previous: int,
    end: int,
) -> None:
    """A completion's ``chat`` span: it ends at its ``Usage`` record and starts ``prompt_ms +
    predicted_ms`` before (not before its turn's start, ``begin``; without timings, at the
    record before it, ``previous``); tokens as the frames count them, an unknown one left
    out."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga

    timings = rec.get("timings") or {}
    counted = usage_tokens(rec)
    chat: dict[str, Any] = {
        ga.GEN_AI_OPERATION_NAME: "chat",
        ga.GEN_AI_PROVIDER_NAME: "llama.cpp",
        ga.GEN_AI_REQUEST_MODEL: model,
        ga.GEN_AI_CONVERSATION_ID: session,
        "boxmaker.request": request,
        **where,
    }
    if counted.prompt is not None:
        chat[ga.GEN_AI_USAGE_INPUT_TOKENS] = int(counted.prompt)
    if counted.cached is not None:
        chat[ga.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS] = int(counted.cached)
    if counted.generated is not None:
        chat[ga.GEN_AI_USAGE_OUTPUT_TOKENS] = int(counted.generated)
    if counted.reasoning is not None:
        chat[ga.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS] = int(counted.reasoning)
    if rec.get("finish_reason"):
        chat[ga.GEN_AI_RESPONSE_FINISH_REASONS] = [rec["finish_reason"]]
    for key in ("cache_n", "prompt_n", "predicted_n", "prompt_ms", "predicted_ms"):
        if timings.get(key) is not None:
            chat[f"boxmaker.{key}"] = timings[key]
    if isinstance(rec.get("thinking_capped"), bool):  # absent: unknown, left out
        chat["boxmaker.thinking_capped"] = rec["thinking_capped"]
    if history is not None:  # the completion's reply is the assistant message just before
        replied = bool(history) and history[-1]["role"] == "assistant"
        asked = history[:-1] if replied else history
        chat[ga.GEN_AI_INPUT_MESSAGES] = json.dumps(asked, ensure_ascii=False)
        chat[ga.GEN_AI_OUTPUT_MESSAGES] = json.dumps(
            history[-1:] if replied else [], ensure_ascii=False
        )
    # the server's time for the completion: prompt_ms + predicted_ms, both given, or unknown
    # (the span then runs from the event before it, as without timings; never one of them
    # alone, which showed the generation's time as the whole completion's)
    prompt_ms, predicted_ms = timings.get("prompt_ms"), timings.get("predicted_ms")
    known = is_measurement(prompt_ms) and is_measurement(predicted_ms)  # the one timings rule
    took_ns = int((timings["prompt_ms"] + timings["predicted_ms"]) * 1e6) if known else 0
    span = tracer.start_span(
        f"chat {model}",
        kind=trace.SpanKind.CLIENT,
        attributes=chat,
        start_time=min(end, max(begin, end - took_ns) if took_ns else previous),
        context=inside,
    )
    span.end(end_time=end)


def _tool_span(
    tracer: Any,
    trace: Any,
    inside: Any,
    records: list[Any],
    turn: Turn,
    call: Call,
    content: bool,
    *,
    start: int,
    end: int,
) -> None:
    """An answered call's ``execute_tool`` span: from the record before it to its result
    when the tool ran or the loop answered for it; a result a fork replayed or a researcher
    edited ran nothing here and takes no time (``boxmaker.ran`` false, ``boxmaker.source``
    says which)."""
    from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as ga

    rec = records[call.result]
    tool: dict[str, Any] = {
        ga.GEN_AI_OPERATION_NAME: "execute_tool",
        ga.GEN_AI_TOOL_NAME: rec["name"],
        ga.GEN_AI_TOOL_CALL_ID: rec["tool_call_id"],
        ga.GEN_AI_TOOL_TYPE: "function",
        "boxmaker.call": rec["call"],
        "boxmaker.truncated": bool(rec.get("truncated")),
        "boxmaker.ran": call.source == "ran",
        "boxmaker.source": call.source,
    }
    for key in ("not_run", "server", "data_class"):
        if rec.get(key) is not None:
            tool[f"boxmaker.{key}"] = rec[key]
    if content:
        tool[ga.GEN_AI_TOOL_CALL_RESULT] = rec["content"]
        args = _arguments(records[turn.start : turn.stop], rec["tool_call_id"])
        if args is not None:
            tool[ga.GEN_AI_TOOL_CALL_ARGUMENTS] = args
    answered_here = call.source in ("ran", "not_run")
    span = tracer.start_span(
        f"execute_tool {rec['name']}",
        kind=trace.SpanKind.INTERNAL,
        attributes=tool,
        start_time=min(start, end) if answered_here else end,
        context=inside,
    )
    if call.approval is not None:
        decided = records[call.approval]
        span.add_event(
            "boxmaker.approval",
            {
                "boxmaker.decision": decided["decision"],
                "boxmaker.by": decided["by"],
                "boxmaker.reason": decided.get("reason", ""),
                "boxmaker.waited_ms": float(decided.get("waited_ms", 0.0)),
            },
            timestamp=nanos(decided["time"]),
        )
    if rec.get("not_run") == "loop":
        span.add_event("boxmaker.nudge", {"boxmaker.content": rec["content"]}, end)
    span.end(end_time=end)


def _loss(rec: dict[str, Any], request: int) -> dict[str, Any]:
    """A ``CacheLoss`` record as the attributes of a ``boxmaker.cache_loss`` event, under the
    frames' names: ``lost_tokens`` (expected - reused) and ``reprocessed_tokens``; what the
    record does not say is left out."""
    loss = {
        f"boxmaker.{key}": rec[key]
        for key in ("expected", "reused", "position", "reprocessed_ms")
        if rec.get(key) is not None
    }
    loss["boxmaker.lost_tokens"] = rec["expected"] - rec["reused"]
    if rec.get("reprocessed") is not None:
        loss["boxmaker.reprocessed_tokens"] = rec["reprocessed"]
    loss["boxmaker.cause"] = rec.get("cause") or "unknown"
    loss["boxmaker.request"] = request
    return loss


_MESSAGES = ("user", "assistant", "tool_result")
"""The record types that are messages of the conversation."""


def _arguments(turn: Sequence[dict[str, Any]], call_id: str) -> str | None:
    for rec in turn:
        for call in rec.get("tool_calls") or () if rec["type"] == "assistant" else ():
            if call["id"] == call_id:
                return str(call["arguments"])
    return None


def _otlp_json(spans: Sequence[Any]) -> str:
    """Finished SDK spans as one OTLP/JSON ``ExportTraceServiceRequest`` (ids in hex, as the
    OTLP JSON encoding wants)."""
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    body = MessageToDict(encode_spans(spans))
    for resource in body.get("resourceSpans", ()):
        for scope in resource.get("scopeSpans", ()):
            for span in scope.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = _hex(span[key])
    return json.dumps(body, ensure_ascii=False)


def _hex(b64: str) -> str:
    import base64

    return base64.b64decode(b64).hex()


def export_otel(
    source: Source,
    *,
    endpoint: str | None = None,
    file: str | Path | None = None,
    content: bool = False,
    server: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> int:
    """Export session logs as OpenTelemetry GenAI spans (see the module docs for the spans).

    Args:
        source: a log, a directory (recursive ``*.jsonl``), or a list of these.
        endpoint: an OTLP/HTTP traces URL (``http://host:4318/v1/traces``): the spans are sent
            there as protobuf.
        file: else, an OTLP JSON file to write: one ``ExportTraceServiceRequest`` per line, one
            line per log (the OpenTelemetry Collector's file exporter format).
        content: also export message texts (off by default: they may be private).
        server: the llama.cpp server's URL, for ``server.address`` / ``server.port``.
        headers: HTTP headers for the receiver (an API key; MLflow's
            ``x-mlflow-experiment-id``).
        timeout: seconds to wait for the receiver.

    Returns:
        The number of spans exported.

    Raises:
        ValueError: neither or both of ``endpoint`` and ``file``.
        SessionError: a path of ``source`` names no log.
        ExportError: the SDK is missing, the receiver refused the spans, or a log has a time
            before 1970 (OTLP cannot hold it; the logs before it are exported).

    Warns:
        LogReadWarning: a log the session refuses is left out.
    """
    if (endpoint is None) == (file is None):
        raise ValueError("give exactly one of endpoint and file")
    provider_type = _sdk()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    memory = InMemorySpanExporter()
    provider = provider_type(resource=Resource.create({"service.name": "boxmaker"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer(
        "boxmaker.export", schema_url=f"https://opentelemetry.io/schemas/{SEMCONV}"
    )
    total = 0
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(Path(file).open("w", encoding="utf-8")) if file else None
        stack.callback(provider.shutdown)
        for reading in readings(source):
            total += session_spans(reading, tracer, content=content, server=server)
            spans = memory.get_finished_spans()
            memory.clear()
            if not spans:
                continue
            if any((span.start_time or 0) < 0 for span in spans):  # OTLP's times are unsigned
                raise ExportError(
                    f"{reading.log.path}: a time before 1970, which OTLP cannot hold "
                    "(its times are nanoseconds since 1970, unsigned)"
                )
            if out is not None:
                out.write(_otlp_json(spans) + "\n")
            else:
                assert endpoint is not None
                _send(endpoint, spans, timeout, dict(headers or {}))
    return total


def _send(endpoint: str, spans: Sequence[Any], timeout: float, headers: dict[str, str]) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout, headers=headers)
    try:
        if exporter.export(spans) is not SpanExportResult.SUCCESS:
            raise ExportError(f"{endpoint}: the receiver did not take the spans")
    finally:
        exporter.shutdown()  # type: ignore[no-untyped-call]
