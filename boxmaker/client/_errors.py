"""A server's error answers -> :class:`~boxmaker.errors.InferError`, and whether the context
is full.

Two places carry a server's error: a non-200 HTTP answer (its body, llama.cpp's
``{"error": {"code", "message", "type", ...}}``) and an error event inside a 200 stream
(``data: {"error": {...}}``, or an older build's ``error: {...}`` line). Both become an
:class:`~boxmaker.errors.InferError` here, and whether it means "the context is full" is
decided here, once, by :func:`context_full_error`: the error's ``context_full`` flag, read by
:func:`is_context_full` (and so by the turn loop, which ends the turn with ``SessionFull``).
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import InferError

__all__ = [
    "CONTEXT_FULL",
    "CONTEXT_FULL_MESSAGES",
    "context_full_error",
    "http_error",
    "is_context_full",
    "stream_error",
]

CONTEXT_FULL = "exceed_context_size_error"
"""llama.cpp's ``error.type`` when the prompt does not fit in the slot's context."""

CONTEXT_FULL_MESSAGES = (
    "exceeds the available context size",
    "context size has been exceeded",
    "context length exceeded",
    "context_length_exceeded",
    "maximum context length",
)
"""Lower-case fragments of a server's error message that mean "the context is full" when the
error has no ``exceed_context_size_error`` type: llama.cpp's 400 message ("request (N tokens)
exceeds the available context size"), llama.cpp's "Context size has been exceeded." (HTTP 500,
or an error event inside a 200 stream, when generation runs out of context), OpenAI's
``context_length_exceeded`` code and vLLM/OpenAI's "maximum context length is N tokens".
Only :func:`context_full_error` reads them."""


def is_context_full(error: BaseException) -> bool:
    """Whether ``error`` is a server's "the context is full" answer.

    True for an :class:`~boxmaker.errors.InferError` whose ``context_full`` flag is set (the
    flag is decided once, where the error is made from the server's answer, an HTTP error
    body or an error inside a 200 stream, by :func:`context_full_error`), or whose
    ``error.type`` is ``"exceed_context_size_error"`` (an error made elsewhere, e.g. by a
    test's fake client). False for anything else (other errors, other exceptions).
    """
    return isinstance(error, InferError) and (
        error.context_full or error.error_type == CONTEXT_FULL
    )


def context_full_error(error: dict[str, Any] | None, text: str) -> bool:
    """Whether a server's error answer says the context is full.

    The one place that decides it (the client and the stream decoder call it when they make an
    :class:`~boxmaker.errors.InferError` from an answer, and set its ``context_full``).

    Args:
        error: the parsed ``error`` object (``{"code", "message", "type", ...}``), or ``None``.
        text: the answer's body text (used when there is no ``error.message``).

    Returns:
        True when ``error.type`` (or ``error.code``) is ``exceed_context_size_error`` or
        ``context_length_exceeded``, or the message contains one of
        :data:`CONTEXT_FULL_MESSAGES` (case-insensitive): servers other than llama.cpp's 400,
        and llama.cpp's own "Context size has been exceeded." (HTTP 500 or in-stream), have no
        type for it, so their message is matched here and nowhere else.
    """
    message = text
    if error is not None:
        kind = error.get("type")
        if kind == CONTEXT_FULL or error.get("code") == "context_length_exceeded":
            return True
        found = error.get("message")
        if isinstance(found, str):
            message = found
    lowered = message[:2000].lower()
    return any(fragment in lowered for fragment in CONTEXT_FULL_MESSAGES)


def http_error(status: int, text: str, what: str, reason: str = "") -> InferError:
    """The :class:`~boxmaker.errors.InferError` for a non-200 answer.

    Args:
        status: the HTTP status code.
        text: the answer's body as text; llama.cpp's is ``{"error": {"code", "message",
            "type", ...}}``, kept parsed as ``InferError.error`` when it has that shape.
        what: which request, for the message (``"chat completion"``).
        reason: the HTTP reason phrase, used when the body is empty.
    """
    error: dict[str, Any] | None = None
    message = text[:500] or reason
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested too deep to read: the text
        parsed = None
    if isinstance(parsed, dict):
        found = parsed.get("error")
        if isinstance(found, dict):
            error = found
            message = str(found.get("message", message))
        elif isinstance(found, str):
            message = found
    kind = f" ({error['type']})" if error and isinstance(error.get("type"), str) else ""
    return InferError(
        f"{what}: llama-server answered HTTP {status}{kind}: {message}",
        status=status,
        body=text,
        error=error,
        context_full=context_full_error(error, text),
    )


def stream_error(payload: Any, text: str) -> InferError:
    """The :class:`InferError` for an error sent inside a 200 stream.

    ``payload`` is the parsed event: ``{"error": {...}}`` (newer llama.cpp, as ``data:``) or
    the bare error object (older builds' ``error:`` line). ``status`` is ``error.code`` when
    it is an integer, ``body`` is ``text``.
    """
    error = payload.get("error", payload) if isinstance(payload, dict) else payload
    if not isinstance(error, dict):
        error = {"message": str(error)}
    code = error.get("code")
    status = code if isinstance(code, int) and not isinstance(code, bool) else None
    kind = error.get("type")
    what = f" ({kind})" if isinstance(kind, str) else ""
    message = error.get("message") or text
    return InferError(
        f"llama-server sent an error inside the stream{what}: {message}",
        status=status,
        body=text,
        error=error,
        context_full=context_full_error(error, text),
    )
