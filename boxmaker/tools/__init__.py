"""Tools: the registry (JSON schemas from type hints and docstrings), ``dispatch``, the
tool port protocol and its answers, ``cap_result``, ``find_text_tool_call`` (a tool call
written in content that the server did not parse).

Private modules by role: ``_registry`` (what the model is offered), ``_ports`` (where a port
tool's call goes and what comes back), ``_dispatch`` (running one call), ``_text_calls``.

Public submodules: :mod:`boxmaker.tools.approval` (``ApprovalPort``: a person approves
calls) and :mod:`boxmaker.tools.mcp` (``McpPort``: MCP servers as the port; imports the
``mcp`` SDK, so it is loaded only when asked for).
"""

from .._public import publish
from ._dispatch import Dispatched, canonical_arguments, cap_result, dispatch
from ._ports import (
    HintedPort,
    InProcessPort,
    ToolAnswer,
    ToolDenied,
    ToolFailed,
    ToolHints,
    ToolOk,
    ToolPendingApproval,
    ToolPort,
    ToolRequest,
)
from ._registry import Registry, Tool, schema_from_function
from ._text_calls import TEXT_TOOL_CALL_FORMATS, TextToolCall, find_text_tool_call

__all__ = [
    "TEXT_TOOL_CALL_FORMATS",
    "Dispatched",
    "HintedPort",
    "InProcessPort",
    "Registry",
    "TextToolCall",
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
    "find_text_tool_call",
    "schema_from_function",
]

publish(globals(), __all__)
