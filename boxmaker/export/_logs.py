"""Reading the logs an exporter turns into another format: the one source iterator
(:func:`boxmaker.session.read_logs`: a log the session refuses, or a copy of a session, is
left out with one warning) and the one split into turns (:func:`boxmaker.session.split_turns`),
so an export counts what the frames count."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

from ..records import parse_time
from ..session import Reading, Source, read_logs, split_turns

__all__ = ["boxmaker_version", "nanos", "readings"]


def readings(source: Source) -> Iterator[Reading]:
    """Each log of ``source`` that is read, split into turns, one at a time.

    Raises:
        SessionError: a path of ``source`` names no log.
    """
    for log in read_logs(source):
        yield split_turns(log)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def nanos(time: str) -> int:
    """A log time (ISO 8601 with an offset) as nanoseconds since the Unix epoch (UTC),
    exact at the records' microseconds, negative before 1970 (a time's float seconds cut
    toward zero put ``1969-12-31T23:59:59.5Z`` 1 s late)."""
    since = parse_time(time) - _EPOCH  # days may be negative; seconds, microseconds never
    return ((since.days * 86_400 + since.seconds) * 1_000_000 + since.microseconds) * 1000


def boxmaker_version() -> str:
    """The installed boxmaker's version (``"unknown"`` when run from a checkout that is not
    installed), as the exports name their writer."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("boxmaker")
    except PackageNotFoundError:  # pragma: no cover - an installed package in CI
        return "unknown"
