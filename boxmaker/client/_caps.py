"""What a llama-server can do, read from its ``GET /props`` answer (pure: JSON in, record out).

llama.cpp's server README documents ``/props``: ``chat_template_caps`` (the chat template's
``supports_tools``, ``supports_tool_calls``, ``supports_parallel_tool_calls``,
``supports_system_role``, ``supports_preserve_reasoning``...), ``total_slots``,
``default_generation_settings.n_ctx`` (tokens one slot may hold), ``chat_template`` (the
template text), ``model_alias`` / ``model_path``. Builds differ in what else they expose
(``kv_unified``, ``n_swa``, ``cache_ram_mib`` at the top level or under
``default_generation_settings``); what a build does not send stays ``None`` and ``detail``
says so, so that nothing is assumed (the build of 2026-10 sends none of the three). Where
``/props`` does not give ``n_swa`` and ``model_path`` names a GGUF file on this machine (the
embedded server, a local llama-server), the window is read from that file's header
(:func:`boxmaker.model.sliding_window`: Gemma 3's 512); only a window found there is taken.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..model import sliding_window
from ..records import Capabilities

__all__ = ["REASONING_MARKS", "capabilities_of"]

REASONING_MARKS = ("reasoning_content", "<think>", "thinking")
"""Words a chat template that renders reasoning contains (Qwen3/DeepSeek ``<think>`` and
``reasoning_content``, gpt-oss ``thinking``); a template with none of them renders none."""

_CAPS = (
    "supports_tools",
    "supports_tool_calls",
    "supports_parallel_tool_calls",
    "supports_system_role",
    "supports_preserve_reasoning",
)


def _flag(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _count(value: object) -> int | None:
    return value if type(value) is int and value >= 0 else None


def capabilities_of(props: object) -> Capabilities | None:
    """The :class:`~boxmaker.records.Capabilities` a ``GET /props`` answer states.

    Args:
        props: the parsed JSON answer.

    Returns:
        The record (fields the answer does not give are ``None``; ``detail`` names the ones
        llama.cpp builds may or may not expose), or ``None`` when the answer states nothing
        boxmaker reads (not an object, or none of the fields: not a llama-server's ``/props``).
    """
    if not isinstance(props, Mapping):
        return None
    caps = props.get("chat_template_caps")
    caps = caps if isinstance(caps, Mapping) else {}
    settings = props.get("default_generation_settings")
    settings = settings if isinstance(settings, Mapping) else {}

    def either(name: str) -> Any:
        return props.get(name, settings.get(name))

    found: dict[str, Any] = {name: _flag(caps.get(name)) for name in _CAPS}
    template = props.get("chat_template")
    thinking = _flag(caps.get("supports_thinking"))
    if thinking is None and isinstance(template, str) and template:
        thinking = any(mark in template for mark in REASONING_MARKS)
    model = props.get("model_alias") or props.get("model_path")
    found.update(
        reasoning=thinking,
        slots=_count(props.get("total_slots")),
        n_ctx=_count(settings.get("n_ctx")),
        kv_unified=_flag(either("kv_unified")),
        n_swa=_count(either("n_swa")),
        cache_ram_mib=_count(either("cache_ram_mib")),
        model=str(model) if isinstance(model, str) and model else None,
    )
    if all(value is None for value in found.values()):
        return None
    unknown = [name for name in ("kv_unified", "n_swa", "cache_ram_mib") if found[name] is None]
    from_file = ""
    path = props.get("model_path")
    if found["n_swa"] is None and isinstance(path, str) and path:
        found["n_swa"] = sliding_window(path)
        if found["n_swa"] is not None:
            unknown.remove("n_swa")
            from_file = f"n_swa {found['n_swa']} read from the model file {path}"
    if not caps:
        unknown.insert(0, "chat_template_caps")
    said = [f"/props does not say: {', '.join(unknown)}"] if unknown else []
    detail = "; ".join([*said, *([from_file] if from_file else [])])
    return Capabilities(**found, detail=detail)
