"""The rule of what is a secret, shared by every writer: cassettes, session logs, the manifest.

One rule, used by :mod:`boxmaker.cassettes` (on recorded bytes) and by
:class:`~boxmaker.session.Session` and the batch manifest (on the JSON objects they write):

- a credential (the ``ClientConfig.api_key`` sent as ``Authorization: Bearer``, or any value
  given as a secret) becomes :data:`API_KEY_PLACEHOLDER` wherever it appears, also in its
  URL-encoded and JSON-escaped forms; a credential shorter than :data:`HARVEST_MIN`
  characters found in a request (a placeholder such as ``EMPTY`` for a local server) is not
  searched for, since replacing it everywhere garbles the text;
- the string value under a credential-like key (:data:`SECRET_FIELDS`, compared in lower
  case with ``-`` read as ``_``; for a dotted key such as ``client.api_key``, its last part)
  becomes :data:`SECRET_PLACEHOLDER`, at any depth; a value that is not a string (a tool's
  JSON Schema property named ``token``) is left alone.

Not covered: a credential nobody named (another service's key typed into a message), or a
JSON key inside a JSON-encoded string (tool-call ``arguments``).
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "API_KEY_PLACEHOLDER",
    "HARVEST_MIN",
    "SECRET_FIELDS",
    "SECRET_PLACEHOLDER",
    "forms",
    "hide_in_json",
    "is_secret_field",
    "norm",
    "searchable",
]

SECRET_FIELDS = (
    "api_key",
    "apikey",
    "x_api_key",
    "key_secret",
    "token",
    "access_token",
    "refresh_token",
    "id_token",
    "auth_token",
    "session_token",
    "bearer",
    "secret",
    "client_secret",
    "password",
    "passwd",
    "authorization",
    "private_key",
)
"""JSON keys whose string values are written as ``<SECRET>``, at any depth (compared in lower
case, ``-`` as ``_``). A value that is not a string (a tool's JSON Schema property named
``token``) is left alone."""

API_KEY_PLACEHOLDER = "<API_KEY>"
"""What replaces a credential wherever it appears."""

SECRET_PLACEHOLDER = "<SECRET>"
"""What replaces the string value of a credential-like JSON field."""

HARVEST_MIN = 8
"""Shortest credential searched for everywhere (characters); a shorter one is only removed
where it stands (a header, a field)."""


def norm(name: str) -> str:
    """A key or parameter name as compared: stripped, lower case, ``-`` as ``_``."""
    return name.strip().lower().replace("-", "_")


_FIELDS = frozenset(norm(n) for n in SECRET_FIELDS)


def is_secret_field(name: str) -> bool:
    """Whether a JSON key (or the last part of a dotted config key) names a credential."""
    return norm(name.rpartition(".")[2]) in _FIELDS


def searchable(secrets: Iterable[str | None]) -> tuple[str, ...]:
    """The credentials worth hiding everywhere: set, at least :data:`HARVEST_MIN` characters,
    each once, longest first (so a key that contains another is hidden whole)."""
    found = {s for s in secrets if isinstance(s, str) and len(s) >= HARVEST_MIN}
    return tuple(sorted(found, key=len, reverse=True))


def forms(secret: str) -> list[bytes]:
    """A secret as it may appear in bytes: itself, URL-encoded, JSON-escaped (longest first)."""
    found = {
        secret,
        urllib.parse.quote(secret, safe=""),
        urllib.parse.quote_plus(secret),
        json.dumps(secret)[1:-1],
    }
    return sorted((f.encode() for f in found), key=len, reverse=True)


def _hide_text(text: str, secrets: Sequence[str]) -> str:
    for secret in secrets:
        for form in forms(secret):
            text = text.replace(form.decode(), API_KEY_PLACEHOLDER)
    return text


def hide_in_json(value: Any, secrets: Sequence[str] = ()) -> Any:
    """A JSON value (as ``json.loads`` gives it) with the rule above applied: the string under
    a credential-like key becomes ``<SECRET>``, each of ``secrets`` (see :func:`searchable`)
    becomes ``<API_KEY>`` in every string, keys included. The value is not changed in place;
    parts without a secret are returned as they are (the same objects)."""
    if isinstance(value, str):
        return _hide_text(value, secrets) if secrets else value
    if isinstance(value, list):
        items = [hide_in_json(v, secrets) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        changed = False
        for key, item in value.items():
            new_key = _hide_text(key, secrets) if secrets and isinstance(key, str) else key
            if isinstance(item, str) and isinstance(key, str) and is_secret_field(key):
                new = SECRET_PLACEHOLDER
            else:
                new = hide_in_json(item, secrets)
            changed = changed or new is not item or new_key is not key
            out[new_key] = new
        return out if changed else value
    return value
