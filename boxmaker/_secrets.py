"""The rule of what is a secret, shared by every writer: cassettes, session logs (the loop's
and the tap's), the batch manifest, ``scores.ndjson``.

One rule, used by :mod:`boxmaker.cassettes` (on recorded bytes) and by
:class:`~boxmaker.session.Session`, the batch manifest and the scores (on the JSON objects they
write):

- the credentials a request shows (:func:`credentials_in`): the token of an
  ``Authorization`` or ``Proxy-Authorization`` header (``Bearer X``: ``X``; ``Basic X``:
  ``X``, and the ``user:password`` it encodes and the password), the value of an
  ``api-key`` or ``x-api-key`` header, the values of credential-like query parameters
  (:data:`SECRET_QUERY_PARAMETERS`: ``?api_key=``) and of credential-like JSON fields of its
  body (:data:`SECRET_FIELDS`: ``"api_key": "..."``), URL-escaped or JSON-escaped as they
  came read as the text they stand for;
- a credential (those, the ``ClientConfig.api_key``, or any value given as a secret) becomes
  :data:`API_KEY_PLACEHOLDER` wherever it appears, also in its URL-encoded and JSON-escaped
  forms (:func:`forms`); a credential shorter than :data:`HARVEST_MIN` characters (a
  placeholder such as ``EMPTY`` for a local server) is not searched for, since replacing it
  everywhere garbles the text;
- the string value under a credential-like key (:data:`SECRET_FIELDS`, compared in lower
  case with ``-`` read as ``_``; for a dotted key such as ``client.api_key``, its last part)
  becomes :data:`SECRET_PLACEHOLDER`, at any depth, in a JSON value (:func:`hide_in_json`)
  or in JSON text (:func:`hide_fields`); a value that is not a string (a tool's JSON Schema
  property named ``token``) is left alone.

Cost: linear in the size of what is scrubbed. The forms of a set of credentials are made once
(:func:`compiled`, kept for the next call with the same credentials), never once per string
written (issue 36: a 50 MB ``api_key``, re-quoted for each string, made a turn take 39 s).

Not covered: a credential nobody named (another service's key typed into a message), or a
JSON key inside a JSON-encoded string (tool-call ``arguments``).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
import urllib.parse
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "API_KEY_PLACEHOLDER",
    "CREDENTIAL_HEADERS",
    "HARVEST_MIN",
    "SECRET_FIELDS",
    "SECRET_PLACEHOLDER",
    "SECRET_QUERY_PARAMETERS",
    "Compiled",
    "compiled",
    "credentials_in",
    "forms",
    "hide_bytes",
    "hide_fields",
    "hide_in_json",
    "hide_text",
    "is_secret_field",
    "is_secret_query",
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
"""URI query parameter names whose values are credentials (compared in lower case, ``-`` as
``_``: ``api-key``, ``API_KEY`` and ``Api-Key`` are all ``api_key``)."""

CREDENTIAL_HEADERS = ("authorization", "proxy-authorization", "api-key", "x-api-key")
"""Request headers whose values are credentials (lower case); an ``Authorization`` value
``Scheme X`` gives ``X``."""


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


_URL_SAFE = re.compile(r"[A-Za-z0-9_.~-]*")

_QUOTE = [chr(b) if _URL_SAFE.fullmatch(chr(b)) else f"%{b:02X}" for b in range(256)]
"""Each byte as ``urllib.parse.quote(..., safe="")`` writes it."""

_QUOTE_PLUS = [("+" if b == 0x20 else q) for b, q in enumerate(_QUOTE)]
"""Each byte as ``urllib.parse.quote_plus`` writes it."""


def _quoted(secret: str, table: list[str]) -> str:
    """``secret`` URL-encoded as ``urllib.parse.quote``/``quote_plus`` encode it (UTF-8), by a
    table in C's loop (``quote`` runs Python code per character: 11 s for 50 MB); a lone
    surrogate (JSON allows one) is encoded as it is, not refused."""
    return "".join(map(table.__getitem__, secret.encode("utf-8", "surrogatepass")))


def forms(secret: str) -> list[bytes]:
    """A secret as it may appear in bytes: itself, URL-encoded, JSON-escaped (longest first;
    UTF-8, a lone surrogate kept as it is)."""
    return [f.encode("utf-8", "surrogatepass") for f in _text_forms(secret)]


def _text_forms(secret: str) -> list[str]:
    found = {secret, json.dumps(secret)[1:-1]}
    if not _URL_SAFE.fullmatch(secret):  # most keys: URL-encoding leaves them as they are
        quoted = _quoted(secret, _QUOTE)
        found.add(quoted)
        found.add(_quoted(secret, _QUOTE_PLUS) if " " in secret else quoted)
    return sorted(found, key=len, reverse=True)


class Compiled:
    """Every form of a set of credentials, made once (:func:`compiled`): each credential in
    order (longest first, as :func:`searchable` gives them), its forms longest first, so a
    key that contains another is hidden whole.

    Attributes:
        text: the forms as text, for :func:`hide_text` and :func:`hide_in_json`.
        data: the forms as UTF-8 bytes, for :func:`hide_bytes` (made when first asked).
    """

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.text: tuple[str, ...] = tuple(f for s in secrets for f in _text_forms(s))
        self._data: tuple[bytes, ...] | None = None

    @property
    def data(self) -> tuple[bytes, ...]:
        """The forms as UTF-8 bytes (a lone surrogate kept as it is)."""
        if self._data is None:
            self._data = tuple(f.encode("utf-8", "surrogatepass") for f in self.text)
        return self._data


@functools.lru_cache(maxsize=8)
def _compiled(secrets: tuple[str, ...]) -> Compiled:
    return Compiled(secrets)


def compiled(secrets: Sequence[str] | Compiled) -> Compiled:
    """The forms of ``secrets`` (see :func:`searchable`), made once and kept for the next
    call with the same credentials (the last 8 sets)."""
    return secrets if isinstance(secrets, Compiled) else _compiled(tuple(secrets))


def hide_text(text: str, secrets: Sequence[str] | Compiled) -> str:
    """``text`` with every form of each of ``secrets`` written :data:`API_KEY_PLACEHOLDER`
    (linear in ``len(text)`` for each form)."""
    for form in compiled(secrets).text:
        if form in text:
            text = text.replace(form, API_KEY_PLACEHOLDER)
    return text


def hide_bytes(data: bytes, secrets: Sequence[str] | Compiled) -> bytes:
    """:func:`hide_text` on bytes (a recorded body, a URI)."""
    placeholder = API_KEY_PLACEHOLDER.encode()
    for form in compiled(secrets).data:
        if form in data:
            data = data.replace(form, placeholder)
    return data


def hide_in_json(value: Any, secrets: Sequence[str] | Compiled = ()) -> Any:
    """A JSON value (as ``json.loads`` gives it) with the rule above applied: the string under
    a credential-like key becomes ``<SECRET>``, each of ``secrets`` (see :func:`searchable`)
    becomes ``<API_KEY>`` in every string, keys included. The value is not changed in place;
    parts without a secret are returned as they are (the same objects). Linear in the size of
    the value (the forms are made once, :func:`compiled`)."""
    return _hide_json(value, compiled(secrets).text)


def _hide_json(value: Any, forms: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return _hide_forms(value, forms) if forms else value
    if isinstance(value, list):
        items = [_hide_json(v, forms) for v in value]
        return value if all(a is b for a, b in zip(items, value, strict=True)) else items
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        changed = False
        for key, item in value.items():
            new_key = _hide_forms(key, forms) if forms and isinstance(key, str) else key
            if isinstance(item, str) and isinstance(key, str) and is_secret_field(key):
                new = SECRET_PLACEHOLDER
            else:
                new = _hide_json(item, forms)
            changed = changed or new is not item or new_key is not key
            out[new_key] = new
        return out if changed else value
    return value


def _hide_forms(text: str, forms: tuple[str, ...]) -> str:
    for form in forms:
        if form in text:
            text = text.replace(form, API_KEY_PLACEHOLDER)
    return text


_FIELD_PAIR = re.compile(
    b'"('
    + b"|".join(
        re.escape(norm(n)).encode().replace(b"_", b"[-_]")
        for n in sorted(SECRET_FIELDS, key=len, reverse=True)
    )
    + rb')"\s*:\s*"((?:[^"\\]|\\.)*)"',
    re.IGNORECASE,
)
"""A credential-like JSON key with its string value, ``"Api-Key": "..."``, in body text (the
value's escapes kept whole; a key written with escapes is not recognised)."""

_QUERY = frozenset(norm(n) for n in SECRET_QUERY_PARAMETERS)


def _json_text(raw: bytes) -> str | None:
    """The text of a JSON string's inside (escapes resolved), ``None`` if malformed."""
    try:
        value = json.loads(b'"' + raw + b'"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _credential_fields(body: bytes) -> Iterable[tuple[re.Match[bytes], str]]:
    if b'"' not in body:
        return
    for match in _FIELD_PAIR.finditer(body):
        yield match, _json_text(match.group(2)) or ""


def hide_fields(body: bytes) -> bytes:
    """JSON text (a body, SSE events) with the string value of every credential-like field
    written :data:`SECRET_PLACEHOLDER`, in place in the text (the rest keeps its bytes)."""
    out, start = [], 0
    for match, _ in _credential_fields(body):
        out += [body[start : match.start(2)], SECRET_PLACEHOLDER.encode()]
        start = match.end(2)
    return b"".join([*out, body[start:]]) if out else body


def is_secret_query(name: str) -> bool:
    """Whether a URI query parameter name names a credential (:data:`SECRET_QUERY_PARAMETERS`)."""
    return norm(name) in _QUERY


def credentials_in(
    headers: Iterable[tuple[str, str]] = (), uri: str = "", body: bytes = b""
) -> list[str]:
    """The credentials a request shows, to hide wherever they appear in what follows it.

    Args:
        headers: the request's headers, ``(name, value)`` (names in any case).
        uri: the request's URL or target (only its query is read).
        body: the request's body (credential-like JSON fields are read from its text).

    Returns:
        In order, each once, empty values left out: the credential of each of
        :data:`CREDENTIAL_HEADERS` (``Scheme X`` gives ``X``; ``Basic X`` also the
        ``user:password`` ``X`` encodes, and the password), the values of credential-like
        query parameters (URL-escapes resolved) and of credential-like JSON fields (JSON
        escapes resolved). Values shorter than :data:`HARVEST_MIN` are left out (a
        placeholder such as ``EMPTY`` cannot be told from text). Never raises.
    """
    found: list[str] = []
    for name, value in headers:
        if name.strip().lower() in CREDENTIAL_HEADERS:
            found += _header_credentials(str(value))
    try:
        query = urllib.parse.parse_qsl(urllib.parse.urlsplit(uri).query)
    except ValueError:  # a malformed URL (an unclosed [ in its host): no query read
        query = []
    found += [value for name, value in query if is_secret_query(name)]
    found += [value for _, value in _credential_fields(body)]
    return list(dict.fromkeys(v for v in found if len(v) >= HARVEST_MIN))


def _header_credentials(value: str) -> list[str]:
    # the scheme ends at any white space: h11 takes "Bearer<TAB>KEY", and the key went unhidden
    scheme, *rest = value.split(None, 1) or [""]
    token = rest[0].strip() if rest else scheme
    out = [token]
    if scheme.lower() == "basic" and token:
        try:
            pair = base64.b64decode(token, validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            return out
        out += [pair, pair.partition(":")[2]]
    return out
