"""The readable cassette format: vcrpy's cassette dict to YAML people can read, and back.

A cassette is vcrpy's YAML file of request/response interactions (vcrpy's cassette model:
``version``, ``interactions``, each a ``request`` and a ``response``), written so people can
read it:

- request bodies are stored parsed (``body_json``: a YAML mapping, not an escaped string);
- llama.cpp's Server-Sent Events streams (WHATWG SSE; each event one ``data: {json}`` line
  holding an OpenAI ``chat.completion.chunk``, then ``data: [DONE]``) are stored as a literal
  block with one event a line (``body.sse``): the blank line that ends each event is dropped
  on save and restored on load; the unterminated tail of a stream cut mid-event is kept apart
  (``body.partial``);
- JSON answers (llama.cpp's error bodies, the reasoning-control answer) are stored as a
  mapping (``body.json``) when that gives back the same bytes, other bodies as ``body.text``
  (or ``body.base64`` when not UTF-8);
- a ``Content-Encoding`` header found in a cassette is dropped on load (bodies are stored
  decoded), so replay never decodes twice.

What is scrubbed before a cassette is written is :mod:`boxmaker.cassettes.scrub`.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from ..errors import CassetteError

__all__ = ["compact", "load_interactions", "serializer"]

_SSE = "text/event-stream"


class _Dumper(yaml.SafeDumper):
    """A safe YAML dumper that writes multi-line strings as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_representer)


def _content_type(headers: Mapping[str, Any]) -> str:
    for name, value in headers.items():
        if name.lower() == "content-type":
            first = value[0] if isinstance(value, list) and value else value
            return str(first).lower()
    return ""


def _body_to_yaml(raw: str | bytes | None, content_type: str) -> dict[str, Any]:
    """A response body as its readable form: ``sse`` (+ ``partial``), ``json``, ``text`` or
    ``base64`` (see the module docstring)."""
    if raw is None:
        return {"text": ""}
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
        raw = text
    if _SSE in content_type or raw.startswith("data:"):
        parts = raw.split("\n\n")
        tail = parts.pop()
        if parts and all(p and "\n" not in p and "\r" not in p for p in parts) and "\n" not in tail:
            out: dict[str, Any] = {"sse": "\n".join(parts) + "\n"}
            if tail:
                out["partial"] = tail
            return out
    if "json" in content_type:
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = None
        if parsed is not None and compact(parsed) == raw:
            return {"json": parsed}
    return {"text": raw}


def _body_from_yaml(body: Mapping[str, Any]) -> bytes:
    """The bytes of a response body stored by :func:`_body_to_yaml` (also vcrpy's ``string``)."""
    if "sse" in body:
        lines = [line for line in str(body["sse"] or "").split("\n") if line]
        return ("".join(f"{line}\n\n" for line in lines) + str(body.get("partial") or "")).encode()
    if "json" in body:
        return compact(body["json"]).encode()
    if "base64" in body:
        return base64.b64decode(body["base64"])
    value = body.get("text", body.get("string", ""))
    return value if isinstance(value, bytes) else str(value or "").encode()


def compact(value: Any) -> str:
    """``value`` as compact JSON text (no spaces, non-ASCII kept): the form llama.cpp's JSON
    answers and the matcher compare by."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class _ReadableSerializer:
    """vcrpy serializer (``serialize(dict) -> str``, ``deserialize(str) -> dict``) writing the
    readable YAML of the module docstring; it reads vcrpy's own ``body.string`` form too."""

    @staticmethod
    def serialize(cassette_dict: dict[str, Any]) -> str:
        """vcrpy's cassette dict (``version``, ``interactions``, ``metadata``) -> YAML text."""
        out = []
        for item in cassette_dict["interactions"]:
            request = dict(item["request"])
            body = request.pop("body", None)
            raw = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            try:
                request["body_json"] = json.loads(raw) if raw else None
            except ValueError:
                request["body"] = raw
            response = dict(item["response"])
            headers = response.get("headers") or {}
            response["body"] = _body_to_yaml(response["body"]["string"], _content_type(headers))
            out.append({"request": request, "response": response})
        data: dict[str, Any] = {"version": cassette_dict.get("version", 1), "interactions": out}
        if cassette_dict.get("metadata"):
            data["metadata"] = cassette_dict["metadata"]
        return str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100))

    @staticmethod
    def deserialize(cassette_string: str) -> dict[str, Any]:
        """YAML text -> vcrpy's cassette dict (bodies as bytes, ``Content-Encoding`` dropped)."""
        data = yaml.safe_load(cassette_string) or {}
        interactions = []
        for item in data.get("interactions") or []:
            request = dict(item["request"])
            request.setdefault("headers", {})
            if "body_json" in request:
                body = request.pop("body_json")
                request["body"] = None if body is None else json.dumps(body).encode("utf-8")
            elif isinstance(request.get("body"), str):
                request["body"] = request["body"].encode("utf-8")
            else:
                request.setdefault("body", None)
            response = dict(item["response"])
            headers = {
                k: v if isinstance(v, list) else [v]
                for k, v in (response.get("headers") or {}).items()
                if k.lower() != "content-encoding"  # bodies are stored decoded
            }
            response["headers"] = headers
            response.setdefault("status", {"code": 200, "message": "OK"})
            response["body"] = {"string": _body_from_yaml(response.get("body") or {})}
            interactions.append({"request": request, "response": response})
        out = {"version": data.get("version", 1), "interactions": interactions}
        if data.get("metadata"):
            out["metadata"] = data["metadata"]
        return out


serializer = _ReadableSerializer()
"""The readable serializer, registered as ``"boxmaker"`` on :func:`make_vcr`'s VCR."""


def load_interactions(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The interactions of a cassette file as plain data, for reading and checking.

    Each item is ``{"request": {"method", "uri", "headers", "body"}, "response": {"status",
    "headers", "body", "error"?}}`` with both bodies as bytes (SSE blank lines restored).

    Raises:
        CassetteError: the file does not exist or is not a cassette.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        raw = yaml.safe_load(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("interactions"), list):
            raise CassetteError(f"{p}: not a cassette (no 'interactions' list)")
        data = serializer.deserialize(text)
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as exc:
        raise CassetteError(f"{p}: not a readable cassette: {exc}") from exc
    return list(data["interactions"])
