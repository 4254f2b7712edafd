"""What never reaches a cassette: credentials, volatile headers, the configured api key.

Only the ``Accept`` and ``Content-Type`` headers are kept: credentials (``Authorization``,
api-key headers, cookies) and volatile headers (``Date``, ``Server``...) never reach the file,
and the configured api key (``secrets``) is replaced by ``<API_KEY>`` wherever it appears
(a body, the URI).
"""

from __future__ import annotations

from typing import Any

from vcr.request import Request as VcrRequest

__all__ = [
    "API_KEY_PLACEHOLDER",
    "SECRET_HEADERS",
    "SECRET_QUERY_PARAMETERS",
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
"""Request and response headers that are never written to a cassette (lower case)."""

SECRET_QUERY_PARAMETERS = ("api_key", "api-key", "key", "token", "access_token")
"""URI query parameters that are never written to a cassette."""

API_KEY_PLACEHOLDER = "<API_KEY>"
"""What replaces a configured secret (``use_cassette(secrets=...)``) in a cassette."""

_KEEP_HEADERS = ("content-type", "accept")
"""The only headers kept in a cassette; the rest (host, user-agent, content-length, date,
server, content-encoding...) are volatile noise or secrets."""


def scrub_request(request: VcrRequest) -> VcrRequest:
    """vcrpy ``before_record_request`` hook: drop every header but ``Accept`` and
    ``Content-Type``."""
    for name in list(request.headers):
        if name.lower() not in _KEEP_HEADERS:
            del request.headers[name]
    return request


def scrub_response(response: dict[str, Any]) -> dict[str, Any]:
    """vcrpy ``before_record_response`` hook: drop every header but ``Accept`` and
    ``Content-Type``."""
    headers = response.get("headers", {})
    response["headers"] = {k: v for k, v in headers.items() if k.lower() in _KEEP_HEADERS}
    return response
