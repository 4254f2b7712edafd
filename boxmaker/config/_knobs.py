"""Every knob of boxmaker in one typed object, loadable from a TOML file.

A config file names sections and keys exactly as the dataclasses below do::

    [client]
    url = "http://127.0.0.1:8080"

    [loop]
    tool_iterations = 6
    tool_result_cap = 4000
    thinking_tokens = 256

    [[mcp.servers]]                # an MCP server over stdio (a command) ...
    name = "weather"
    command = ["python", "weather_server.py"]

    [[mcp.servers]]                # ... or over streamable HTTP (a URL)
    name = "search"
    url = "http://127.0.0.1:8000/mcp"
    prefix = "search_"

    [approval]
    tools = ["delete_file"]
    destructive = true

    [history]
    reasoning = "keep"             # send earlier reasoning back rendered: keeps the cache

    [cache]
    forensics = true               # after a cache loss, find where and why (a few requests)

    [tap]
    max_body_bytes = 16777216      # boxmaker tap: a larger request body is refused (413)

Unknown sections or keys, values of the wrong type and values out of range raise
:class:`ConfigError` naming the file and the key. Every limit is in :class:`LoopLimits`, and
for each of them ``None`` means "off"; TOML has no null, so write ``-1`` there to turn a limit
off (also ``client.silence_timeout_s``, ``client.max_event_bytes`` and
``approval.timeout_s``). The thinking cap's old place, ``[thinking] turn_tokens``
(``ThinkingConfig.turn_tokens``), still loads, moved to ``loop.thinking_tokens`` with a
``FutureWarning``. Every dataclass is frozen and keyword-only; use :func:`dataclasses.replace`
to derive a variant.
"""

from __future__ import annotations

import dataclasses
import os
import urllib.parse
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ._checks import check as _check
from ._checks import check_loop_types
from ._checks import nonneg as _nonneg
from ._ports import ApprovalPolicy, McpConfig, McpServerConfig
from ._read import build, did_you_mean, fits, read_toml, type_hints
from ._tap import TapConfig

__all__ = [
    "HISTORY_REASONING",
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
    "ThinkingConfig",
    "load_config",
    "server_base_url",
]


def server_base_url(url: str) -> str:
    """llama-server's base URL from ``url``: without trailing ``/`` and without a trailing
    ``/v1`` (``http://h:8080/v1/`` -> ``http://h:8080``), so ``{base}/v1/chat/completions``
    and ``{base}/health`` are both right whichever form a user copied."""
    base = url.rstrip("/")
    return base[: -len("/v1")].rstrip("/") if base.endswith("/v1") else base


UNSUPPORTED_TOOLS = ("error", "warn")
"""The values of :attr:`ClientConfig.unsupported_tools`."""

SLOT_CHOICES = ("auto", "client", "server")
"""The values of :attr:`ClientConfig.slot_choice`."""


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    """How to reach llama-server and how hard to try."""

    url: str = "http://127.0.0.1:8080"
    """Base URL of llama-server. A trailing ``/v1`` (the OpenAI base URL other clients
    want) is dropped, as is a trailing ``/``: llama-server's own endpoints (``/health``,
    ``/props``, ``/slots``) are not under ``/v1`` (see :func:`server_base_url`)."""
    api_key: str | None = None
    """Sent as ``Authorization: Bearer ...``; ``None`` sends no header. Never in cassettes."""
    connect_timeout_s: float = 10.0
    """Seconds to wait for a TCP connection."""
    idle_timeout_s: float = 300.0
    """Seconds without a single byte from the server before the request fails (not a total
    timeout: a long stream that keeps sending never times out). Prompt processing of a long
    prompt with ``return_progress`` sends progress events, so this can stay moderate."""
    silence_timeout_s: float | None = 600.0
    """Seconds a streaming answer may go without a single data event before the request fails
    with :class:`~boxmaker.errors.InferError`: SSE comments (llama.cpp's ``: ping``) keep the
    connection from the idle timeout but do not count as life here; progress events, tokens
    and every other data event do. Counted from the response head, or from the first read
    without data after the last data event (so up to one ping interval more in all). The
    default allows llama.cpp's long prompt processing of a server without progress events.
    ``None`` (or ``-1`` in a TOML file): no limit."""
    retry_attempts: int = 4
    """Retries after the first attempt on connection refused and HTTP 429, 502, 503, 504
    (0: no retry)."""
    retry_base_delay_s: float = 0.5
    """Delay before the first retry in seconds; doubles each retry."""
    retry_max_delay_s: float = 8.0
    """Upper bound of one retry delay in seconds."""
    send_thinking_budget: bool = True
    """Send a thinking cap's budget as llama.cpp's ``thinking_budget_tokens`` (the sampler ends
    reasoning exactly); ``False``: only ``reasoning_end`` through reasoning control, sent once
    the client counted the budget (late by the tokens in flight; for servers that reject it)."""
    max_event_bytes: int | None = 16 * 1024 * 1024
    """Largest SSE event of a stream in bytes (16 MiB; llama.cpp's chunks are far below a
    kilobyte): a longer one, or a line that never ends, fails the request with
    :class:`~boxmaker.errors.InferError` before it fills the memory. ``None`` (``-1`` in a
    TOML file): no cap."""
    unsupported_tools: str = "error"
    """The session offers tools and the server's chat template cannot take them (``GET
    /props``): ``"error"`` refuses the turn (:class:`~boxmaker.errors.ToolsNotSupported`);
    ``"warn"`` records the warning in the session's ``Capabilities`` record and runs it (the
    server drops the tools: the model answers without them)."""
    slot_choice: str = "auto"
    """Who picks the llama.cpp slot of a request that is not pinned by ``id_slot`` -1:
    ``"client"``: boxmaker, through its slot leases (the slot holding the session's prompt,
    never one another boxmaker request is using), sending the pin (``id_slot``);
    ``"server"``: llama.cpp (``id_slot`` -1: its prompt-similarity pick among idle slots, then
    its RAM prompt cache, ``--cache-ram``); a pin (``slots.main``, a batch run's slot) is then
    not sent either. ``"auto"`` (the default): ``"client"``, until the client sees that the
    server clears idle slots (llama-server's ``--cache-idle-slots``, on by default with a
    unified KV cache: a pinned request to an emptied slot is not reloaded from the RAM cache,
    ggml-org/llama.cpp ``get_available_slot``), then ``"server"`` for that server in this
    process: a follow-up whose slot a task started since may have emptied (tasks of every
    process of this user count) looks at ``GET /slots`` first, no other request starting
    meanwhile. With the server picking, a slot cannot be saved at turn ends (no slot is
    known)."""

    def __post_init__(self) -> None:
        if self.unsupported_tools not in UNSUPPORTED_TOOLS:
            raise ConfigError(
                f"client.unsupported_tools = {self.unsupported_tools!r} is not one of "
                f"{', '.join(repr(v) for v in UNSUPPORTED_TOOLS)}"
            )
        if self.slot_choice not in SLOT_CHOICES:
            raise ConfigError(
                f"client.slot_choice = {self.slot_choice!r} is not one of "
                f"{', '.join(repr(v) for v in SLOT_CHOICES)}"
            )
        if isinstance(self.url, str):
            object.__setattr__(self, "url", server_base_url(self.url))
        for name in ("silence_timeout_s", "max_event_bytes"):
            if getattr(self, name) == -1:
                object.__setattr__(self, name, None)
        events = self.max_event_bytes
        silence = self.silence_timeout_s
        try:
            parts = urllib.parse.urlsplit(self.url)
            ok = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError:
            ok = False
        if not ok:
            hint = "" if "://" in self.url else f" (with its scheme: 'http://{self.url}')"
            raise ConfigError(f"client.url = {self.url!r} is not an http(s) URL with a host{hint}")
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
            silence_timeout_s=(silence, silence is None or (_nonneg(silence) and silence > 0)),
            retry_attempts=(self.retry_attempts, self.retry_attempts >= 0),
            retry_base_delay_s=(self.retry_base_delay_s, _nonneg(self.retry_base_delay_s)),
            retry_max_delay_s=(self.retry_max_delay_s, _nonneg(self.retry_max_delay_s)),
            max_event_bytes=(events, events is None or (type(events) is int and events > 0)),
        )


@dataclass(frozen=True, kw_only=True)
class SlotsConfig:
    """llama.cpp slots (``id_slot``) the loop uses."""

    main: int | None = None
    """Slot (``id_slot``) of the main conversation. ``None`` (the default; leave the key out
    of a TOML file): the client takes a free slot, the one holding this session's prompt cache
    when it is free, and never one another request is using (safe for any number of
    sessions, threads and processes on one machine). ``0`` or more: a pin; a request waits
    while another boxmaker request holds that slot. ``-1``: sent as it is (llama.cpp picks an
    idle slot), without a lease: do not mix with pins on the same server."""

    def __post_init__(self) -> None:
        m = self.main
        _check("slots", main=(m, m is None or (not isinstance(m, bool) and m >= -1)))


@dataclass(frozen=True, kw_only=True)
class LoopLimits:
    """Every limit of one turn in one object (see the spec's limits table).

    For each limit, ``None`` means "off" (``-1`` in a TOML file, which has no null). The
    limits that end a turn raise :class:`~boxmaker.errors.TurnLimit` with the kind, the value
    reached and the bound; each limit that fires leaves a ``LimitHit`` record.
    """

    tool_iterations: int | None = 8
    """Completions with tool calls allowed in one turn; one more ends the turn (``TurnLimit``
    of kind ``tool_iterations``). ``None``: no limit."""
    repeat_detection: bool = True
    """Count identical (name, canonical JSON arguments) tool calls within one turn and apply
    :attr:`repeat_answered_at` and :attr:`repeat_ends_turn_at`; ``False`` turns both off."""
    repeat_answered_at: int | None = 2
    """The n-th identical call of a turn (and every later one) is answered "already made with
    these arguments in this turn" without running (at least 2: the first call always runs).
    ``None``: repeats run."""
    repeat_ends_turn_at: int | None = 3
    """The n-th identical call of a turn ends the turn (``TurnLimit`` of kind
    ``repeated_call``, bound n - 1) before it runs; at least 2. ``None``: repeats never end
    the turn."""
    tool_result_cap: int | None = 4_000
    """Longest tool result in characters sent to the model; longer ones are cut and marked
    ``truncated``. ``None``: no cap. About 1,000 tokens of a sub-word model, 4,000 of the
    shipped char-level one: keep it well below the context."""
    thinking_tokens: int | None = None
    """Reasoning tokens allowed per turn (all completions of the turn together, as llama.cpp
    counts them); each request carries what is left as ``thinking_budget_tokens``, and when it
    is reached reasoning is ended through llama.cpp's reasoning control. ``None``: no cap."""

    cycle_length: int | None = 4
    """Longest cycle of tool calls (in calls, from 2) the loop guard looks for: the turn's last
    calls being one block of that many (name, canonical arguments) calls repeated
    :attr:`cycle_repeats` times in a row (A, B, A, B) fires the guard. The cycle of length 1
    is the identical-repeat rule above. A cycle repeats calls, so with the repeat rule on
    (the default) a cycle's third call is already answered "already made" and the turn ends
    as ``repeated_call`` first; the cycle rule is the stop that sees a cycle as such with
    ``repeat_detection`` off. ``None``: no cycle detection."""
    cycle_repeats: int = 2
    """Times in a row a block of calls must be repeated to count as a cycle (at least 2)."""
    stale_results_at: int | None = None
    """A tool that returned the same result this many times in the turn, whatever the
    arguments, makes no progress: its next call fires the loop guard. ``None``: off."""
    repeat_exempt: tuple[str, ...] = ()
    """Tools left out of the repeat, cycle and stale-result rules (a status poll is meant to
    repeat); ``tool_call_caps`` still apply to them."""
    tool_call_caps: Mapping[str, int] = field(default_factory=dict)
    """Calls allowed per tool in one turn (tool name to count, a TOML table
    ``[loop.tool_call_caps]``); the call past the cap fires the loop guard."""
    completion_tokens: int | None = 32_768
    """Tokens one completion may stream, counted by the client (each reasoning, content and
    tool-call delta counts one: llama.cpp sends a token a chunk), whatever the server does
    with ``max_tokens``: past it the stream is closed and the turn ends (``TurnLimit`` of kind
    ``completion_tokens``). The stream is also closed past ``sampling.max_tokens`` plus
    :data:`boxmaker.turn.TOKEN_GRACE` deltas, and past the thinking cap's budget plus
    :data:`boxmaker.turn.THINKING_GRACE` reasoning deltas (a server that ignores both the
    budget and ``reasoning_end``). ``None``: only those two."""
    completions: int | None = 32
    """Completions allowed in one turn (with or without tool calls; the answer after a limit
    counts too); the next one ends the turn first (``TurnLimit`` of kind ``completions``).
    ``None``: no limit."""
    turn_deadline_s: float | None = 1800.0
    """Seconds one turn may take from its first request: then the running request is closed
    (through the runtime's ``cancel``: within about 0.1 s), a port tool waiting is told to
    stop, and the turn ends (``TurnLimit`` of kind ``turn_deadline``); a local tool running
    is not interrupted, the turn ends when it returns. ``None`` (``-1`` in TOML): none."""
    tool_calls_per_completion: int | None = 64
    """Tool calls one completion may make; one more closes the stream and ends the turn
    (``TurnLimit`` of kind ``tool_calls``) before any of them runs. ``None``: no limit."""
    tool_argument_chars: int | None = 1_000_000
    """Characters of one tool call's ``arguments`` string (counted as the fragments stream);
    a longer one closes the stream and ends the turn (``TurnLimit`` of kind
    ``tool_arguments``) before anything runs. ``None``: no limit."""
    on_limit: str = "stop"
    """When tool iterations or the loop guard end the turn: ``"stop"`` raises ``TurnLimit``;
    ``"answer"`` makes the log whole the same way, then asks one last completion without
    tools (``tool_choice: "none"``, tools kept in the request so the prompt cache holds) for
    an answer: the turn's outcome is ``answered_after_limit``. The loop guard's cycle, stale
    and cap rules first answer with a nudge (``not_run="loop"``), then end the turn
    (``TurnLimit`` of kind ``loop``)."""

    def __post_init__(self) -> None:
        check_loop_types(self, _OFF_WITH_MINUS_ONE)  # Python callers: the TOML reader's errors
        deadline = self.turn_deadline_s
        if deadline == -1:
            object.__setattr__(self, "turn_deadline_s", deadline := None)
        if deadline is not None and (type(deadline) not in (int, float) or not deadline > 0):
            raise ConfigError(f"loop.turn_deadline_s = {deadline!r:.60} is not seconds above 0")
        for name in _OFF_WITH_MINUS_ONE:
            if getattr(self, name) == -1:
                object.__setattr__(self, name, None)
        object.__setattr__(self, "repeat_exempt", tuple(self.repeat_exempt))
        it, answered, ends = self.tool_iterations, self.repeat_answered_at, self.repeat_ends_turn_at
        cap, think = self.tool_result_cap, self.thinking_tokens
        bounds = {n: getattr(self, n) for n in _OFF_WITH_MINUS_ONE[-4:]}  # the turn's bounds
        k, stale, caps = self.cycle_length, self.stale_results_at, self.tool_call_caps
        _check(
            "loop",
            tool_iterations=(it, it is None or it >= 0),
            repeat_answered_at=(answered, answered is None or answered >= 2),
            repeat_ends_turn_at=(ends, ends is None or ends >= 2),
            tool_result_cap=(cap, cap is None or cap >= 0),
            thinking_tokens=(think, think is None or think >= 0),
            cycle_length=(k, k is None or k >= 1),
            cycle_repeats=(self.cycle_repeats, self.cycle_repeats >= 2),
            stale_results_at=(stale, stale is None or stale >= 1),
            tool_call_caps=(dict(caps), min(caps.values(), default=0) >= 0),
            on_limit=(self.on_limit, self.on_limit in ("stop", "answer")),
            turn_deadline_s=(deadline, True),
            **{n: (v, v is None or v >= 1) for n, v in bounds.items()},
        )
        if answered is not None and ends is not None and answered > ends:
            raise ConfigError(
                f"loop.repeat_answered_at = {answered} is after loop.repeat_ends_turn_at = "
                f"{ends}: the turn would end before a repeat is ever answered (set "
                "repeat_answered_at to None, -1 in TOML, for no answer before the end)"
            )


_OFF_WITH_MINUS_ONE = (
    "tool_iterations",
    "repeat_answered_at",
    "repeat_ends_turn_at",
    "tool_result_cap",
    "thinking_tokens",
    "cycle_length",
    "stale_results_at",
    "completion_tokens",
    "completions",
    "tool_calls_per_completion",
    "tool_argument_chars",
)
"""The :class:`LoopLimits` fields where ``-1`` (TOML's stand-in for null) means ``None``."""

_TURN_TOKENS_MOVED = (
    "ThinkingConfig.turn_tokens is deprecated: the thinking cap is LoopLimits.thinking_tokens "
    "(config.loop.thinking_tokens, [loop] thinking_tokens in TOML)"
)


@dataclass(frozen=True, kw_only=True)
class ThinkingConfig:
    """Reasoning ("thinking") settings. The thinking cap is :attr:`LoopLimits.thinking_tokens`."""

    enabled: bool = True
    """Ask for reasoning (``chat_template_kwargs.enable_thinking``)."""
    turn_tokens: int | None = None
    """Deprecated: the thinking cap's old place. A value given here is moved by :class:`Config`
    to ``loop.thinking_tokens`` (with a ``FutureWarning``) and this field is then ``None``."""

    def __post_init__(self) -> None:
        t = self.turn_tokens
        _check("thinking", turn_tokens=(t, t is None or t >= 0))
        if t is not None:
            warnings.warn(_TURN_TOKENS_MOVED, FutureWarning, stacklevel=3)


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

    def request_fields(self) -> dict[str, Any]:
        """These knobs as chat-completion request fields (OpenAI / llama.cpp names):
        ``temperature``, and ``max_tokens`` and ``seed`` when not ``None``."""
        fields: dict[str, Any] = {"temperature": self.temperature}
        if self.max_tokens is not None:
            fields["max_tokens"] = self.max_tokens
        if self.seed is not None:
            fields["seed"] = self.seed
        return fields


HISTORY_REASONING = ("drop", "keep")
"""The values of :attr:`HistoryConfig.reasoning`."""


@dataclass(frozen=True, kw_only=True)
class HistoryConfig:
    """How the session's history is sent back to the server."""

    reasoning: str = "drop"
    """Earlier reasoning: ``"drop"`` leaves it to the template (every assistant message carries
    its ``reasoning_content``; a Qwen3-style template renders it only after the last user
    message, so each user turn loses the cache from the first earlier reasoning on); ``"keep"``
    also sends ``chat_template_kwargs.preserve_thinking = true``: a template that can render
    every earlier reasoning does, and the cache is kept (one that cannot: as ``"drop"``)."""

    def __post_init__(self) -> None:
        if self.reasoning not in HISTORY_REASONING:
            raise ConfigError(
                f"history.reasoning = {self.reasoning!r} is not one of "
                f"{', '.join(repr(v) for v in HISTORY_REASONING)}"
            )

    def template_kwargs(self) -> dict[str, Any]:
        """The ``chat_template_kwargs`` entries this option adds to a chat request
        (``{}`` for ``"drop"``, ``{"preserve_thinking": True}`` for ``"keep"``)."""
        return {"preserve_thinking": True} if self.reasoning == "keep" else {}


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    """Prompt-cache forensics (:mod:`boxmaker.cache`)."""

    forensics: bool = True
    """After a cache loss, ask the server where the prompts diverged and why (a few extra
    requests after the completion, see :func:`boxmaker.cache._forensics.explain_loss`); ``False``
    records the loss without a cause."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """Every knob in one object. ``Config()`` gives working defaults."""

    client: ClientConfig = field(default_factory=ClientConfig)
    slots: SlotsConfig = field(default_factory=SlotsConfig)
    loop: LoopLimits = field(default_factory=LoopLimits)
    thinking: ThinkingConfig = field(default_factory=ThinkingConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    mcp: McpConfig = field(default_factory=McpConfig)
    approval: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    history: HistoryConfig = field(default_factory=HistoryConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    tap: TapConfig = field(default_factory=TapConfig)

    def __post_init__(self) -> None:
        moved = self.thinking.turn_tokens
        if moved is None:
            return
        if self.loop.thinking_tokens not in (None, moved):
            raise ConfigError(
                f"thinking.turn_tokens = {moved} and loop.thinking_tokens = "
                f"{self.loop.thinking_tokens} disagree: keep only loop.thinking_tokens"
            )
        object.__setattr__(self, "loop", dataclasses.replace(self.loop, thinking_tokens=moved))
        thinking = dataclasses.replace(self.thinking, turn_tokens=None)
        object.__setattr__(self, "thinking", thinking)

    def template_kwargs(self) -> dict[str, Any]:
        """The ``chat_template_kwargs`` of every chat request: ``enable_thinking``
        (:attr:`ThinkingConfig.enabled`), and ``preserve_thinking`` with
        ``history.reasoning = "keep"``."""
        return {"enable_thinking": self.thinking.enabled, **self.history.template_kwargs()}

    def changed(self) -> dict[str, dict[str, Any]]:
        """The fields that differ from their defaults, shaped like the TOML file (section ->
        key -> value): :meth:`from_dict` of them gives this config back."""
        out: dict[str, dict[str, Any]] = {}
        for section in dataclasses.fields(self):
            value = getattr(self, section.name)
            default = type(value)()
            changed = {
                f.name: getattr(value, f.name)
                for f in dataclasses.fields(value)
                if getattr(value, f.name) != getattr(default, f.name)
            }
            if changed:
                out[section.name] = changed
        return out

    def with_settings(self, settings: Mapping[str, Any], *, source: str = "settings") -> Config:
        """This config with dotted settings laid on top (``{"loop.tool_iterations": 2}``, as
        ``--set KEY=VALUE`` and the batch grid name them), checked as a TOML file is
        (:meth:`from_dict`: types, ranges, renamed keys).

        Raises:
            ConfigError: a key that is not ``section.key``, an unknown one, or a value of the
                wrong type or range.
        """
        data: dict[str, Any] = self.changed()
        for key, value in settings.items():
            section_name, _, name = key.partition(".")
            if not name:
                raise ConfigError(f"{source}: {key!r} is not a section.key config name")
            data.setdefault(section_name, {})[name] = value
        return Config.from_dict(data, source=source)

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
        hints = type_hints(cls, globals())
        data = _moved_turn_tokens(data, source)
        for name, value in data.items():
            if name not in hints:
                raise ConfigError(f"{source}: unknown section [{name}]{did_you_mean(name, hints)}")
            if not isinstance(value, dict):
                raise ConfigError(f"{source}: [{name}] must be a table")
            sections[name] = build(hints[name], value, f"{source}: [{name}]", globals())
        return cls(**sections)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Load a :class:`Config` from a TOML file (see the module docstring for the layout).

    Raises:
        ConfigError: unreadable or invalid file (also one nested too deeply for the parser,
            about 300 levels), unknown key, wrong type, or a value out of range (durations:
            finite, at most :data:`boxmaker.config._checks.MAX_SECONDS`). The message names the
            file.
    """
    return Config.from_dict(read_toml(path), source=str(Path(path)))


def _moved_turn_tokens(data: dict[str, Any], source: str) -> dict[str, Any]:
    """``[thinking] turn_tokens`` moved to ``[loop] thinking_tokens``, with a FutureWarning."""
    thinking = data.get("thinking")
    if not isinstance(thinking, dict) or "turn_tokens" not in thinking:
        return data
    value = thinking["turn_tokens"]
    where = f"{source}: [thinking]"
    if not fits(int, value):
        raise ConfigError(f"{where}: turn_tokens = {value!r} is not of type int")
    if value < 0:
        raise ConfigError(f"{where}: thinking.turn_tokens = {value!r} is out of range")
    loop = data.get("loop", {})
    if not isinstance(loop, dict):
        return data  # Config.from_dict names the bad [loop]
    if loop.get("thinking_tokens", value) != value:
        raise ConfigError(f"{where}: turn_tokens and [loop] thinking_tokens disagree")
    warnings.warn(
        f"{where}: turn_tokens is deprecated, write [loop] thinking_tokens = {value}",
        FutureWarning,
        stacklevel=4,
    )
    rest = {k: v for k, v in thinking.items() if k != "turn_tokens"}
    return {**data, "thinking": rest, "loop": {**loop, "thinking_tokens": value}}
