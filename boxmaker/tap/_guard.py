"""What the tap lets in: the rules a request meets before anything goes upstream, and the
clocks and count of its connections.

The tap holds no secret of its own, but every agent's request carries one (an
``Authorization`` header) and its port reaches a llama-server. So nothing but a plain request
for the upstream's own paths is forwarded (issue 36: a target written ``@host:port/path``
went to that host with the agent's key; browsers could reach the tap through DNS rebinding;
1 GB bodies and silent connections were held without end):

- the request target is in origin form (``/path?query``, RFC 9112 section 3.2.1): an
  absolute-form (``http://host/...``), authority-form (``host:port``, ``CONNECT``),
  asterisk-form (``*``, also the HTTP/2 preface ``PRI * HTTP/2.0``) or any other target is
  answered 400; the upstream's address comes from the tap's configuration alone
  (:func:`upstream_url`), never from the request;
- a protocol upgrade (``Upgrade``: WebSocket, ``h2c``) is answered 400 (the tap forwards
  HTTP/1.1 requests and answers, nothing else);
- ``Host`` names the tap (:attr:`Guard.hosts`; 400 when missing or repeated, 421 when it
  names another host: a web page whose name was made to resolve to 127.0.0.1 sends its own);
- a request with an ``Origin`` header (a browser's) is answered 403 unless the origin is
  allowed (:attr:`~boxmaker.config.TapConfig.allowed_origins`);
- a body over :attr:`~boxmaker.config.TapConfig.max_body_bytes` is answered 413, before it
  is read when ``Content-Length`` says so, else as soon as it grows past the cap
  (:func:`read_body`);
- a connection's head must come within ``head_timeout_s`` of its first byte (else 408), a
  connection waiting for a request or for more of a body is closed after ``idle_timeout_s``
  of silence (408 when a request was under way), and one connection over
  ``max_connections`` is answered 503 and closed (:func:`guarded_protocol`).

Every refusal is an HTTP answer with a JSON body in OpenAI's error shape
(``{"error": {"message", "type": "tap_refused", "code"}}``) and ``Connection: close``; none
raises inside the server (no traceback), none reaches the upstream.
"""

from __future__ import annotations

import asyncio
import contextvars
import http
import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import h11
import yarl
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..config import LOOPBACK_NAMES, TapConfig

__all__ = ["CUT", "Guard", "Refusal", "guarded_protocol", "read_body", "refuse", "upstream_url"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_TUNNELS = frozenset({"CONNECT", "PRI"})


@dataclass(frozen=True)
class Refusal:
    """Why a request is not forwarded: the HTTP ``status`` the client gets and the
    ``message`` (in words, naming the knob or flag that would let it in, where one does)."""

    status: int
    message: str


def answer_bytes(refusal: Refusal) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The headers and JSON body of a refusal (OpenAI's error shape, ``Connection: close``)."""
    body = json.dumps(
        {"error": {"message": refusal.message, "type": "tap_refused", "code": refusal.status}}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    return headers, body


def raw_answer(refusal: Refusal) -> bytes:
    """A refusal as the bytes of a whole HTTP/1.1 answer (for a connection the server has not
    parsed a request of: a head too slow, one connection too many)."""
    headers, body = answer_bytes(refusal)
    reason = http.HTTPStatus(refusal.status).phrase.encode()
    head = b"HTTP/1.1 %d %s\r\n" % (refusal.status, reason)
    return head + b"".join(k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n" + body


async def refuse(send: Send, refusal: Refusal) -> None:
    """Answer the request with ``refusal`` (the server closes the connection after it)."""
    headers, body = answer_bytes(refusal)
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """The rules of the module docstring for one tap: its :class:`TapConfig` and the port it
    listens on (``Host`` must name it).

    Attributes:
        hosts: the ``Host`` header values accepted (lower case bytes, ``name:port``; also the
            bare name when the port is 80).
        origins: the ``Origin`` values accepted (``"*"``: any).
        max_body_bytes: the body cap (bytes).
    """

    def __init__(self, config: TapConfig, port: int) -> None:
        address = ipaddress.ip_address(config.host)
        names = list(LOOPBACK_NAMES) if address.is_loopback or address.is_unspecified else []
        if not address.is_unspecified:  # 0.0.0.0 or :: is no name a client can use
            names.append(f"[{address}]" if address.version == 6 else str(address))
        names += config.allowed_hosts
        hosts = {f"{n}:{port}".lower().encode() for n in names}
        if port == 80:
            hosts |= {n.lower().encode() for n in names}
        self.hosts = frozenset(hosts)
        self.origins = frozenset(o.lower() for o in config.allowed_origins)
        self.max_body_bytes = config.max_body_bytes
        self._port = port

    def check(self, scope: Scope) -> Refusal | None:
        """The refusal of a request (its ASGI ``scope``), or ``None`` to forward it."""
        method = str(scope.get("method", ""))
        raw_path = scope.get("raw_path") or b""
        if method in _TUNNELS or not raw_path.startswith(b"/") or b"#" in raw_path:
            shown = raw_path.decode("latin-1")[:80]
            return Refusal(
                400,
                f"the tap forwards only requests for a path of its upstream (origin form, "
                f"/path?query): {method} {shown!r} is refused",
            )
        host: list[bytes] = []
        origin: bytes | None = None
        length: bytes | None = None
        for name, value in scope.get("headers") or ():
            if name == b"host":
                host.append(value)
            elif name == b"origin":
                origin = value
            elif name == b"upgrade":
                shown = value.decode("latin-1")[:40]
                why = f"the tap does not switch protocols (Upgrade: {shown}): refused"
                return Refusal(400, why)
            elif name == b"content-length":
                length = value
        if len(host) != 1:
            why = "no Host header" if not host else "more than one Host header"
            return Refusal(400, f"{why}: a request to the tap names it in one Host header")
        if host[0].strip().lower() not in self.hosts:
            shown = host[0].decode("latin-1")[:80]
            return Refusal(
                421,
                f"Host {shown!r} does not name the tap (127.0.0.1:{self._port}); a name other "
                "than the tap's own is refused (a web page's, through DNS rebinding); "
                "allow one with tap.allowed_hosts (--allow-host)",
            )
        if origin is not None and not self._origin_allowed(origin):
            shown = origin.decode("latin-1")[:80]
            return Refusal(
                403,
                f"a browser's request (Origin {shown!r}) is refused; allow the origin "
                "with tap.allowed_origins (--allow-origin)",
            )
        digits = (length or b"").strip()
        if digits.isdigit() and (len(digits) > 18 or int(digits) > self.max_body_bytes):
            return self.too_large()
        return None

    def _origin_allowed(self, origin: bytes) -> bool:
        return "*" in self.origins or origin.decode("latin-1").strip().lower() in self.origins

    def too_large(self) -> Refusal:
        """The refusal of a body over the cap."""
        return Refusal(
            413,
            f"the request body is larger than the tap's cap of {self.max_body_bytes} bytes "
            "(tap.max_body_bytes, --max-body-bytes)",
        )


async def read_body(receive: Receive, cap: int) -> bytes | None:
    """The request's body, read whole; ``None`` when the client went away first.

    Raises:
        OverflowError: the body grew past ``cap`` bytes (the rest is not read).
    """
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        part = message.get("body", b"")
        size += len(part)
        if size > cap:
            raise OverflowError(size)
        parts.append(part)
        if not message.get("more_body", False):
            return b"".join(parts)


def upstream_url(base: yarl.URL, scope: Scope) -> yarl.URL:
    """The upstream's URL for a request that passed :meth:`Guard.check`: the scheme, host and
    port of ``base`` (never the request's), ``base``'s path, then the request's path and
    query as they came (bytes, not re-encoded: ``yarl.URL(..., encoded=True)``).

    Raises:
        ValueError: a target that is not printable ASCII (h11 lets no other in), or one that
            would change the upstream's address.
    """
    prefix = base.raw_path.rstrip("/") if base.raw_path != "/" else ""
    query = scope.get("query_string") or b""
    target = scope["raw_path"] + (b"?" + query if query else b"")
    if not all(0x21 <= c <= 0x7E for c in target) or b"#" in target:
        raise ValueError(f"the target {target[:80]!r} is not printable ASCII")
    origin = f"{base.scheme}://{base.raw_authority}"
    url = yarl.URL(origin + prefix + target.decode("ascii"), encoded=True)
    if (url.scheme, url.host, url.port) != (base.scheme, base.host, base.port):
        raise ValueError("the request's target changed the upstream's address")
    return url


def guarded_protocol(config: TapConfig) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) with the tap's clocks and connection cap (see the
    module docstring), for ``uvicorn.Config(http=...)``.

    Why a subclass: uvicorn has a keep-alive timeout but no clock on a request's head or
    body, and accepts any number of connections (issue 36: 600 slow connections still open
    after 90 s). The subclass looks at h11's own state after each read to know what the
    connection waits for; it never switches protocols (an ``Upgrade`` request reaches the
    app, which refuses it)."""

    class GuardedH11(_Clocked):
        head_timeout_s = config.head_timeout_s
        idle_timeout_s = config.idle_timeout_s
        max_connections = config.max_connections

    return GuardedH11


_INCOMPLETE = "ASGI callable returned without completing response."

CUT: contextvars.ContextVar[bool] = contextvars.ContextVar("boxmaker_tap_cut", default=False)
"""Set by the app in a request's task when it cut the agent's answer on purpose (the upstream
broke it off: the agent must see it cut, not ended) and said so itself; uvicorn's cycle runs
the app in that task and reads it when it logs."""


class _Cut(logging.Filter):
    """Leaves out uvicorn's ``ASGI callable returned without completing response.`` for an
    answer the tap cut on purpose (:data:`CUT`): said in the tap's own words on
    ``boxmaker.tap`` (``_proxy._forward``), not as an error of the server. Any other answer
    left unfinished is still said."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.msg == _INCOMPLETE and CUT.get())


HTTP_LOGGER = logging.getLogger("boxmaker.tap.http")
"""What uvicorn's HTTP protocol says of the tap's connections (a malformed request, an
answer left unfinished), instead of ``uvicorn.error``: the tap's, under its own name."""
HTTP_LOGGER.addFilter(_Cut())


class _Clocked(H11Protocol):
    """See :func:`guarded_protocol`; the class attributes are set there."""

    head_timeout_s: float
    idle_timeout_s: float
    max_connections: int
    _clock: asyncio.TimerHandle | None = None
    _clock_kind = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.logger = HTTP_LOGGER  # each request's cycle is given this one

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            why = (
                f"the tap has {self.max_connections} connections open, its cap "
                "(tap.max_connections): try again when one has closed"
            )
            self.transport.write(raw_answer(Refusal(503, why)))
            self.transport.close()
            return
        self._set_clock()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._set_clock()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._set_clock()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_clock()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """h11 could not parse the request (a second ``Host``, none in HTTP/1.1, a malformed
        head): the refusal in the tap's JSON shape, then the connection closed."""
        why = f"not an HTTP/1.1 request the tap can read ({msg.rstrip('.')})"
        self.transport.write(raw_answer(Refusal(400, why)))
        self.transport.close()

    def _should_upgrade(self) -> bool:
        return False  # the app answers an Upgrade request 400; no warning, no switch

    def _set_clock(self) -> None:
        """Arm the clock for what the connection waits for now: a head under way (``head``,
        from its first byte, not restarted by later bytes), a request or a body with no
        byte yet (``idle``, restarted by each byte); none while the answer is on its way."""
        if self.transport.is_closing():
            self._stop_clock()
            return
        state = self.conn.their_state
        if state is h11.IDLE:
            kind = "head" if self.conn.trailing_data[0] else "idle"
        elif state is h11.SEND_BODY:
            kind = "body"
        else:
            kind = ""
        if kind == "head" and self._clock_kind == "head":
            return
        self._stop_clock()
        if kind:
            delay = self.head_timeout_s if kind == "head" else self.idle_timeout_s
            self._clock_kind = kind
            self._clock = self.loop.call_later(delay, self._time_out)

    def _stop_clock(self) -> None:
        if self._clock is not None:
            self._clock.cancel()
        self._clock, self._clock_kind = None, ""

    def _time_out(self) -> None:
        kind, self._clock, self._clock_kind = self._clock_kind, None, ""
        if self.transport.is_closing():
            return
        if kind == "head":
            why = f"the request's head did not arrive in {self.head_timeout_s:g} s"
            self.transport.write(raw_answer(Refusal(408, why + " (tap.head_timeout_s)")))
        elif kind == "body":
            why = f"the request's body stopped for {self.idle_timeout_s:g} s"
            self.transport.write(raw_answer(Refusal(408, why + " (tap.idle_timeout_s)")))
        self.transport.close()
