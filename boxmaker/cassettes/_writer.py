"""A cassette written from exchanges seen elsewhere than inside :func:`use_cassette`: a proxy
(``boxmaker tap --cassette``) that saw each request and answer pass hands them here.

The file is the same as :func:`use_cassette` writes: vcrpy's cassette in the readable form
(:mod:`boxmaker.cassettes`' serializer: request bodies parsed, SSE streams one event a line),
scrubbed by the same rules before anything is written (every header but ``Accept`` and
``Content-Type`` dropped; the request's credentials, the ``Authorization`` token, api-key
headers, credential-like query parameters and JSON fields, hidden wherever they appear in
the interaction). :func:`use_cassette`, the pytest plugin and ``boxmaker cassette show`` read
it; a streamed answer replays event by event.

Each interaction is appended to the file as it is added (the YAML of one more item of the
``interactions`` list), so the file is a whole cassette after each :meth:`CassetteWriter.add`
returns and writing costs the size of one interaction, not of the whole file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from vcr.request import Request as VcrRequest
from vcr.serialize import serialize as vcr_serialize

from ..errors import CassetteError
from ._scrub import credentials, hide_in_request, hide_in_response, scrub_request, scrub_response
from ._serializer import serializer
from ._transport import recorded_response

__all__ = ["CassetteWriter"]

_HEAD = "version: 1\ninteractions:\n"
"""How the readable form of a cassette begins; each interaction then is one list item."""


class CassetteWriter:
    """Append interactions to a cassette file, scrubbed as :func:`use_cassette` scrubs.

    Args:
        path: the YAML file. An existing file is replaced when the first interaction is
            added (as vcrpy's record mode ``all`` re-records); nothing is written before.
        secrets: more values to hide as ``<API_KEY>`` wherever they appear (see
            :func:`use_cassette`; each request's own credentials always are).

    Attributes:
        path: the file.
        count: interactions written so far.

    Not thread-safe: one thread adds (the tap's cassette thread). Close it (or use it as a
    context manager) to release the file.
    """

    def __init__(self, path: str | os.PathLike[str], *, secrets: Sequence[str] = ()) -> None:
        self.path = Path(path)
        self.secrets = tuple(s for s in secrets if s)
        self.count = 0
        self._file: IO[str] | None = None

    def add(
        self,
        *,
        method: str,
        uri: str,
        request_headers: Sequence[tuple[str, str]] | Mapping[str, str],
        request_body: bytes,
        status: int,
        response_headers: Sequence[tuple[str, str]],
        body: bytes,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        """Scrub one exchange and append it to the file (flushed).

        Args:
            method: the request's HTTP method.
            uri: its full URL (``http://host:port/v1/chat/completions?...``); replay matches
                on the method, the path and the body (compared as JSON).
            request_headers: its headers as sent (only credentials are read from them: no
                header but ``Accept`` and ``Content-Type`` is written).
            request_body: its bytes.
            status: the answer's HTTP status.
            response_headers: its headers, in order.
            body: its bytes as they arrived (a compressed body is stored decoded).
            reason: its reason phrase.
            error: the transport error that broke the answer off (``"ReadError: ..."``,
                an httpx class name first), ``None`` when it ended; replay raises it after
                the same bytes.

        Raises:
            CassetteError: the file cannot be written (a full disk, no such directory);
                nothing more should be added then (the last item may be cut short).
        """
        pairs = request_headers.items() if isinstance(request_headers, Mapping) else request_headers
        lines = list(pairs)  # every line (a mapping, as before, holds one value a name)
        vreq = VcrRequest(method, uri, request_body, dict(lines))
        known = credentials(vreq, self.secrets, headers=lines)
        vreq = scrub_request(hide_in_request(vreq, known))
        response = recorded_response(status, reason, response_headers, body, error)
        response = scrub_response(hide_in_response(response, known))
        text = vcr_serialize({"requests": [vreq], "responses": [response]}, serializer)
        if not text.startswith(_HEAD):  # pragma: no cover - the serializer's own layout
            raise CassetteError(f"{self.path}: the serializer's layout changed: {text[:40]!r}")
        try:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("w", encoding="utf-8")
                self._file.write(_HEAD)
            self._file.write(text[len(_HEAD) :])
            self._file.flush()
        except OSError as exc:
            raise CassetteError(f"{self.path}: cannot write the cassette: {exc}") from exc
        self.count += 1

    def close(self) -> None:
        """Close the file (idempotent).

        Raises:
            CassetteError: closing failed (what was flushed stays written).
        """
        file, self._file = self._file, None
        if file is not None:
            try:
                file.close()
            except OSError as exc:
                raise CassetteError(f"{self.path}: cannot close the cassette: {exc}") from exc

    def __enter__(self) -> CassetteWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
