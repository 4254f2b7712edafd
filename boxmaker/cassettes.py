"""Record and replay inference traffic with vcrpy: readable cassettes, no secrets.

A cassette is vcrpy's YAML file of request/response interactions, written so people can read
it: JSON request bodies are stored parsed (``body_json``: a YAML mapping, not an escaped
string), response bodies as text, SSE streams as a literal block with one ``data:`` event a
line. Headers that carry credentials (``Authorization``, api-key headers, cookies) never reach
the file, and volatile ones (``Date``, ``Server``...) are dropped.

Requests match on method, path and the body compared as parsed JSON (key order and white space
do not matter; the port does not, so a recording from one embedded server replays against
another URL). In record mode ``none`` (the default, used in CI) a request with no match fails
and no real request is made.

Example::

    with use_cassette("cassettes/demo.yaml", record_mode="none"):
        run_turn(session, runtime, "What is the weather in Lisbon?")
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import vcr
import yaml
from vcr.errors import CannotOverwriteExistingCassetteException
from vcr.request import Request as VcrRequest

from .errors import CassetteError

__all__ = ["SECRET_HEADERS", "RecordMode", "make_vcr", "serializer", "use_cassette"]

RecordMode = Literal["none", "once", "new_episodes", "all"]

SECRET_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "set-cookie",
    "proxy-authorization",
)
"""Request and response headers that are never written to a cassette (lower case)."""

_KEEP_HEADERS = ("content-type", "accept")
"""The only headers kept in a cassette; the rest (host, user-agent, content-length, date,
server...) are volatile noise or secrets."""


class _Dumper(yaml.SafeDumper):
    """A safe YAML dumper that writes multi-line strings as literal blocks."""


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_representer)


class _ReadableSerializer:
    """vcrpy serializer: bodies as parsed JSON or text (see the module docstring)."""

    @staticmethod
    def serialize(cassette_dict: dict[str, Any]) -> str:
        out = []
        for item in cassette_dict["interactions"]:
            request = dict(item["request"])
            body = request.pop("body", None)
            raw = body.decode("utf-8") if isinstance(body, bytes) else body
            try:
                request["body_json"] = json.loads(raw) if raw else None
            except ValueError:
                request["body"] = raw
            response = dict(item["response"])
            resp_body = response["body"]["string"]
            text = resp_body.decode("utf-8") if isinstance(resp_body, bytes) else resp_body
            response["body"] = {"text": text.replace("\r\n", "\n")}
            out.append({"request": request, "response": response})
        data = {"version": cassette_dict.get("version", 1), "interactions": out}
        return str(yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100))

    @staticmethod
    def deserialize(cassette_string: str) -> dict[str, Any]:
        data = yaml.safe_load(cassette_string) or {}
        interactions = []
        for item in data.get("interactions", []):
            request = dict(item["request"])
            if "body_json" in request:
                body = request.pop("body_json")
                request["body"] = None if body is None else json.dumps(body).encode("utf-8")
            elif isinstance(request.get("body"), str):
                request["body"] = request["body"].encode("utf-8")
            response = dict(item["response"])
            response["body"] = {"string": response["body"]["text"].encode("utf-8")}
            interactions.append({"request": request, "response": response})
        return {"version": data.get("version", 1), "interactions": interactions}


serializer = _ReadableSerializer()
"""The readable serializer, registered as ``"boxmaker"`` on :func:`make_vcr`'s VCR."""


def _json_body(r1: VcrRequest, r2: VcrRequest) -> None:
    """vcrpy matcher: bodies equal as parsed JSON (raises AssertionError naming the place)."""
    b1, b2 = _parse(r1.body), _parse(r2.body)
    if b1 != b2:
        raise AssertionError(f"bodies differ at {_first_difference(b1, b2)}")


def _parse(body: Any) -> Any:
    if body is None or body == b"" or body == "":
        return None
    try:
        return json.loads(body)
    except (ValueError, TypeError):
        return body


def _first_difference(a: Any, b: Any, where: str = "body") -> str:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b or a[key] != b[key]:
                if key in a and key in b:
                    return _first_difference(a[key], b[key], f"{where}.{key}")
                return f"{where}.{key}"
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            if x != y:
                return _first_difference(x, y, f"{where}[{i}]")
        if len(a) != len(b):
            return f"{where} (length {len(a)} vs {len(b)})"
    return where


def _why_no_match(cassette: Any, request: VcrRequest) -> str:
    """Where the request differs from the next unplayed recorded one."""
    for index, (recorded, _) in enumerate(cassette.data):
        if cassette.play_counts[index] == 0:
            if recorded.path != request.path:
                return f"the next recorded request is {recorded.method} {recorded.path}"
            a, b = _parse(recorded.body), _parse(request.body)
            return f"bodies differ at {_first_difference(a, b)}"
    return "every recorded interaction was played already"


def _scrub_request(request: VcrRequest) -> VcrRequest:
    for name in list(request.headers):
        if name.lower() not in _KEEP_HEADERS:
            del request.headers[name]
    return request


def _scrub_response(response: dict[str, Any]) -> dict[str, Any]:
    headers = response.get("headers", {})
    response["headers"] = {k: v for k, v in headers.items() if k.lower() in _KEEP_HEADERS}
    return response


def make_vcr(record_mode: RecordMode = "none") -> vcr.VCR:
    """A vcrpy ``VCR`` set up for llama-server traffic.

    Matching on method, path and JSON body; secret headers filtered from requests; response
    headers reduced to ``Content-Type``; compressed responses stored decoded; the readable
    serializer; playback of each interaction once, in order.
    """
    v = vcr.VCR(
        record_mode=record_mode,
        serializer="boxmaker",
        match_on=("method", "path", "json_body"),
        filter_headers=[(h, None) for h in SECRET_HEADERS],
        before_record_request=_scrub_request,
        before_record_response=_scrub_response,
        decode_compressed_response=True,
    )
    v.register_serializer("boxmaker", serializer)
    v.register_matcher("json_body", _json_body)
    return v


@contextmanager
def use_cassette(
    path: str | os.PathLike[str], record_mode: RecordMode = "none", *, strict: bool = True
) -> Iterator[Any]:
    """Record or replay every httpx request inside the block with the cassette at ``path``.

    Args:
        path: the YAML file (created when recording).
        record_mode: vcrpy's mode: ``none`` replays only (no real request is made; a request
            with no match fails), ``once`` records when the file does not exist, ``new_episodes``
            adds new interactions, ``all`` re-records everything.
        strict: in ``none`` mode, fail when the block leaves interactions unplayed.

    Raises:
        CassetteError: ``none`` mode and the file does not exist; a request matched no
            recorded interaction (the message names the cassette, the request's number and the
            first place where its body differs, e.g. ``body.messages[3].content``); or
            (``strict``) some recorded interactions were not played.
    """
    p = Path(path)
    if record_mode == "none" and not p.exists():
        raise CassetteError(f"{p}: no such cassette (record it with record_mode='once')")
    with make_vcr(record_mode).use_cassette(str(p)) as cassette:
        try:
            yield cassette
        except CannotOverwriteExistingCassetteException as exc:
            request = exc.failed_request
            raise CassetteError(
                f"{p}: no recorded interaction matches request {cassette.play_count + 1} "
                f"({request.method} {request.path}): {_why_no_match(cassette, request)}"
            ) from None
    if strict and record_mode == "none" and not cassette.all_played:
        unplayed = len(cassette.data) - cassette.play_count
        raise CassetteError(f"{p}: {unplayed} recorded interaction(s) were not played")


def cli_show(paths: Sequence[str]) -> int:
    """``boxmaker cassette show``: print a transcript of each cassette. Returns the exit code.

    Raises:
        NotImplementedError: not built yet.
    """
    raise NotImplementedError("boxmaker cassette show is not built yet")


def cli_check(paths: Sequence[str]) -> int:
    """``boxmaker cassette check``: verify each chat request extends the previous one.

    Raises:
        NotImplementedError: not built yet.
    """
    raise NotImplementedError("boxmaker cassette check is not built yet")


def cli_replay(args: argparse.Namespace) -> int:
    """``boxmaker replay``: re-run the loop against a recording with other limits.

    Raises:
        NotImplementedError: not built yet.
    """
    raise NotImplementedError("boxmaker replay is not built yet")
