"""Record and replay inference traffic with vcrpy: live recording, readable files, no secrets.

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
- a compressed response is stored decoded and without its ``Content-Encoding`` header, and
  a ``Content-Encoding`` header found in a cassette is dropped on load, so replay never
  decodes twice;
- only the ``Accept`` and ``Content-Type`` headers are kept: credentials (``Authorization``,
  api-key headers, cookies) and volatile headers (``Date``, ``Server``...) never reach the
  file, and the configured api key (``secrets``) is replaced by ``<API_KEY>`` wherever it
  appears (a body, the URI).

Recording passes the stream on as it arrives. vcrpy's own httpx stub reads a whole response
before handing it over, which would freeze the widgets, Stop, and the thinking cap (it must
send ``reasoning_end`` while reasoning streams). Here the sync httpx transports
(``HTTPTransport``, ``MockTransport``) are patched instead: a response to record gets its
stream teed into a buffer, and the interaction is appended to vcrpy's cassette when the
response ends (read to the end, closed by the client, or broken: then what arrived is kept
with the error in ``response.error``, and replay raises the same httpx error after the same
bytes). Interactions are therefore stored in the order their responses ended: a
reasoning-control request sent during a stream comes before that stream's interaction.

Requests match on method, path and body compared as parsed JSON (key order and white space do
not matter; host and port do not, so a recording from one embedded server replays against
another URL). Each interaction plays once, the first unplayed match first. In record mode
``none`` (the default, used in CI) no real request is made: a request with no match fails at
once with a :class:`~boxmaker.errors.CassetteError` naming the cassette, the request's number
and the first differing place in the body, e.g. ``messages[5].content``.

Example::

    with use_cassette("cassettes/demo.yaml", record_mode="none"):
        run_turn(session, runtime, "What is the weather in Lisbon?")

The pytest side (fixture, marker, ``--record-mode``) is :mod:`boxmaker.pytest_plugin`; the
command line (``boxmaker cassette show|check``, ``boxmaker replay``) is at the end of this
module.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal
from unittest import mock

import httpx
import vcr
import yaml
from vcr.request import Request as VcrRequest

from .errors import CassetteError, InferError
from .stream import StreamDecoder

__all__ = [
    "API_KEY_PLACEHOLDER",
    "CHAT_PATH",
    "MISSING",
    "RECORD_MODES",
    "SECRET_HEADERS",
    "SECRET_QUERY_PARAMETERS",
    "RecordMode",
    "RecordedSession",
    "StreamReading",
    "UnrecordedRequest",
    "WhatIf",
    "cli_check",
    "cli_replay",
    "cli_show",
    "first_difference",
    "load_interactions",
    "make_vcr",
    "prefix_problems",
    "read_stream",
    "recorded_session",
    "serializer",
    "transcript",
    "unplayed_message",
    "use_cassette",
    "what_if",
]

RecordMode = Literal["none", "once", "new_episodes", "all"]
"""vcrpy's record modes: ``none`` replays only, ``once`` records a cassette that does not
exist yet, ``new_episodes`` replays what matches and records the rest, ``all`` re-records."""

RECORD_MODES: tuple[RecordMode, ...] = ("none", "once", "new_episodes", "all")
"""The record modes, in the order ``--record-mode`` lists them."""

SECRET_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "set-cookie",
    "proxy-authorization",
)
"""Request and response headers that are never written to a cassette (lower case)."""

SECRET_QUERY_PARAMETERS = ("api_key", "api-key", "key", "token", "access_token")
"""URI query parameters that are never written to a cassette."""

API_KEY_PLACEHOLDER = "<API_KEY>"
"""What replaces a configured secret (``use_cassette(secrets=...)``) in a cassette."""

_KEEP_HEADERS = ("content-type", "accept")
"""The only headers kept in a cassette; the rest (host, user-agent, content-length, date,
server, content-encoding...) are volatile noise or secrets."""

_SSE = "text/event-stream"


class UnrecordedRequest(CassetteError):
    """A request that matched no recorded interaction in a replay-only cassette.

    A :class:`~boxmaker.errors.CassetteError`; the message names the cassette, the request's
    number and the first differing place in its body.

    Attributes:
        number: the request's number among the requests made inside the cassette (from 1).
        method: its HTTP method.
        path: its URL path (``/v1/chat/completions``, ``.../control``).
    """

    def __init__(self, message: str, *, number: int, method: str, path: str) -> None:
        super().__init__(message)
        self.number = number
        self.method = method
        self.path = path


# --------------------------------------------------------------------------------------------
# the readable serializer


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
        if parsed is not None and _compact(parsed) == raw:
            return {"json": parsed}
    return {"text": raw}


def _body_from_yaml(body: Mapping[str, Any]) -> bytes:
    """The bytes of a response body stored by :func:`_body_to_yaml` (also vcrpy's ``string``)."""
    if "sse" in body:
        lines = [line for line in str(body["sse"] or "").split("\n") if line]
        return ("".join(f"{line}\n\n" for line in lines) + str(body.get("partial") or "")).encode()
    if "json" in body:
        return _compact(body["json"]).encode()
    if "base64" in body:
        return base64.b64decode(body["base64"])
    value = body.get("text", body.get("string", ""))
    return value if isinstance(value, bytes) else str(value or "").encode()


def _compact(value: Any) -> str:
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


# --------------------------------------------------------------------------------------------
# matching


_MISSING = object()


def first_difference(recorded: Any, sent: Any, where: str = "") -> tuple[str, Any, Any] | None:
    """Where two JSON values first differ: ``(place, recorded_part, sent_part)`` or ``None``.

    ``place`` is a path such as ``messages[5].content`` (``""`` for the whole value). Mappings
    are walked in the recorded key order, then keys only ``sent`` has; lists by index, then a
    length difference (``messages[7]`` missing on one side). A part missing on one side is
    :data:`MISSING`.
    """
    if recorded == sent and type(recorded) is type(sent):
        return None
    if isinstance(recorded, Mapping) and isinstance(sent, Mapping):
        for key in [*recorded, *(k for k in sent if k not in recorded)]:
            place = f"{where}.{key}" if where else str(key)
            a, b = recorded.get(key, _MISSING), sent.get(key, _MISSING)
            if a is _MISSING or b is _MISSING:
                return place, a, b
            found = first_difference(a, b, place)
            if found:
                return found
        return None
    if isinstance(recorded, list) and isinstance(sent, list):
        for i in range(max(len(recorded), len(sent))):
            place = f"{where}[{i}]"
            if i >= len(recorded) or i >= len(sent):
                a = recorded[i] if i < len(recorded) else _MISSING
                b = sent[i] if i < len(sent) else _MISSING
                return place, a, b
            found = first_difference(recorded[i], sent[i], place)
            if found:
                return found
        return None
    if recorded == sent:  # 1 == 1.0, True == 1: JSON-equal enough for matching
        return None
    return where, recorded, sent


MISSING = _MISSING
"""The marker :func:`first_difference` puts where one side has no such key or index."""


def _parse(body: Any) -> Any:
    if body is None or body == b"" or body == "":
        return None
    try:
        return json.loads(body)
    except (ValueError, TypeError):
        return body.decode("utf-8", "replace") if isinstance(body, bytes) else body


def _short(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    text = _compact(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(found: tuple[str, Any, Any]) -> str:
    place, recorded, sent = found
    return f"{place or 'the whole body'} (recorded {_short(recorded)}, sent {_short(sent)})"


def _body_for_matching(body: Any, ignore: Sequence[str]) -> Any:
    parsed = _parse(body)
    if ignore and isinstance(parsed, dict):
        return {k: v for k, v in parsed.items() if k not in ignore}
    return parsed


def _json_body_matcher(ignore: Sequence[str]) -> Callable[[VcrRequest, VcrRequest], None]:
    """vcrpy matcher: bodies equal as parsed JSON, leaving out the top-level keys ``ignore``
    (raises AssertionError naming the first differing place)."""

    def json_body(r1: VcrRequest, r2: VcrRequest) -> None:
        found = first_difference(
            _body_for_matching(r2.body, ignore), _body_for_matching(r1.body, ignore)
        )
        if found:
            raise AssertionError(f"bodies differ at {_describe(found)}")

    return json_body


# --------------------------------------------------------------------------------------------
# scrubbing


def _scrub_request(request: VcrRequest) -> VcrRequest:
    for name in list(request.headers):
        if name.lower() not in _KEEP_HEADERS:
            del request.headers[name]
    return request


def _scrub_response(response: dict[str, Any]) -> dict[str, Any]:
    headers = response.get("headers", {})
    response["headers"] = {k: v for k, v in headers.items() if k.lower() in _KEEP_HEADERS}
    return response


def make_vcr(
    record_mode: RecordMode = "none",
    *,
    secrets: Sequence[str] = (),
    ignore_body_keys: Sequence[str] = (),
) -> vcr.VCR:
    """A vcrpy ``VCR`` set up for llama-server traffic.

    Matching on method, path and JSON body; secret headers and query parameters filtered,
    each of ``secrets`` replaced by ``<API_KEY>`` (restored when the cassette is loaded with
    the same secrets); response headers reduced to ``Content-Type``; compressed responses
    stored decoded; the readable serializer; each interaction played once. vcrpy's own httpx
    patch is skipped: :func:`use_cassette` installs the streaming one.

    Args:
        record_mode: see :data:`RecordMode`.
        secrets: values (an api key) that must not appear anywhere in a cassette.
        ignore_body_keys: top-level request-body keys left out of matching (the what-if
            replay leaves out ``reasoning_control``, which only says a thinking cap is armed).
    """
    v = vcr.VCR(
        record_mode=record_mode,
        serializer="boxmaker",
        match_on=("method", "path", "json_body"),
        filter_headers=[(h, None) for h in SECRET_HEADERS],
        filter_query_parameters=[(q, None) for q in SECRET_QUERY_PARAMETERS],
        filter_sensitive_data=[(API_KEY_PLACEHOLDER, s) for s in secrets if s],
        before_record_request=_scrub_request,
        before_record_response=_scrub_response,
        decode_compressed_response=True,
        skip_patchers=("httpx",),
    )
    v.register_serializer("boxmaker", serializer)
    v.register_matcher("json_body", _json_body_matcher(tuple(ignore_body_keys)))
    return v


# --------------------------------------------------------------------------------------------
# the streaming record/replay transport patch


class _Tee(httpx.SyncByteStream):
    """A response stream passed on chunk by chunk while a copy is kept; ``on_end(body, error)``
    runs once, when the stream is exhausted, breaks, or is closed."""

    def __init__(
        self, inner: httpx.SyncByteStream, on_end: Callable[[bytes, Exception | None], None]
    ) -> None:
        self._inner = inner
        self._parts: list[bytes] = []
        self._on_end: Callable[[bytes, Exception | None], None] | None = on_end

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                self._parts.append(chunk)
                yield chunk
        except Exception as exc:
            self._end(exc)
            raise
        self._end(None)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._end(None)

    def _end(self, error: Exception | None) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(b"".join(self._parts), error)


class _Replay(httpx.SyncByteStream):
    """A recorded body played back one SSE event per chunk (like llama-server sends it),
    then the recorded transport error, if any."""

    def __init__(self, body: bytes, error: str | None) -> None:
        self._body = body
        self._error = error

    def __iter__(self) -> Iterator[bytes]:
        body = self._body
        start = 0
        while start < len(body):
            end = body.find(b"\n\n", start)
            end = len(body) if end < 0 else end + 2
            yield body[start:end]
            start = end
        if self._error:
            name, _, message = self._error.partition(": ")
            kind = getattr(httpx, name, None)
            if not (isinstance(kind, type) and issubclass(kind, httpx.TransportError)):
                kind, message = httpx.RemoteProtocolError, self._error
            raise kind(message)


def _replayed(recorded: Mapping[str, Any], request: httpx.Request) -> httpx.Response:
    status = recorded.get("status") or {}
    message = status.get("message")
    headers = [
        (name, str(value))
        for name, values in (recorded.get("headers") or {}).items()
        for value in (values if isinstance(values, list) else [values])
    ]
    body = recorded["body"]["string"] or b""
    return httpx.Response(
        int(status.get("code", 200)),
        headers=headers,
        stream=_Replay(
            body if isinstance(body, bytes) else str(body).encode(), recorded.get("error")
        ),
        extensions={"reason_phrase": str(message).encode("ascii")} if message else {},
        request=request,
    )


class _Run:
    """One open cassette: the vcrpy cassette, the requests seen, the no-match failures."""

    def __init__(self, cassette: Any, path: Path, ignore: Sequence[str] = ()) -> None:
        self.cassette = cassette
        self.path = path
        self.ignore = tuple(ignore)
        self.requests = 0
        self.failures: list[UnrecordedRequest] = []
        self.lock = threading.Lock()

    def handle(
        self,
        original: Callable[[Any, httpx.Request], httpx.Response],
        transport: Any,
        request: httpx.Request,
    ) -> httpx.Response:
        body = request.read()
        vreq = VcrRequest(request.method, str(request.url), body, dict(request.headers))
        with self.lock:
            self.requests += 1
            number = self.requests
            cassette = self.cassette
            if cassette.can_play_response_for(vreq):
                return _replayed(cassette.play_response(vreq), request)
            if cassette.write_protected and cassette.filter_request(vreq):
                error = UnrecordedRequest(
                    self.no_match(number, vreq), number=number, method=vreq.method, path=vreq.path
                )
                self.failures.append(error)
                raise error
        response = original(transport, request)
        if hasattr(response, "_content"):  # already read and decoded (MockTransport content=)
            self.record(vreq, response, response.content, None, decoded=True)
            return response
        stream = response.stream
        if isinstance(stream, httpx.SyncByteStream):
            response.stream = _Tee(
                stream, lambda data, error: self.record(vreq, response, data, error)
            )
        return response

    def record(
        self,
        vreq: VcrRequest,
        response: httpx.Response,
        body: bytes,
        error: Exception | None,
        *,
        decoded: bool = False,
    ) -> None:
        """Append one interaction: the body as it reached the client (decoded with httpx's
        own decoders, ``Content-Encoding`` dropped) and the error that broke it, if any."""
        if not decoded and "content-encoding" in response.headers:
            try:  # the same decoding httpx applied for the client (gzip, deflate, br, zstd)
                plain = httpx.Response(200, headers=response.headers, stream=httpx.ByteStream(body))
                body = plain.read()
                decoded = True
            except httpx.DecodingError:
                pass  # a compressed body cut mid-way is stored as it came
        headers: dict[str, list[str]] = {}
        for name, value in response.headers.multi_items():
            if not (decoded and name.lower() in ("content-encoding", "content-length")):
                headers.setdefault(name, []).append(value)
        data: dict[str, Any] = {
            "status": {"code": response.status_code, "message": response.reason_phrase},
            "headers": headers,
            "body": {"string": body},
        }
        if error is not None:
            data["error"] = f"{type(error).__name__}: {error}"
        with self.lock:
            self.cassette.append(vreq, data)

    def no_match(self, number: int, vreq: VcrRequest) -> str:
        what = f"{self.path}: request {number} ({vreq.method} {vreq.path}) matches no recorded"
        cassette = self.cassette
        unplayed = [i for i in range(len(cassette.data)) if cassette.play_counts[i] == 0]
        for i in unplayed:
            recorded = cassette.data[i][0]
            if recorded.method == vreq.method and recorded.path == vreq.path:
                found = first_difference(
                    _body_for_matching(recorded.body, self.ignore),
                    _body_for_matching(vreq.body, self.ignore),
                )
                where = _describe(found) if found else "a place the matcher rejects"
                return (
                    f"{what} interaction: its body differs from recorded interaction {i + 1} "
                    f"at {where}"
                )
        if unplayed:
            nxt = cassette.data[unplayed[0]][0]
            return (
                f"{what} interaction: no unplayed one has this method and path "
                f"(the next unplayed, {unplayed[0] + 1}, is {nxt.method} {nxt.path})"
            )
        return f"{what} interaction: all {len(cassette.data)} recorded interactions were played"


@contextmanager
def _patched_transports(run: _Run) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for cls in (httpx.HTTPTransport, httpx.MockTransport):
            original = cls.handle_request

            def handle(
                self: Any,
                request: httpx.Request,
                _original: Callable[[Any, httpx.Request], httpx.Response] = original,
            ) -> httpx.Response:
                return run.handle(_original, self, request)

            stack.enter_context(mock.patch.object(cls, "handle_request", handle))
        yield


@contextmanager
def use_cassette(
    path: str | os.PathLike[str],
    record_mode: RecordMode = "none",
    *,
    strict: bool = True,
    secrets: Sequence[str] = (),
    ignore_body_keys: Sequence[str] = (),
) -> Iterator[Any]:
    """Record or replay every sync httpx request inside the block with the cassette at ``path``.

    Args:
        path: the YAML file (created when recording).
        record_mode: vcrpy's mode: ``none`` replays only (no real request is made; a request
            with no match fails), ``once`` records when the file does not exist, ``new_episodes``
            adds new interactions, ``all`` re-records everything.
        strict: in ``none`` mode, fail when the block leaves interactions unplayed.
        secrets: values (the configured api key) replaced by ``<API_KEY>`` wherever they
            appear in what is recorded, and put back when the cassette is loaded.
        ignore_body_keys: top-level request-body keys left out of matching.

    A response being recorded is appended when it ends, so close (or read to the end) every
    response inside the block: one still open when the block ends is not saved.

    Yields:
        vcrpy's ``Cassette`` (``play_count``, ``all_played``, ``data``...), with one more
        attribute, ``failures``: the :class:`UnrecordedRequest` of each request that matched
        nothing (so a caller that swallowed one can still fail).

    Raises:
        CassetteError: ``none`` mode and the file does not exist; a request matched no
            recorded interaction (:class:`UnrecordedRequest`, raised by the request itself;
            the message names the cassette, the request's number and the first place where
            its body differs, e.g. ``messages[3].content``); or (``strict``, ``none`` mode)
            the block ended normally with recorded interactions unplayed.
    """
    p = Path(path)
    if record_mode == "none" and not p.exists():
        raise CassetteError(f"{p}: no such cassette (record it with record_mode='once')")
    v = make_vcr(record_mode, secrets=secrets, ignore_body_keys=ignore_body_keys)
    with v.use_cassette(str(p)) as cassette:
        run = _Run(cassette, p, ignore_body_keys)
        cassette.failures = run.failures
        with _patched_transports(run):
            yield cassette
    if strict and record_mode == "none" and not cassette.all_played:
        raise CassetteError(unplayed_message(cassette, p))


def unplayed_message(cassette: Any, path: str | os.PathLike[str]) -> str:
    """The message for a cassette whose recorded interactions were not all played: how many,
    and the first one's number, method and path."""
    unplayed = [i for i in range(len(cassette.data)) if cassette.play_counts[i] == 0]
    first = cassette.data[unplayed[0]][0] if unplayed else None
    where = f", the first is {unplayed[0] + 1} ({first.method} {first.path})" if first else ""
    return f"{path}: {len(unplayed)} recorded interaction(s) were not played{where}"


# --------------------------------------------------------------------------------------------
# reading cassettes: transcript and prefix check

CHAT_PATH = "/v1/chat/completions"
"""The path of llama-server's OpenAI-compatible chat endpoint."""

_SHOW_CHARS = 600


def _path_of(uri: str) -> str:
    return httpx.URL(uri).path


def _request_json(interaction: Mapping[str, Any]) -> Any:
    return _parse(interaction["request"].get("body"))


def _chat_interactions(interactions: Sequence[Mapping[str, Any]]) -> list[tuple[int, Any]]:
    """``(number, parsed body)`` of each chat-completion request (numbers from 1)."""
    out = []
    for number, item in enumerate(interactions, 1):
        body = _request_json(item)
        if _path_of(item["request"]["uri"]) == CHAT_PATH and isinstance(body, dict):
            out.append((number, body))
    return out


@dataclass
class StreamReading:
    """What the client reads from a recorded chat-completion stream, as far as it can.

    Attributes:
        reasoning: joined ``delta.reasoning_content`` (``""`` if none).
        reasoning_tokens: reasoning deltas (llama.cpp sends about one token each).
        content: joined ``delta.content`` (``""`` if none).
        tool_calls: ``(id, name, arguments)`` per ``delta.tool_calls`` index, arguments joined.
        finish_reason: the ``finish_reason`` of the stream, ``None`` if none came.
        timings: llama.cpp's ``timings`` of the last chunk that carried them.
        problem: why the stream could not be read to its end (an error event, a malformed
            chunk, a cut), ``None`` when it ended with ``finish_reason`` or ``[DONE]``.
    """

    reasoning: str = ""
    reasoning_tokens: int = 0
    content: str = ""
    tool_calls: list[tuple[str, str, str]] = field(default_factory=list)
    finish_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    problem: str | None = None


def read_stream(body: bytes) -> StreamReading:
    """Read a recorded chat-completion body with the client's own decoder
    (:class:`~boxmaker.stream.StreamDecoder`), keeping what arrived before an error or a cut
    (an unterminated last event is not parsed)."""
    decoder = StreamDecoder()
    out = StreamReading()
    try:
        decoder.feed(body)
        if not decoder.chunks.finished:
            cut = body.rfind(b"\n\n")
            tail = len(body) - cut - 2 if cut >= 0 else len(body)
            out.problem = f"the stream ended without finish_reason or [DONE] ({tail} bytes unread)"
    except InferError as exc:
        out.problem = str(exc)
    got = decoder.chunks.partial()
    out.reasoning, out.content = got.reasoning or "", got.content or ""
    out.reasoning_tokens = got.reasoning_tokens
    out.tool_calls = [(c.id, c.name, c.arguments) for c in got.tool_calls]
    out.finish_reason, out.timings = got.finish_reason, dict(got.timings)
    return out


def _clip(text: str) -> str:
    text = text.replace("\n", "\n      ")
    if len(text) <= _SHOW_CHARS:
        return text
    return f"{text[:_SHOW_CHARS]}... ({len(text) - _SHOW_CHARS} more characters)"


def _message_line(message: Mapping[str, Any]) -> list[str]:
    role = message.get("role", "?")
    lines = []
    head = f"  + {role}"
    if role == "tool":
        head += f" [{message.get('tool_call_id', '')}]"
    if message.get("reasoning_content"):
        lines.append(f"{head} reasoning: {_clip(str(message['reasoning_content']))}")
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        lines.append(f"{head} tool call {fn.get('name')} {fn.get('arguments')} [{call.get('id')}]")
    content = message.get("content")
    if content or not lines:
        lines.append(f"{head}: {_clip(str(content or ''))}")
    return lines


def transcript(path: str | os.PathLike[str]) -> str:
    """A readable transcript of a cassette (what ``boxmaker cassette show`` prints).

    For each interaction: its number, method, path and status; for a chat request the
    messages it adds to the previous chat request (all of them when it does not extend it),
    then the streamed answer as the client reads it (reasoning, content, tool calls, finish
    reason) and llama.cpp's timings; for other requests (reasoning control) the bodies.

    Raises:
        CassetteError: the file is not a readable cassette.
    """
    interactions = load_interactions(path)
    out = [f"{path}: {len(interactions)} interaction(s)"]
    previous: list[Any] = []
    for number, item in enumerate(interactions, 1):
        request, response = item["request"], item["response"]
        status = (response.get("status") or {}).get("code")
        where = _path_of(request["uri"])
        body = _request_json(item)
        out.append("")
        out.append(f"[{number}] {request['method']} {where} -> {status}")
        raw = response["body"]["string"] or b""
        if where != CHAT_PATH or not isinstance(body, dict):
            out.append(f"  request: {_clip(_compact(body))}")
            out.append(f"  answer: {_clip(raw.decode('utf-8', 'replace'))}")
            continue
        messages = list(body.get("messages") or [])
        extends = messages[: len(previous)] == previous and bool(previous)
        new = messages[len(previous) :] if extends else messages
        settings = ", ".join(
            f"{k} {_compact(body[k])}"
            for k in ("id_slot", "temperature", "max_tokens", "seed")
            if k in body
        )
        tools = [t.get("function", {}).get("name") for t in body.get("tools") or []]
        out.append(f"  {settings}; tools: {', '.join(map(str, tools)) or 'none'}")
        if previous and not extends:
            out.append("  (does not extend the previous chat request: all its messages)")
        elif extends and not new:
            out.append("  (the same messages as the previous chat request: a retry)")
        for message in new:
            out.extend(_message_line(message))
        previous = messages
        if status != 200:
            out.append(f"  error answer: {_clip(raw.decode('utf-8', 'replace'))}")
            continue
        reading = read_stream(raw)
        if reading.reasoning:
            out.append(
                f"  = reasoning ({reading.reasoning_tokens} tokens): {_clip(reading.reasoning)}"
            )
        if reading.content:
            out.append(f"  = content: {_clip(reading.content)}")
        for call_id, name, arguments in reading.tool_calls:
            out.append(f"  = tool call {name} {arguments} [{call_id}]")
        if reading.finish_reason:
            out.append(f"  = finish: {reading.finish_reason}")
        if reading.timings:
            t = reading.timings
            names = ("cache_n", "prompt_n", "prompt_ms", "predicted_n", "predicted_ms")
            out.append("  = timings: " + ", ".join(f"{k} {t[k]:g}" for k in names if k in t))
        if reading.problem:
            out.append(f"  ! {reading.problem}")
        if response.get("error"):
            out.append(f"  ! transport error after the recorded bytes: {response['error']}")
    return "\n".join(out)


def prefix_problems(path: str | os.PathLike[str]) -> list[str]:
    """Where the chat requests of a cassette do not each extend the previous one.

    A request extends the previous chat request when the earlier messages are a prefix of its
    own, byte for byte once serialised (so llama.cpp's prompt cache can reuse them), and its
    ``tools`` are the same. Returns one line per break (empty: every request extends the
    previous one), e.g. ``interaction 5 does not extend interaction 3: messages[2].content
    (recorded 'a', sent 'b')``.

    Raises:
        CassetteError: the file is not a readable cassette.
    """
    problems = []
    chats = _chat_interactions(load_interactions(path))
    for (before_n, before), (number, body) in itertools.pairwise(chats):
        what = f"interaction {number} does not extend interaction {before_n}"
        old, new = list(before.get("messages") or []), list(body.get("messages") or [])
        if len(new) < len(old):
            problems.append(f"{what}: it has {len(new)} messages, the earlier one {len(old)}")
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=False)):
            found = first_difference(a, b, f"messages[{i}]")
            if found:
                problems.append(f"{what}: {_describe(found)}")
                break
            if _compact(a) != _compact(b):
                problems.append(f"{what}: messages[{i}] has its keys in another order")
                break
        else:
            found = first_difference(before.get("tools"), body.get("tools"), "tools")
            if found:
                problems.append(f"{what}: the tools changed at {_describe(found)}")
    return problems


def cli_show(paths: Sequence[str]) -> int:
    """``boxmaker cassette show PATH...``: print the :func:`transcript` of each cassette.

    Returns:
        The exit code: 0.

    Raises:
        CassetteError: a file is not a readable cassette.
    """
    for n, path in enumerate(paths):
        print(("\n" if n else "") + transcript(path))
    return 0


def cli_check(paths: Sequence[str]) -> int:
    """``boxmaker cassette check PATH...``: verify that every chat request of each cassette
    extends the previous one (:func:`prefix_problems`), printing one line per cassette and one
    per break.

    Returns:
        The exit code: 0 when every cassette passes, 1 otherwise.

    Raises:
        CassetteError: a file is not a readable cassette.
    """
    failed = False
    for path in paths:
        problems = prefix_problems(path)
        chats = len(_chat_interactions(load_interactions(path)))
        if problems:
            failed = True
            print(f"{path}: FAIL, {len(problems)} of {chats} chat requests break the prefix")
            for line in problems:
                print(f"  {line}")
        else:
            print(f"{path}: ok, {chats} chat requests, each extends the previous one")
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------
# what-if replay


@dataclass(frozen=True, kw_only=True)
class RecordedSession:
    """A session as its cassette holds it, enough to run the loop on it again.

    Attributes:
        system: the system prompt (the first request's leading ``system`` message, else ``""``).
        tools: the first request's ``tools`` (OpenAI definitions), sent as recorded.
        users: the user message of each turn: the last message of each chat request that ends
            with a ``user`` message (a retry of the same request counts once).
        results: recorded tool results by ``(tool name, canonical JSON arguments)``, in order
            (from the ``tool`` messages of later requests, via their ``tool_call_id``).
        config: the knobs the requests show: ``id_slot``, ``temperature``, ``max_tokens``,
            ``seed``, ``chat_template_kwargs.enable_thinking``; the loop limits are defaults.
        chat_requests: how many chat requests the cassette holds.
    """

    system: str
    tools: tuple[dict[str, Any], ...]
    users: tuple[str, ...]
    results: dict[tuple[str, str], list[str]]
    config: Any
    chat_requests: int


def recorded_session(path: str | os.PathLike[str]) -> RecordedSession:
    """Read a :class:`RecordedSession` from a cassette.

    Raises:
        CassetteError: not a readable cassette, or no chat request in it.
    """
    from .config import Config, SamplingConfig, SlotsConfig, ThinkingConfig
    from .tools import canonical_arguments

    chats = _chat_interactions(load_interactions(path))
    if not chats:
        raise CassetteError(f"{path}: no {CHAT_PATH} request to replay")
    first = chats[0][1]
    messages = list(first.get("messages") or [])
    system = ""
    if messages and messages[0].get("role") == "system":
        system = str(messages[0].get("content") or "")
    users: list[str] = []
    results: dict[tuple[str, str], list[str]] = {}
    calls: dict[str, tuple[str, str]] = {}
    answered: set[str] = set()
    previous: list[Any] | None = None
    for _, body in chats:
        msgs = list(body.get("messages") or [])
        if msgs and msgs[-1].get("role") == "user" and msgs != previous:
            users.append(str(msgs[-1].get("content") or ""))
        previous = msgs
        for message in msgs:
            for call in message.get("tool_calls") or []:
                fn = call.get("function") or {}
                args = canonical_arguments(str(fn.get("arguments") or ""))
                calls[str(call.get("id"))] = (str(fn.get("name")), args)
            call_id = str(message.get("tool_call_id"))
            if message.get("role") == "tool" and call_id in calls and call_id not in answered:
                answered.add(call_id)
                results.setdefault(calls[call_id], []).append(str(message.get("content") or ""))
    thinking = (first.get("chat_template_kwargs") or {}).get("enable_thinking", True)
    defaults = SamplingConfig()
    config = Config(
        slots=SlotsConfig(main=int(first.get("id_slot", 0))),
        sampling=SamplingConfig(
            temperature=float(first.get("temperature", defaults.temperature)),
            max_tokens=first.get("max_tokens"),
            seed=first.get("seed"),
        ),
        thinking=ThinkingConfig(enabled=bool(thinking)),
    )
    return RecordedSession(
        system=system,
        tools=tuple(first.get("tools") or ()),
        users=tuple(users),
        results=results,
        config=config,
        chat_requests=len(chats),
    )


class _RecordedPort:
    """A tool port answering each call with the result the cassette recorded for the same
    tool and arguments (in order); a call never recorded fails, saying so."""

    def __init__(self, results: Mapping[tuple[str, str], list[str]]) -> None:
        self._results = {key: list(values) for key, values in results.items()}
        self.missing: list[str] = []

    def request(self, request: Any) -> Any:
        from .tools import Failed, Result, canonical_arguments

        key = (request.tool, canonical_arguments(json.dumps(dict(request.arguments))))
        values = self._results.get(key)
        if not values:
            self.missing.append(f"{request.tool} {key[1]}")
            return Failed(message=f"no result recorded for {request.tool} with {key[1]}")
        return Result(content=values.pop(0) if len(values) > 1 else values[0])


@dataclass
class WhatIf:
    """The outcome of :func:`what_if`.

    Attributes:
        lines: the report, one line each: the limits in force, the tools used, then per turn
            each limit that fired (turn, completion within the turn, kind, detail) and how the
            turn ended, and where the replay stopped, if it did.
        stopped: why the replay stopped early (the loop needed traffic the cassette does not
            hold), ``None`` when every turn ran.
        hits: ``(turn, completion, kind, detail)`` of each limit that fired.
    """

    lines: list[str] = field(default_factory=list)
    stopped: str | None = None
    hits: list[tuple[int, int, str, str]] = field(default_factory=list)


def what_if(
    path: str | os.PathLike[str],
    *,
    tool_iterations: int | None = None,
    repeat_detection: bool | None = None,
    tool_result_cap: int | None = None,
    thinking_tokens: int | None = None,
) -> WhatIf:
    """Run the loop again on a recorded session with other limits; say which fire and when.

    The user messages, system prompt, tools and sampling come from the cassette
    (:func:`recorded_session`); the limits are :class:`~boxmaker.config.LoopLimits`'
    defaults but for the ones given. Tools: the demo tools when the recorded tool names are
    theirs, else a port answering from the results recorded in the cassette. Each completion
    is replayed from the cassette (record mode ``none``; ``reasoning_control`` is left out of
    matching, so a cap can be armed or not); the replay stops, with the reason, at the first
    request the cassette does not hold, since what the model would answer to it is unknown
    (a thinking cap that fires where the recording had none, a tool result cut differently,
    a turn that goes on where the recorded one ended...).

    Args:
        path: the cassette.
        tool_iterations: ``loop.tool_iterations``; ``None`` keeps the default.
        repeat_detection: ``loop.repeat_detection``; ``None`` keeps the default (on).
        tool_result_cap: ``loop.tool_result_cap`` in characters; ``None`` keeps the default.
        thinking_tokens: ``thinking.turn_tokens``; ``None``: no thinking cap.

    Raises:
        CassetteError: not a readable cassette, or no chat request in it.
    """
    import dataclasses
    import tempfile

    from .client import Client
    from .config import ClientConfig, LoopLimits
    from .demo import demo_registry
    from .errors import SessionFull, TurnError, TurnInferError, TurnLimit
    from .events import Queued
    from .records import Baseline, LimitHit
    from .session import Session
    from .tools import Registry
    from .turn import Runtime, run_turn

    recorded = recorded_session(path)
    defaults = LoopLimits()
    loop = LoopLimits(
        tool_iterations=defaults.tool_iterations if tool_iterations is None else tool_iterations,
        repeat_detection=defaults.repeat_detection
        if repeat_detection is None
        else repeat_detection,
        tool_result_cap=defaults.tool_result_cap if tool_result_cap is None else tool_result_cap,
    )
    config = dataclasses.replace(
        recorded.config,
        client=ClientConfig(url="http://127.0.0.1:9", retry_attempts=4),
        loop=loop,
        thinking=dataclasses.replace(recorded.config.thinking, turn_tokens=thinking_tokens),
    )
    names = [str((t.get("function") or {}).get("name")) for t in recorded.tools]
    demo = demo_registry()
    port: _RecordedPort | None = None
    if sorted(names) == sorted(demo.names):
        registry, tools_text = demo, f"the demo tools ({', '.join(names)})"
    else:
        registry = Registry()
        for t in recorded.tools:
            fn = t.get("function") or {}
            registry.add_port_tool(
                str(fn.get("name")), str(fn.get("description") or ""), fn.get("parameters") or {}
            )
        port = _RecordedPort(recorded.results)
        tools_text = f"results recorded in the cassette ({', '.join(names) or 'none'})"
    report = WhatIf()
    cap = "none" if thinking_tokens is None else str(thinking_tokens)
    report.lines += [
        f"what-if replay of {path}: {len(recorded.users)} turn(s), "
        f"{recorded.chat_requests} chat request(s) recorded",
        f"limits: tool_iterations {loop.tool_iterations}, repeat_detection "
        f"{'on' if loop.repeat_detection else 'off'}, tool_result_cap {loop.tool_result_cap}, "
        f"thinking turn_tokens {cap}",
        f"tools: {tools_text}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        session = Session.create(tmp, Baseline(system=recorded.system, tools=recorded.tools))
        with (
            use_cassette(path, "none", strict=False, ignore_body_keys=("reasoning_control",)) as c,
            Client(config.client, sleep=lambda s: None) as client,
        ):
            runtime = Runtime(config=config, client=client, registry=registry, port=port)
            for number, text in enumerate(recorded.users, 1):
                completions = [0]
                head = f"turn {number} ({_short(text)})"

                def on_event(
                    event: Any, turn: int = number, count: list[int] = completions
                ) -> None:
                    if isinstance(event, Queued):
                        count[0] += 1
                    elif isinstance(event, LimitHit):
                        report.hits.append((turn, count[0], event.kind, event.detail))
                        report.lines.append(
                            f"turn {turn}, completion {count[0]}: {event.kind} fired: "
                            f"{event.detail}"
                        )

                try:
                    run_turn(session, runtime, text, on_event)
                    report.lines.append(f"{head}: answered after {completions[0]} completion(s)")
                except UnrecordedRequest as exc:
                    if exc.path.endswith("/control"):  # during the current completion
                        where = completions[0]
                        why = (
                            f"the thinking cap fires in completion {where} "
                            f"(reasoning_end after {thinking_tokens} reasoning tokens of the "
                            "turn), where the recording went on reasoning: what the model "
                            "does after reasoning_end is not in the cassette"
                        )
                    else:  # the next completion's request, refused before any event
                        where = completions[0] + 1
                        why = f"the loop needs traffic the cassette does not hold: {exc}"
                    report.stopped = f"{head}, completion {where}: {why}"
                    report.lines.append(f"stopped at {report.stopped}")
                    break
                except (TurnLimit, SessionFull) as exc:
                    report.lines.append(f"{head}: ended by {type(exc).__name__}: {exc}")
                except TurnInferError as exc:
                    report.lines.append(f"{head}: the completion failed: {exc}")
                except TurnError as exc:
                    report.lines.append(f"{head}: ended: {exc}")
            played = c.play_count
            total = len(c.data)
            capped = sum(
                1
                for i, (request, _) in enumerate(c.data)
                if request.path.endswith("/control") and c.play_counts[i] == 0
            )
        session.close()
    if port is not None and port.missing:
        report.lines.append(f"tool calls with no recorded result: {', '.join(port.missing)}")
    if capped and report.stopped is None:
        report.lines.append(
            f"note: the recording's thinking cap ended reasoning early {capped} time(s); this "
            "replay streams those completions as recorded (the cassette cannot show what an "
            "uncapped model would have reasoned)"
        )
    report.lines.append(f"played {played} of {total} recorded interactions")
    return report


def cli_replay(args: argparse.Namespace) -> int:
    """``boxmaker replay CASSETTE [--tool-iterations N] [--no-repeat-detection]
    [--tool-result-cap N] [--thinking-tokens N]``: print :func:`what_if`'s report.

    Returns:
        The exit code: 0 (also when the replay stopped where the cassette ends: that is a
        finding, printed last).

    Raises:
        CassetteError: not a readable cassette, or no chat request in it.
    """
    report = what_if(
        args.cassette,
        tool_iterations=args.tool_iterations,
        repeat_detection=False if args.no_repeat_detection else None,
        tool_result_cap=args.tool_result_cap,
        thinking_tokens=args.thinking_tokens,
    )
    print("\n".join(report.lines))
    return 0
