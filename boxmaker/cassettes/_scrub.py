"""What never reaches a cassette: credentials, volatile headers, the api key wherever it is.

The rule of what is a secret (:data:`SECRET_FIELDS`, the placeholders, the forms a secret
takes, the shortest one searched for) is :mod:`boxmaker`'s ``_secrets``, shared with the
session log and the batch manifest; this module applies it to recorded bytes.

Before an interaction is written (and, the same way, before a request is matched on replay):

- headers: only ``Accept`` and ``Content-Type`` are kept; every other request and response
  header (``Authorization``, api-key headers, cookies, ``Date``, ``Server``...) is dropped;
- the credentials of the request, wherever they appear in the interaction (URI, request
  body, response body, a recorded transport error), become ``<API_KEY>``: the configured
  secrets (``use_cassette(secrets=...)``), the token of the request's ``Authorization``
  header (``Bearer X``: ``X``, so ``ClientConfig.api_key`` is always covered), the value of
  an ``api-key``/``x-api-key`` header, and the values of credential-like query parameters
  and JSON body fields below; also in their URL-encoded and JSON-escaped forms. A value
  found in the request shorter than 8 characters (a placeholder such as ``EMPTY`` for a
  local server) is not searched for: it cannot be told apart from text, and replacing it
  everywhere garbles the cassette (``"e"`` in every word); headers are dropped anyway and
  credential-named fields still become ``<SECRET>``;
- URI query parameters with a credential-like name (:data:`SECRET_QUERY_PARAMETERS`) are
  removed;
- JSON string values under a credential-like key (:data:`SECRET_FIELDS`), at any depth of a
  request or response body (SSE events too), become ``<SECRET>``. Names are compared case
  insensitively with ``-`` read as ``_``. The value is rewritten in place in the text, so the
  rest of the body keeps its bytes.

Not covered: a credential the request does not show (another service's key typed into a
message), or a JSON key inside a JSON-encoded string (tool-call ``arguments``).
On replay the request's credentials are hidden the same way before matching, and
``<API_KEY>`` in the replayed response is put back as the request's first credential, so a
cassette recorded with one key replays with another, or with none when the body does not
hold it.
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

from vcr.request import Request as VcrRequest

from .._secrets import API_KEY_PLACEHOLDER, SECRET_FIELDS, SECRET_PLACEHOLDER
from .._secrets import HARVEST_MIN as _HARVEST_MIN
from .._secrets import forms as _forms
from .._secrets import norm as _norm

__all__ = [
    "API_KEY_PLACEHOLDER",
    "SECRET_FIELDS",
    "SECRET_HEADERS",
    "SECRET_PLACEHOLDER",
    "SECRET_QUERY_PARAMETERS",
    "credentials",
    "hide_in_request",
    "hide_in_response",
    "restore",
    "scrub_request",
    "scrub_response",
]

SECRET_HEADERS = (
    "authorization",
    "api-key",
    "x-api-key",
    "cookie",
    "set-cookie",
    "proxy-authorization",
)
"""Credential headers (lower case). They are never written (no header but ``Accept`` and
``Content-Type`` is); the values of the first, second, third and last are also hidden
wherever else they appear."""

SECRET_QUERY_PARAMETERS = (
    "api_key",
    "apikey",
    "key",
    "token",
    "access_token",
    "auth",
    "auth_token",
    "secret",
    "password",
    "signature",
    "sig",
)
"""URI query parameter names that are never written (compared in lower case, ``-`` as ``_``:
``api-key``, ``API_KEY`` and ``Api-Key`` are all ``api_key``)."""

_KEEP_HEADERS = ("content-type", "accept")
"""The only headers kept in a cassette; the rest (host, user-agent, content-length, date,
server, content-encoding...) are volatile noise or secrets."""

_KEYED_HEADERS = ("authorization", "proxy-authorization", "api-key", "x-api-key")

_QUERY = frozenset(_norm(n) for n in SECRET_QUERY_PARAMETERS)

_FIELD_PAIR = re.compile(
    b'"('
    + b"|".join(
        re.escape(_norm(n)).encode().replace(b"_", b"[-_]")
        for n in sorted(SECRET_FIELDS, key=len, reverse=True)
    )
    + rb')"\s*:\s*"((?:[^"\\]|\\.)*)"',
    re.IGNORECASE,
)
"""A credential-like JSON key with its string value, ``"Api-Key": "..."``, in body text (the
value's escapes kept whole; a key written with escapes is not recognised)."""


def _json_text(raw: bytes) -> str | None:
    """The text of a JSON string's inside (escapes resolved), ``None`` if malformed."""
    try:
        value = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _credential_fields(body: bytes) -> Iterable[tuple[re.Match[bytes], str]]:
    for match in _FIELD_PAIR.finditer(body):
        yield match, _json_text(match.group(2)) or ""


def _scrub_fields(body: bytes) -> bytes:
    """``body`` with the string value of every credential-like JSON field replaced."""
    if b'"' not in body:
        return body
    out, start = [], 0
    for match, _ in _credential_fields(body):
        out += [body[start : match.start(2)], SECRET_PLACEHOLDER.encode()]
        start = match.end(2)
    return b"".join([*out, body[start:]]) if out else body


def credentials(request: VcrRequest, configured: Sequence[str] = ()) -> list[str]:
    """The credentials a request shows, to hide wherever they appear in its interaction.

    In order: ``configured`` (the ``secrets`` given to ``use_cassette``, at any length), the
    credential of each of :data:`SECRET_HEADERS`' ``authorization``, ``proxy-authorization``,
    ``api-key`` and ``x-api-key`` (an ``Authorization`` value ``Scheme X`` gives ``X``), then
    the values of credential-like query parameters and JSON body fields; those found in the
    request only when 8 characters or more. Empty values and repeats are left out.
    """
    found: list[str] = list(configured)
    for name, value in request.headers.items():
        if name.lower() in _KEYED_HEADERS:
            scheme, _, token = str(value).strip().partition(" ")
            token = token.strip() if token else scheme
            if len(token) >= _HARVEST_MIN:  # shorter: a placeholder, not told apart from text
                found.append(token)
    for name, value in urllib.parse.parse_qsl(urllib.parse.urlsplit(request.uri).query):
        if _norm(name) in _QUERY and len(value) >= _HARVEST_MIN:
            found.append(value)
    body = request.body if isinstance(request.body, bytes) else b""
    found += [v for _, v in _credential_fields(body) if len(v) >= _HARVEST_MIN]
    return list(dict.fromkeys(v for v in found if v))


def _hide(data: bytes, secrets: Sequence[str]) -> bytes:
    placeholder = API_KEY_PLACEHOLDER.encode()
    for secret in secrets:
        for form in _forms(secret):
            data = data.replace(form, placeholder)
    return data


def hide_in_request(request: VcrRequest, secrets: Sequence[str]) -> VcrRequest:
    """Replace each of ``secrets`` by ``<API_KEY>`` in the request's URI and body (in place;
    returned for chaining)."""
    if not secrets:
        return request
    request.uri = _hide(request.uri.encode(), secrets).decode()
    if isinstance(request.body, bytes):
        request.body = _hide(request.body, secrets)
    return request


def hide_in_response(response: dict[str, Any], secrets: Sequence[str]) -> dict[str, Any]:
    """Replace each of ``secrets`` by ``<API_KEY>`` in a recorded response (vcrpy's dict:
    ``body.string`` bytes, ``headers``, and the ``error`` text of a broken stream)."""
    if not secrets:
        return response
    body = response["body"]["string"]
    if isinstance(body, bytes):
        response["body"]["string"] = _hide(body, secrets)
    if response.get("error"):
        response["error"] = _hide(str(response["error"]).encode(), secrets).decode()
    response["headers"] = {
        name: [_hide(str(v).encode(), secrets).decode() for v in values]
        for name, values in (response.get("headers") or {}).items()
    }
    return response


def restore(body: bytes, secret: str | None) -> bytes:
    """A replayed response body with ``<API_KEY>`` put back as ``secret`` (unchanged when
    ``None``)."""
    return body if secret is None else body.replace(API_KEY_PLACEHOLDER.encode(), secret.encode())


def scrub_request(request: VcrRequest) -> VcrRequest:
    """vcrpy ``before_record_request`` hook (also run on each request before matching): drop
    every header but ``Accept`` and ``Content-Type`` and the credential-like query parameters;
    credential-like JSON fields of the body become ``<SECRET>``."""
    for name in list(request.headers):
        if name.lower() not in _KEEP_HEADERS:
            del request.headers[name]
    parts = urllib.parse.urlsplit(request.uri)
    if parts.query:
        query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        kept = [(k, v) for k, v in query if _norm(k) not in _QUERY]
        if len(kept) != len(query):
            request.uri = parts._replace(query=urllib.parse.urlencode(kept)).geturl()
    if isinstance(request.body, bytes):
        request.body = _scrub_fields(request.body)
    return request


def scrub_response(response: dict[str, Any]) -> dict[str, Any]:
    """vcrpy ``before_record_response`` hook: drop every header but ``Accept`` and
    ``Content-Type``; credential-like JSON fields of the body become ``<SECRET>``."""
    headers = response.get("headers", {})
    response["headers"] = {k: v for k, v in headers.items() if k.lower() in _KEEP_HEADERS}
    body = response.get("body", {}).get("string")
    if isinstance(body, bytes):
        response["body"]["string"] = _scrub_fields(body)
    return response
