"""The api keys a turn's requests carry, for the session to keep out of its log."""

from __future__ import annotations

from ..client import Client
from ..config import Config

__all__ = ["api_keys"]


def api_keys(config: Config, client: object) -> tuple[str | None, ...]:
    """``config.client.api_key`` and, when ``client`` is a :class:`~boxmaker.client.Client`,
    the key of its own config (sent as ``Authorization: Bearer``; ``None`` when unset).

    A server may echo the key (in an answer, an error body); :meth:`Session.hide` writes it
    as ``<API_KEY>``, the way the cassettes do.
    """
    own = client.config.api_key if isinstance(client, Client) else None
    return (config.client.api_key, own)
