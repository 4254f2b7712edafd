"""pandas frames over one or many session logs: ``requests``, ``turns``,
``cache_losses``, ``limit_hits``, ``tool_calls``, ``summary`` (``load`` reads each log once
and gives all six). Columns are data (``COLUMNS``). ``forks``: one row per fork (its parent,
turn and point, the first record that differs from the parent, usage, limit hits and answer
compared); the summary carries ``parent_session``, ``fork_turn`` and ``fork_point``. A fork's
log begins with copies of its parent's records: their rows in the per-row frames have
``from_parent`` true and the summary's totals leave them out (``inherited_turns``,
``inherited_requests``), so sums over a parent and its forks count each record once. Two
engines compute the frames: pandas (in
memory, the default) and DuckDB (``engine="duckdb"``, the ``duckdb`` extra: the same columns and
values, SQL over the same validated records, past memory); :func:`connect` gives the frames as
DuckDB views and :func:`query` runs ad-hoc SQL over them.

The logs come from the one source iterator (:func:`boxmaker.session.read_logs`) and their turns
from the one split (:func:`boxmaker.session.split_turns`), as in every other view. A value the
server did not send is ``<NA>``, never 0, and so is a total or a ratio over one (see each
column's doc in :func:`describe`); a figure the server sent another way is taken from there
(``prompt_tokens`` from OpenAI ``usage`` where there are no ``timings``).

Public submodules: :mod:`boxmaker.frames.plots` (matplotlib figures) and
:mod:`boxmaker.frames.report` (``boxmaker report``: text tables or HTML).
"""

from .._public import publish
from ._build import (
    Engine,
    Frames,
    LogReadWarning,
    Source,
    cache_losses,
    describe,
    find_logs,
    limit_hits,
    load,
    requests,
    summary,
    tool_calls,
    turns,
)
from ._columns import COLUMNS, ENDING_LIMITS, TURN_OUTCOMES, Column
from ._duck import FRAME_SQL, EngineError, connect, query
from ._forks import FORK_COLUMNS, forks

__all__ = [
    "COLUMNS",
    "ENDING_LIMITS",
    "FORK_COLUMNS",
    "FRAME_SQL",
    "TURN_OUTCOMES",
    "Column",
    "Engine",
    "EngineError",
    "Frames",
    "LogReadWarning",
    "Source",
    "cache_losses",
    "connect",
    "describe",
    "find_logs",
    "forks",
    "limit_hits",
    "load",
    "query",
    "requests",
    "summary",
    "tool_calls",
    "turns",
]

publish(globals(), __all__)
