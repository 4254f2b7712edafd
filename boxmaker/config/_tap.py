"""The tap's knobs (``[tap]`` in a config file): where it listens and what it lets in.

``boxmaker tap`` is a network service in front of a llama-server that holds the agent's
credentials; these bound what any client of its port can make it do (see
:mod:`boxmaker.tap`: only origin-form requests to its own upstream, ``Host`` naming the tap,
no browser's request, bodies, heads and idle connections bounded, a connection count cap).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..errors import ConfigError
from ._checks import check as _check
from ._checks import nonneg as _nonneg

__all__ = ["LOOPBACK_NAMES", "TapConfig"]

_HOST_NAME = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]{1,253}")

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
"""The names a ``Host`` header may give the tap when it listens on a loopback address (each
with the tap's port)."""


@dataclass(frozen=True, kw_only=True)
class TapConfig:
    """What the tap accepts from the clients of its port (:class:`boxmaker.tap.Tap`).

    Raises:
        ConfigError: a value out of range (a size or count below 1, a timeout not positive),
            ``host`` not an IP address, an allowed host that is not a bare name, or an allowed
            origin that is not ``scheme://host[:port]`` or ``*``.
    """

    host: str = "127.0.0.1"
    """The address to listen on: ``127.0.0.1`` (this machine only), ``::1``, or another
    address of this machine (``0.0.0.0``: every interface; then the agents' ``Host`` names must
    be listed in :attr:`allowed_hosts`). Anyone who can reach the port can use the upstream
    with the credentials the agents send: listen elsewhere than loopback on purpose only."""
    max_body_bytes: int = 16 * 1024 * 1024
    """Largest request body in bytes (16 MiB): a longer one is answered HTTP 413 and never
    forwarded, before it is read (``Content-Length``) or as soon as it grows past the cap
    (chunked). The largest real chat request is a full context: about 4 bytes a token, so
    a 262,144-token context is about 1 MiB of text and 2 MiB JSON-escaped; the default leaves
    room for images sent inline (base64) and for contexts of a million tokens."""
    head_timeout_s: float = 10.0
    """Seconds from a request's first byte to the end of its headers; a slower head is
    answered HTTP 408 and the connection closed (a client that trickles its head byte by
    byte holds a connection no longer)."""
    idle_timeout_s: float = 30.0
    """Seconds a connection may stay silent while the tap waits for it: for its next request
    (keep-alive; also a new connection that sends nothing) or for more of a request's body;
    then it is closed. Not counted while the upstream works on an answer (a long prompt's
    processing is not the agent's silence)."""
    max_connections: int = 128
    """Connections open at once, at most; one more is answered HTTP 503 and closed at once.
    With :attr:`max_body_bytes`, it bounds the memory the bodies in flight can take (128 x
    16 MiB = 2 GiB at the very worst)."""
    allowed_hosts: tuple[str, ...] = ()
    """More names a ``Host`` header may give the tap (``"myhost"``, ``"10.0.0.5"``), each
    with the tap's port; the loopback names :data:`LOOPBACK_NAMES` are always accepted when
    the tap listens on loopback, and :attr:`host` itself. Any other ``Host`` is refused with
    HTTP 421: a web page whose name was made to resolve to 127.0.0.1 (DNS rebinding) sends
    its own name."""
    allowed_origins: tuple[str, ...] = ()
    """Browser origins allowed to use the tap (``"http://localhost:8888"`` for a notebook
    that calls the tap from the browser; ``"*"``: any). A request with any other ``Origin``
    header (every browser's cross-origin request has one) is refused with HTTP 403; clients
    that are not browsers send none."""

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ConfigError(
                f"tap.host = {self.host!r} is not an IP address (127.0.0.1, ::1, 0.0.0.0, ...)"
            ) from None
        for name in self.allowed_hosts:
            if not (isinstance(name, str) and _HOST_NAME.fullmatch(name)):
                raise ConfigError(
                    f"tap.allowed_hosts: {name!r} is not a bare host name or address "
                    "(no scheme, port or path; an IPv6 address in brackets)"
                )
        for origin in self.allowed_origins:
            scheme, sep, rest = origin.partition("://") if isinstance(origin, str) else ("", "", "")
            if origin != "*" and (
                scheme not in ("http", "https") or not sep or not rest or "/" in rest
            ):
                raise ConfigError(
                    f"tap.allowed_origins: {origin!r} is not scheme://host[:port] or '*'"
                )
        _check(
            "tap",
            max_body_bytes=(self.max_body_bytes, _whole(self.max_body_bytes)),
            head_timeout_s=(self.head_timeout_s, _positive(self.head_timeout_s)),
            idle_timeout_s=(self.idle_timeout_s, _positive(self.idle_timeout_s)),
            max_connections=(self.max_connections, _whole(self.max_connections)),
        )

    @property
    def loopback(self) -> bool:
        """:attr:`host` is a loopback address (only this machine can connect)."""
        return ipaddress.ip_address(self.host).is_loopback


def _whole(value: object) -> bool:
    return type(value) is int and value >= 1


def _positive(value: object) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return _nonneg(value) and value > 0
