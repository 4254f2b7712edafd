"""Every knob in one typed object, loadable from a TOML file.

``Config`` bundles one dataclass per section (``client``, ``slots``, ``loop`` (every limit,
``LoopLimits``), ``sampling``, ``history``, ``cache``, ``mcp``, ``approval``, ``tap``);
``Config.from_toml(path)`` / ``load_config(path)`` read the file with :mod:`tomllib` and
refuse unknown keys and values of the wrong type or range with ``ConfigError``.

Private modules by role: ``_knobs`` (the sections and their defaults), ``_ports`` (MCP
servers and approval), ``_tap`` (what ``boxmaker tap`` lets in), ``_checks`` (ranges),
``_read`` (a TOML file into typed values).
"""

from .._public import publish
from ._knobs import (
    HISTORY_REASONING,
    CacheConfig,
    ClientConfig,
    Config,
    HistoryConfig,
    LoopLimits,
    SamplingConfig,
    SlotsConfig,
    ThinkingConfig,
    load_config,
    server_base_url,
)
from ._ports import ApprovalPolicy, McpConfig, McpServerConfig
from ._tap import LOOPBACK_NAMES, TapConfig

__all__ = [
    "HISTORY_REASONING",
    "LOOPBACK_NAMES",
    "ApprovalPolicy",
    "CacheConfig",
    "ClientConfig",
    "Config",
    "HistoryConfig",
    "LoopLimits",
    "McpConfig",
    "McpServerConfig",
    "SamplingConfig",
    "SlotsConfig",
    "TapConfig",
    "ThinkingConfig",
    "load_config",
    "server_base_url",
]

publish(globals(), __all__)
