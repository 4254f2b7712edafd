"""The HTTP-status retry policy of :meth:`boxmaker.client.Client.chat_with_retry`: which
answers are retried, and how long to wait before the next attempt.

Proxies and servers answer these while a model loads or past a concurrency limit: llama.cpp
503 ``"Loading model"``; llama-swap, LiteLLM and other routers 429 (rate or concurrency
limit), 502 (the upstream is not up yet) and 504 (the upstream did not answer in time). An
answer may say how long to wait in ``Retry-After`` (RFC 9110 section 10.2.3: a number of
seconds, or an HTTP date). No I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from ..config import ClientConfig

__all__ = ["RETRIED_STATUSES", "retry_after_s", "retry_delay_s"]

RETRIED_STATUSES = frozenset({429, 502, 503, 504})
"""HTTP statuses retried like a connection failure (the request is sent again as it was)."""


def retry_after_s(value: str | None, now: datetime | None = None) -> float | None:
    """The wait a ``Retry-After`` header asks for, in seconds (``>= 0``).

    Args:
        value: the header's value: ``"120"`` (seconds) or an HTTP date (``"Wed, 21 Oct 2015
            07:28:00 GMT"``, then the wait is from ``now``); ``None`` when absent.
        now: the current time (aware), ``None`` for the clock's.

    Returns:
        The seconds to wait (a date in the past gives 0), or ``None`` for no header or a value
        that is neither form (then the usual backoff applies).
    """
    if value is None:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # RFC 9110 dates are GMT
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN, infinities
        return None
    return max(0.0, seconds)


def retry_delay_s(attempt: int, config: ClientConfig, retry_after: float | None) -> float:
    """Seconds to wait before retry ``attempt`` (1, 2, ...): the server's ``Retry-After`` when
    it sent one, else ``retry_base_delay_s * 2**(attempt-1)``; at most ``retry_max_delay_s``."""
    if retry_after is None:
        retry_after = config.retry_base_delay_s * 2 ** (attempt - 1)
    return min(retry_after, config.retry_max_delay_s)
