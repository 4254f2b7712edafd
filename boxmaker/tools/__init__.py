"""Tools: the registry (JSON schemas from type hints and docstrings), ``dispatch``, the
tool port protocol and its answers, ``cap_result``.

Public submodules: :mod:`boxmaker.tools.approval` (``ApprovalPort``: a person approves
calls) and :mod:`boxmaker.tools.mcp` (``McpPort``: MCP servers as the port; imports the
``mcp`` SDK, so it is loaded only when asked for).
"""

from .._public import publish
from ._tools import (
    Dispatched,
    HintedPort,
    InProcessPort,
    Registry,
    Tool,
    ToolAnswer,
    ToolDenied,
    ToolFailed,
    ToolHints,
    ToolOk,
    ToolPendingApproval,
    ToolPort,
    ToolRequest,
    canonical_arguments,
    cap_result,
    dispatch,
    schema_from_function,
)

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

publish(globals(), __all__)
