"""A session: an append-only JSON Lines log of records on disk, its baseline and wire
``messages()``.

One writer per log (an exclusive ``flock`` while open for writing; read-only opens never
lock), one turn at a time. ``read_log`` is the one reader of the format (torn tails, head
and schema checks, older schemas upgraded by named migrations); ``upgrade_log`` rewrites a
log in place atomically.
"""

from .._public import publish
from ._file import LogReadWarning, LogWriter, dumps_line, read_log, upgrade_log
from ._fork import first_difference
from ._safe import check_folder
from ._session import Session, message_of, messages, new_session_id, wire_arguments

__all__ = [
    "LogReadWarning",
    "LogWriter",
    "Session",
    "check_folder",
    "dumps_line",
    "first_difference",
    "message_of",
    "messages",
    "new_session_id",
    "read_log",
    "upgrade_log",
    "wire_arguments",
]

publish(globals(), __all__)
