"""What never reaches a cassette: credentials, volatile headers, the api key wherever it is.

The rule of what is a secret (:data:`SECRET_FIELDS`, :data:`SECRET_QUERY_PARAMETERS`, the
credentials a request shows, the placeholders, the forms a secret takes, the shortest one
searched for) is :mod:`boxmaker`'s ``_secrets``, shared with the session logs (the loop's and
the tap's), the batch manifest and the scores; this module applies it to recorded bytes and
adds what is a cassette's own: which headers are kept.

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
import urllib.parse
from collections.abc import Sequence
from typing import Any

from vcr.request import Request as VcrRequest

from .._secrets import (
    API_KEY_PLACEHOLDER,
    CREDENTIAL_HEADERS,
    SECRET_FIELDS,
    SECRET_PLACEHOLDER,
    SECRET_QUERY_PARAMETERS,
    credentials_in,
    hide_bytes,
    hide_fields,
    hide_text,
    is_secret_query,
)
from ._serializer import compact

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

SECRET_HEADERS = (*CREDENTIAL_HEADERS, "cookie", "set-cookie")
"""Credential headers (lower case). They are never written (no header but ``Accept`` and
``Content-Type`` is); the values of the first four (``_secrets``' ``CREDENTIAL_HEADERS``)
are also hidden wherever else they appear."""

_KEEP_HEADERS = ("content-type", "accept")
"""The only headers kept in a cassette; the rest (host, user-agent, content-length, date,
server, content-encoding...) are volatile noise or secrets."""


def credentials(
    request: VcrRequest,
    configured: Sequence[str] = (),
    headers: Sequence[tuple[str, str]] | None = None,
) -> list[str]:
    """The credentials a request shows, to hide wherever they appear in its interaction.

    In order: ``configured`` (the ``secrets`` given to ``use_cassette``, at any length), then
    what ``_secrets``' ``credentials_in`` finds in the request's headers, URI and body (the
    one rule: ``Authorization`` Bearer and Basic, api-key headers, credential-like query
    parameters and JSON fields; 8 characters or more). Empty values and repeats are left out.
    ``headers``: the request's headers as sent, every line (a header sent twice is one key of
    ``request.headers``, its first value lost: an echo of it then went unhidden); default
    ``request.headers``.
    """
    body = request.body if isinstance(request.body, bytes) else b""
    if headers is None:
        headers = [(str(k), str(v)) for k, v in request.headers.items()]
    found = [*configured, *credentials_in(headers, request.uri, body)]
    return list(dict.fromkeys(v for v in found if v))


def _hide(data: bytes, secrets: Sequence[str]) -> bytes:
    """:func:`boxmaker._secrets.hide_bytes` (kept under this name for the tests that compare
    the log's and the cassettes' scrubbing)."""
    return hide_bytes(data, secrets)


def hide_in_request(request: VcrRequest, secrets: Sequence[str]) -> VcrRequest:
    """Replace each of ``secrets`` by ``<API_KEY>`` in the request's URI and body (in place;
    returned for chaining)."""
    if not secrets:
        return request
    request.uri = _hide(request.uri.encode(), secrets).decode()
    if isinstance(request.body, bytes):
        request.body = _hide_decoded(_hide(request.body, secrets), secrets)
    return request


def _hide_decoded(body: bytes, secrets: Sequence[str]) -> bytes:
    """A JSON body that still shows one of ``secrets`` once decoded (written escaped:
    ``\\u0045``, ``\\/``, which the bytes do not show, and the cassette stores the decoded
    JSON), written again compact (:func:`compact`'s form) with it hidden; else as it is."""
    try:
        value = json.loads(body)
        text = compact(value)
    except (ValueError, RecursionError):  # not JSON: the bytes were all there was to hide
        return body
    hidden = hide_text(text, secrets)
    if hidden == text:
        return body
    try:
        return hidden.encode()
    except UnicodeEncodeError:  # a lone surrogate (\\ud83d) in it: written escaped then
        return hide_text(json.dumps(value, separators=(",", ":")), secrets).encode()


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
        kept = [(k, v) for k, v in query if not is_secret_query(k)]
        if len(kept) != len(query):
            request.uri = parts._replace(query=urllib.parse.urlencode(kept)).geturl()
    if isinstance(request.body, bytes):
        request.body = hide_fields(request.body)
    return request


def scrub_response(response: dict[str, Any]) -> dict[str, Any]:
    """vcrpy ``before_record_response`` hook: drop every header but ``Accept`` and
    ``Content-Type``; credential-like JSON fields of the body become ``<SECRET>``."""
    headers = response.get("headers", {})
    response["headers"] = {k: v for k, v in headers.items() if k.lower() in _KEEP_HEADERS}
    body = response.get("body", {}).get("string")
    if isinstance(body, bytes):
        response["body"]["string"] = hide_fields(body)
    return response
