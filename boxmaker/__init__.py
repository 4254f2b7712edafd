"""boxmaker: a Jupyter-first research toolkit for LLM agent turn loops on llama.cpp's server.

The public API, in one place (implementation lives in one module per role; see the README)::

    from boxmaker import Client, Config, Runtime, Session, Baseline, Registry, run_turn

    registry = Registry()
    registry.add(get_weather)                      # a typed, documented Python function
    session = Session.create("sessions", Baseline(tools=registry.definitions()))
    with Client(Config().client) as client:
        runtime = Runtime(config=Config(), client=client, registry=registry)
        outcome = run_turn(session, runtime, "What is the weather in Oslo?", print)
"""

import typing as _typing

from .cache import CacheOutcome, cache_outcome
from .client import Client
from .config import (
    ClientConfig,
    Config,
    LoopLimits,
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
    TurnCancelled,
    TurnError,
    TurnInferError,
    TurnLimit,
)
from .events import (
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallDelta,
    ToolCallStarted,
    Waiting,
)
from .records import (
    Assistant,
    Baseline,
    CacheLoss,
    LimitHit,
    ToolCall,
    ToolResult,
    Usage,
    User,
)
from .session import Session, messages
from .stream import Completion, is_context_full
from .tools import (
    InProcessPort,
    Registry,
    ToolDenied,
    ToolFailed,
    ToolOk,
    ToolPendingApproval,
    ToolPort,
    ToolRequest,
    cap_result,
    dispatch,
)
from .turn import Runtime, TurnOutcome, run_turn

if _typing.TYPE_CHECKING:
    from .widgets import ChatPanel, SessionView

__version__ = "0.1.0"

_WIDGETS = ("ChatPanel", "SessionView")
"""Names loaded from :mod:`boxmaker.widgets` on first use, so that ``import boxmaker`` does not
import ipywidgets (a kernel-side library a script or CI run need not load)."""


def __getattr__(name: str) -> object:
    """Load :data:`_WIDGETS` names from :mod:`boxmaker.widgets` when first asked for (PEP 562).

    Raises:
        AttributeError: ``name`` is not a name of the package.
    """
    if name in _WIDGETS:
        from . import widgets  # ipywidgets on first use only (see _WIDGETS)

        value = getattr(widgets, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'boxmaker' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The package's names, the lazily loaded widget classes among them."""
    return sorted(set(globals()) | set(_WIDGETS))


__all__ = [
    "Assistant",
    "Baseline",
    "BoxmakerError",
    "CacheLoss",
    "CacheOutcome",
    "CassetteError",
    "ChatPanel",
    "Client",
    "ClientConfig",
    "Completion",
    "Config",
    "ConfigError",
    "Content",
    "InProcessPort",
    "InferError",
    "LimitHit",
    "LoopLimits",
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
    "ToolCallDelta",
    "ToolCallStarted",
    "ToolDenied",
    "ToolFailed",
    "ToolOk",
    "ToolPendingApproval",
    "ToolPort",
    "ToolRequest",
    "ToolResult",
    "TurnCancelled",
    "TurnError",
    "TurnInferError",
    "TurnLimit",
    "TurnOutcome",
    "Usage",
    "User",
    "Waiting",
    "__version__",
    "cache_outcome",
    "cap_result",
    "dispatch",
    "is_context_full",
    "load_config",
    "messages",
    "run_turn",
]
