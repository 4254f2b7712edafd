"""The three chat formats the tap reads, as one (pure: no I/O).

llama-server answers OpenAI chat completions (``POST /v1/chat/completions``, also
``/chat/completions``), Anthropic messages (``POST /v1/messages``) and OpenAI responses
(``POST /v1/responses``, also ``/responses``: :mod:`boxmaker.tap._responses`). The tap logs
all three in boxmaker's records, so it reads each request as an OpenAI-shaped body
(``messages``, ``tools``, ``chat_template_kwargs``: what llama.cpp's template renders, and what
:class:`boxmaker.cache.SentRequest` takes; :func:`chat_body`) and each answer as a
:class:`WireReply` (the assistant message, its :class:`~boxmaker.records.Usage`, the HTTP
status; :func:`read_reply`). Every ``Usage`` is made by the client's one rule
(:meth:`boxmaker.client.Completion.usage_record`): what the server measured, or unknown.

Anthropic's format (docs.anthropic.com, "Messages"): ``system`` is a string or text blocks;
``messages[i].content`` is a string or blocks (``text``, ``thinking``, ``tool_use`` with
``id``/``name``/``input``, ``tool_result`` with ``tool_use_id``/``content``); tools are
``{"name", "description", "input_schema"}``; a stream is ``event: message_start`` ...
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta``,
``input_json_delta``) ... ``message_delta`` (``stop_reason``, ``usage``) ... ``message_stop``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ..client import Completion, StreamDecoder
from ..errors import InferError
from ..records import Assistant, ToolCall, Usage
from ._responses import RESPONSES_PATHS, input_output_usage, read_responses, responses_body

__all__ = [
    "ANTHROPIC_PATHS",
    "CHAT_PATHS",
    "UNREAD_PATHS",
    "WireApi",
    "WireReply",
    "anthropic_body",
    "api_of",
    "chat_body",
    "message_key",
    "read_reply",
    "text_of",
]

CHAT_PATHS = frozenset({"/v1/chat/completions", "/chat/completions"})
"""Paths of OpenAI chat completions on llama-server."""

ANTHROPIC_PATHS = frozenset({"/v1/messages"})
"""Path of Anthropic messages on llama-server."""

UNREAD_PATHS = frozenset({"/completion", "/completions", "/v1/completions", "/infill"})
"""llama-server's routes that generate from a prompt, not a conversation (legacy and OpenAI
completions, code infill): the tap forwards them without logging and says so once per route
(:meth:`boxmaker.tap.TapLog.note_route`)."""

_STOP_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length"}

WireApi: TypeAlias = Literal["chat", "anthropic", "responses"]
"""The formats the tap reads: OpenAI chat completions, Anthropic messages, OpenAI responses."""


def api_of(path: str) -> WireApi | None:
    """The format the tap reads at ``path`` (:data:`CHAT_PATHS`, :data:`ANTHROPIC_PATHS`,
    :data:`~boxmaker.tap.RESPONSES_PATHS`), ``None`` for a route it does not read."""
    if path in CHAT_PATHS:
        return "chat"
    if path in ANTHROPIC_PATHS:
        return "anthropic"
    return "responses" if path in RESPONSES_PATHS else None


def chat_body(api: WireApi, body: Any) -> dict[str, Any]:
    """A request's JSON ``body`` in ``api``'s format as the OpenAI chat body llama.cpp renders
    (:func:`anthropic_body`, :func:`~boxmaker.tap.responses_body`; a chat body as it is).

    Raises:
        ValueError: what of the request the tap cannot read, in words (not an object, no
            ``messages`` list, a Responses request holding what :func:`responses_body`
            refuses).
    """
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    if api == "responses":
        return responses_body(body)
    if not isinstance(body.get("messages"), list):
        raise ValueError("the body has no messages list")
    return anthropic_body(body) if api == "anthropic" else body


def text_of(content: Any) -> str:
    """The text of a message's ``content``: a string as it is, a list of parts (OpenAI
    ``{"type": "text", "text"}``, Anthropic text blocks) joined, anything else ``""``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p
        )
    return ""


def _arguments(text: Any) -> str:
    """Arguments compared as parsed JSON (an agent may re-serialise them), else as text."""
    if not isinstance(text, str):
        return json.dumps(text, sort_keys=True)
    try:
        return json.dumps(json.loads(text), sort_keys=True)
    except (ValueError, RecursionError):
        return text


def message_key(message: Any) -> tuple[Any, ...]:
    """What of an OpenAI message the model sees, for telling conversations apart: role, text,
    tool calls (id, name, arguments as parsed JSON) and ``tool_call_id``. The reasoning is
    left out on purpose: a harness that drops it still continues its conversation (forensics
    then finds the rewrite in the tokens)."""
    if not isinstance(message, dict):
        return ("?", repr(message))
    calls = tuple(
        (
            str(c.get("id", "")),
            str((c.get("function") or {}).get("name", "")),
            _arguments((c.get("function") or {}).get("arguments", "")),
        )
        for c in message.get("tool_calls") or ()
        if isinstance(c, dict)
    )
    return (
        str(message.get("role", "")),
        text_of(message.get("content")),
        calls,
        str(message.get("tool_call_id", "")),
    )


def anthropic_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic messages request as the OpenAI body llama.cpp renders the same way:
    ``system`` first, ``tool_use`` blocks as ``tool_calls``, each ``tool_result`` block as a
    ``tool`` message, ``thinking`` as ``reasoning_content``, tools as functions."""
    out: list[dict[str, Any]] = []
    system = text_of(body.get("system"))
    if system:
        out.append({"role": "system", "content": system})
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        role, content = str(message.get("role", "")), message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        texts, thinking, calls = [], [], []
        for block in blocks:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text") or ""))
            elif kind == "thinking":
                thinking.append(str(block.get("thinking") or ""))
            elif kind == "tool_use":
                arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
                calls.append(
                    {
                        "id": str(block.get("id", "")),
                        "type": "function",
                        "function": {"name": str(block.get("name", "")), "arguments": arguments},
                    }
                )
            elif kind == "tool_result":
                result = block.get("content")
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id", "")),
                        "content": text_of(result) if isinstance(result, list) else str(result),
                    }
                )
        if (
            texts
            or calls
            or role == "assistant"
            or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks)
        ):
            msg: dict[str, Any] = {"role": role, "content": "".join(texts)}
            if thinking:
                msg["reasoning_content"] = "".join(thinking)
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.get("name"),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {},
            },
        }
        for t in body.get("tools") or ()
        if isinstance(t, dict)
    ]
    openai: dict[str, Any] = {"messages": out}
    if tools:
        openai["tools"] = tools
    return openai


@dataclass(frozen=True, kw_only=True)
class WireReply:
    """One answer as the log keeps it: ``assistant`` (``None`` when no message came: an
    error, a disconnect before the first event), ``usage`` (``None`` likewise), ``error``
    (what failed, in words, ``None`` for a finished answer), ``status`` (the HTTP status,
    ``None`` when the upstream did not answer)."""

    assistant: Assistant | None
    usage: Usage | None
    error: str | None = None
    status: int | None = None


def read_reply(
    body: bytes, *, status: int | None, api: WireApi, streamed: bool, error: str | None
) -> WireReply:
    """Read an upstream answer (the bytes the agent got) as a :class:`WireReply`.

    Args:
        body: the answer's bytes (a stream cut by a disconnect: what arrived).
        status: its HTTP status (``None``: the upstream was not reached).
        api: its format (:data:`WireApi`).
        streamed: an SSE stream (``text/event-stream``), else one JSON answer.
        error: what went wrong on the way (the upstream unreachable, the agent gone), or
            ``None``.
    """
    if status is None or status >= 400:
        text = body.decode("utf-8", "replace")[:500]
        why = error or f"HTTP {status}: {text}"
        return WireReply(assistant=None, usage=None, error=why, status=status)
    if api == "anthropic":
        return _anthropic_reply(body, streamed=streamed, status=status, error=error)
    if api == "responses":
        assistant, usage, problem = read_responses(body, streamed=streamed)
        problem = error or problem
        return WireReply(assistant=assistant, usage=usage, error=problem, status=status)
    decoder = StreamDecoder(tool_call_deltas=False, max_event_bytes=None)
    problem = error
    try:
        if streamed:
            decoder.feed(body)
            if not decoder.chunks.finished and problem is None:
                problem = "the stream ended without finish_reason or [DONE]"
        else:
            decoder.feed_completion(body.decode("utf-8", "replace"))
    except InferError as exc:
        problem = problem or str(exc)
    got = decoder.chunks.partial()
    if got.content is None and got.reasoning is None and not got.tool_calls and problem:
        return WireReply(assistant=None, usage=None, error=problem, status=status)
    assistant = Assistant(content=got.content, reasoning=got.reasoning, tool_calls=got.tool_calls)
    return WireReply(assistant=assistant, usage=got.usage_record(), error=problem, status=status)


def _anthropic_events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for line in body.decode("utf-8", "replace").splitlines():
        if line.startswith("data:"):
            try:
                item = json.loads(line[5:].strip())
            except ValueError:
                continue
            if isinstance(item, dict):
                out.append(item)
    return out


def _anthropic_reply(body: bytes, *, streamed: bool, status: int, error: str | None) -> WireReply:
    blocks: list[dict[str, Any]] = []
    usage: dict[str, Any] = {}
    timings: dict[str, Any] = {}
    stop: str | None = None
    problem = error
    deltas = 0
    if streamed:
        events = _anthropic_events(body)
        for event in events:
            kind = event.get("type")
            if kind == "message_start":
                usage.update((event.get("message") or {}).get("usage") or {})
            elif kind == "content_block_start":
                blocks.append(dict(event.get("content_block") or {}))
                blocks[-1].setdefault("_json", "")
            elif kind == "content_block_delta" and blocks:
                delta, block = event.get("delta") or {}, blocks[-1]
                for field, key in (("text", "text"), ("thinking", "thinking")):
                    if field in delta:
                        block[key] = str(block.get(key) or "") + str(delta[field])
                deltas += "thinking" in delta
                if "partial_json" in delta:
                    block["_json"] = str(block["_json"]) + str(delta["partial_json"])
            elif kind == "message_delta":
                stop = (event.get("delta") or {}).get("stop_reason") or stop
                usage.update(event.get("usage") or {})
            if isinstance(event.get("timings"), dict):
                timings = event["timings"]
        if problem is None and not any(e.get("type") == "message_stop" for e in events):
            problem = "the stream ended without message_stop"
    else:
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        if not isinstance(answer, dict) or answer.get("type") != "message":
            why = problem or f"not an Anthropic message: {body[:200]!r}"
            return WireReply(assistant=None, usage=None, error=why, status=status)
        blocks = [dict(b) for b in answer.get("content") or () if isinstance(b, dict)]
        stop, usage = answer.get("stop_reason"), dict(answer.get("usage") or {})
        given = answer.get("timings")
        timings = given if isinstance(given, dict) else {}
    texts, thinking, calls = [], [], []
    for block in blocks:
        if block.get("type") == "text":
            texts.append(str(block.get("text") or ""))
        elif block.get("type") == "thinking":
            thinking.append(str(block.get("thinking") or ""))
        elif block.get("type") == "tool_use":
            given = block.get("_json") or json.dumps(block.get("input") or {})
            calls.append(
                ToolCall(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=str(given),
                )
            )
    assistant = Assistant(
        content="".join(texts) if texts else None,
        reasoning="".join(thinking) if thinking else None,
        tool_calls=tuple(calls),
    )
    finish = _STOP_REASONS.get(str(stop), "tool_calls" if stop == "tool_use" else stop)
    completion = Completion(
        id="",
        content=assistant.content,
        reasoning=assistant.reasoning,
        tool_calls=assistant.tool_calls,
        finish_reason=finish,
        timings=dict(timings),
        usage=_anthropic_usage(usage),
        reasoning_tokens=deltas,  # one thinking_delta a token, as llama.cpp streams them
        whole=not streamed,  # Anthropic's usage counts no thinking tokens: then unknown
    )
    record = input_output_usage(completion, usage)
    return WireReply(assistant=assistant, usage=record, error=problem, status=status)


def _anthropic_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """An Anthropic ``usage`` in the chat names :class:`~boxmaker.client.Completion` reads:
    the prompt is ``input_tokens`` and the cached tokens beside it
    (``cache_read_input_tokens``, ``cache_creation_input_tokens``: Anthropic's
    ``input_tokens`` leaves them out, and llama.cpp sends ``input_tokens`` as the prompt less
    its cached part)."""
    out: dict[str, Any] = {}
    if "input_tokens" in usage:
        prompt = usage["input_tokens"]
        for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
            more = usage.get(key)
            if _is_count(prompt) and _is_count(more):
                prompt += more
        out["prompt_tokens"] = prompt
    if "output_tokens" in usage:
        out["completion_tokens"] = usage["output_tokens"]
    return out


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def tool_names(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """``tool_call_id -> tool name`` of every call among ``messages``."""
    out = {}
    for m in messages:
        for c in m.get("tool_calls") or ():
            if isinstance(c, dict):
                out[str(c.get("id", ""))] = str((c.get("function") or {}).get("name", ""))
    return out
