"""Side requests: the small JSON requests other parts send to the same llama-server.

Cache forensics asks the server that served a session for its template and tokenizer
(llama.cpp's ``POST /apply-template``, ``POST /tokenize``, ``GET /props``). It does so through
the protocol here, which :class:`boxmaker.client.Client` offers (:meth:`Client.server_json`),
so the client's transport and key stay its own, and any client that offers the method can be
asked (a test's fake that does not offer it simply has no server).

Every side request carries the request extension :data:`SIDE_REQUEST`. A transport that must
not send it (an open cassette: it holds the chat traffic only) answers it at once with
:data:`SIDE_REFUSED_STATUS` and an error object of type :data:`SIDE_REFUSED`; the client raises
that as an ``InferError`` whose ``error["type"]`` says so (:func:`refused`), and the caller
treats it as "no server to ask here", not as a failure.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Protocol, runtime_checkable

import httpx

from ..errors import BoxmakerError, InferError
from ._cancel import cancellable
from ._reuse import ConnectionTrace, send_once_more

__all__ = [
    "SIDE_REFUSED",
    "SIDE_REFUSED_STATUS",
    "SIDE_REQUEST",
    "ServerJson",
    "refused",
    "side_json",
]

SIDE_REQUEST = "boxmaker.side_request"
"""The httpx request extension (value ``True``) that marks a side request."""

SIDE_REFUSED = "side_request_refused"
"""``error.type`` of the answer a transport gives to a side request it does not send."""

SIDE_REFUSED_STATUS = 503
"""The HTTP status of that answer."""


@runtime_checkable
class ServerJson(Protocol):
    """A client that can send a side request to its server (:meth:`Client.server_json`)."""

    def server_json(
        self, method: str, path: str, body: Any = None, *, timeout_s: float
    ) -> Any:  # pragma: no cover - a protocol
        """One JSON request to ``path`` of the client's server; the parsed JSON answer.

        Raises:
            InferError: no connection, or an HTTP status other than 200 (status, body and
                the ``error`` object kept).
            BoxmakerError: an answer that is not JSON.
        """
        ...


def refused(exc: InferError) -> bool:
    """Whether ``exc`` is a transport's refusal of a side request (:data:`SIDE_REFUSED`)."""
    return exc.error is not None and exc.error.get("type") == SIDE_REFUSED


def side_json(
    http: httpx.Client,
    url: str,
    method: str,
    path: str,
    body: Any,
    timeout_s: float,
    cancel: threading.Event | None = None,
) -> Any:
    """Send one side request with ``http`` to ``url + path`` (JSON ``body``, ``None``: none)
    and parse the answer (sent once more when it failed on a kept connection the server had
    closed: :func:`~boxmaker.client._reuse.send_once_more`); raises as
    :meth:`ServerJson.server_json` says, and
    :class:`~boxmaker.errors.RequestCancelled` when ``cancel`` is set (within about 0.1 s,
    :func:`~boxmaker.client._cancel.cancellable`)."""
    try:
        with cancellable(cancel, f"{method} {path} at {url}") as watched:

            def send(trace: ConnectionTrace) -> httpx.Response:
                return http.request(
                    method,
                    f"{url}{path}",
                    json=body,
                    timeout=timeout_s,
                    extensions={SIDE_REQUEST: True, **watched, "trace": trace},
                )

            # a kept connection the server closed under it (llama-server closes after a
            # stream): sent once more on a new one, as a chat request is
            response = send_once_more(send, watched.get("trace"))
    except httpx.HTTPError as exc:
        raise InferError(f"{method} {path} at {url} failed: {exc!r}") from exc
    if response.status_code != 200:
        text = response.text
        raise InferError(
            f"{method} {path}: HTTP {response.status_code} {text[:200]}",
            status=response.status_code,
            body=text,
            error=_error_object(text),
        )
    try:
        return response.json()
    except ValueError as exc:
        raise BoxmakerError(f"{method} {path}: the answer is not JSON") from exc


def _error_object(text: str) -> dict[str, Any] | None:
    """The ``error`` object of an error answer's JSON body (llama.cpp's shape), if any."""
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return None
    return error if isinstance(error, dict) else None
