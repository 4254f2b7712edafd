"""The exceptions boxmaker raises: one root, one subtree per kind of failure.

Tree::

    BoxmakerError                 every error boxmaker raises on purpose
    ├── ConfigError               a config file or value that cannot be used
    ├── InferError                an inference request failed (HTTP status and body kept)
    │   ├── StreamCut             the stream ended before finish_reason / [DONE]
    │   └── RequestCancelled      the cancel event was set; the stream was closed
    ├── StreamStopped             a hook closed a stream on purpose (what arrived kept)
    ├── SessionError              a session log that cannot be created, read or appended
    │   └── LogBusy               another writer holds the log's lock (its pid kept)
    ├── ServerError               the embedded llama.cpp server could not start or answer
    ├── SlotError                 a slot that cannot be saved or restored (no --slot-save-path,
    │                             a missing or corrupt saved file)
    ├── CassetteError             a cassette that cannot be recorded or replayed
    │   └── UnrecordedRequest     a replayed request that matched no recorded interaction
    ├── RecordError               a log line that breaks the records' rule (also a ValueError)
    ├── EngineError               the frames' DuckDB engine cannot run (extra missing, bad SQL)
    ├── ExportError               an export cannot run (extra missing) or was refused;
    │                             an import's file is no trajectory boxmaker can read
    ├── BenchError                a benchmark cannot run (its package missing, a bad slice)
    ├── ToolError                 a tool that cannot be registered (also a ValueError)
    ├── ToolPortError             a tool port that cannot start (an MCP server not reachable)
    └── TurnError                 a turn that ended without an answer
        ├── SessionFull           the server said the context is full
        ├── TurnLimit             a loop limit fired (kind, value, limit)
        ├── TurnCancelled         the runtime's cancel event was set
        ├── TurnInferError        the completion failed for another reason (wraps InferError)
        ├── TurnNotAnswered       the completion came, but is no answer (outcome, detail)
        ├── ForkDiverged          a fork's call differed from its parent's; asked to stop there
        └── ToolsNotSupported     tools offered to a chat template that cannot take them

Warnings (``UserWarning`` subclasses, each its own category to filter)::

    LogReadWarning                a session log, or part of one, could not be read
    ColdFork                      a fork runs without its parent's prompt cache
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .records import LimitKind

__all__ = [
    "BenchError",
    "BoxmakerError",
    "CassetteError",
    "ColdFork",
    "ConfigError",
    "EngineError",
    "ExportError",
    "ForkDiverged",
    "InferError",
    "LogBusy",
    "LogReadWarning",
    "RecordError",
    "RequestCancelled",
    "ServerError",
    "SessionError",
    "SessionFull",
    "SlotError",
    "StreamCut",
    "StreamStopped",
    "ToolError",
    "ToolPortError",
    "ToolsNotSupported",
    "TurnCancelled",
    "TurnError",
    "TurnInferError",
    "TurnLimit",
    "TurnNotAnswered",
    "UnrecordedRequest",
]


class BoxmakerError(Exception):
    """Root of every exception boxmaker raises on purpose."""


class RecordError(BoxmakerError, ValueError):
    """A log line breaks the rule of :data:`boxmaker.records.RULES`; ``index`` is the line's
    position in the list checked (the message names the record type, field and value)."""

    def __init__(self, message: str, index: int) -> None:
        super().__init__(message)
        self.index = index


class EngineError(BoxmakerError):
    """The DuckDB engine of :mod:`boxmaker.frames` cannot run: ``duckdb`` is not installed
    (``pip install 'boxmaker[duckdb]'``), or an ad-hoc query failed (DuckDB's message kept)."""


class ExportError(BoxmakerError):
    """An export cannot run or failed: an optional library is missing (the message names the
    extra to install), or a receiver refused the data (its status and words kept); or an
    import (``boxmaker import atif``) was given a file that is no trajectory it can read."""


class BenchError(BoxmakerError):
    """A benchmark of :mod:`boxmaker.bench` cannot run: its package is not installed (the
    message gives the set-up command), an unknown category or harness, or a slice with no
    task."""


class LogReadWarning(UserWarning):
    """A session log, or part of one, could not be read; the message names file and line."""


class ColdFork(UserWarning):
    """A fork runs without its parent's prompt cache: no slot holds the prefix and no saved
    slot could be restored (the message says why)."""


class ConfigError(BoxmakerError):
    """A configuration file or value that cannot be used (unknown key, wrong type, bad range)."""


class InferError(BoxmakerError):
    """An inference request to llama-server failed.

    Attributes:
        status: HTTP status code, or ``None`` when no response arrived (connection refused,
            idle timeout) or the error came inside a 200 stream (then ``status`` is the
            ``error.code`` the server put in the stream, if any).
        body: the response body as text (for an error inside a stream: the error event's
            JSON text), ``""`` when there was none.
        error: the parsed ``error`` object of llama.cpp's error body
            (``{"code", "message", "type", ...}``), or ``None`` when the body is not such JSON.
        context_full: the server said this request's prompt does not fit its slot's context
            (decided once, where the error is made from the server's answer, by
            :func:`boxmaker.client._errors.context_error`).
        pool_full: the server said its KV cache was full although the prompt fits its slot
            (llama.cpp's "Context size has been exceeded.": a KV pool shared by several slots
            was full): transient, retried by the client (same place decides).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        body: str = "",
        error: dict[str, Any] | None = None,
        context_full: bool = False,
        pool_full: bool = False,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = body
        self.error = error
        self.context_full = context_full
        self.pool_full = pool_full

    @property
    def error_type(self) -> str | None:
        """llama.cpp's ``error.type`` (e.g. ``"exceed_context_size_error"``), or ``None``."""
        value = self.error.get("type") if self.error else None
        return value if isinstance(value, str) else None


class StreamCut(InferError):
    """The SSE stream ended (or broke) before ``finish_reason`` or ``data: [DONE]``."""


class RequestCancelled(InferError):
    """The caller's cancel event was set during the request; the stream was closed, which
    makes llama.cpp stop generating for it."""


class StreamStopped(BoxmakerError):
    """A hook stopped a streamed completion on purpose: raised from the ``on_event`` of
    :meth:`boxmaker.client.Client.chat` (the turn's client-side bounds raise a subclass), it
    makes the client close the stream (llama.cpp then stops generating), set
    :attr:`completion` and let the exception go on.

    The server ran that completion, so its caller can still record it: a completion refused
    client-side (too many tool calls, arguments too long) is logged with its ``Assistant``
    and ``Usage``.

    Attributes:
        completion: what had arrived when the stream was closed, a
            :class:`boxmaker.client.Completion` (its ``finish_reason`` ``None`` unless the
            server had sent one; no ``timings`` or ``usage`` unless they had come): set by the
            client that closed the stream, ``None`` until then.
    """

    completion: object = None


class SessionError(BoxmakerError):
    """A session log that cannot be created, read or appended (names the file and line)."""


class LogBusy(SessionError):
    """Another writer holds a log's (or a batch manifest's) exclusive lock.

    Attributes:
        holder: ``"pid N"`` of the holder as its ``<log>.writer`` says, else ``"pid unknown"``.
    """

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class ServerError(BoxmakerError):
    """The embedded llama.cpp server could not start, or did not become healthy in time."""


class SlotError(BoxmakerError):
    """A llama.cpp slot that cannot be saved to or restored from a file: the server has no
    ``--slot-save-path`` (HTTP 501), the saved file is missing, corrupt or too large for the
    KV cache, or no slot is known yet (the message names slot and file)."""


class CassetteError(BoxmakerError):
    """A cassette that cannot be recorded or replayed (no match, unplayed interactions)."""


class UnrecordedRequest(CassetteError):
    """A request that matched no recorded interaction in a replay-only cassette.

    A :class:`CassetteError`; the message names the cassette, the request's number and the
    first differing place in its body.

    Attributes:
        number: the request's number among the requests made inside the cassette (from 1).
        method: its HTTP method.
        path: its URL path (``/v1/chat/completions``, ``.../control``).
    """

    def __init__(self, message: str, *, number: int, method: str, path: str) -> None:
        super().__init__(message)
        self.number = number
        self.method = method
        self.path = path


class ToolError(BoxmakerError, ValueError):
    """A tool that cannot be registered: an invalid or taken name, no description, a
    parameter without a JSON form, an invalid parameters schema. Also a :class:`ValueError`,
    which :meth:`boxmaker.Registry.add` raised before."""


class ToolPortError(BoxmakerError):
    """A tool port could not start: an MCP server that cannot be launched, reached or listed
    when the port connects (later failures of a call are the model's to read, not raised)."""


class TurnError(BoxmakerError):
    """A turn ended without an answer; the session log is left well formed."""


class SessionFull(TurnError):
    """The server said this session's prompt does not fit its slot's context (llama.cpp's HTTP
    400 ``exceed_context_size_error`` with ``n_prompt_tokens > n_ctx``, or another server's
    form, see :func:`boxmaker.client.is_context_full`): the session no longer fits. A full KV
    pool shared by several slots (the prompt fits) is no ``SessionFull``: the client waits and
    retries, then the turn ends with :class:`TurnInferError` naming the pool and the fix.

    Attributes:
        n_prompt_tokens: tokens the request would have needed, when the server said.
        n_ctx: the server's context size in tokens, when the server said.
        cause: the :class:`InferError` that carried the server's answer.
    """

    def __init__(self, message: str, *, cause: InferError) -> None:
        super().__init__(message)
        self.cause = cause
        error = cause.error or {}
        n_prompt = error.get("n_prompt_tokens")
        n_ctx = error.get("n_ctx")
        self.n_prompt_tokens: int | None = n_prompt if isinstance(n_prompt, int) else None
        self.n_ctx: int | None = n_ctx if isinstance(n_ctx, int) else None


class TurnLimit(TurnError):
    """A loop limit ended the turn.

    Attributes:
        kind: which limit: ``"tool_iterations"``, ``"repeated_call"`` or ``"loop"`` (the
            loop guard's cycle, stale-result and per-tool cap rules), or one of the turn's
            client-side bounds: ``"completion_tokens"``, ``"completions"``,
            ``"turn_deadline"`` (value and limit in whole seconds), ``"tool_calls"``,
            ``"tool_arguments"`` (characters); the limits that end a turn; the others cap
            without ending it.
        value: the count that crossed the bound (iterations, or times the call was seen).
        limit: the bound in force (``config.loop.tool_iterations``, or 2 for repeats).
    """

    def __init__(self, kind: LimitKind, value: int, limit: int, detail: str) -> None:
        super().__init__(f"{kind}: {detail} (value {value}, limit {limit})")
        self.kind = kind
        self.value = value
        self.limit = limit
        self.detail = detail


class TurnCancelled(TurnError):
    """The runtime's ``cancel`` event was set; the turn stopped between events."""


class TurnInferError(TurnError):
    """The completion failed for a reason other than a full context.

    Attributes:
        cause: the :class:`InferError` (HTTP status and body kept).
    """

    def __init__(self, message: str, *, cause: InferError) -> None:
        super().__init__(message)
        self.cause = cause


class TurnNotAnswered(TurnError):
    """The completion arrived whole but is not an answer, so the turn ended without one.

    Attributes:
        outcome: the turn's outcome (:attr:`boxmaker.records.TurnEnd.outcome`):
            ``"server_stopped"``, the server ended the completion with a ``finish_reason``
            other than ``stop``, ``length`` or ``tool_calls`` (vLLM's ``abort``, ``error``);
            ``"tool_call_in_content"``, the content holds a tool call the server's parser
            did not turn into ``tool_calls`` (see :func:`boxmaker.tools.find_text_tool_call`).
        detail: what was received and, for a tool call in content, what fixes the server.
    """

    def __init__(self, outcome: str, detail: str) -> None:
        super().__init__(f"{outcome}: {detail}")
        self.outcome = outcome
        self.detail = detail


class ForkDiverged(TurnError):
    """A fork replaying its parent's tool results made a call that differs from the parent's
    at the same position (another name or other canonical arguments, or a call the parent
    did not make), and was asked to stop there (:class:`boxmaker.turn.Replay` ``stop=True``).
    The turn ends with outcome ``diverged``; the call is answered ``not_run="diverged"``.

    Attributes:
        position: the call's position among the calls run since the fork point (0-based).
    """

    def __init__(self, message: str, *, position: int) -> None:
        super().__init__(message)
        self.position = position


class ToolsNotSupported(TurnError):
    """The session offers tools and the server's chat template cannot take them (``GET
    /props`` ``chat_template_caps.supports_tools: false``): llama.cpp would drop the tools from
    the prompt without a word and the model would answer as if it had none. Raised before the
    turn's first record, so nothing is sent; ``client.unsupported_tools = "warn"`` records a
    warning instead and runs the turn."""
