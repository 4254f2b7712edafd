"""Every knob of boxmaker in one typed object, loadable from a TOML file.

A config file names sections and keys exactly as the dataclasses below do::

    [client]
    url = "http://127.0.0.1:8080"

    [loop]
    tool_iterations = 6
    tool_result_cap = 4000

    [thinking]
    turn_tokens = 256

Unknown sections or keys, values of the wrong type and values out of range raise
:class:`ConfigError` naming the file and the key. TOML has no null: write ``-1`` for
``tool_result_cap`` to turn the cap off. Every dataclass is frozen and keyword-only; use
:func:`dataclasses.replace` to derive a variant.
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
import tomllib
import types
import typing
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ConfigError

__all__ = [
    "ClientConfig",
    "Config",
    "LoopLimits",
    "SamplingConfig",
    "SlotsConfig",
    "ThinkingConfig",
    "load_config",
]


MAX_SECONDS = 86_400.0
"""Upper bound of every duration knob (names ending in ``_s``): one day. Larger values are
typos or overflow the socket layer (``1e308`` seconds cannot be a socket timeout)."""


def _check(where: str, **bounds: tuple[object, bool]) -> None:
    """Raise ConfigError for the first ``name=(value, ok)`` whose ``ok`` is false.

    Whatever ``ok`` says, a float that is infinite or NaN is refused, and so is a duration
    (a name ending in ``_s``) above :data:`MAX_SECONDS`.
    """
    for name, (value, ok) in bounds.items():
        if isinstance(value, float) and not math.isfinite(value):
            ok = False
        if name.endswith("_s") and isinstance(value, int | float) and value > MAX_SECONDS:
            raise ConfigError(
                f"{where}.{name} = {value!r} is out of range: at most {MAX_SECONDS:.0f} s (a day)"
            )
        if not ok:
            raise ConfigError(f"{where}.{name} = {value!r} is out of range")


def _nonneg(x: float) -> bool:
    return math.isfinite(x) and x >= 0


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """How to reach llama-server and how hard to try."""

    url: str = "http://127.0.0.1:8080"
    """Base URL of llama-server (no trailing ``/v1``)."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer ...``; ``None`` sends no header. Never in cassettes."""
    connect_timeout_s: float = 10.0
    """Seconds to wait for a TCP connection."""
    idle_timeout_s: float = 300.0
    """Seconds without a single byte from the server before the request fails (not a total
    timeout: a long stream that keeps sending never times out). Prompt processing of a long
    prompt with ``return_progress`` sends progress events, so this can stay moderate."""
    retry_attempts: int = 4
    """Retries after the first attempt on connection refused and HTTP 503 (0: no retry)."""
    retry_base_delay_s: float = 0.5
    """Delay before the first retry in seconds; doubles each retry."""
    retry_max_delay_s: float = 8.0
    """Upper bound of one retry delay in seconds."""

    def __post_init__(self) -> None:
        try:
            parts = urllib.parse.urlsplit(self.url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError:
            ok = False
        if not ok:
            raise ConfigError(f"client.url = {self.url!r} is not an http(s) URL with a host")
        _check(
            "client",
            connect_timeout_s=(
                self.connect_timeout_s,
                _nonneg(self.connect_timeout_s) and self.connect_timeout_s > 0,
            ),
            idle_timeout_s=(
                self.idle_timeout_s,
                _nonneg(self.idle_timeout_s) and self.idle_timeout_s > 0,
            ),
            retry_attempts=(self.retry_attempts, self.retry_attempts >= 0),
            retry_base_delay_s=(self.retry_base_delay_s, _nonneg(self.retry_base_delay_s)),
            retry_max_delay_s=(self.retry_max_delay_s, _nonneg(self.retry_max_delay_s)),
        )


@dataclass(frozen=True, kw_only=True)
class SlotsConfig:
    """llama.cpp slots (``id_slot``) the loop uses."""

    main: int = 0
    """Slot of the main conversation; keeping one slot per session keeps its prompt cache
    (``-1``: llama.cpp picks any idle slot)."""

    def __post_init__(self) -> None:
        _check("slots", main=(self.main, self.main >= -1))


@dataclass(frozen=True, kw_only=True)
class LoopLimits:
    """The limits of one turn (see the spec's limits table)."""

    tool_iterations: int = 8
    """Completions with tool calls allowed in one turn; one more ends the turn (``TurnLimit``)."""
    repeat_detection: bool = True
    """Detect identical (name, arguments) calls in one turn: the first repeat is answered
    without running, the second ends the turn."""
    tool_result_cap: int | None = 4_000
    """Longest tool result in characters sent to the model; longer ones are cut and marked
    ``truncated``. ``None`` (or ``-1`` in a TOML file): no cap. About 1,000 tokens of a
    sub-word model, 4,000 of the shipped char-level one: keep it well below the context."""

    def __post_init__(self) -> None:
        if self.tool_result_cap == -1:
            object.__setattr__(self, "tool_result_cap", None)
        cap = self.tool_result_cap
        _check(
            "loop",
            tool_iterations=(self.tool_iterations, self.tool_iterations >= 0),
            tool_result_cap=(cap, cap is None or cap >= 0),
        )


@dataclass(frozen=True, kw_only=True)
class ThinkingConfig:
    """Reasoning ("thinking") settings."""

    enabled: bool = True
    """Ask for reasoning (``chat_template_kwargs.enable_thinking``)."""
    turn_tokens: int | None = None
    """Reasoning tokens allowed per turn (all completions of the turn together); when reached,
    reasoning is ended through llama.cpp's reasoning control. ``None``: no cap."""

    def __post_init__(self) -> None:
        t = self.turn_tokens
        _check("thinking", turn_tokens=(t, t is None or t >= 0))


@dataclass(frozen=True, kw_only=True)
class SamplingConfig:
    """Sampling parameters sent with every request."""

    temperature: float = 0.0
    """Sampling temperature; 0 is greedy (reproducible)."""
    max_tokens: int | None = 1024
    """Tokens one completion may generate (``max_tokens``); ``None``: the server's default."""
    seed: int | None = 0
    """Sampler seed sent to the server; ``None`` sends none."""

    def __post_init__(self) -> None:
        m = self.max_tokens
        _check(
            "sampling",
            temperature=(self.temperature, _nonneg(self.temperature)),
            max_tokens=(m, m is None or m >= 1),
        )


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every knob in one object. ``Config()`` gives working defaults."""

    client: ClientConfig = field(default_factory=ClientConfig)
    slots: SlotsConfig = field(default_factory=SlotsConfig)
    loop: LoopLimits = field(default_factory=LoopLimits)
    thinking: ThinkingConfig = field(default_factory=ThinkingConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> Config:
        """Load a config from a TOML file; missing keys keep their defaults.

        Raises:
            ConfigError: the file cannot be read or parsed, or names an unknown section or
                key, or a value has the wrong type.
        """
        return load_config(path)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, source: str = "<dict>") -> Config:
        """Build a config from nested mappings shaped like the TOML file.

        Raises:
            ConfigError: unknown section or key, or a value of the wrong type.
        """
        sections: dict[str, Any] = {}
        hints = typing.get_type_hints(cls)
        for name, value in data.items():
            if name not in hints:
                raise ConfigError(f"{source}: unknown section [{name}]")
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{name}] must be a table")
            sections[name] = _build(hints[name], value, f"{source}: [{name}]")
        return cls(**sections)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load a :class:`Config` from a TOML file (see the module docstring for the layout).

    Raises:
        ConfigError: unreadable or invalid file (also one nested too deeply for the parser,
            about 300 levels), unknown key, wrong type, or a value out of range (durations:
            finite, at most :data:`MAX_SECONDS`). The message names the file.
    """
    p = Path(path)
    try:
        with p.open("rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read config: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{p}: invalid TOML: arrays or tables nested too deeply") from None
    return Config.from_dict(data, source=str(p))


def _build(cls: Any, values: dict[str, Any], where: str) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r}")
        if not _fits(hints[key], value):
            hint = _type_name(hints[key])
            raise ConfigError(f"{where}: {key} = {_short(value)} is not of type {hint}")
        kwargs[key] = float(value) if hints[key] is float and isinstance(value, int) else value
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def _short(value: Any) -> str:
    """``repr`` cut to a line: a value in an error message may be a huge or deep TOML value."""
    return _REPR.repr(value)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("NoneType", "None")


def _fits(hint: Any, value: Any) -> bool:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_fits(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)
