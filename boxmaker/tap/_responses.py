"""The Responses API as the tap reads it (pure: no I/O).

OpenAI's Responses API (``POST /v1/responses``; platform.openai.com/docs/api-reference/
responses) is what Codex CLI speaks, and the OpenAI Agents SDK's default model
(``OpenAIResponsesModel``). llama-server serves it (also at ``/responses``) by turning each
request into a chat completion (llama.cpp ``tools/server/server-chat.cpp``,
``server_chat_convert_responses_to_chatcmpl``) and its answer back into Responses output items.
The tap does the same conversion, so that its grouping, its records and cache forensics
(``/apply-template``) see the chat request the server rendered (:func:`responses_body`), and
reads the answer, whole or streamed (:class:`ResponsesDecoder`), as the chat answer it was
(:func:`read_responses`).

Request -> chat body, as llama.cpp converts it:

- ``instructions`` -> a ``system`` message first; ``input`` a string -> one ``user`` message;
- ``input`` items, in order: a message of role ``user``, ``system`` or ``developer`` (its
  ``content`` a string or ``input_text`` / ``input_image`` parts) -> that message, its text
  parts as ``{"type": "text"}``; an assistant ``message`` (``output_text`` parts), a
  ``reasoning`` item (its ``content[0].text`` as ``reasoning_content``) and a
  ``function_call`` (``call_id``, ``name``, ``arguments`` as a tool call with ``id`` =
  ``call_id``) each join the assistant message before them, or begin one; a
  ``function_call_output`` (``call_id``, ``output`` a string or parts) -> a ``tool`` message.
  A ``reasoning`` item without content (Codex sends back only its ``summary`` and
  ``encrypted_content``) adds nothing, as newer llama.cpp builds read it;
- ``tools`` of ``type: "function"`` (``name``, ``description``, ``parameters`` at the top
  level; ``strict`` true unless given) -> chat tools; other tool types are dropped, as the
  server drops them (no chat equivalent); ``chat_template_kwargs`` is kept.

What the tap cannot read (:func:`responses_body` raises ``ValueError`` naming it, the tap
forwards the request unlogged and says so once per route): ``previous_response_id`` or
``conversation`` (the earlier turns are the server's, not in the request; llama-server
refuses the first), an input item of another type (``item_reference``, ``custom_tool_call``,
``local_shell_call``...), an ``input`` that is neither a string nor a list.

Answer -> the chat answer: ``output`` items give the reply (``message`` items' ``output_text``
joined as the content, ``reasoning`` items' ``reasoning_text`` content, else their
``summary_text``, as the reasoning, ``function_call`` items as tool calls with ``id`` =
``call_id``); ``usage`` (``input_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens``) and llama.cpp's ``timings`` give the ``Usage``
by the client's one rule (:meth:`boxmaker.client.Completion.usage_record`: what the server
measured or unknown); ``status`` gives the finish reason (``completed``: ``tool_calls`` when
the output has calls, else ``stop``; ``incomplete`` with ``incomplete_details.reason``
``max_output_tokens``: ``length``; ``failed``: an error). llama.cpp sends no ``timings`` with a
whole (non-streamed) answer: its cache figures are then unknown, and the ``Usage`` note keeps
``input_tokens_details.cached_tokens`` in words.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..client import Completion, StreamDecoder
from ..records import Assistant, ToolCall, Usage

__all__ = [
    "RESPONSES_PATHS",
    "ResponsesDecoder",
    "input_output_usage",
    "read_responses",
    "responses_body",
]

RESPONSES_PATHS = frozenset({"/v1/responses", "/responses"})
"""Paths of the Responses API on llama-server."""

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})
_INCOMPLETE = {"max_output_tokens": "length", "content_filter": "content_filter"}


# -- the request -----------------------------------------------------------------------------


def responses_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses request as the chat-completions body llama-server renders for it
    (``messages``, ``tools``, ``chat_template_kwargs``; the module's rules).

    Raises:
        ValueError: the request holds what the tap cannot read (the message names it).
    """
    for key in ("previous_response_id", "conversation"):
        if body.get(key):
            raise ValueError(f"{key} (the earlier turns are kept by the server, not sent)")
    messages: list[dict[str, Any]] = []
    if "instructions" in body:
        given = body["instructions"]
        messages.append({"role": "system", "content": given if isinstance(given, str) else ""})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            _add_item(messages, item)
    else:
        raise ValueError("an input that is neither a string nor a list of items")
    out: dict[str, Any] = {"messages": messages}
    tools = [_tool(t) for t in _objects(body.get("tools"))]
    if any(tools):
        out["tools"] = [t for t in tools if t is not None]
    if isinstance(body.get("chat_template_kwargs"), dict):
        out["chat_template_kwargs"] = body["chat_template_kwargs"]
    return out


def _add_item(messages: list[dict[str, Any]], item: Any) -> None:
    if not isinstance(item, dict):
        # its type, not its text: the note is printed, and an item's text is the agent's
        raise ValueError(f"an input item that is not an object (a {type(item).__name__})")
    kind, role = item.get("type"), item.get("role")
    last = messages[-1] if messages and messages[-1].get("role") == "assistant" else None
    if role in ("user", "system", "developer") and kind in (None, "message"):
        messages.append({"role": role, "content": _parts(item.get("content"))})
    elif role == "assistant" and kind in (None, "message"):
        parts = _parts(item.get("content"))
        if last is not None:
            last["content"] = [*_as_parts(last.get("content")), *parts]
        else:
            messages.append({"role": "assistant", "content": parts})
    elif kind == "function_call":
        call = {
            "id": str(item.get("call_id", "")),
            "type": "function",
            "function": {"name": str(item.get("name", "")), "arguments": item.get("arguments")},
        }
        if last is not None:
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else _parts(output)
        messages.append(
            {"role": "tool", "tool_call_id": str(item.get("call_id", "")), "content": content}
        )
    elif kind == "reasoning":
        text = _reasoning_text(item)
        if text is None:
            return
        if last is not None:
            last["reasoning_content"] = text
        else:
            messages.append({"role": "assistant", "content": [], "reasoning_content": text})
    else:
        raise ValueError(f"an input item of type {str(kind or role)[:40]!r}")


def _reasoning_text(item: Mapping[str, Any]) -> str | None:
    """A reasoning input item's text as llama.cpp reads it: its first content part's."""
    content = item.get("content")
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else None
    return None


def _parts(content: Any) -> list[dict[str, Any]]:
    """A Responses message content (a string or parts) as chat content parts: text as
    ``{"type": "text"}``, images as ``{"type": "image_url"}``, others left out."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    out: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            out.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and "image_url" in part:
            out.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            out.append({"type": "refusal", "refusal": part["refusal"]})
    return out


def _as_parts(content: Any) -> list[Any]:
    if isinstance(content, list):
        return content
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _tool(tool: Mapping[str, Any]) -> dict[str, Any] | None:
    if tool.get("type") != "function":
        return None
    function = {k: v for k, v in tool.items() if k != "type"}
    function.setdefault("strict", True)
    return {"type": "function", "function": function}


# -- the answer ------------------------------------------------------------------------------


@dataclass
class _Item:
    """One output item as its events build it: ``final`` once ``output_item.done`` gave it
    whole, else what ``output_item.added`` and the deltas gave."""

    head: dict[str, Any]
    text: list[str] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    final: dict[str, Any] | None = None

    def whole(self) -> dict[str, Any]:
        if self.final is not None:
            return self.final
        item = dict(self.head)
        kind = item.get("type")
        if kind == "message" and self.text:
            item["content"] = [{"type": "output_text", "text": "".join(self.text)}]
        elif kind == "function_call" and self.arguments:
            item["arguments"] = str(item.get("arguments") or "") + "".join(self.arguments)
        elif kind == "reasoning":
            if self.reasoning:
                item["content"] = [{"type": "reasoning_text", "text": "".join(self.reasoning)}]
            if self.summary:
                item["summary"] = [{"type": "summary_text", "text": "".join(self.summary)}]
        return item


class ResponsesDecoder:
    """A streamed Responses answer: bytes as they arrive -> its events, and the answer they
    add up to.

    Two layers: the SSE layer of the client's :class:`~boxmaker.client.StreamDecoder` (bytes
    -> SSE events, the one reader of that format; a read may end anywhere: mid-line, mid-UTF-8
    character, between ``\\r`` and ``\\n``; two events may come in one read) and this one,
    which parses each ``data`` event as a JSON object and reads it by its ``type``:

    - ``response.created`` / ``response.in_progress``: the response's ``id``;
    - ``response.output_item.added``: an output item begins (``message``, ``function_call``
      with ``call_id`` and ``name``, ``reasoning``); ``response.output_item.done``: the item,
      whole (it replaces what its deltas gave);
    - ``response.output_text.delta``, ``response.function_call_arguments.delta``,
      ``response.reasoning_text.delta`` (counted: llama.cpp sends one per token, as it sends
      chat deltas), ``response.reasoning_summary_text.delta``: text of the item named by
      ``item_id`` (else by ``output_index``, else the last item);
    - ``response.completed`` / ``response.incomplete`` / ``response.failed``: the final
      ``response`` object (its ``output``, when given, is the answer; its ``usage``, its
      ``status``), which ends the stream;
    - an ``error`` event, or an object with an ``error`` and no ``type`` (llama.cpp's error
      inside a stream): the stream's error;
    - ``timings`` at the top level of any event (llama.cpp's): the last ones kept.

    Other events are returned and otherwise ignored; an event that is not a JSON object is
    counted in :attr:`unread`, never raised.

    Attributes:
        sse: the SSE layer.
        id: the response's ``id`` (``""`` until one came).
        response: the final ``response`` object (``None`` until a terminal event).
        timings: llama.cpp's ``timings`` of the last event that carried them (``{}``: none).
        reasoning_deltas: ``response.reasoning_text.delta`` events received.
        error: the error the server sent in the stream, in words (``None``: none).
        unread: ``data`` events that were not a JSON object (skipped; a stream cut
            mid-event leaves one).
    """

    def __init__(self) -> None:
        # the client's SSE layer (as doctor takes it); no cap: the agent got the answer whole
        self.sse = StreamDecoder(max_event_bytes=None).sse
        self.id = ""
        self.response: dict[str, Any] | None = None
        self.timings: dict[str, Any] = {}
        self.reasoning_deltas = 0
        self.error: str | None = None
        self.unread = 0
        self._items: list[_Item] = []
        self._by_id: dict[str, _Item] = {}
        self._by_index: dict[int, _Item] = {}

    @property
    def finished(self) -> bool:
        """A terminal event (``response.completed``, ``.incomplete``, ``.failed``) came."""
        return self.response is not None

    def feed(self, raw: bytes) -> list[dict[str, Any]]:
        """Decode one read of bytes; return the events it completed, parsed."""
        return self._events(self.sse.feed(raw))

    def flush(self) -> list[dict[str, Any]]:
        """End of stream: decode an unterminated last event; return its events."""
        return self._events(self.sse.flush())

    def output(self) -> list[dict[str, Any]]:
        """The answer's output items: the final response's ``output`` when it gave one, else
        the items as their events built them (a stream cut short: what arrived)."""
        given = (self.response or {}).get("output")
        if isinstance(given, list) and given:
            return [i for i in given if isinstance(i, dict)]
        return [item.whole() for item in self._items]

    def _events(self, sse_events: Iterable[tuple[str, str]]) -> list[dict[str, Any]]:
        out = []
        for name, data in sse_events:
            if name not in ("data", "error") or data == "[DONE]":
                continue
            try:
                event = json.loads(data)
            except (ValueError, RecursionError):
                event = None
            if not isinstance(event, dict):
                self.unread += 1
                continue
            if name == "error":  # an older llama.cpp build's error event
                self._fail(_error_text(event))
            else:
                self._read(event)
            out.append(event)
        return out

    def _fail(self, why: str) -> None:
        self.error = self.error or why

    def _read(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if isinstance(event.get("timings"), dict):
            self.timings = event["timings"]
        if kind == "error" or (kind is None and event.get("error") is not None):
            self._fail(_error_text(event))
        elif kind in ("response.created", "response.in_progress", "response.queued"):
            response = event.get("response")
            if isinstance(response, dict):
                self.id = str(response.get("id") or self.id)
        elif kind == "response.output_item.added":
            self._add(event)
        elif kind == "response.output_item.done":
            item = event.get("item")
            if isinstance(item, dict):
                self._item(event, added=item).final = item
        elif kind == "response.output_text.delta":
            self._item(event).text.append(_text(event.get("delta")))
        elif kind == "response.function_call_arguments.delta":
            self._item(event).arguments.append(_text(event.get("delta")))
        elif kind == "response.reasoning_text.delta":
            self._item(event).reasoning.append(_text(event.get("delta")))
            self.reasoning_deltas += 1
        elif kind == "response.reasoning_summary_text.delta":
            self._item(event).summary.append(_text(event.get("delta")))
        elif kind in _TERMINAL:
            response = event.get("response")
            self.response = response if isinstance(response, dict) else {}
            self.id = str(self.response.get("id") or self.id)

    def _add(self, event: dict[str, Any]) -> _Item:
        head = event.get("item")
        item = _Item(head=dict(head) if isinstance(head, dict) else {})
        self._items.append(item)
        key = item.head.get("id")
        if isinstance(key, str) and key:
            self._by_id[key] = item  # a later item with the same id takes its deltas
        index = event.get("output_index")
        if isinstance(index, int):
            self._by_index[index] = item
        return item

    def _item(self, event: dict[str, Any], added: dict[str, Any] | None = None) -> _Item:
        """The item an event is about: by ``item_id`` (``item.id`` for ``.done``), else by
        ``output_index``, else the last one; a new one when none matches."""
        key = event.get("item_id") if added is None else added.get("id")
        if isinstance(key, str) and key in self._by_id:
            return self._by_id[key]
        index = event.get("output_index")
        if isinstance(index, int) and index in self._by_index:
            return self._by_index[index]
        if added is None and self._items:
            return self._items[-1]
        return self._add({"item": added or {}, "output_index": index})


def _objects(value: Any) -> list[dict[str, Any]]:
    """The objects of a JSON list (``[]`` for anything but a list)."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _error_text(event: Mapping[str, Any]) -> str:
    """An error event in words: its message (``error.message`` or ``message``), code, type."""
    error = event.get("error")
    where = error if isinstance(error, dict) else event
    message = where.get("message") or (error if isinstance(error, str) else "") or "an error"
    code = where.get("code") or where.get("type")
    return f"the server sent an error: {message}" + (f" ({code})" if code else "")


def read_responses(
    body: bytes, *, streamed: bool
) -> tuple[Assistant | None, Usage | None, str | None]:
    """A Responses answer (the bytes the agent got) as the log's reply: ``(assistant,
    usage, problem)``; ``assistant`` and ``usage`` are ``None`` when no output came,
    ``problem`` says what went wrong (``None``: nothing).

    Args:
        body: a ``response`` JSON object, or (``streamed``) its SSE events as they arrived.
        streamed: an SSE stream (``text/event-stream``), else one JSON answer.
    """
    if streamed:
        decoder = ResponsesDecoder()
        decoder.feed(body)
        decoder.flush()
        response = decoder.response or {}
        items, timings, deltas = decoder.output(), decoder.timings, decoder.reasoning_deltas
        problem = decoder.error
        if problem is None and not decoder.finished:
            problem = "the stream ended without response.completed"
    else:
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            answer = None
        if not isinstance(answer, dict) or not (
            answer.get("object") == "response" or isinstance(answer.get("output"), list)
        ):
            if isinstance(answer, dict) and answer.get("error") is not None:
                return None, None, _error_text(answer)
            return None, None, f"not a Responses answer: {body[:200]!r}"
        response, deltas, problem = answer, 0, None
        items = _objects(answer.get("output"))
        given = answer.get("timings")
        timings = given if isinstance(given, dict) else {}
    status = response.get("status")
    if status == "failed" and problem is None:
        problem = _error_text(response) if response.get("error") else "the response failed"
    content, reasoning, calls = _reply(items)
    if content is None and reasoning is None and not calls and problem is not None:
        return None, None, problem
    given_usage = response.get("usage")
    usage: dict[str, Any] = given_usage if isinstance(given_usage, dict) else {}
    completion = Completion(
        id=str(response.get("id") or ""),
        content=content,
        reasoning=reasoning,
        tool_calls=calls,
        finish_reason=_finish(response, calls),
        timings=dict(timings),
        usage=_chat_usage(usage),
        reasoning_tokens=deltas,
        # the server's output_tokens_details.reasoning_tokens when it sent one (above 0 on a
        # stream), else a count of the reasoning_text deltas, or unknown for a whole answer
        # (Completion.usage_record's rule)
        whole=not streamed or (reasoning is not None and deltas == 0),
    )
    assistant = Assistant(content=content, reasoning=reasoning, tool_calls=calls)
    return assistant, input_output_usage(completion, usage), problem


def _reply(
    items: Sequence[Mapping[str, Any]],
) -> tuple[str | None, str | None, tuple[ToolCall, ...]]:
    """Content, reasoning and tool calls of output items (the module's rules)."""
    texts: list[str] = []
    thinking: list[str] = []
    calls: list[ToolCall] = []
    for item in items:
        kind = item.get("type")
        if kind == "message":
            texts += [
                p["text"]
                for p in _objects(item.get("content"))
                if p.get("type") in ("output_text", "text")
                and isinstance(p.get("text"), str)
            ]  # fmt: skip
        elif kind == "reasoning":
            parts = _objects(item.get("content")) or _objects(item.get("summary"))
            thinking += [p["text"] for p in parts if isinstance(p.get("text"), str)]
        elif kind == "function_call":
            arguments = item.get("arguments", "")
            calls.append(
                ToolCall(
                    id=str(item.get("call_id") or item.get("id") or ""),
                    name=str(item.get("name", "")),
                    arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                )
            )
    return "".join(texts) or None, "".join(thinking) or None, tuple(calls)


def _finish(response: Mapping[str, Any], calls: Sequence[ToolCall]) -> str | None:
    """The chat ``finish_reason`` a response's ``status`` amounts to (``None``: no status)."""
    status = response.get("status")
    if status == "completed":
        return "tool_calls" if calls else "stop"
    if status == "incomplete":
        details = response.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        return _INCOMPLETE.get(str(reason), str(reason or "incomplete"))
    return None


def _chat_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """A Responses ``usage`` in the chat names :class:`~boxmaker.client.Completion` reads."""
    out: dict[str, Any] = {}
    for theirs, ours in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens")):
        if theirs in usage:
            out[ours] = usage[theirs]
    details = usage.get("output_tokens_details")
    if isinstance(details, dict) and "reasoning_tokens" in details:
        out["completion_tokens_details"] = {"reasoning_tokens": details["reasoning_tokens"]}
    return out


def input_output_usage(completion: Completion, usage: Mapping[str, Any]) -> Usage:
    """The ``Usage`` record of an answer whose ``usage`` counts ``input_tokens`` and
    ``output_tokens`` (Responses, Anthropic messages): ``completion``'s by the client's rule
    (:meth:`~boxmaker.client.Completion.usage_record`), its note in those names, with the
    cached tokens ``usage`` gave (``input_tokens_details.cached_tokens``) when the timings do
    not say (llama.cpp's whole Responses answer)."""
    record = completion.usage_record()
    notes = [record.note] if record.note else []
    notes = [
        n.replace("usage.prompt_tokens", "usage.input_tokens").replace(
            "usage.completion_tokens", "usage.output_tokens"
        )
        for n in notes
    ]
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if "cache_n" not in record.timings and cached is not None:
        notes.append(
            f"no timings: usage.input_tokens_details.cached_tokens {str(cached)[:40]} "
            "(not a cache figure of the log, which reads llama.cpp's timings)"
        )
    return dataclasses.replace(record, note="; ".join(notes) or None)
