"""Running one call: :func:`dispatch`, :func:`canonical_arguments` and :func:`cap_result`.

:func:`dispatch` never raises for what the model sent: an unknown tool, arguments that are not
JSON or do not fit the schema (checked with ``jsonschema``), and exceptions inside a tool all
become result texts the model can read.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

from ..records import Approval, NotRunReason, ResultSource, ToolCall, ToolResult
from ._ports import ToolDenied, ToolFailed, ToolOk, ToolPendingApproval, ToolPort, ToolRequest
from ._registry import Registry

__all__ = [
    "Dispatched",
    "canonical_arguments",
    "cap_result",
    "dispatch",
]


# -- dispatch ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Dispatched:
    """The text a call produced (before capping) and its labels: ``not_run`` says why the call
    was answered without running (one of :data:`boxmaker.records.NOT_RUN_REASONS`, ``None``
    when it ran or was tried), ``server`` which tool server answered, ``approvals`` the
    decisions taken on the call, to be logged before its result; ``source`` is ``"replayed"``
    for a result a fork took from its parent's log (no tool ran)."""

    content: str
    data_class: str = "public"
    untrusted: bool = False
    not_run: NotRunReason | None = None
    server: str | None = None
    approvals: tuple[Approval, ...] = ()
    source: ResultSource | None = None

    def record(self, call: ToolCall, number: int, content: str, truncated: bool) -> ToolResult:
        """The ``ToolResult`` of ``call`` (the session's call ``number``) with these labels and
        ``content``, the text as logged (capped: ``truncated`` says so)."""
        return ToolResult(
            call=number,
            tool_call_id=call.id,
            name=call.name,
            content=content,
            data_class=self.data_class,
            untrusted=self.untrusted,
            truncated=truncated,
            not_run=self.not_run,
            server=self.server,
            source=self.source,
        )


def dispatch(
    registry: Registry,
    name: str,
    arguments: str,
    *,
    port: ToolPort | None = None,
    session_id: str = "",
    call: int = 0,
    cancel: threading.Event | None = None,
) -> Dispatched:
    """Run one tool call and return its result text; never raises for what the model sent.

    Args:
        registry: the offered tools.
        name: the tool name the model called.
        arguments: the model's arguments text (should be a JSON object).
        port: where port tools go; a port tool with no port gives a failure text.
        session_id, call, cancel: passed on in the :class:`ToolRequest` (call = session
            tool-call number, cancel = the turn's cancel switch).

    Returns:
        A local tool's result (``str`` as is, anything else as JSON), public and trusted; a port
        ``ToolOk`` with its labels; or a text saying why the call was not run or failed:
        unknown tool, arguments not JSON or not fitting the schema, ``ToolFailed`` -> "The tool
        failed: ...", ``ToolDenied`` -> "The call was denied: ..." (``not_run="denied"``),
        ``ToolPendingApproval`` (``not_run="needs_approval"``), or an exception inside the tool
        or port. A port's ``server`` and ``approval`` are passed on.
    """
    tool = registry.get(name)
    if tool is None:
        offered = ", ".join(registry.names) or "none"
        text = f"Unknown tool {name!r}. The tools offered are: {offered}."
        return Dispatched(content=text, not_run="invalid_call")
    try:
        args = json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError) as exc:
        return Dispatched(
            content=f"The arguments for {name} are not valid JSON ({exc}); the call was not run.",
            not_run="invalid_call",
        )
    if not isinstance(args, dict):
        return Dispatched(
            content=f"The arguments for {name} must be a JSON object, not {type(args).__name__}; "
            "the call was not run.",
            not_run="invalid_call",
        )
    error = next(iter(tool.validator.iter_errors(args)), None) if tool.validator else None
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        return Dispatched(
            content=f"The arguments for {name} do not fit its schema at {where}: "
            f"{error.message}; the call was not run.",
            not_run="invalid_call",
        )
    if tool.function is not None:
        try:
            value = tool.function(**args)
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        except Exception as exc:  # a tool's bug (or an unserialisable result) must not crash
            return Dispatched(content=f"The tool failed: {type(exc).__name__}: {exc}")
        return Dispatched(content=_valid_text(text))
    if port is None:
        return Dispatched(content=f"The tool failed: no tool port is connected to run {name}.")
    request = ToolRequest(
        session_id=session_id, call=call, tool=name, arguments=args, cancel=cancel
    )
    try:
        answer = port.request(request)
    except Exception as exc:  # the port's failure is the model's to read
        return Dispatched(content=f"The tool failed: {type(exc).__name__}: {exc}")
    if isinstance(answer, ToolPendingApproval):
        why = f" ({answer.reason})" if answer.reason else ""
        return Dispatched(
            content=f"The call needs approval{why}, and this loop cannot wait for approval: "
            "it was not run.",
            not_run="needs_approval",
        )
    approval = getattr(answer, "approval", None)  # getattr: a port may answer anything
    approvals = (approval,) if isinstance(approval, Approval) else ()
    if isinstance(answer, ToolOk):
        return Dispatched(
            content=_valid_text(answer.content),
            data_class=answer.data_class,
            untrusted=answer.untrusted,
            server=answer.server,
            approvals=approvals,
        )
    if isinstance(answer, ToolFailed):
        text = f"The tool failed: {answer.message}"
        return Dispatched(content=text, server=answer.server, approvals=approvals)
    if isinstance(answer, ToolDenied):
        text = f"The call was denied: {answer.reason}"
        return Dispatched(content=text, not_run="denied", approvals=approvals)
    return Dispatched(content=f"The tool failed: the port answered {answer!r}.")


_SURROGATE = re.compile("[\ud800-\udfff]")


def _valid_text(text: str) -> str:
    """``text`` with lone surrogates (not encodable as UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def canonical_arguments(arguments: str) -> str:
    """Arguments text as canonical JSON (sorted keys, no spaces), to compare two calls;
    text that is not JSON (or nested too deeply to parse) is returned as it is."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except (ValueError, RecursionError):
        return arguments


def cap_result(text: str, cap: int | None) -> tuple[str, bool]:
    """Cap a tool result at ``cap`` characters; returns ``(text, truncated)``.

    A longer text keeps its head and ends with a note saying how much was shown, all within
    ``cap`` characters; a cap too small for that note ends it with the short note
    ``"\\n[truncated]"`` (12 characters), and a cap smaller than that cuts the text bare (the
    log's ``truncated`` flag still says so). ``None``: no cap.

    Raises:
        ValueError: a negative cap.
    """
    if cap is None or len(text) <= cap:
        return text, False
    if cap < 0:
        raise ValueError(f"tool_result_cap must be >= 0, got {cap}")
    total = len(text)

    def note(shown: int) -> str:
        return f"\n[truncated: the first {shown} of {total} characters are shown]"

    keep = cap
    for _ in range(4):  # the note's length depends on the digits of `keep`: find the fixpoint
        keep = cap - len(note(keep))
    if keep <= 0 or keep + len(note(keep)) > cap:
        short = "\n[truncated]"
        if cap > len(short):
            return text[: cap - len(short)] + short, True
        return text[:cap], True
    return text[:keep] + note(keep), True
