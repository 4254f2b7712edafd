"""The DuckDB engine of the frames: the same six frames, computed in SQL, past memory.

Design (a validated intermediate, then SQL): validity is decided once, by the session's own
reader. Every log goes through :func:`boxmaker.frames._build.vet_logs` (that is
:func:`boxmaker.session.read_log` and the frames' copy check, as the pandas engine's
``read_logs``; big inputs in worker processes, one per CPU), so a log the session refuses is
left out with the same :class:`~boxmaker.session.LogReadWarning`, and records of unknown type
warn the same way; DuckDB never judges a line. What DuckDB then reads:

- a log read as it is on disk (current schema, no line dropped or repeated, no unknown
  type, no ``\\u`` escape of a UTF-16 surrogate, which DuckDB's JSON reader refuses): the
  file itself, line by line (``read_text``), its first line (the baseline) skipped;
- any other log (upgraded from an older schema, a torn or repeated line dropped, unknown
  records, surrogates): its validated records re-written to a temporary JSON Lines file
  (records of unknown type left out; lone surrogates become U+FFFD, so ``*_chars`` lengths
  stay the same), deleted once the records table is built.

The records are parsed once into a DuckDB table ``records`` (one row per record: ``_l`` the
log's number, ``_i`` the record's index after the baseline, the fields the frames read);
the frames are views over it (``requests``, ``turns``, ``cache_losses``, ``limit_hits``,
``tool_calls``, ``summary``) with the columns, names and units of :data:`COLUMNS`, so that a
frame can be written to Parquet (``COPY``) or aggregated without ever being in memory. DuckDB
spills to disk past its ``memory_limit``.

The only Python work per record is the session's own check (:func:`read_log`), spread over
worker processes for big inputs (``workers``); a log's records are held in memory one log at
a time, in the process that checks it, and only a small :class:`_Vetted` comes back.

Differences from the pandas engine, by design: float sums (``prompt_ms`` over a turn or a
session) are added in another order, so they can differ in the last bits; times are read by
DuckDB to the microsecond (the logs' precision; :func:`boxmaker.records.format_time`), and a
time form DuckDB does not read (an ISO week date, say) is read by
:func:`boxmaker.records.parse_time` instead.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import tempfile
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias

import pandas as pd

from ..errors import EngineError
from ..records import LIMIT_KINDS, SCHEMA_VERSION, parse_time
from ..session import ENDING_LIMITS, KNOWN_TYPES, Log, LogReadWarning, Session, open_log
from ..session._sources import vet_logs
from ..session._turns import backwards, unknown_types
from ._columns import COLUMNS, TIME, TURN_OUTCOMES, Column, fork_settings_text

if TYPE_CHECKING:
    import duckdb

__all__ = ["FRAME_SQL", "EngineError", "connect", "frame", "query"]


_FIELDS: dict[str, str] = {
    "type": "VARCHAR",
    "time": "VARCHAR",
    "content": "VARCHAR",
    "tool_calls": "JSON",
    "timings": "JSON",
    **dict.fromkeys(
        ("reasoning_tokens", "finish_reason", "thinking_capped", "expected", "reused"),
        "VARCHAR",
    ),
    **dict.fromkeys(
        ("prompt_tokens", "completion_tokens", "source"),
        "VARCHAR",
    ),
    **dict.fromkeys(
        ("reprocessed", "reprocessed_ms", "position", "cause", "old_window", "new_window"),
        "VARCHAR",
    ),
    **dict.fromkeys(("detail", "kind", "call", "name", "tool_call_id", "truncated"), "VARCHAR"),
    **dict.fromkeys(("data_class", "untrusted", "not_run", "server", "decision"), "VARCHAR"),
    **dict.fromkeys(("by", "reason", "waited_ms", "outcome", "status"), "VARCHAR"),
}
"""The keys of a record the frames read, as DuckDB's ``from_json`` reads them: text (cast
per record type below, so that a key of the same name on another record type, which the
log's rule does not check, can never fail the cast), JSON for the nested ones."""


def _typed(type_: str, expr: str, sql_type: str) -> str:
    return f"CASE WHEN j.type = '{type_}' THEN CAST({expr} AS {sql_type}) END"


_RECORD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("type", "j.type"),
    ("time", "j.time"),
    ("t", "try_cast(j.time AS TIMESTAMPTZ)"),
    (
        "n_calls",
        "CASE WHEN j.type = 'assistant' THEN coalesce(json_array_length(j.tool_calls), 0) END",
    ),
    ("cache_n", _typed("usage", "j.timings->>'cache_n'", "BIGINT")),
    ("prompt_n", _typed("usage", "j.timings->>'prompt_n'", "BIGINT")),
    ("predicted_n", _typed("usage", "j.timings->>'predicted_n'", "BIGINT")),
    ("prompt_ms", _typed("usage", "j.timings->>'prompt_ms'", "DOUBLE")),
    ("predicted_ms", _typed("usage", "j.timings->>'predicted_ms'", "DOUBLE")),
    ("reasoning_tokens", _typed("usage", "j.reasoning_tokens", "BIGINT")),
    ("usage_prompt_tokens", _typed("usage", "j.prompt_tokens", "BIGINT")),
    ("usage_completion_tokens", _typed("usage", "j.completion_tokens", "BIGINT")),
    ("thinking_capped", _typed("usage", "j.thinking_capped", "BOOLEAN")),
    ("finish_reason", _typed("usage", "j.finish_reason", "VARCHAR")),
    ("expected", _typed("cache_loss", "j.expected", "BIGINT")),
    ("reused", _typed("cache_loss", "j.reused", "BIGINT")),
    ("reprocessed", _typed("cache_loss", "j.reprocessed", "BIGINT")),
    ("reprocessed_ms", _typed("cache_loss", "j.reprocessed_ms", "DOUBLE")),
    ("position", _typed("cache_loss", "j.position", "BIGINT")),
    ("cause", _typed("cache_loss", "j.cause", "VARCHAR")),
    ("old_window", _typed("cache_loss", "j.old_window", "VARCHAR")),
    ("new_window", _typed("cache_loss", "j.new_window", "VARCHAR")),
    (
        "detail",
        "CASE WHEN j.type IN ('cache_loss', 'limit_hit', 'turn_end') THEN j.detail END",
    ),
    ("kind", _typed("limit_hit", "j.kind", "VARCHAR")),
    ("outcome", _typed("turn_end", "j.outcome", "VARCHAR")),
    ("status", _typed("turn_end", "j.status", "BIGINT")),
    (
        "call",
        "CASE WHEN j.type IN ('tool_result', 'approval') THEN CAST(j.call AS BIGINT) END",
    ),
    ("name", _typed("tool_result", "j.name", "VARCHAR")),
    ("tool_call_id", _typed("tool_result", "j.tool_call_id", "VARCHAR")),
    ("content_chars", _typed("tool_result", "length(j.content)", "BIGINT")),
    ("truncated", _typed("tool_result", "j.truncated", "BOOLEAN")),
    ("data_class", _typed("tool_result", "j.data_class", "VARCHAR")),
    ("untrusted", _typed("tool_result", "j.untrusted", "BOOLEAN")),
    ("not_run", _typed("tool_result", "j.not_run", "VARCHAR")),
    (
        "source",
        "CASE WHEN j.type = 'tool_result' THEN coalesce(CAST(j.source AS VARCHAR), "
        "CASE WHEN j.not_run IS NULL THEN 'ran' ELSE 'not_run' END) END",
    ),
    ("server", _typed("tool_result", "j.server", "VARCHAR")),
    ("decision", _typed("approval", "j.decision", "VARCHAR")),
    ("decided_by", _typed("approval", 'j."by"', "VARCHAR")),
    ("reason", _typed("approval", "j.reason", "VARCHAR")),
    ("waited_ms", _typed("approval", "j.waited_ms", "DOUBLE")),
)
"""The ``records`` table's columns: name, SQL over the parsed line ``j``."""


def _sql_list(values: Iterable[str]) -> str:
    return "(" + ", ".join("'" + v.replace("'", "''") + "'" for v in values) + ")"


_ENDING = _sql_list(ENDING_LIMITS)
_ENDING_CASE = (
    "CASE ending " + " ".join(f"WHEN '{k}' THEN '{v}'" for k, v in ENDING_LIMITS.items()) + " END"
)


def _ratio(num: str, den: str) -> str:
    """:func:`boxmaker.frames.ratio` in SQL: ``<NA>`` where either is missing or ``den`` is
    0."""
    return f"(CAST({num} AS DOUBLE) / CAST(nullif({den}, 0) AS DOUBLE))"


_SUMS = (
    ("tool_calls", "BIGINT"),
    ("cached_tokens", "BIGINT"),
    ("processed_tokens", "BIGINT"),
    ("prompt_tokens", "BIGINT"),
    ("generated_tokens", "BIGINT"),
    ("reasoning_tokens", "BIGINT"),
    ("prompt_ms", "DOUBLE"),
    ("generation_ms", "DOUBLE"),
)
"""The requests' columns that turns and sessions sum."""

_LOSS_SUMS = (
    ("lost_tokens", "BIGINT"),
    ("reprocessed_tokens", "BIGINT"),
    ("reprocessed_ms", "DOUBLE"),
)
"""The cache losses' columns that turns and sessions sum."""


def _usum(expr: str, sql_type: str) -> str:
    """A sum over a group in which an unknown (NULL) value makes the total unknown (as the
    pandas engine's ``_aggregate``): never 0, never the sum of the known part."""
    return (
        f"CASE WHEN bool_or(({expr}) IS NULL) THEN NULL "
        f"ELSE CAST(coalesce(sum({expr}), 0) AS {sql_type}) END"
    )


def _sums(alias: str, sums: tuple[tuple[str, str], ...] = _SUMS) -> str:
    return ", ".join(f"{_usum(f'{alias}.{n}', t)} AS {n}" for n, t in sums)


def _joined(alias: str, sums: tuple[tuple[str, str], ...] = _SUMS) -> str:
    """The sums of a LEFT JOINed group: 0 where the row has no group, the group's sum (NULL
    when unknown) otherwise."""
    return ", ".join(f"CASE WHEN {alias}._l IS NULL THEN 0 ELSE {alias}.{n} END AS {n}"
                     for n, _ in sums)  # fmt: skip


_WALL = "(CAST((epoch_ns(f.ended) - epoch_ns(f.started)) AS DOUBLE) / 1e9 * 1000)"
"""``wall_ms`` as pandas computes it: nanoseconds / 1e9 (``total_seconds``) * 1000."""

_OWN_OUTCOMES = ", ".join(
    f"count(*) FILTER (WHERE outcome = '{o}' AND NOT from_parent) AS {o}" for o in TURN_OUTCOMES
)
"""The summary's ``<outcome>_turns`` counts: a log's own turns of each outcome."""


_WINDOWS = """
n AS (SELECT _l, _i, type, n_calls FROM base),
w AS (
SELECT _l, _i, type,
  sum(CASE WHEN type = 'user' THEN 1 ELSE 0 END) OVER o AS turn0,
  sum(CASE WHEN type = 'usage' THEN 1 ELSE 0 END) OVER o AS req0,
  max(CASE WHEN type = 'user' THEN _i END) OVER o AS _ts,
  max(CASE WHEN type = 'assistant' THEN _i END) OVER b AS _la,
  last_value(CASE WHEN type = 'assistant' THEN n_calls END IGNORE NULLS) OVER b AS _lan,
  max(CASE WHEN type = 'usage' THEN _i END) OVER b AS _lp
FROM n
WINDOW o AS (PARTITION BY _l ORDER BY _i ROWS UNBOUNDED PRECEDING),
  b AS (PARTITION BY _l ORDER BY _i ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING)),
x AS (
SELECT _l, _i, turn0, req0,
  CASE WHEN _la > coalesce(_ts, -1) THEN _la END AS a_i,
  CASE WHEN _la > coalesce(_ts, -1) THEN _lan END AS a_n,
  CASE WHEN _lp > coalesce(_ts, -1) THEN _lp END AS p_i,
  req0 - min(req0 - CASE WHEN type = 'usage' THEN 1 ELSE 0 END) OVER (PARTITION BY _l, turn0)
    AS turn_req
FROM w)
SELECT base.*, x.turn0, x.req0, x.a_i, x.a_n, x.p_i, x.turn_req
FROM base JOIN x ON x._l = base._l AND x._i = base._i
"""
"""Each record's place, computed once when the ``records`` table is made (every frame reads
it; as views they were computed again by each frame), over the records' keys alone (``_l``,
``_i``, type, tool calls) sorted once and joined back (window functions over the whole wide
rows, sorted again per turn, took 3/4 of the engine's time: 1M requests, 31 -> 19 s):
``turn0`` its turn (0: before the first user message; ``_ts`` the turn's user record), ``req0``
the completions (``Usage``) of its session up to it, ``copied`` whether it is a copy of a
fork's parent's record (its index below the log's ``fork_record``), and within its turn
``a_i``/``a_n`` the last assistant record before it and its tool calls, ``p_i`` the last
``Usage`` before it, ``turn_req`` the turn's completions up to it (its session's less those
before the turn's first record)."""

FRAME_SQL: dict[str, str] = {
    "_w": "SELECT * FROM records",
    "_u": "SELECT * FROM records",
    "requests": f"""
SELECT g.session AS session, req0 AS request, nullif(turn0, 0) AS turn,
  CASE WHEN turn0 > 0 THEN turn_req END AS turn_request, t AS time,
  cache_n AS cached_tokens, prompt_n AS processed_tokens,
  usage_prompt_tokens, usage_completion_tokens,
  coalesce(cache_n + prompt_n, usage_prompt_tokens) AS prompt_tokens,
  coalesce(predicted_n, usage_completion_tokens) AS generated_tokens, reasoning_tokens,
  prompt_ms, predicted_ms AS generation_ms,
  {_ratio("prompt_n * 1000", "prompt_ms")} AS prompt_tokens_per_s,
  {_ratio("coalesce(predicted_n, usage_completion_tokens) * 1000", "predicted_ms")}
    AS generation_tokens_per_s,
  {_ratio("cache_n", "coalesce(cache_n + prompt_n, usage_prompt_tokens)")} AS cache_reuse_ratio,
  thinking_capped, finish_reason,
  CASE WHEN a_i IS NOT NULL AND (p_i IS NULL OR a_i > p_i) THEN a_n END AS tool_calls,
  u.copied AS from_parent,
  u._l AS _l, u._i AS _i, u.turn0 AS _turn
FROM _u u JOIN logs g ON g._l = u._l
WHERE type = 'usage'
""",
    "cache_losses": """
SELECT g.session AS session, nullif(req0, 0) AS request, nullif(turn0, 0) AS turn, t AS time,
  expected AS expected_tokens, reused AS reused_tokens, expected - reused AS lost_tokens,
  reprocessed AS reprocessed_tokens, reprocessed_ms,
  position, cause, old_window, new_window, detail, w.copied AS from_parent,
  w._l AS _l, w._i AS _i, w.turn0 AS _turn
FROM _w w JOIN logs g ON g._l = w._l
WHERE type = 'cache_loss'
""",
    "limit_hits": f"""
SELECT g.session AS session, nullif(turn0, 0) AS turn, nullif(req0, 0) AS request, t AS time,
  kind, detail, kind IN {_ENDING} AS ended_turn, w.copied AS from_parent,
  w._l AS _l, w._i AS _i, w.turn0 AS _turn
FROM _w w JOIN logs g ON g._l = w._l
WHERE type = 'limit_hit'
""",
    "_results": """
SELECT w.*, lag(_i) OVER (PARTITION BY _l, call ORDER BY _i) AS prev_i
FROM _w w WHERE type = 'tool_result'
""",
    "_approvals": """
SELECT _l, _i, call, decision, decided_by, reason, waited_ms FROM records WHERE type = 'approval'
""",
    "tool_calls": """
SELECT g.session AS session, nullif(w.turn0, 0) AS turn, w.t AS time, w.call AS call,
  w.name AS name, w.tool_call_id AS tool_call_id, c.chars AS arguments_chars,
  w.content_chars AS result_chars, w.truncated AS truncated, w.data_class AS data_class,
  w.untrusted AS untrusted, w.source AS source, w.source = 'ran' AS ran, w.not_run AS not_run,
  w.server AS server,
  CASE WHEN ok THEN a.decision END AS approval,
  CASE WHEN ok THEN a.decided_by END AS approved_by,
  CASE WHEN ok THEN a.reason END AS approval_reason,
  CASE WHEN ok THEN a.waited_ms END AS approval_wait_ms, w.copied AS from_parent,
  w._l AS _l, w._i AS _i, w.turn0 AS _turn
FROM (
  SELECT x.*, a._i AS approval_i, (a._i IS NOT NULL AND (x.prev_i IS NULL OR x.prev_i < a._i)) AS ok
  FROM _results x ASOF LEFT JOIN _approvals a
    ON a._l = x._l AND a.call = x.call AND x._i > a._i
) w
LEFT JOIN _approvals a ON a._l = w._l AND a._i = w.approval_i
ASOF LEFT JOIN calls c ON c._l = w._l AND c.id = w.tool_call_id AND w._i > c._i
JOIN logs g ON g._l = w._l
""",
    "_turn_facts": f"""
SELECT _l, turn0,
  arg_min(t, _i) AS first_t, arg_max(t, _i) AS ended,
  bool_or(copied) AND NOT bool_and(copied) AS straddles,
  arg_max(struct_pack(o := outcome, d := detail, s := status), _i)
    FILTER (WHERE type = 'turn_end') AS te,
  arg_max(CASE WHEN type = 'assistant' THEN n_calls = 0 ELSE false END, _i)
    FILTER (WHERE type IN ('assistant', 'tool_result')) AS answered,
  arg_max(coalesce(finish_reason = 'length', false), _i) FILTER (WHERE type = 'usage') AS cut,
  bool_or(type = 'tool_result' AND not_run = 'cancelled') AS cancelled,
  arg_max(kind, _i) FILTER (WHERE type = 'limit_hit' AND kind IN {_ENDING}) AS ending,
  bool_and(copied) AS from_parent,
  count(*) FILTER (WHERE type = 'assistant' AND n_calls > 0) AS iterations_all,
  count(*) FILTER (WHERE type = 'assistant' AND n_calls > 0 AND NOT copied) AS iterations_own,
  count(*) FILTER (WHERE type = 'tool_result') AS tool_results_all,
  count(*) FILTER (WHERE type = 'tool_result' AND NOT copied) AS tool_results_own
FROM _w WHERE turn0 > 0 GROUP BY _l, turn0
""",
    "turns": f"""
SELECT g.session AS session, f.turn0 AS turn, f.started AS started, f.ended AS ended,
  {_WALL} AS wall_ms,
  coalesce(te.o, CASE
    WHEN ending IS NOT NULL THEN {_ENDING_CASE}
    WHEN coalesce(answered, false) THEN
      CASE WHEN coalesce(cut, false) THEN 'length' ELSE 'answered' END
    WHEN coalesce(cancelled, false) THEN 'cancelled'
    ELSE 'no_answer' END) AS outcome,
  te.d AS end_detail, te.s AS http_status,
  coalesce(q.n, 0) AS requests,
  CASE WHEN f.from_parent THEN iterations_all ELSE iterations_own END AS iterations,
  {_joined("q", _SUMS[:1])},
  CASE WHEN f.from_parent THEN tool_results_all ELSE tool_results_own END AS tool_results,
  {_joined("q", _SUMS[1:])},
  {_joined("q", (("thinking_capped", ""),))},
  coalesce(c.n, 0) AS cache_losses, {_joined("c", _LOSS_SUMS)},
  coalesce(h.n, 0) AS limit_hits, f.from_parent AS from_parent,
  f._l AS _l, f.turn0 AS _turn
FROM (
  -- a turn a fork continues from copied records started no earlier than its Forked record
  SELECT tf.* EXCLUDE (first_t, straddles),
    CASE WHEN tf.straddles AND fk.t > tf.first_t THEN fk.t ELSE tf.first_t END AS started
  FROM _turn_facts tf
  LEFT JOIN (SELECT _l, t FROM records WHERE type = 'forked' AND _i = 0) fk ON fk._l = tf._l
) f JOIN logs g ON g._l = f._l
LEFT JOIN (SELECT _l, _turn, from_parent, count(*) AS n,
             {_usum("CAST(r.thinking_capped AS BIGINT)", "BIGINT")} AS thinking_capped,
             {_sums("r")}
           FROM requests r GROUP BY _l, _turn, from_parent) q
  ON q._l = f._l AND q._turn = f.turn0 AND q.from_parent = f.from_parent
LEFT JOIN (SELECT _l, _turn, from_parent, count(*) AS n, {_sums("x", _LOSS_SUMS)}
           FROM cache_losses x GROUP BY _l, _turn, from_parent) c
  ON c._l = f._l AND c._turn = f.turn0 AND c.from_parent = f.from_parent
LEFT JOIN (SELECT _l, _turn, from_parent, count(*) AS n
           FROM limit_hits GROUP BY _l, _turn, from_parent) h
  ON h._l = f._l AND h._turn = f.turn0 AND h.from_parent = f.from_parent
""",
    "summary": f"""
SELECT g.session AS session, g.path AS path, g.started AS started,
  coalesce(e.ended, g.started) AS ended, g.records AS records,
  g.unknown_records AS unknown_records,
  g.parent_session AS parent_session, g.fork_turn AS fork_turn, g.fork_point AS fork_point,
  g.fork_settings AS fork_settings,
  coalesce(tu.inherited, 0) AS inherited_turns, coalesce(qi.n, 0) AS inherited_requests,
  coalesce(tu.n, 0) AS turns,
  {", ".join(f"coalesce(tu.{o}, 0) AS {o}_turns" for o in TURN_OUTCOMES)},
  coalesce(q.n, 0) AS requests, {_joined("q")},
  CASE WHEN q._l IS NULL THEN NULL ELSE {_ratio("q.cached_tokens", "q.prompt_tokens")} END
    AS cache_reuse_ratio,
  coalesce(c.n, 0) AS cache_losses, {_joined("c", _LOSS_SUMS)},
  coalesce(h.n, 0) AS limit_hits,
  {", ".join(f"coalesce(h.{k}, 0) AS {k}_hits" for k in LIMIT_KINDS)},
  g._l AS _l
FROM logs g
LEFT JOIN (SELECT _l, arg_max(t, _i) AS ended FROM records GROUP BY _l) e ON e._l = g._l
LEFT JOIN (SELECT _l, count(*) FILTER (WHERE NOT from_parent) AS n,
             count(*) FILTER (WHERE from_parent) AS inherited,
             {_OWN_OUTCOMES}
           FROM turns GROUP BY _l) tu ON tu._l = g._l
LEFT JOIN (SELECT _l, count(*) AS n, {_sums("r")}
           FROM requests r WHERE NOT r.from_parent GROUP BY _l) q ON q._l = g._l
LEFT JOIN (SELECT _l, count(*) AS n FROM requests WHERE from_parent GROUP BY _l) qi
  ON qi._l = g._l
LEFT JOIN (SELECT _l, count(*) AS n, {_sums("x", _LOSS_SUMS)}
           FROM cache_losses x WHERE NOT from_parent GROUP BY _l) c ON c._l = g._l
LEFT JOIN (SELECT _l, count(*) AS n,
             {", ".join(f"count(*) FILTER (WHERE kind = '{k}') AS {k}" for k in LIMIT_KINDS)}
           FROM limit_hits WHERE NOT from_parent GROUP BY _l) h ON h._l = g._l
""",
}
"""The SQL of each frame (a view of the connection :func:`connect` gives), over the tables
``records`` (one row per record), ``calls`` (the length of each tool call's arguments, by
``id``) and ``logs`` (one row per log). Views whose name starts with ``_`` are steps; each
frame view ends with its hidden key columns (``_l``, the log's number; ``_i``; ``_turn``),
which :func:`frame` drops."""

_ORDER = {
    "requests": "_l, _i",
    "cache_losses": "_l, _i",
    "limit_hits": "_l, _i",
    "tool_calls": "_l, _i",
    "turns": "_l, _turn",
    "summary": "_l",
}

FRAME_VIEWS = tuple(_ORDER)
"""The frame views (the others of :data:`FRAME_SQL` are steps)."""


_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_LONE = re.compile("[\ud800-\udfff]")


def _duckdb() -> Any:
    try:
        import duckdb
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise EngineError("the DuckDB engine needs duckdb: pip install 'boxmaker[duckdb]'") from exc
    return duckdb


def _as_is(log: Log) -> bool:
    """``log``'s file lines 2.. are exactly its validated records (nothing upgraded,
    dropped or repeated, every type known, no surrogate escape DuckDB would refuse)."""
    path = Path(log.path)
    if log.head.get("schema") != SCHEMA_VERSION or not path.is_file():
        return False
    raw = path.read_bytes()
    if _SURROGATE.search(raw):
        return False
    lines = raw.count(b"\n") + (0 if raw.endswith(b"\n") else 1)
    return lines == len(log.records) + 1


def _rewrite(log: Log, into: Path) -> None:
    """The validated records of ``log`` as JSON Lines (unknown types left out, lone
    surrogates as U+FFFD)."""
    with into.open("w", encoding="utf-8") as out:
        for rec in log.records:
            known = rec["type"] in KNOWN_TYPES
            text = json.dumps(rec if known else {"type": "_unknown"}, ensure_ascii=False)
            out.write(_LONE.sub("\ufffd", text) + "\n")


class _Vetted(NamedTuple):
    """What the DuckDB engine keeps of a log the session reads (made by :func:`_vet`, in a
    worker process for big inputs): never its records, which DuckDB reads from ``file``."""

    session: str
    path: str
    time: str | None  # when the log's own part started: the baseline's, a fork's Forked time
    records: int
    unknown: dict[str, int]  # records of a type this version does not know, by type
    file: str  # what DuckDB reads: the log itself, or its records re-written in the scratch
    skip: int  # lines of ``file`` before the first record (1: the baseline)
    parent_session: str | None  # a fork's origin (None: not a fork)
    fork_turn: int | None
    fork_point: str | None
    fork_settings: str | None  # Forked.settings as the frames show it (fork_settings_text)
    fork_record: int | None  # records before this index are the parent's copies (Forked.record)


def _vet(item: Path | Session | Log, *, scratch: str) -> _Vetted:
    """Read ``item`` by the session's rule and decide what DuckDB reads of it: the file as it
    is (see :func:`_as_is`) or its validated records re-written into ``scratch``.

    Raises:
        SessionError: the session refuses the log (see :func:`~boxmaker.session.read_log`).
    """
    log = open_log(item)
    unknown: dict[str, int] = {}
    for rec in log.records:
        if rec["type"] not in KNOWN_TYPES:
            unknown[str(rec["type"])] = unknown.get(str(rec["type"]), 0) + 1
    if not unknown and _as_is(log):
        file, skip = os.path.abspath(log.path), 1
    else:
        handle, file = tempfile.mkstemp(suffix=".jsonl", dir=scratch)
        os.close(handle)
        _rewrite(log, Path(file))
        skip = 0
    first = log.records[0] if log.records else {}
    forked = first if first.get("type") == "forked" else {}
    return _Vetted(
        log.session,
        log.path,
        forked.get("time", log.head.get("time")),
        len(log.records),
        unknown,
        file,
        skip,
        forked.get("parent_session"),
        forked.get("turn"),
        forked.get("point"),
        fork_settings_text(forked or None),
        forked.get("record"),
    )


def connect(
    source: Any,
    *,
    memory_limit: str | None = None,
    temp_directory: str | None = None,
    workers: int | None = None,
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection holding the frames of ``source`` as views.

    Args:
        source: as for :func:`boxmaker.frames.requests` (a log, a directory, a
            :class:`~boxmaker.session.Session`, or a list of these).
        memory_limit: DuckDB's ``memory_limit`` (e.g. ``"1GB"``; ``None``: DuckDB's default,
            80% of RAM); past it DuckDB spills to ``temp_directory``.
        temp_directory: where DuckDB spills (``None``: a private folder of this process in
            the system's temporary directory, made by :func:`tempfile.mkdtemp`, mode 0700,
            removed at exit; never the current one; DuckDB removes its files when the
            connection closes).
        workers: processes that read and check the logs at once (the session's rule, in
            Python, the engine's largest cost): ``None``: every CPU this process may use when
            the logs hold at least 64 MiB in two or more files, else this process; 1: this
            process (see :func:`boxmaker.frames._build.vet_logs`).

    Returns:
        An in-memory :class:`duckdb.DuckDBPyConnection` with the views ``requests``,
        ``turns``, ``cache_losses``, ``limit_hits``, ``tool_calls``, ``summary`` (the columns
        of :data:`COLUMNS` in order, then the hidden ``_l``, ``_i``/``_turn`` keys) over the
        tables ``records``, ``calls`` and ``logs`` (see :data:`FRAME_SQL`); times are
        ``TIMESTAMPTZ`` in UTC.

    Raises:
        SessionError: a path of ``source`` names no log.
        EngineError: ``duckdb`` is not installed.

    Warns:
        LogReadWarning: as the pandas engine: the same logs are left out with the same words.
    """
    duckdb_module = _duckdb()  # before reading: the extra's absence said at once
    scratch = Path(tempfile.mkdtemp(prefix="boxmaker-duck-"))
    try:
        files: list[tuple[str, int, int, int]] = []  # file, log number, lines skipped, count
        heads: list[_Head] = []
        vetting = vet_logs(source, functools.partial(_vet, scratch=str(scratch)), workers=workers)
        for number, log in enumerate(vetting):
            if log.unknown:
                warnings.warn(unknown_types(log.path, log.unknown), LogReadWarning, stacklevel=2)
            files.append((log.file, number, log.skip, log.records))
            heads.append(
                (
                    number,
                    log.session,
                    log.path,
                    log.time,
                    log.records,
                    sum(log.unknown.values()),
                    log.parent_session,
                    log.fork_turn,
                    log.fork_point,
                    log.fork_settings,
                    log.fork_record,
                )
            )
        # connected once the logs are read: worker processes are never forked from a process
        # running DuckDB's threads
        con = duckdb_module.connect()
        # the tables in a compressed in-memory database (DuckDB >= 1.4), compressed at each
        # checkpoint: a log's records are mostly NULL columns, so 1M request records hold
        # 81 MiB instead of 830 MiB (memory and spill; at 50M the uncompressed tables'
        # spill files filled the disk)
        con.execute("ATTACH ':memory:' AS frames (COMPRESS)")
        con.execute("USE frames")
        con.execute("SET TimeZone = 'UTC'")
        # DuckDB's own bar writes to stdout (a report piped to a file would hold it): the
        # frames show their reading's progress on stderr instead (vet_logs)
        con.execute("SET enable_progress_bar = false")
        con.execute("SET enable_progress_bar_print = false")  # even if a query turns it on
        spill = temp_directory or _private_spill()
        con.execute("SET temp_directory = ?", [spill])
        if memory_limit is not None:
            con.execute(f"SET memory_limit = '{memory_limit}'")
        try:
            _tables(con, files, heads)
        except BaseException:
            con.close()
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for name, sql in FRAME_SQL.items():
        con.execute(f"CREATE VIEW {name} AS {sql}")
    backward = "SELECT g.path, t.turn FROM turns t JOIN logs g ON g._l = t._l WHERE t.wall_ms < 0"
    for path, turn in con.execute(f"{backward} ORDER BY t._l, t.turn").fetchall():
        warnings.warn(backwards(path, turn), LogReadWarning, stacklevel=2)
    connection: duckdb.DuckDBPyConnection = con
    return connection


_SPILL: list[str] = []
"""This process's private spill folder, made once (see :func:`_private_spill`)."""


def _private_spill() -> str:
    """A spill folder of this process's own: made by :func:`tempfile.mkdtemp` (mode 0700, a
    new name, never a path someone planted a link at: ``<tmp>/boxmaker-duckdb-<pid>`` was),
    removed when the process exits."""
    if not _SPILL:
        made = tempfile.mkdtemp(prefix="boxmaker-duckdb-")
        atexit.register(shutil.rmtree, made, True)
        _SPILL.append(made)
    return _SPILL[0]


_Head: TypeAlias = tuple[
    int, str, str, str | None, int, int, str | None, int | None, str | None, str | None, int | None
]
"""A row of the ``logs`` table: its number, session, path, baseline time, records, unknown
records, and the fork's parent session, turn, point, settings (JSON) and ``Forked.record``
(``None``: not a fork)."""


def _tables(
    con: Any,
    files: list[tuple[str, int, int, int]],
    heads: list[_Head],
) -> None:
    """Create ``logs``, ``records`` and ``calls`` in ``con``."""
    con.execute(
        "CREATE TABLE logs (_l BIGINT, session VARCHAR, path VARCHAR, time VARCHAR, "
        "records BIGINT, unknown_records BIGINT, parent_session VARCHAR, fork_turn BIGINT, "
        "fork_point VARCHAR, fork_settings VARCHAR, fork_record BIGINT)"
    )
    if heads:
        con.executemany("INSERT INTO logs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", heads)
    con.execute("CREATE TABLE files (file VARCHAR, _l BIGINT, skip BIGINT, n BIGINT)")
    if files:
        con.executemany("INSERT INTO files VALUES (?, ?, ?, ?)", files)
    struct = "{" + ", ".join(f'"{k}": "{v}"' for k, v in _FIELDS.items()) + "}"
    columns = ", ".join(f"{sql} AS {name}" for name, sql in _RECORD_COLUMNS)
    # the lines parsed once into a table (``j``), a batch of logs at a time: the records and
    # the calls of each batch added, the batch's table dropped; so the parsed lines (every
    # text field) are never held for all the logs at once beside ``records`` (at 50M request
    # records they were, and DuckDB's spill files filled 32 GB). Each log is in one batch:
    # the windows are per log.
    empty = f"SELECT 0 AS _l, 0 AS _i, from_json('{{}}', '{struct}') AS j WHERE false"
    made = False
    total = sum(os.path.getsize(f[0]) for f in files)
    unpacked = 0  # bytes of logs whose rows are not yet compressed
    batches = _batches(files) or [[]]  # no log: the tables made empty
    for batch in batches:
        if batch:
            listed = "[" + ", ".join("'" + f[0].replace("'", "''") + "'" for f in batch) + "]"
            lines = f"""
WITH t AS (SELECT filename, string_split(content, chr(10)) AS ls FROM read_text({listed})),
l AS (SELECT filename, generate_subscripts(ls, 1) AS idx, unnest(ls) AS line FROM t)
SELECT m._l AS _l, l.idx - 1 - m.skip AS _i, from_json(l.line, '{struct}') AS j
FROM l JOIN files m ON m.file = l.filename
WHERE l.idx > m.skip AND l.idx <= m.n + m.skip"""
        else:
            lines = empty
        con.execute(f"CREATE OR REPLACE TEMP TABLE _lines AS {lines}")
        rows = (
            f"WITH base AS (SELECT _lines._l AS _l, _lines._i AS _i, {columns}, "
            f"coalesce(_lines._i < lg.fork_record, false) AS copied FROM _lines "
            f"JOIN logs lg ON lg._l = _lines._l WHERE j.type <> '_unknown'), {_WINDOWS}"
        )
        calls = """
SELECT _l, _i, c.id AS id, arg_max(length(c.arguments), k) AS chars FROM (
  SELECT _l, _i, unnest(cs) AS c, generate_subscripts(cs, 1) AS k FROM (
    SELECT _l, _i, from_json(j.tool_calls, '[{"id": "VARCHAR", "arguments": "VARCHAR"}]') AS cs
    FROM _lines WHERE j.type = 'assistant' AND json_array_length(j.tool_calls) > 0))
GROUP BY _l, _i, c.id"""
        if made:
            con.execute(f"INSERT INTO records {rows}")
            con.execute(f"INSERT INTO calls {calls}")
        else:
            con.execute(f"CREATE TABLE records AS {rows}")
            con.execute(f"CREATE TABLE calls AS {calls}")
            made = True
        # the rows compressed (a checkpoint) every CHECKPOINT_BYTES of logs and at the end
        # when the logs are larger than that; smaller logs' rows stay as made (compressing
        # them costs more than it saves: 1M requests, 795 MiB of logs, 4 s)
        unpacked += sum(os.path.getsize(f[0]) for f in batch)
        if unpacked >= CHECKPOINT_BYTES or (
            unpacked and total >= CHECKPOINT_BYTES and batch is batches[-1]
        ):
            con.execute("CHECKPOINT frames")
            unpacked = 0
    con.execute("DROP TABLE _lines")
    _fix_times(con)
    con.execute("ALTER TABLE logs ADD COLUMN started TIMESTAMPTZ")
    con.execute("UPDATE logs SET started = try_cast(time AS TIMESTAMPTZ)")
    for (text,) in con.execute(
        "SELECT time FROM logs WHERE started IS NULL AND time IS NOT NULL"
    ).fetchall():
        con.execute("UPDATE logs SET started = ? WHERE time = ?", [parse_time(text), text])


BATCH_BYTES = 512 * 2**20
"""Bytes of log files parsed into one DuckDB table at a time when the records are made."""

CHECKPOINT_BYTES = 4 * 2**30
"""Bytes of log files whose rows are compressed at once (a ``CHECKPOINT``); the rows made
from them are about as large as the logs until then (1M request records: 830 MiB, 81 MiB
compressed), in memory up to DuckDB's ``memory_limit``, then spilled to ``temp_directory``."""


def _batches(
    files: list[tuple[str, int, int, int]],
) -> list[list[tuple[str, int, int, int]]]:
    """``files`` in runs of about :data:`BATCH_BYTES` (a file larger than that alone)."""
    out: list[list[tuple[str, int, int, int]]] = []
    size = 0
    for f in files:
        here = os.path.getsize(f[0])
        if not out or size + here > BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(f)
        size += here
    return out


def _fix_times(con: Any) -> None:
    """Times DuckDB does not read (forms of ISO 8601 beyond its own) read by
    :func:`boxmaker.records.parse_time`, the session's reader (the log's rule checked each)."""
    odd = con.execute(
        "SELECT DISTINCT time FROM records WHERE t IS NULL AND time IS NOT NULL"
    ).fetchall()
    if odd:
        fixed = pd.DataFrame(
            {"time": [t for (t,) in odd], "fixed": [parse_time(t) for (t,) in odd]}
        )
        con.register("_fixed", fixed)
        con.execute("UPDATE records SET t = f.fixed FROM _fixed f WHERE records.time = f.time")
        con.unregister("_fixed")


def _pandas(column: Column, values: Any) -> Any:
    """A result column (from Arrow) in the pandas engine's dtype for ``column``."""
    if column.dtype == TIME:
        return (
            pd.to_datetime(pd.Series(values, dtype=object), utc=True)
            .astype(pd.api.types.pandas_dtype(TIME))
            .array
        )
    if column.dtype == "category":
        known = list(column.categories)
        extra = sorted(set(values) - set(known) - {None})
        return pd.Categorical(values, categories=pd.Index(known + extra, dtype="str"))
    return pd.array(values, dtype=pd.api.types.pandas_dtype(column.dtype))


def frame(con: Any, name: str) -> pd.DataFrame:
    """One frame of a :func:`connect` connection as the pandas engine gives it: the columns
    of :data:`COLUMNS` with their dtypes, in log order.

    Raises:
        KeyError: no such frame.
    """
    columns = COLUMNS[name]
    table = con.sql(
        f"SELECT {', '.join(c.name for c in columns)} FROM {name} ORDER BY {_ORDER[name]}"
    ).to_arrow_table()
    data = {c.name: _pandas(c, table.column(c.name).to_pylist()) for c in columns}
    return pd.DataFrame(data, copy=False).reset_index(drop=True)


def query(sql: str, source: Any, *, memory_limit: str | None = None) -> pd.DataFrame:
    """Ad-hoc SQL over the frames of ``source`` (DuckDB): the views ``requests``, ``turns``,
    ``cache_losses``, ``limit_hits``, ``tool_calls``, ``summary`` with the columns of the
    pandas frames (the hidden keys of :func:`connect` left out; ``SELECT *`` gives what
    :func:`boxmaker.frames.requests` gives), and the tables ``records``, ``calls``, ``logs``.

    Example: ``query("SELECT outcome, count(*) AS n FROM turns GROUP BY outcome", "logs/")``.

    Returns:
        The result as a pandas frame (DuckDB's conversion).

    Raises:
        SessionError: a path of ``source`` names no log.
        EngineError: ``duckdb`` is missing, or the query failed (DuckDB's message).
    """
    con = connect(source, memory_limit=memory_limit)
    try:
        # the frames without their hidden keys (``_l``, ``_i``, ``_turn``: the frame views
        # join on them), in a schema searched first; the frame views keep binding to their
        # own schema's, and the tables stay reachable
        con.execute("CREATE SCHEMA frames.public_frames")
        for name in FRAME_VIEWS:
            columns = con.sql(f"SELECT * FROM frames.main.{name} LIMIT 0").columns
            hidden = ", ".join(c for c in columns if c.startswith("_"))
            con.execute(
                f"CREATE VIEW frames.public_frames.{name} AS "
                f"SELECT * EXCLUDE ({hidden}) FROM frames.main.{name}"
            )
        con.execute("SET search_path = 'frames.public_frames,frames.main'")
        result: pd.DataFrame = con.sql(sql).df()
        return result
    except _duckdb().Error as exc:
        raise EngineError(f"query failed: {exc}") from exc
    finally:
        con.close()
