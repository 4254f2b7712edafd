"""The readable cassette format: vcrpy's cassette dict to YAML people can read, and back.

A cassette is vcrpy's YAML file of request/response interactions (vcrpy's cassette model:
``version``, ``interactions``, each a ``request`` and a ``response``), written so people can
read it:

- request bodies are stored parsed (``body_json``: a YAML mapping, not an escaped string);
- llama.cpp's Server-Sent Events streams (WHATWG SSE; each event one ``data: {json}`` line
  holding an OpenAI ``chat.completion.chunk``, then ``data: [DONE]``) are stored as a literal
  block with one event a line (``body.sse``): the blank line that ends each event is dropped
  on save and restored on load; the unterminated tail of a stream cut mid-event is kept apart
  (``body.partial``); a stream holding a character YAML reads as a line break (``\\r``,
  U+0085, U+2028, U+2029) is stored as a list, one event an item;
- JSON answers (llama.cpp's error bodies, the reasoning-control answer) are stored as a
  mapping (``body.json``) when that gives back the same bytes, other bodies as ``body.text``
  (or ``body.base64`` when not UTF-8);
- a ``Content-Encoding`` header found in a cassette is dropped on load (bodies are stored
  decoded), so replay never decodes twice;
- every string comes back byte for byte: one holding a character a YAML literal block or
  plain scalar would not give back (line breaks other than ``\\n``, control characters, a byte
  order mark) is written double-quoted, with YAML's escapes.

A file that is not valid YAML or not shaped like a cassette raises
:class:`~boxmaker.errors.CassetteError` naming the file, whether it is read by
:func:`load_interactions` or loaded by vcrpy (:class:`FilePersister`).

What is scrubbed before a cassette is written is :mod:`boxmaker.cassettes`.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import yaml
from vcr.persisters.filesystem import CassetteNotFoundError, FilesystemPersister
from vcr.serialize import deserialize as vcr_deserialize

from ..errors import CassetteError

__all__ = ["FilePersister", "compact", "load_interactions", "serializer"]

_SSE = "text/event-stream"


_YAML_PRINTABLE = re.compile(
    "[\t\n\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]*"
)
"""Text a YAML literal block or plain/single-quoted scalar gives back unchanged: YAML 1.1's
printable characters (PyYAML's reader) without the ones YAML reads as line breaks (``\\r``,
U+0085 NEL, U+2028 LINE SEPARATOR, U+2029 PARAGRAPH SEPARATOR: a literal block turns them into
``\\n``, a quoted scalar folds a lone one into a space) and without U+FEFF (a byte order mark)."""


def _not_yaml(text: str, exc: yaml.YAMLError) -> str:
    """The message for a file YAML cannot read: a session log (JSON Lines, each line an object
    with a ``type``) is named as one; otherwise the line and column where YAML failed."""
    lines = [line for line in text.splitlines()[:2] if line.strip()]
    try:
        first = [json.loads(line) for line in lines]
    except ValueError:
        first = []
    if len(first) > 1 and all(isinstance(r, dict) and "type" in r for r in first):
        return (
            "not a cassette: this is a session log (JSON Lines); a cassette is the YAML file "
            "use_cassette or --record-mode wrote"
        )
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (str(exc) if type(exc) is yaml.YAMLError else "")
    problem = problem or "not YAML"
    return f"not a readable cassette: invalid YAML{where} ({problem})"


MAX_ALIASES = 16
"""YAML aliases (``*name``) one cassette may hold. boxmaker writes none; a few in a cassette
edited by hand are fine, but aliases of aliases ("billion laughs": 9 levels of 9 give 9**9
copies) expand to gigabytes when the data is walked; 16 aliases expand a document at most
about 400 times."""

MAX_DEPTH = 64
"""Deepest nesting of YAML collections in a cassette (boxmaker writes about 8); deeper
nesting would overflow Python's recursion on the way in."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with :data:`MAX_ALIASES` and :data:`MAX_DEPTH` enforced as the
    document is composed (before anything is built), as :class:`yaml.YAMLError`; ``aliases``
    and ``depth`` are what came before ``stream`` (one interaction of a longer document)."""

    def __init__(self, stream: str, *, aliases: int = 0, depth: int = 0) -> None:
        super().__init__(stream)
        self._aliases = aliases
        self._depth = depth

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.YAMLError(f"more than {MAX_ALIASES} YAML aliases (an alias bomb?)")
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.YAMLError(f"YAML nested deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _safe_load(text: str) -> Any:
    """``text`` read as YAML by :class:`_BoundedLoader`: a cassette in the layout boxmaker
    writes one interaction at a time (:func:`_load_items`), any other document whole."""
    data = _load_items(text)
    return data if data is not None else _load_whole(text)


def _load_whole(text: str, *, aliases: int = 0, depth: int = 0) -> Any:
    loader = _BoundedLoader(text, aliases=aliases, depth=depth)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


_CSafeLoader: Any = getattr(yaml, "CSafeLoader", None)
"""libyaml's loader when PyYAML was built with it (its wheels are): about 6 times faster than
the pure-Python one; used for an interaction whose tokens show nothing the bounds are for."""

_MARKED = (yaml.AliasToken, yaml.AnchorToken, yaml.TagToken)
_OPEN = (
    yaml.BlockMappingStartToken,
    yaml.BlockSequenceStartToken,
    yaml.FlowMappingStartToken,
    yaml.FlowSequenceStartToken,
)
_CLOSE = (yaml.BlockEndToken, yaml.FlowMappingEndToken, yaml.FlowSequenceEndToken)


def _load_item(text: str, aliases: int) -> tuple[Any, int]:
    """One interaction's YAML (a one-item list at the file's second level) and the aliases
    counted so far. With libyaml, its tokens are scanned first (in C): when it holds no
    alias, anchor or tag and nests well within :data:`MAX_DEPTH` (each counted level at most
    doubled by an indentless sequence), libyaml builds it; otherwise :class:`_BoundedLoader`
    does, which enforces the bounds exactly.

    Raises:
        yaml.YAMLError, ValueError, TypeError, RecursionError: it does not read."""
    if _CSafeLoader is not None:
        depth = deepest = 0
        plain = True
        for token in yaml.scan(text, Loader=_CSafeLoader):
            if isinstance(token, _MARKED):
                plain = False
                break
            if isinstance(token, _OPEN):
                depth += 1
                deepest = max(deepest, depth)
            elif isinstance(token, _CLOSE):
                depth -= 1
        if plain and 2 * deepest + 2 <= MAX_DEPTH:
            return yaml.load(text, Loader=_CSafeLoader), aliases
    loader = _BoundedLoader(text, aliases=aliases, depth=1)
    try:
        return loader.get_single_data(), loader._aliases
    finally:
        loader.dispose()


_HEAD = "version: 1\ninteractions:\n"
_ITEM = re.compile(r"^- ", re.MULTILINE)
_AFTER_ITEMS = re.compile(r"^(?!- |#|\s|$)", re.MULTILINE)


def _load_items(text: str) -> dict[str, Any] | None:
    """A cassette in the layout boxmaker writes (``version: 1``, ``interactions:``, then one
    ``- `` item at column 0 per interaction, maybe more keys after) read one interaction at a
    time, with the same bounds (the aliases counted over the whole file, the depth from the
    file's root); ``None`` when the text is not in that layout or any part of it does not
    read alone (an alias to another interaction's anchor, a quoted text cut by the split):
    then the caller reads it whole, which says what is wrong where.

    Why: the whole document composed at once held every node of every interaction (a
    200,000-interaction cassette took 1.5 GB to read); one at a time holds one."""
    if not text.startswith(_HEAD + "- "):
        return None
    body = text[len(_HEAD) :]
    after = _AFTER_ITEMS.search(body)
    items_end = after.start() if after else len(body)
    starts = [m.start() for m in _ITEM.finditer(body, 0, items_end)]
    interactions: list[Any] = []
    aliases = 0
    try:
        for start, end in zip(starts, [*starts[1:], items_end], strict=True):
            item, aliases = _load_item(body[start:end], aliases)
            if not (isinstance(item, list) and len(item) == 1):
                return None
            interactions.append(item[0])
        rest = _load_whole(_HEAD + body[items_end:], aliases=aliases)
    except (yaml.YAMLError, ValueError, TypeError, RecursionError):
        return None
    if not isinstance(rest, dict) or rest.get("interactions") is not None:
        return None
    rest["interactions"] = interactions
    return rest


_SafeDumper: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
"""libyaml's emitter when PyYAML was built with it (its wheels are): the same text, about 25
times faster than PyYAML's pure-Python one on a long stream's literal block (0.26 s -> 0.01 s
for a 1,009-event answer), which matters where a cassette is written while traffic flows
(``boxmaker tap --cassette``)."""


class _Dumper(_SafeDumper):  # type: ignore[valid-type,misc]
    """A safe YAML dumper that writes multi-line strings as literal blocks, and any string
    holding a character YAML would not give back (:data:`_YAML_PRINTABLE`) double-quoted, where
    YAML escapes it (``\\N``, ``\\L``, ``\\P``, ``\\r``, ``\\x00``...)."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if not _YAML_PRINTABLE.fullmatch(data):
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
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
            block = "\n".join(parts) + "\n"
            # a block holding a character YAML reads as a line break is stored one event a
            # list item instead, so only those events are written escaped
            out: dict[str, Any] = {"sse": block if _YAML_PRINTABLE.fullmatch(block) else parts}
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
        sse = body["sse"]
        if isinstance(sse, list):
            lines = [str(event) for event in sse]
        else:
            lines = [line for line in str(sse or "").split("\n") if line]
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


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
"""A JSON escape of a UTF-16 surrogate: a request body that may decode to a lone one, which
no YAML (UTF-8) can hold: it broke the serializer, and the tap's cassette stopped."""


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
                value = json.loads(raw) if raw else None
                if raw and _SURROGATE.search(raw):  # YAML is UTF-8: a lone surrogate
                    compact(value).encode()  # (\ud83d) stays text
                request["body_json"] = value
            except ValueError:  # UnicodeEncodeError too
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
        """YAML text -> vcrpy's cassette dict (bodies as bytes, ``Content-Encoding`` dropped).

        Raises:
            CassetteError: not valid YAML (also: more than :data:`MAX_ALIASES` aliases,
                nesting deeper than :data:`MAX_DEPTH`, a tagged value that is not of its tag
                such as ``!!float x``), or not shaped like a cassette (the message says where;
                the caller adds the file name).
        """
        try:
            data = _safe_load(cassette_string)
        except yaml.YAMLError as exc:
            raise CassetteError(_not_yaml(cassette_string, exc)) from exc
        except (ValueError, TypeError, RecursionError) as exc:  # a tag's value: !!float x
            raise CassetteError(f"not a readable cassette: {type(exc).__name__}: {exc}") from exc
        problem = _shape_problem(data)
        if problem:
            raise CassetteError(f"not a cassette: {problem}")
        try:
            return _from_yaml(data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CassetteError(f"not a readable cassette: {type(exc).__name__}: {exc}") from exc


def _shape_problem(data: Any) -> str | None:
    """What keeps parsed YAML from being a cassette (``None``: nothing)."""
    if not isinstance(data, dict) or not isinstance(data.get("interactions"), list):
        return "no 'interactions' list"
    for number, item in enumerate(data["interactions"], 1):
        request = item.get("request") if isinstance(item, dict) else None
        response = item.get("response") if isinstance(item, dict) else None
        if not isinstance(request, dict) or not isinstance(response, dict):
            return f"interaction {number} is not a mapping with a request and a response"
        if not isinstance(request.get("method"), str) or not isinstance(request.get("uri"), str):
            return f"request {number} has no method or uri"
        problem = _url_problem(request["uri"])
        if problem is not None:
            return f"request {number}'s uri {request['uri'][:200]!r} is not a URL: {problem}"
        for part, name in ((request, "headers"), (response, "headers"), (response, "body")):
            if not isinstance(part.get(name) or {}, dict):
                return f"interaction {number}: {name} is not a mapping"
        for part in (request, response):
            for name, value in (part.get("headers") or {}).items():
                values = value if isinstance(value, list) else [value]
                if not values or not all(isinstance(v, str | int | float) for v in values):
                    return f"interaction {number}: header {str(name)[:40]!r} has no text value"
        status = response.get("status") or {}
        code = status.get("code", 200) if isinstance(status, dict) else None
        if type(code) is not int or not 100 <= code <= 599:
            return f"interaction {number}: the response status has no HTTP code (100-599)"
        if not isinstance(status.get("message", ""), str | None):
            return f"interaction {number}: the response status message is not text"
    return None


def _from_yaml(data: dict[str, Any]) -> dict[str, Any]:
    """Parsed YAML of the readable form (its shape checked) -> vcrpy's cassette dict."""
    interactions = []
    for item in data["interactions"]:
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


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CassetteError(f"{path}: not a readable cassette: not UTF-8 ({exc})") from exc
    except OSError as exc:
        raise CassetteError(f"{path}: cannot read the cassette: {exc}") from exc


def load_interactions(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The interactions of a cassette file as plain data, for reading and checking.

    Each item is ``{"request": {"method", "uri", "headers", "body"}, "response": {"status",
    "headers", "body", "error"?}}`` with both bodies as bytes (SSE blank lines restored).

    Raises:
        CassetteError: the file does not exist, is not UTF-8 or valid YAML, or is not shaped
            like a cassette (a request without a method, or whose ``uri`` is not a URL); the
            message starts with the file name.
    """
    p = Path(path)
    text = _read(p)
    try:
        data = serializer.deserialize(text)
    except CassetteError as exc:
        raise CassetteError(f"{p}: {exc}") from exc
    return list(data["interactions"])


@functools.lru_cache(maxsize=256)
def _url_problem(uri: str) -> str | None:
    """Why ``uri`` cannot be read as a URL by httpx or by vcrpy (the standard library's
    parser, also for its port), ``None`` when both can; kept for the next request to the same
    URL (a cassette's requests go to a handful)."""
    try:
        httpx.URL(uri)
        urllib.parse.urlsplit(uri).port  # noqa: B018 - raises ValueError on a bad port
    except (httpx.InvalidURL, ValueError) as exc:
        return str(exc)
    return None


class FilePersister:
    """vcrpy persister (``load_cassette``, ``save_cassette``) that refuses a broken cassette.

    vcrpy's own file persister lets the serializer's errors through as they are (a YAML
    error, a ``KeyError``, its ``ValueError`` for an unknown YAML tag) and treats a file that
    is not UTF-8 as an empty cassette, which recording may then overwrite. This one raises
    :class:`~boxmaker.errors.CassetteError` naming the file instead. A missing or empty file
    is a missing cassette, as in vcrpy.
    """

    @staticmethod
    def load_cassette(cassette_path: str | os.PathLike[str], serializer: Any) -> Any:
        """``(requests, responses[, metadata])`` of the cassette at ``cassette_path``.

        Raises:
            CassetteNotFoundError: (vcrpy's) no such file, or an empty one.
            CassetteError: the file is not a readable cassette.
        """
        p = Path(cassette_path)
        if not p.is_file():
            raise CassetteNotFoundError()
        text = _read(p)
        if not text.strip():
            raise CassetteNotFoundError()
        try:
            return vcr_deserialize(text, serializer)
        except CassetteError as exc:
            raise CassetteError(f"{p}: {exc}") from exc
        except (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CassetteError(f"{p}: not a readable cassette: {exc}") from exc

    @staticmethod
    def save_cassette(
        cassette_path: str | os.PathLike[str], cassette_dict: Any, serializer: Any
    ) -> None:
        """Write the cassette (vcrpy's file persister)."""
        FilesystemPersister.save_cassette(cassette_path, cassette_dict, serializer=serializer)
