"""A session: an append-only JSON Lines log of records on disk, its baseline and wire
``messages()``.

One writer per log (an exclusive ``flock`` while open for writing; read-only opens never
lock), one turn at a time. ``read_log`` is the one reader of the format (torn tails, head
and schema checks, older schemas upgraded by named migrations); ``upgrade_log`` rewrites a
log in place atomically.

Reading many logs: ``read_logs(source)`` is the one source iterator (which logs a file, a
folder, a list or a batch folder names, which are read, which are copies of a session), and
``split_turns(log)`` the one split of a log into turns, completions and tool calls with their
origin and times. Every view of a log (frames, exports, the transcript, the tap's what-if,
forks, compare) reads through these two.
"""

from .._public import publish
from ._file import LogReadWarning, LogWriter, dumps_line, read_log, upgrade_log
from ._fork import first_difference
from ._safe import check_folder
from ._session import (
    SYNC_POLICIES,
    Messages,
    Session,
    message_of,
    messages,
    new_session_id,
    wire_arguments,
)
from ._sources import Log, Source, find_logs, open_log, read_logs
from ._turns import (
    CALL_SOURCES,
    ENDING_LIMITS,
    KNOWN_TYPES,
    Call,
    CallSource,
    Reading,
    Request,
    Turn,
    inferred_outcome,
    split_turns,
)

__all__ = [
    "CALL_SOURCES",
    "ENDING_LIMITS",
    "KNOWN_TYPES",
    "SYNC_POLICIES",
    "Call",
    "CallSource",
    "Log",
    "LogReadWarning",
    "LogWriter",
    "Messages",
    "Reading",
    "Request",
    "Session",
    "Source",
    "Turn",
    "check_folder",
    "dumps_line",
    "find_logs",
    "first_difference",
    "inferred_outcome",
    "message_of",
    "messages",
    "new_session_id",
    "open_log",
    "read_log",
    "read_logs",
    "split_turns",
    "upgrade_log",
    "wire_arguments",
]

publish(globals(), __all__)
