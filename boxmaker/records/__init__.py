"""The record types of a session log, and their JSON form.

A session log (see :mod:`boxmaker.session`) is one JSON object per line. The first line is the
session's :class:`Baseline` (with ``"schema"``, the log format version, and ``"session_id"``);
every later line is one of the records below, tagged by ``"type"``::

    {"type": "user", "time": "2026-11-30T07:01:02.123456Z", "content": "What is the weather?"}

Every record carries ``time``: when it was made, UTC, written as ISO 8601 with a ``Z``. Time is
kept in the log only; it never goes into a message sent to the model.

Records are frozen: a record, once written, never changes. Field names follow the OpenAI
chat-completions API (``tool_calls``, ``tool_call_id``) and llama.cpp's server (``timings``
with ``cache_n``, ``prompt_n``, ``predicted_n``, ``prompt_ms``, ``predicted_ms``).

What each line may hold is one rule table, :data:`RULES`, derived from the dataclasses' type
hints (``Literal`` values, :data:`Tokens` and :data:`Millis` never negative, times within
:data:`TIME_RANGE`); :func:`check_records` applies it, and every reader of a log
(:func:`boxmaker.session.read_log`, so the session and the frames alike) and its writer use it.

Private modules by role: ``_types`` (the records and their vocabularies), ``_rules`` (the rule
table and its checks), ``_codec`` (records to and from JSON lines).
"""

from .._public import publish
from ._codec import (
    baseline_from_json,
    record_from_json,
    record_to_json,
    records_from_json,
)
from ._rules import (
    COUNT_TIMINGS,
    COUNTS,
    RULES,
    SESSION_ID,
    FieldRule,
    RecordError,
    check_baseline,
    check_records,
    is_measurement,
)
from ._types import (
    APPROVAL_DECISIONS,
    FORK_POINTS,
    LIMIT_KINDS,
    MAX_MS,
    MAX_TOKENS,
    NOT_RUN_REASONS,
    RESULT_SOURCES,
    SCHEMA_VERSION,
    TIME_RANGE,
    TURN_END_OUTCOMES,
    WARM_LABELS,
    Approval,
    ApprovalDecision,
    Assistant,
    AtLeast,
    Baseline,
    CacheLoss,
    Capabilities,
    Forked,
    ForkPoint,
    LimitHit,
    LimitKind,
    Millis,
    NotRunReason,
    Record,
    ResultSource,
    Tokens,
    ToolCall,
    ToolResult,
    TurnEnd,
    TurnEndOutcome,
    Unknown,
    Usage,
    User,
    Warmed,
    WarmFound,
    WarmLabel,
    format_time,
    parse_time,
    time_problem,
    utc_now,
)
from ._usage import UsageTokens, usage_tokens

__all__ = [
    "APPROVAL_DECISIONS",
    "COUNTS",
    "COUNT_TIMINGS",
    "FORK_POINTS",
    "LIMIT_KINDS",
    "MAX_MS",
    "MAX_TOKENS",
    "NOT_RUN_REASONS",
    "RESULT_SOURCES",
    "RULES",
    "SCHEMA_VERSION",
    "SESSION_ID",
    "TIME_RANGE",
    "TURN_END_OUTCOMES",
    "WARM_LABELS",
    "Approval",
    "ApprovalDecision",
    "Assistant",
    "AtLeast",
    "Baseline",
    "CacheLoss",
    "Capabilities",
    "FieldRule",
    "ForkPoint",
    "Forked",
    "LimitHit",
    "LimitKind",
    "Millis",
    "NotRunReason",
    "Record",
    "RecordError",
    "ResultSource",
    "Tokens",
    "ToolCall",
    "ToolResult",
    "TurnEnd",
    "TurnEndOutcome",
    "Unknown",
    "Usage",
    "UsageTokens",
    "User",
    "WarmFound",
    "WarmLabel",
    "Warmed",
    "baseline_from_json",
    "check_baseline",
    "check_records",
    "format_time",
    "is_measurement",
    "parse_time",
    "record_from_json",
    "record_to_json",
    "records_from_json",
    "time_problem",
    "usage_tokens",
    "utc_now",
]

publish(globals(), __all__)
