"""A server's error answers -> :class:`~boxmaker.errors.InferError`, and what a context error
means.

Two places carry a server's error: a non-200 HTTP answer (its body, llama.cpp's
``{"error": {"code", "message", "type", ...}}``) and an error event inside a 200 stream
(``data: {"error": {...}}``, or an older build's ``error: {...}`` line). Both become an
:class:`~boxmaker.errors.InferError` here, and what a context error means is decided here,
once, by :func:`context_error`, from what the error says:

- ``"full"``: this request's prompt does not fit its slot (llama.cpp's 400
  ``exceed_context_size_error`` with ``n_prompt_tokens > n_ctx``, OpenAI's
  ``context_length_exceeded``, vLLM's messages past its maximum): the error's
  ``context_full`` flag, read by :func:`is_context_full` (the turn ends with ``SessionFull``);
- ``"pool"``: the server's KV cache was full although the prompt fits its slot (llama.cpp's
  "Context size has been exceeded.", HTTP 500 or in the stream: a unified KV pool shared by
  several slots, llama-server's default, filled by the other slots' requests): the
  ``pool_full`` flag; transient, the client waits and retries (:mod:`boxmaker.client`);
- ``"max_tokens"``: the prompt fits, the completion's share does not (vLLM's "maximum context
  length is N tokens ... (X in the messages, Y in the completion)", or its "'max_tokens' ...
  is too large"): a request error whose message names ``sampling.max_tokens``.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

from ..errors import InferError

__all__ = [
    "CONTEXT_FULL",
    "CONTEXT_FULL_MESSAGES",
    "POOL_FULL_FIX",
    "ContextError",
    "context_error",
    "context_full_error",
    "http_error",
    "is_context_full",
    "stream_error",
]

CONTEXT_FULL = "exceed_context_size_error"
"""llama.cpp's ``error.type`` when the prompt does not fit in the slot's context."""

CONTEXT_FULL_MESSAGES = (
    "exceeds the available context size",
    "context length exceeded",
    "context_length_exceeded",
    "maximum context length",
)
"""Lower-case fragments of a server's error message that mean "this prompt does not fit the
context" when the error has no ``exceed_context_size_error`` type: llama.cpp's 400 message
("request (N tokens) exceeds the available context size"), OpenAI's
``context_length_exceeded`` code and vLLM/OpenAI's "maximum context length is N tokens" (when
its shares do not say the messages fit). llama.cpp's "Context size has been exceeded." is no
such message: the KV cache filled while the prompt fit (see :func:`context_error`). Only
:func:`context_error` reads them."""


def is_context_full(error: BaseException) -> bool:
    """Whether ``error`` is a server's "this prompt does not fit its slot's context" answer.

    True for an :class:`~boxmaker.errors.InferError` whose ``context_full`` flag is set (the
    flag is decided once, where the error is made from the server's answer, an HTTP error
    body or an error inside a 200 stream, by :func:`context_error`), or whose ``error`` object
    says so itself (``error.type`` ``"exceed_context_size_error"`` and, where it gives them,
    ``n_prompt_tokens > n_ctx``: an error made elsewhere, e.g. by a test's fake client).
    False for anything else: other errors, a full KV pool (``pool_full``, transient), other
    exceptions.
    """
    if not isinstance(error, InferError) or error.pool_full:
        return False
    return error.context_full or (
        error.error_type == CONTEXT_FULL and context_error(error.error, error.body) == "full"
    )


ContextError = Literal["full", "pool", "max_tokens"]
"""What a server's context error means (see the module docstring)."""

POOL_FULL_FIX = (
    "llama-server's KV cache was full although this request fits its slot's context: its "
    "slots share one pool (a unified KV cache, llama-server's default with -np unset), and "
    "the other slots' requests held the rest. Give each session its own room: start "
    "llama-server with -np N for N sessions at once and -c N x (tokens a session needs), "
    "or a larger -c; or run fewer sessions at once"
)
"""What the error of a full KV pool says (the retries' reason, and the turn's error)."""

# vLLM: "This model's maximum context length is 4096 tokens. However, you requested 4726
# tokens (3726 in the messages, 1000 in the completion). ..." (vllm-project/vllm#3851), and
# newer: "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum
# context length is 4096 tokens and your request has 3726 input tokens (1000 > 4096 - 3726)."
_VLLM_SHARES = re.compile(
    r"maximum context length is (\d+) tokens.{0,200}?\((\d+) in the messages, "
    r"(\d+) in the completion\)",
    re.DOTALL,
)
_VLLM_TOO_LARGE = re.compile(
    r"is too large: (\d+)\..{0,80}?maximum context length is (\d+) tokens and your request "
    r"has (\d+) input tokens",
    re.DOTALL,
)
_POOL = "context size has been exceeded"


def context_error(error: dict[str, Any] | None, text: str) -> ContextError | None:
    """What a server's error answer says about the context: ``"full"``, ``"pool"``,
    ``"max_tokens"`` (see the module docstring), or ``None`` for any other error.

    The one place that decides it; the numbers the server gives decide where it gives them
    (``n_prompt_tokens`` and ``n_ctx`` of llama.cpp's 400, the shares in vLLM's message), the
    message where it gives none (:data:`CONTEXT_FULL_MESSAGES`; case-insensitive).

    Args:
        error: the parsed ``error`` object (``{"code", "message", "type", ...}``), or ``None``.
        text: the answer's body text (used when there is no ``error.message``).
    """
    message = text
    if error is not None:
        found = error.get("message")
        if isinstance(found, str):
            message = found
    lowered = message[:2000].lower()
    if (share := _max_tokens_share(message[:2000])) is not None:
        return "max_tokens" if share else "full"
    if error is not None:
        if error.get("type") == CONTEXT_FULL:
            n_prompt, n_ctx = _count(error.get("n_prompt_tokens")), _count(error.get("n_ctx"))
            if n_prompt is not None and n_ctx is not None and n_prompt <= n_ctx:
                return "pool"  # it says the prompt fits: the pool the slot draws from did not
            return "full"
        if error.get("code") == "context_length_exceeded":
            return "full"
    if _POOL in lowered:
        return "pool"
    if any(fragment in lowered for fragment in CONTEXT_FULL_MESSAGES):
        return "full"
    return None


def _max_tokens_share(message: str) -> bool | None:
    """vLLM's context error: ``True`` when the messages fit and the completion's share does
    not, ``False`` when the messages alone do not fit, ``None`` for another message."""
    if (found := _VLLM_SHARES.search(message)) is not None:
        limit, prompt = int(found[1]), int(found[2])
    elif (found := _VLLM_TOO_LARGE.search(message)) is not None:
        limit, prompt = int(found[2]), int(found[3])
    else:
        return None
    return prompt < limit


def _count(value: object) -> int | None:
    """``value`` when it is a token count (an int, 0 or more, not a bool), else ``None``."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def context_full_error(error: dict[str, Any] | None, text: str) -> bool:
    """Whether a server's error answer says this request's prompt does not fit its slot
    (:func:`context_error` is ``"full"``)."""
    return context_error(error, text) == "full"


def _explained(message: str, kind: ContextError | None) -> str:
    """The error's message, with what it means and the fix for a pool or max_tokens error."""
    if kind == "pool":
        return f"{message} ({POOL_FULL_FIX})"
    if kind == "max_tokens":
        return (
            f"{message} (the prompt fits the server's context; the completion's share, "
            "max_tokens, does not: lower sampling.max_tokens, or leave it unset)"
        )
    return message


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
    context = context_error(error, text)
    return InferError(
        _explained(f"{what}: llama-server answered HTTP {status}{kind}: {message}", context),
        status=status,
        body=text,
        error=error,
        context_full=context == "full",
        pool_full=context == "pool",
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
    context = context_error(error, text)
    return InferError(
        _explained(f"llama-server sent an error inside the stream{what}: {message}", context),
        status=status,
        body=text,
        error=error,
        context_full=context == "full",
        pool_full=context == "pool",
    )
