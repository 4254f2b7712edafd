"""boxmaker: a Jupyter-first research toolkit for LLM agent turn loops on llama.cpp's server.

The public API, in one place (implementation lives in one module per role; see the docs'
Architecture page).

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

A turn, in short::

    from boxmaker import Client, Config, Runtime, Session, Baseline, Registry, run_turn

    registry = Registry()
    registry.add(get_weather)                      # a typed, documented Python function
    session = Session.create("sessions", Baseline(tools=registry.definitions()))
    with Client(Config().client) as client:
        runtime = Runtime(config=Config(), client=client, registry=registry)
        outcome = run_turn(session, runtime, "What is the weather in Oslo?", print)
"""

import importlib as _importlib
import typing as _typing

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
    ToolError,
    ToolPortError,
    ToolsNotSupported,
    TurnCancelled,
    TurnError,
    TurnInferError,
    TurnLimit,
    TurnNotAnswered,
)
from .events import (
    CapNotEnforced,
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    SlotWait,
    ThinkingCapped,
    ToolCallStarted,
    Waiting,
)
from .records import (
    Approval,
    Assistant,
    Baseline,
    CacheLoss,
    Capabilities,
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

if _typing.TYPE_CHECKING:
    from .batch import compare
    from .cache import explain_log
    from .client import Client
    from .tools.mcp import McpPort
    from .turn import Runtime, TurnOutcome, run_turn
    from .widgets import ChatPanel, SessionView

__version__ = "0.1.0"


_LAZY = {
    "ChatPanel": "widgets",
    "SessionView": "widgets",
    "McpPort": "tools.mcp",
    "Client": "client",
    "explain_log": "cache",
    "Runtime": "turn",
    "TurnOutcome": "turn",
    "run_turn": "turn",
    "compare": "batch",
}
"""Names loaded from their part on first use (name -> module under ``boxmaker``), so that
``import boxmaker`` (and so ``boxmaker --help``, whose console script imports the package
first) stays light: the widgets import ipywidgets (a kernel-side library a script or CI run
need not load), the MCP port the ``mcp`` SDK (pydantic, anyio, starlette), the client, the
cache forensics and the loop httpx, ``compare`` pandas and numpy. ``tests/test_package.py``
keeps the import light."""


def __getattr__(name: str) -> object:
    """Load a :data:`_LAZY` name from its module when first asked for (PEP 562).

    Raises:
        AttributeError: ``name`` is not a name of the package.
    """
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'boxmaker' has no attribute {name!r}")
    value: object = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, the lazily loaded ones among them."""
    return sorted(set(globals()) | set(_LAZY))


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
    "Capabilities",
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
    "SlotWait",
    "SlotsConfig",
    "StreamCut",
    "ThinkingCapped",
    "ThinkingConfig",
    "ToolCall",
    "ToolCallStarted",
    "ToolDenied",
    "ToolError",
    "ToolFailed",
    "ToolOk",
    "ToolPendingApproval",
    "ToolPort",
    "ToolPortError",
    "ToolRequest",
    "ToolResult",
    "ToolsNotSupported",
    "TurnCancelled",
    "TurnEnd",
    "TurnError",
    "TurnInferError",
    "TurnLimit",
    "TurnNotAnswered",
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
