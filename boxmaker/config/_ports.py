"""The tool-port knobs of :class:`boxmaker.config.Config`: MCP servers (``[[mcp.servers]]``)
and the approval policy (``[approval]``). Part of the one config object, kept apart so each
module stays readable; import them from :mod:`boxmaker.config`."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass

from ..errors import ConfigError
from ._checks import check as _check
from ._checks import nonneg as _nonneg

__all__ = ["ApprovalPolicy", "McpConfig", "McpServerConfig"]

_SERVER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True, kw_only=True)
class McpServerConfig:
    """One MCP server whose tools a :class:`boxmaker.tools.mcp.McpPort` offers: a ``command``
    started as a subprocess (stdio transport) or a ``url`` (streamable HTTP), exactly one.

    Raises:
        ConfigError: no or both of ``command`` and ``url``, a URL that is not http(s), a name
            that is not ``[A-Za-z0-9_.-]{1,64}``, or a timeout that is not positive.
    """

    name: str
    """The server's name in the log (``ToolResult.server``) and in error messages."""
    command: tuple[str, ...] = ()
    """Program and arguments of a stdio server, e.g. ``("python", "server.py")``."""
    url: str | None = None
    """Endpoint of a streamable-HTTP server, e.g. ``"http://127.0.0.1:8000/mcp"``."""
    cwd: str | None = None
    """Working directory of a stdio server (``None``: the current one)."""
    prefix: str = ""
    """Put before each of the server's tool names in the registry (``"search_"``), to tell
    apart two servers that offer a tool of the same name."""
    timeout_s: float = 30.0
    """Seconds one ``tools/call`` may take; then the call fails and the server is restarted."""
    start_timeout_s: float = 30.0
    """Seconds to start (or reach) the server and list its tools."""
    partial_line_s: float = 5.0
    """Seconds a stdio server may leave a line unfinished (bytes of a message, no newline)
    with no further byte; then its running calls fail at once, showing the line's start,
    instead of at ``timeout_s`` (a message written slowly goes on: each byte restarts the
    clock)."""
    max_line_chars: int = 16 * 1024 * 1024
    """Longest line (one JSON-RPC message) a stdio server may write, in characters (16 Mi,
    as the client's cap on one SSE event): a longer one fails the server's running calls at
    once, showing the line's start, and is read no further (a 500 MB line was held whole:
    1.3 GB)."""
    data_class: str = "public"
    """The ``data_class`` label of the server's results."""
    untrusted: bool | None = None
    """Mark the server's results untrusted (``True``) or trusted (``False``); ``None``: from
    each tool's ``openWorldHint`` (absent counts as open world, as the MCP specification says)."""

    def __post_init__(self) -> None:
        if not _SERVER_NAME.fullmatch(self.name):
            raise ConfigError(f"mcp server name {self.name!r} is not [A-Za-z0-9_.-]{{1,64}}")
        where = f"mcp server {self.name!r}"
        if bool(self.command) == (self.url is not None):
            raise ConfigError(f"{where}: give either command (stdio) or url (HTTP), not both")
        if self.url is not None and urllib.parse.urlsplit(self.url).scheme not in ("http", "https"):
            raise ConfigError(f"{where}: url = {self.url!r} is not an http(s) URL")
        _check(
            where,
            timeout_s=(self.timeout_s, _nonneg(self.timeout_s) and self.timeout_s > 0),
            start_timeout_s=(
                self.start_timeout_s,
                _nonneg(self.start_timeout_s) and self.start_timeout_s > 0,
            ),
            partial_line_s=(
                self.partial_line_s,
                _nonneg(self.partial_line_s) and self.partial_line_s > 0,
            ),
            max_line_chars=(
                self.max_line_chars,
                type(self.max_line_chars) is int and self.max_line_chars >= 1,
            ),
        )


@dataclass(frozen=True, kw_only=True)
class McpConfig:
    """The MCP servers whose tools join the registry (``[[mcp.servers]]`` tables in TOML).

    Raises:
        ConfigError: two servers of the same name.
    """

    servers: tuple[McpServerConfig, ...] = ()
    """The servers, in order (their tools join the registry in this order)."""

    def __post_init__(self) -> None:
        names = [s.name for s in self.servers]
        for name in names:
            if names.count(name) > 1:
                raise ConfigError(f"mcp: two servers are named {name!r}")


@dataclass(frozen=True, kw_only=True)
class ApprovalPolicy:
    """Which tool calls wait for a person's (or a callback's) approval before they run
    (:class:`boxmaker.tools.approval.ApprovalPort`). A call needs approval when any rule says so.

    Raises:
        ConfigError: a timeout that is not positive.
    """

    tools: tuple[str, ...] = ()
    """Tool names (as registered) whose every call needs approval."""
    destructive: bool = False
    """Calls of tools the port marks destructive need approval (MCP ``destructiveHint``; a
    tool with no annotation counts as destructive unless read-only, as the MCP spec says)."""
    every_call: bool = False
    """Every port call needs approval."""
    timeout_s: float | None = 120.0
    """Seconds to wait for a decision; then the call is denied (``by="timeout"``). ``None``
    (or ``-1`` in a TOML file): wait until decided or the turn is stopped."""

    def __post_init__(self) -> None:
        if self.timeout_s == -1:
            object.__setattr__(self, "timeout_s", None)
        t = self.timeout_s
        _check("approval", timeout_s=(t, t is None or (_nonneg(t) and t > 0)))
