"""A whole ``chat.completion`` (the non-streamed OpenAI answer) as the one chunk it amounts to.

Some servers and proxies answer a request with ``stream: true`` by one JSON document
(``Content-Type: application/json``): ``{"object": "chat.completion", "choices": [{"message":
{...}, "finish_reason": ...}], "usage": {...}, "timings": {...}}`` (OpenAI chat completions
API; ``timings`` and ``message.reasoning_content`` are llama.cpp's). Its ``message`` is the
sum of a stream's deltas, so it is read as one chunk whose delta is that message: the
:class:`ChunkDecoder` rules (``</think>`` in content, arguments as an object, made-up call
ids) apply unchanged. No I/O.
"""

from __future__ import annotations

import json
from typing import Any

from ...errors import InferError

__all__ = ["completion_chunk"]

_MESSAGE_FIELDS = ("role", "content", "reasoning_content", "reasoning")


def completion_chunk(text: str) -> dict[str, Any]:
    """The chunk that stands for the whole ``chat.completion`` JSON ``text``.

    Returns:
        ``{"id", "choices": [{"index": 0, "delta": <the message>, "finish_reason"}],
        "usage", "timings"}`` (each only when the answer has it); the message's
        ``tool_calls`` get their ``index`` (their position) when they lack one. An
        ``{"error": {...}}`` object is passed through as it is (the decoder raises it).

    Raises:
        InferError: ``text`` is not JSON, or not a ``chat.completion`` with a ``message``;
            the message quotes what was received (``body`` keeps it whole).
    """
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise _not_a_completion(text, f"not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise _not_a_completion(text, "not a JSON object")
    if "error" in obj:
        return obj
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _not_a_completion(text, "no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _not_a_completion(text, "no choices[0].message")
    delta = {key: message[key] for key in _MESSAGE_FIELDS if key in message}
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        delta["tool_calls"] = [
            {"index": i, **call} if isinstance(call, dict) and "index" not in call else call
            for i, call in enumerate(calls)
        ]
    chunk: dict[str, Any] = {key: obj[key] for key in ("id", "usage", "timings") if key in obj}
    chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": choice.get("finish_reason")}]
    return chunk


def _not_a_completion(text: str, why: str) -> InferError:
    return InferError(
        f"llama-server answered a streamed request with application/json that is not a "
        f"chat.completion ({why}): {text[:500]}",
        status=200,
        body=text,
    )
