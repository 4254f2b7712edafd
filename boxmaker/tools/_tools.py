"""Tool registry, ``dispatch``, the tool port protocol, and ``cap_result``.

Two kinds of tool live in a :class:`Registry`:

- a *local* tool is a Python function; its JSON schema is derived from its type hints and
  docstring (or given), it runs in-process and its result is public, trusted text;
- a *port* tool is only a name and a schema; calls go to a :class:`ToolPort` as a
  :class:`ToolRequest` and come back as :data:`ToolAnswer` (``ToolOk``, ``ToolFailed``,
  ``ToolDenied`` or ``ToolPendingApproval``: each outcome's name says it is a tool's).
  :class:`InProcessPort` is a port made of Python handlers.

:func:`dispatch` never raises for what the model sent: an unknown tool, arguments that are not
JSON or do not fit the schema (checked with ``jsonschema``), and exceptions inside a tool all
become result texts the model can read. Tool definitions use the OpenAI chat-completions
``tools`` format (``{"type": "function", "function": {"name", "description", "parameters"}}``).
"""

from __future__ import annotations

import inspect
import json
import re
import threading
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

from ..errors import ToolError
from ..records import Approval, NotRunReason, ResultSource, ToolCall, ToolResult

__all__ = [
    "Dispatched",
    "HintedPort",
    "InProcessPort",
    "Registry",
    "Tool",
    "ToolAnswer",
    "ToolDenied",
    "ToolFailed",
    "ToolHints",
    "ToolOk",
    "ToolPendingApproval",
    "ToolPort",
    "ToolRequest",
    "canonical_arguments",
    "cap_result",
    "dispatch",
    "schema_from_function",
]


# -- the tool port protocol -------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ToolRequest:
    """A call sent to a tool port: ``call`` is the session's tool-call number (1, 2, ...),
    ``arguments`` the parsed, schema-checked JSON object. ``cancel`` is the turn's cancel
    switch (``Runtime.cancel``; ``None`` outside a turn): a port that waits (for a server, for a
    person) stops waiting when it is set and answers at once."""

    session_id: str
    call: int
    tool: str
    arguments: Mapping[str, Any]
    cancel: threading.Event | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, kw_only=True)
class ToolOk:
    """The port ran the call: ``content`` goes to the model; ``data_class`` labels the data
    (e.g. ``"public"``, ``"internal"``); ``untrusted`` marks content from outside; ``server``
    names the tool server that answered (``None``: no server); ``approval`` is the decision
    that let the call run, when one was needed."""

    content: str
    data_class: str = "public"
    untrusted: bool = False
    server: str | None = None
    approval: Approval | None = None


@dataclass(frozen=True, kw_only=True)
class ToolFailed:
    """The port tried the call and it failed; ``message`` says why; ``server`` and
    ``approval`` as in :class:`ToolOk`."""

    message: str
    server: str | None = None
    approval: Approval | None = None


@dataclass(frozen=True, kw_only=True)
class ToolDenied:
    """The port refused the call; ``reason`` says why; ``approval`` is the denial's record
    when a person (or a timeout, or a cancel) decided."""

    reason: str
    approval: Approval | None = None


@dataclass(frozen=True, kw_only=True)
class ToolPendingApproval:
    """The call needs a person's approval first and this port cannot ask for it (wrap the port
    in :class:`boxmaker.tools.approval.ApprovalPort` to ask)."""

    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ToolHints:
    """What a port knows of a tool's behaviour (MCP tool annotations; hints, not guarantees).

    ``read_only``: does not change its environment; ``destructive``: may delete or overwrite
    (only meaningful when not read-only); ``idempotent``: repeating a call changes nothing more;
    ``open_world``: reaches outside entities (the web), so its output is untrusted. The
    defaults are the MCP specification's for a tool that gives no annotation.
    """

    read_only: bool = False
    destructive: bool = True
    idempotent: bool = False
    open_world: bool = True


ToolAnswer: TypeAlias = ToolOk | ToolFailed | ToolDenied | ToolPendingApproval
"""What a tool port answers to a :class:`ToolRequest`."""


@runtime_checkable
class ToolPort(Protocol):
    """Where port tools are executed (another process, a sandbox, a person)."""

    def request(self, request: ToolRequest) -> ToolAnswer:
        """Run (or refuse) one call and answer it. May raise; dispatch turns that into text."""
        ...


@runtime_checkable
class HintedPort(Protocol):
    """A tool port that knows its tools' :class:`ToolHints` (the MCP port does)."""

    def hints(self, tool: str) -> ToolHints | None:
        """The hints of ``tool`` (a registry name), ``None`` for a tool the port does not know."""
        ...


class InProcessPort:
    """A tool port made of Python handlers, one per tool name; for tests and notebooks.

    ``handlers`` maps a tool name to ``handler(request) -> ToolAnswer``. ``requests`` keeps
    every request received, in order.
    """

    def __init__(self, handlers: Mapping[str, Callable[[ToolRequest], ToolAnswer]]) -> None:
        self.handlers = dict(handlers)
        self.requests: list[ToolRequest] = []

    def request(self, request: ToolRequest) -> ToolAnswer:
        """Answer with the tool's handler; ``ToolFailed`` when the port has none for it."""
        self.requests.append(request)
        handler = self.handlers.get(request.tool)
        if handler is None:
            return ToolFailed(message=f"this port has no handler for {request.tool!r}")
        return handler(request)


# -- the registry -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Tool:
    """One registered tool: ``function`` is set for a local tool, ``None`` for a port tool.
    ``parameters`` is the JSON schema (an ``object`` schema) of its arguments."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: Callable[..., Any] | None = None
    validator: Any = field(default=None, repr=False, compare=False)

    def definition(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


class Registry:
    """The tools offered to the model, by name, in registration order."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}

    def add(
        self,
        function: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> Any:
        """Register a local tool; usable as ``@registry.add`` or ``@registry.add(name=...)``.

        The schema is derived from the function's type hints and docstring (see
        :func:`schema_from_function`) unless ``parameters`` is given; the description is the
        docstring's first paragraph unless ``description`` is given. Returns the function.

        Raises:
            ToolError: the name is taken or not a valid tool name, the tool has no description
                (no docstring and no ``description=``: the model would see a tool it cannot
                tell the use of), or the schema is invalid.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            if parameters is None or description is None:
                derived_desc, derived_params = schema_from_function(fn)
            told = description if description is not None else derived_desc
            if not told.strip():
                raise ToolError(
                    f"tool {name or fn.__name__!r} has no description: give the function a "
                    "docstring (its first paragraph is what the model reads) or description=..."
                )
            self._put(
                Tool(
                    name=name or fn.__name__,
                    description=told,
                    parameters=parameters if parameters is not None else derived_params,
                    function=fn,
                )
            )
            return fn

        return register(function) if function is not None else register

    def add_port_tool(self, name: str, description: str, parameters: Mapping[str, Any]) -> None:
        """Register a tool that a :class:`ToolPort` executes.

        Raises:
            ToolError: the name is taken or invalid, or the schema is invalid.
        """
        self._put(Tool(name=name, description=description, parameters=parameters))

    def _put(self, tool: Tool) -> None:
        if not _NAME.fullmatch(tool.name):
            raise ToolError(f"invalid tool name {tool.name!r}")
        if tool.name in self._tools:
            raise ToolError(f"a tool named {tool.name!r} is registered already")
        import jsonschema  # ~1 s (its format checker's grammars): only once a tool registers

        try:
            jsonschema.Draft202012Validator.check_schema(dict(tool.parameters))
        except jsonschema.SchemaError as exc:
            raise ToolError(f"invalid parameters schema for {tool.name!r}: {exc.message}") from exc
        validator = jsonschema.Draft202012Validator(dict(tool.parameters))
        self._tools[tool.name] = Tool(
            name=tool.name,
            description=tool.description,
            parameters=tool.parameters,
            function=tool.function,
            validator=validator,
        )

    def get(self, name: str) -> Tool | None:
        """The tool of that name, or ``None``."""
        return self._tools.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Registered tool names in registration order."""
        return tuple(self._tools)

    def definitions(self) -> tuple[dict[str, Any], ...]:
        """OpenAI ``tools`` entries for every tool, in registration order (for a Baseline)."""
        return tuple(t.definition() for t in self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)


_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}


def schema_from_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """Description and JSON schema of a function's parameters, from hints and docstring.

    The description is the docstring's first paragraph; a parameter's description comes from
    an ``Args:`` section (``name: text``). ``str``/``int``/``float``/``bool``/``list[X]``/
    ``dict``/``Literal[...]`` map to JSON schema types; a parameter with a default is optional;
    ``X | None`` allows ``null``.

    Raises:
        ToolError: a parameter without a type hint, of a type with no JSON form, or not
            passable by name (``*args``, ``**kwargs``, positional-only).
    """
    try:
        hints = typing.get_type_hints(fn)
    except NameError as exc:
        raise ToolError(f"{fn.__name__}: a type hint cannot be resolved: {exc}") from exc
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    arg_docs = dict(re.findall(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.+)$", _args_section(doc), re.M))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ToolError(
                f"{fn.__name__}: parameter {pname!r} is {param.kind.description}; a tool takes "
                "named arguments only (the model sends a JSON object)"
            )
        if pname not in hints:
            raise ToolError(f"{fn.__name__}: parameter {pname!r} has no type hint")
        prop = _json_type(hints[pname], f"{fn.__name__}.{pname}")
        if pname in arg_docs:
            prop["description"] = arg_docs[pname].strip()
        properties[pname] = prop
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    return description, schema


def _args_section(doc: str) -> str:
    match = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    return match.group(1) if match else ""


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (list, tuple):
        args = typing.get_args(hint)
        return {"type": "array", "items": _json_type(args[0], where)} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object"}
    if origin in (types.UnionType, typing.Union):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1:
            inner = _json_type(options[0], where)
            if "type" in inner:
                inner["type"] = [inner["type"], "null"]
            return inner
        return {"anyOf": [_json_type(a, where) for a in typing.get_args(hint)]}
    if hint is type(None):
        return {"type": "null"}
    raise ToolError(f"{where}: type {hint!r} has no JSON schema form")


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
    ``"\n[truncated]"`` (12 characters), and a cap smaller than that cuts the text bare (the
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
