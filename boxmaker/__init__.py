"""boxmaker: a Jupyter-first research toolkit for LLM agent turn loops on llama.cpp's server.

The public API, in one place (implementation lives in one module per role; see the README).

What is here, and what is not: the top-level namespace holds what a notebook user needs to
run turns, watch them and keep their logs: the loop (``run_turn``, ``Runtime``,
``TurnOutcome``), sessions and their records, the config, the client, the tool registry and
the answers of tool ports (names that say they are tools'), the events a hook receives, the
errors, the widgets (loaded on first use) and the tool ports. The building blocks under them
stay in their modules and are imported from there: message building
(``boxmaker.session.messages``), stream decoding (``boxmaker.client``: ``Completion``,
``is_context_full``; the client-level ``ToolCallDelta`` of ``boxmaker.events``, which turn
hooks never receive), the cache rule (``boxmaker.cache.cache_outcome``), tool dispatch and
capping (``boxmaker.tools.dispatch``, ``cap_result``), the log file (``boxmaker.session``:
``read_log``), the frames (``boxmaker.frames``), cassettes (``boxmaker.cassettes``), the
batch runner (``boxmaker.batch``), the embedded server (``boxmaker.server``).
``tests/test_package.py`` keeps this list exact.

    from boxmaker import Client, Config, Runtime, Session, Baseline, Registry, run_turn

    registry = Registry()
    registry.add(get_weather)                      # a typed, documented Python function
    session = Session.create("sessions", Baseline(tools=registry.definitions()))
    with Client(Config().client) as client:
        runtime = Runtime(config=Config(), client=client, registry=registry)
        outcome = run_turn(session, runtime, "What is the weather in Oslo?", print)
"""

import typing as _typing

from . import _relocated
from .cache import explain_log
from .client import Client
from .config import (
    ApprovalPolicy,
    CacheConfig,
    ClientConfig,
    Config,
    HistoryConfig,
    LoopLimits,
    McpConfig,
    McpServerConfig,
    SamplingConfig,
    SlotsConfig,
    ThinkingConfig,
    load_config,
)
from .errors import (
    BoxmakerError,
    CassetteError,
    ConfigError,
    InferError,
    RequestCancelled,
    ServerError,
    SessionError,
    SessionFull,
    StreamCut,
    ToolPortError,
    TurnCancelled,
    TurnError,
    TurnInferError,
    TurnLimit,
)
from .events import (
    CapNotEnforced,
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallStarted,
    Waiting,
)
from .records import (
    Approval,
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    ToolCall,
    ToolResult,
    TurnEnd,
    Usage,
    User,
)
from .session import Session
from .tools import (
    InProcessPort,
    Registry,
    ToolDenied,
    ToolFailed,
    ToolOk,
    ToolPendingApproval,
    ToolPort,
    ToolRequest,
)
from .tools.approval import ApprovalPort, PendingCall
from .turn import Runtime, TurnOutcome, run_turn

if _typing.TYPE_CHECKING:
    from .tools.mcp import McpPort
    from .batch import compare
    from .widgets import ChatPanel, SessionView

__version__ = "0.1.0"

_relocated.install()  # old module paths (boxmaker.stream, ...) for one release

_WIDGETS = ("ChatPanel", "SessionView")
"""Names loaded from :mod:`boxmaker.widgets` on first use, so that ``import boxmaker`` does not
import ipywidgets (a kernel-side library a script or CI run need not load)."""
_BATCH = ("compare",)
"""Names loaded from :mod:`boxmaker.batch` on first use (pandas, numpy)."""
_MCP = ("McpPort",)
"""Names loaded from :mod:`boxmaker.tools.mcp` on first use, so that ``import boxmaker`` does not
import the ``mcp`` SDK (pydantic, anyio, starlette) when no MCP server is used."""


def __getattr__(name: str) -> object:
    """Load :data:`_WIDGETS` and :data:`_MCP` names from their modules when first asked for
    (PEP 562).

    Raises:
        AttributeError: ``name`` is not a name of the package.
    """
    value: object
    if name in _WIDGETS:
        from . import widgets  # ipywidgets on first use only (see _WIDGETS)

        value = getattr(widgets, name)
    elif name in _BATCH:
        from . import batch  # pandas and numpy on first use only (see _BATCH)

        value = getattr(batch, name)
    elif name in _MCP:
        from .tools import mcp as mcp_port  # the mcp SDK on first use only (see _MCP)

        value = getattr(mcp_port, name)
    else:
        raise AttributeError(f"module 'boxmaker' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the lazily loaded classes among them."""
    return sorted(set(globals()) | set(_WIDGETS) | set(_MCP) | set(_BATCH))


__all__ = [
    "Approval",
    "ApprovalPolicy",
    "ApprovalPort",
    "Assistant",
    "Baseline",
    "BoxmakerError",
    "CacheConfig",
    "CacheLoss",
    "CapNotEnforced",
    "CassetteError",
    "ChatPanel",
    "Client",
    "ClientConfig",
    "Config",
    "ConfigError",
    "Content",
    "HistoryConfig",
    "InProcessPort",
    "InferError",
    "LimitHit",
    "LoopLimits",
    "McpConfig",
    "McpPort",
    "McpServerConfig",
    "PendingCall",
    "Progress",
    "Queued",
    "Reasoning",
    "Registry",
    "RequestCancelled",
    "Retrying",
    "Runtime",
    "SamplingConfig",
    "ServerError",
    "Session",
    "SessionError",
    "SessionFull",
    "SessionView",
    "SlotsConfig",
    "StreamCut",
    "ThinkingCapped",
    "ThinkingConfig",
    "ToolCall",
    "ToolCallStarted",
    "ToolDenied",
    "ToolFailed",
    "ToolOk",
    "ToolPendingApproval",
    "ToolPort",
    "ToolPortError",
    "ToolRequest",
    "ToolResult",
    "TurnCancelled",
    "TurnEnd",
    "TurnError",
    "TurnInferError",
    "TurnLimit",
    "TurnOutcome",
    "Usage",
    "User",
    "Waiting",
    "__version__",
    "compare",
    "explain_log",
    "load_config",
    "run_turn",
]
