"""The tool port protocol: a port tool's call goes out as a :class:`ToolRequest` and comes
back as a :data:`ToolAnswer` (``ToolOk``, ``ToolFailed``, ``ToolDenied`` or
``ToolPendingApproval``: each outcome's name says it is a tool's); :class:`ToolHints` are what a
port knows of a tool (MCP annotations); :class:`InProcessPort` is a port made of Python handlers.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias, runtime_checkable

from ..records import Approval

__all__ = [
    "HintedPort",
    "InProcessPort",
    "ToolAnswer",
    "ToolDenied",
    "ToolFailed",
    "ToolHints",
    "ToolOk",
    "ToolPendingApproval",
    "ToolPort",
    "ToolRequest",
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
