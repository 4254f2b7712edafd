"""Tool calls written into ``content``: the server's parser did not know the model's format.

llama-server turns a model's tool-call text into ``delta.tool_calls`` only when it knows the
format, from the chat template (``--jinja``) it runs; otherwise the call arrives as plain
content, and a loop that takes content as the answer silently drops the call. The formats
seen in public reports (the markup is the models' own, from their chat templates):

- ``harmony``: gpt-oss, ``<|channel|>commentary to=functions.NAME <|constrain|>json
  <|message|>{...}<|call|>``;
- ``qwen3_coder``: Qwen3-Coder's XML, ``<tool_call><function=NAME><parameter=KEY>value
  </parameter></function></tool_call>``;
- ``hermes``: Hermes, Qwen 2.5/3 and most ChatML tool templates, ``<tool_call>{"name": NAME,
  "arguments": {...}}</tool_call>``;
- ``llama3``: Llama 3.x (its template's custom-tool format), the whole content one JSON
  object ``{"name": NAME, "parameters": {...}}``, maybe after ``<|python_tag|>``;
- ``mistral``: Mistral, ``[TOOL_CALLS][{"name": NAME, "arguments": {...}}]``.

:func:`find_text_tool_call` looks for each in the whole content (so a tag split across
deltas is found). Pure logic.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["TEXT_TOOL_CALL_FORMATS", "TextToolCall", "find_text_tool_call"]

_HARMONY = re.compile(r"<\|channel\|>\s*commentary\s+to=functions\.([A-Za-z0-9_.\-]+)")
_HARMONY_MESSAGE = "<|message|>"
_QWEN3_CODER = re.compile(r"<function=([^>\s]+)>")
_HERMES = re.compile(r"<tool_call>\s*(\{.*?)(?:</tool_call>|$)", re.DOTALL)
_LLAMA3 = re.compile(
    r'\A\s*(?:<\|python_tag\|>)?\s*\{\s*"name"\s*:\s*"([^"]+)"\s*,\s*"parameters"\s*:'
)
_MISTRAL = re.compile(r'\[TOOL_CALLS\]\s*\[?\s*\{\s*"name"\s*:\s*"([^"]+)"')

TEXT_TOOL_CALL_FORMATS = {
    "harmony": (
        "gpt-oss harmony",
        "run llama-server with --jinja and gpt-oss's own chat template (llama.cpp parses "
        "harmony tool calls only from it; a template passed with --chat-template-file must "
        "be the model's); a proxy in front must pass the request through unchanged",
    ),
    "qwen3_coder": (
        "Qwen3-Coder XML",
        "run llama-server with --jinja and Qwen3-Coder's own chat template (its XML tool "
        "calls are parsed only from that template; update llama.cpp if it predates the "
        "Qwen3-Coder parser)",
    ),
    "hermes": (
        "Hermes <tool_call>",
        "run llama-server with --jinja and a chat template that declares tools "
        "(--chat-template-file with the model's tool-calling template when the GGUF's lacks "
        "it; GET /props shows chat_template_caps.supports_tool_calls)",
    ),
    "llama3": (
        "Llama 3.x JSON",
        "run llama-server with --jinja and the model's Llama 3.x chat template (llama.cpp "
        "parses its JSON calls only when the template renders <|start_header_id|>ipython)",
    ),
    "mistral": (
        "Mistral [TOOL_CALLS]",
        "run llama-server with --jinja and the model's Mistral chat template (with "
        "[AVAILABLE_TOOLS]; GET /props shows chat_template_caps.supports_tool_calls)",
    ),
}
"""Each format's key -> (its name for people, the llama-server flag or template that fixes it)."""


@dataclass(frozen=True, kw_only=True)
class TextToolCall:
    """A tool call found written in content.

    Attributes:
        format: ``"harmony"``, ``"qwen3_coder"``, ``"hermes"``, ``"llama3"`` or ``"mistral"``
            (:data:`TEXT_TOOL_CALL_FORMATS`).
        name: the tool named in the markup (``""`` when it could not be read).
        label: the format's name for people (``"gpt-oss harmony"``...).
        fix: the llama-server flag or template that makes the server parse it.
    """

    format: str
    name: str
    label: str
    fix: str

    def describe(self) -> str:
        """One line: ``"a gpt-oss harmony tool call to get_weather written in content"``."""
        to = f" to {self.name}" if self.name else ""
        return f"a {self.label} tool call{to} written in content"


def find_text_tool_call(content: str | None) -> TextToolCall | None:
    """The first tool call written in ``content`` (a completion's whole content, all deltas
    joined), or ``None``.

    Harmony needs ``<|channel|>commentary to=functions.NAME`` followed by ``<|message|>``;
    Qwen3-Coder ``<function=NAME>``; Hermes ``<tool_call>`` followed by a JSON object (its
    ``name`` read when the object is whole); Llama 3.x a content that is, from its start, an
    object with ``"name"`` then ``"parameters"``; Mistral ``[TOOL_CALLS]`` before such an
    object. Prose that merely mentions a tag (``"use <tool_call>"``) is no call.
    """
    if not content:
        return None
    found = _LLAMA3.search(content)
    if found is not None:
        return _call("llama3", found[1])
    found = _MISTRAL.search(content)
    if found is not None:
        return _call("mistral", found[1])
    if "<" not in content:
        return None
    found = _HARMONY.search(content)
    if found is not None and _HARMONY_MESSAGE in content[found.end() :]:
        return _call("harmony", found[1])
    found = _QWEN3_CODER.search(content)
    if found is not None:
        return _call("qwen3_coder", found[1])
    found = _HERMES.search(content)
    if found is not None:
        return _call("hermes", _hermes_name(found[1]))
    return None


def _call(key: str, name: str) -> TextToolCall:
    label, fix = TEXT_TOOL_CALL_FORMATS[key]
    return TextToolCall(format=key, name=name, label=label, fix=fix)


def _hermes_name(text: str) -> str:
    try:
        obj, _ = json.JSONDecoder().raw_decode(text)
    except ValueError:
        match = re.search(r'"name"\s*:\s*"([^"]+)"', text)
        return match[1] if match else ""
    name = obj.get("name") if isinstance(obj, dict) else None
    return name if isinstance(name, str) else ""
