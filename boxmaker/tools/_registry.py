"""The tool registry: the tools offered to the model, by name.

Two kinds of tool live in a :class:`Registry`: a *local* tool is a Python function, its JSON
schema derived from its type hints and docstring (:func:`schema_from_function`) or given, run
in-process, its result public, trusted text; a *port* tool is only a name and a schema, its
calls sent to a :class:`~boxmaker.tools.ToolPort`. Tool definitions use the OpenAI
chat-completions ``tools`` format (``{"type": "function", "function": {"name", "description",
"parameters"}}``).
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import ToolError

__all__ = [
    "Registry",
    "Tool",
    "schema_from_function",
]


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
