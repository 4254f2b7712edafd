"""The one rule of the log: what each field of each line may hold (:data:`RULES`, derived
from the record types' hints), applied by :func:`check_records` and :func:`check_baseline` for
every reader and the writer."""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import chain, compress, repeat
from typing import Annotated, Any, Literal

from ..errors import RecordError
from . import _types
from ._types import MAX_MS, MAX_TOKENS, TIME_RANGE, TYPE_OF, AtLeast, Baseline, time_problem

__all__ = [
    "COUNTS",
    "COUNT_TIMINGS",
    "RULES",
    "SESSION_ID",
    "FieldRule",
    "RecordError",
    "check_baseline",
    "check_records",
    "is_measurement",
]
# -- the one rule of the log: what each field of each line may hold ---------------------------

_INT64 = (-(2**63), 2**63 - 1)
"""The range of every integer (pandas' ``Int64``, the frames' integer dtype)."""


class _Absent:
    """The value of a key a line does not have (``None`` is JSON's ``null``)."""

    def __repr__(self) -> str:
        return "<absent>"


_ABSENT = _Absent()


@dataclass(frozen=True)
class FieldRule:
    """What one key of a log line's JSON object may hold, derived from the record dataclass's
    type hint (:data:`RULES`).

    Attributes:
        name: the JSON key (the dataclass field).
        required: the line must have it: a field without a default, and ``time`` of every
            record after the baseline.
        types: the JSON value types allowed, as Python types (``NoneType`` for ``null``);
            ``int`` and ``float`` for a float (JSON has one number type), never ``bool`` for
            a number.
        values: for a ``Literal``: the strings allowed; ``None`` otherwise.
        minimum: numbers are never below it (:data:`Tokens`, :data:`Millis`: 0).
        maximum: numbers are never above it (:data:`MAX_TOKENS`, :data:`MAX_MS`).
        time: a time: ISO 8601 with a UTC offset, within :data:`TIME_RANGE`.
        items: a list whose elements are JSON objects checked by these rules (``tool_calls``:
            :class:`ToolCall`'s), ``()`` for objects of any shape (``tools``); ``None``: no list.
        measurements: a JSON object whose values are llama.cpp measurements
            (:func:`is_measurement`; ``timings``).
        pattern: a string that must match it whole (the session id).
        want: what the value should be, in words, for the error message.
    """

    name: str
    required: bool
    types: frozenset[type]
    values: frozenset[str] | None = None
    minimum: int | None = None
    maximum: float | None = None
    time: bool = False
    items: tuple[FieldRule, ...] | None = None
    measurements: bool = False
    pattern: re.Pattern[str] | None = None
    want: str = ""


def _rule(name: str, hint: Any, required: bool) -> FieldRule:
    """The :class:`FieldRule` of a field from its type hint (see :data:`RULES`)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = typing.get_args(hint) if union else (hint,)
    allowed: set[type] = set()
    options: dict[str, Any] = {}
    words: list[str] = []
    for member in members:
        if member is type(None):
            allowed.add(type(None))
            continue
        if typing.get_origin(member) is Annotated:
            member, *meta = typing.get_args(member)
            bound = next(m for m in meta if isinstance(m, AtLeast))
            options["minimum"], options["maximum"] = bound.minimum, bound.maximum
        origin, args = typing.get_origin(member), typing.get_args(member)
        if origin is Literal:
            allowed.add(str)
            options["values"] = frozenset(args)
            words.append("one of " + ", ".join(args))
        elif member is datetime:
            allowed.add(str)
            options["time"] = True
            words.append("an ISO 8601 time with a UTC offset")
        elif member in (str, int, bool):
            allowed.add(member)
            words.append(member.__name__)
        elif member is float:
            allowed |= {int, float}
            words.append("a finite number")
        elif origin is Mapping:
            allowed.add(dict)
            options["measurements"] = args[1] is float
            words.append("a JSON object")
        elif origin is tuple and isinstance(args[0], type) and dataclasses.is_dataclass(args[0]):
            allowed.add(list)
            options["items"] = _rules(args[0], timed=False)
            words.append("a list of objects")
        elif origin is tuple:
            allowed.add(list)
            options["items"] = ()
            words.append("a list of objects")
        else:  # pragma: no cover - a record field of a new kind needs a rule here
            raise TypeError(f"no log rule for {name}: {hint!r}")
    if type(None) in allowed:
        words.append("null")
    if options.get("minimum") is not None:
        words[0] += f" >= {options['minimum']}"
    if options.get("maximum") is not None:
        words[0] += f" and <= {int(options['maximum'])}"
    return FieldRule(name, required, frozenset(allowed), want=" or ".join(words), **options)


def _rules(cls: type[Any], *, timed: bool) -> tuple[FieldRule, ...]:
    """The rules of a dataclass's fields, from its type hints; ``time`` is required when
    ``timed`` (every record after the baseline carries one)."""
    hints = typing.get_type_hints(cls, globalns=vars(_types), include_extras=True)
    return tuple(
        _rule(
            f.name,
            hints[f.name],
            (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            or (timed and f.name == "time"),
        )
        for f in dataclasses.fields(cls)
    )


SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""A session id: safe as a file name (letters, digits, ``.``, ``_``, ``-``; at most 128
characters; not starting with ``.``, ``_`` or ``-``)."""


_TIME = FieldRule(
    "time", True, frozenset({str}), time=True, want="an ISO 8601 time with a UTC offset"
)
"""The rule of a record of a type this version does not know: it carries a time."""

RULES: Mapping[str, tuple[FieldRule, ...]] = {
    **{name: _rules(cls, timed=True) for name, cls in TYPE_OF.items()},
    "baseline": (
        *_rules(Baseline, timed=False),
        FieldRule(
            "session_id", False, frozenset({str}), pattern=SESSION_ID, want="safe as a file name"
        ),
    ),
}
"""THE rule of the log: for each line's ``type``, the rule of each key, derived from the type
hints of the record dataclasses (:class:`User`, ..., :class:`TurnEnd`; ``"baseline"``: the
first line, :class:`Baseline` and its ``session_id``). :meth:`Session.open
<boxmaker.session.Session.open>`, :func:`boxmaker.session.read_log` and the frames all read
through it, so they accept and refuse the same logs:

- a key of a field without a default must be there, and every record after the baseline has a
  ``time`` (the baseline's is optional);
- ``str``, ``int``, ``bool`` are those JSON types (``true`` is no ``int``); a ``float`` is any
  finite JSON number; ``X | None`` also allows ``null``; integers fit in 64 bits;
- a ``Literal`` allows its strings only: :data:`LimitKind`, :data:`TurnEndOutcome`,
  :data:`NotRunReason`, :data:`ApprovalDecision` (a value a newer version added is refused,
  naming it: read such a log with that version);
- :data:`Tokens` and :data:`Millis` are never negative nor past :data:`MAX_TOKENS` and
  :data:`MAX_MS` (absurd values: a sum of them could leave 64 bits, an export overflow);
  ``timings`` values are measurements (:func:`is_measurement`: its token counts integers);
- a time is ISO 8601 with a UTC offset within :data:`TIME_RANGE`;
- ``tool_calls`` are objects with ``id``, ``name``, ``arguments`` strings; baseline ``tools``
  are objects; the session id matches :data:`SESSION_ID`.

Keys a type does not name are ignored (an optional field a later version added); a line of a
``type`` this version does not know needs a ``time`` only (it is kept as :class:`Unknown`)."""

COUNTS = frozenset(
    f"{name}.{rule.name}"
    for name, rules in RULES.items()
    for rule in rules
    if rule.minimum is not None and int in rule.types and float not in rule.types
)
"""The fields that count tokens (``"cache_loss.reused"``, ``"usage.prompt_tokens"``, ...):
never negative, for the session and the frames alike (from :data:`Tokens` in the hints)."""


def is_measurement(value: object, key: str | None = None) -> bool:
    """``value`` can be a llama.cpp timing: a count (a ``key`` of :data:`COUNT_TIMINGS`: an
    int from 0 to :data:`MAX_TOKENS`) or another timing (a finite int or float from 0 to
    :data:`MAX_MS`; never a bool). The one rule of the session and the frames for
    ``timings``."""
    if key in COUNT_TIMINGS:
        return type(value) is int and 0 <= value <= MAX_TOKENS
    return (type(value) is int and 0 <= value <= MAX_MS) or (
        type(value) is float and math.isfinite(value) and 0 <= value <= MAX_MS
    )


def check_baseline(head: Mapping[str, Any]) -> None:
    """Check a log's first line (the baseline's JSON object) against ``RULES["baseline"]``.

    Its ``schema`` is checked by the upgrade steps (:mod:`boxmaker.session`).

    Raises:
        RecordError: not a baseline, or a field breaks its rule (the message says which).
    """
    if head.get("type") != "baseline":
        raise RecordError(f"first record is {head.get('type')!r:.40}, not 'baseline'", 0)
    found = _problems(RULES["baseline"], [dict(head)], "baseline")
    if found:
        raise RecordError(found[0][1], 0)


def check_records(items: Sequence[Any]) -> None:
    """Check a log's lines after the baseline (JSON values, current schema) against
    :data:`RULES`, field by field over all lines of a type at once (the frames check every
    record of every log).

    Raises:
        RecordError: the first line (in ``items``' order) that breaks the rule; ``index`` is
            its position, the message names record type, field and value.
    """
    try:
        names = [item.get("type", _ABSENT) for item in items]  # of JSON values, dicts have .get
    except AttributeError:
        j = next(j for j, item in enumerate(items) if type(item) is not dict)
        raise RecordError(f"line is not a JSON object: {items[j]!r:.80}", j) from None
    found: list[tuple[int, str]] = []
    if not set(map(type, names)) <= {str}:
        j = next(j for j, name in enumerate(names) if type(name) is not str)
        found.append((j, f"record without a 'type' string: {items[j]!r:.80}"))
    # C-level passes (map, compress): this runs over every record of every log the frames read
    for name in {name for name in names if type(name) is str}:
        where = list(compress(range(len(names)), map(operator.eq, names, repeat(name))))
        rules = RULES.get(name) if name != "baseline" else None
        lines = list(map(items.__getitem__, where))
        for k, message in _problems(rules or (_TIME,), lines, name):
            found.append((where[k], message))
            break
    if found:
        j, message = min(found)
        raise RecordError(message, j)


def _problems(
    rules: tuple[FieldRule, ...], lines: Sequence[dict[str, Any]], name: str
) -> list[tuple[int, str]]:
    """The first break of each rule over ``lines`` (position, message), earliest first."""
    found = []
    for rule in rules:
        values = list(map(dict.get, lines, repeat(rule.name), repeat(_ABSENT)))
        bad = _problem(rule, values, rule.name)
        if bad is not None:
            k, what = bad
            found.append((k, f"{name} record {what}" if what.startswith("without") else
                          f"{name} record: {what}"))  # fmt: skip
    return sorted(found, key=lambda problem: problem[0])  # a line's first field first


def _problem(rule: FieldRule, values: list[Any], label: str) -> tuple[int, str] | None:
    """The first value of ``values`` (one per line) that breaks ``rule``: (position, what)."""
    kinds = set(map(type, values))
    ok = rule.types if rule.required else rule.types | {_Absent}
    if not kinds <= ok:
        k = next(k for k, v in enumerate(values) if type(v) not in ok)
        if values[k] is _ABSENT:
            return k, f"without {label!r}"
        return k, f"{label} = {values[k]!r:.60} is not {rule.want}"
    if _suspect(rule, values, kinds):
        for check, why in _checks(rule):
            k = next((k for k, v in enumerate(values) if not check(v)), -1)
            if k >= 0:
                return k, f"{label} = {values[k]!r:.60} {why}"
    if rule.time:
        return _time_problem(values, label)
    if rule.measurements:
        return _inner(values, label, _MEASUREMENT) or _counts_problem(values, label)
    if rule.items is not None:
        return _inner(values, label, rule.items)
    return None


_NUMBERS = (int, float)
_NULLS = frozenset({None, _ABSENT})


def _suspect(rule: FieldRule, values: list[Any], kinds: set[type]) -> bool:
    """Whether a value may break the value checks of ``rule``: one quick pass in C over all
    (``sum``, ``min``, ``max``, a set); only then are the values checked one by one."""
    if kinds & {int, float}:
        nums = values if kinds <= {int, float} else [v for v in values if type(v) in _NUMBERS]
        try:
            total, lo, hi = sum(nums), min(nums), max(nums)
        except OverflowError:  # an int too large for a float, among floats
            return True
        if float in kinds and not math.isfinite(total):  # NaN or infinity (or a sum past 1e308)
            return True
        if int in kinds and (lo < _INT64[0] or hi > _INT64[1]):
            return True
        if rule.minimum is not None and lo < rule.minimum:
            return True
        if rule.maximum is not None and hi > rule.maximum:
            return True
    if rule.values is not None and not set(values) <= rule.values | _NULLS:
        return True
    return rule.pattern is not None and str in kinds


def _checks(rule: FieldRule) -> list[tuple[Callable[[Any], bool], str]]:
    """The value checks of ``rule``, one value at a time, and what a failure says."""
    number = f"is not {rule.want}" if float in rule.types else "is not a count (>= 0)"
    least, allowed, pattern = rule.minimum, rule.values, rule.pattern
    out: list[tuple[Callable[[Any], bool], str]] = [
        (lambda v: type(v) is not int or _INT64[0] <= v <= _INT64[1], "is out of range (64-bit)"),
        (lambda v: type(v) is not float or math.isfinite(v), number),
    ]
    if least is not None:
        out.append((lambda v: type(v) not in _NUMBERS or v >= least, number))
    most = rule.maximum
    if most is not None:
        out.append((lambda v: type(v) not in _NUMBERS or v <= most, f"is not {rule.want}"))
    if allowed is not None:
        out.append((lambda v: type(v) is not str or v in allowed, f"is not {rule.want}"))
    if pattern is not None:
        out.append((lambda v: type(v) is not str or bool(pattern.fullmatch(v)),
                    f"is not {rule.want}"))  # fmt: skip
    return out


_MEASUREMENT = FieldRule(
    "value",
    True,
    frozenset({int, float}),
    minimum=0,
    maximum=MAX_MS,
    want=f"a finite number >= 0 and <= {int(MAX_MS)}",
)

COUNT_TIMINGS = ("cache_n", "prompt_n", "predicted_n", "draft_n", "draft_n_accepted")
"""The ``timings`` keys that count tokens: integers from 0 to :data:`MAX_TOKENS`."""

_COUNT = FieldRule(
    "value",
    False,
    frozenset({int}),
    minimum=0,
    maximum=MAX_TOKENS,
    want=f"a count (an integer >= 0 and <= {MAX_TOKENS})",
)


def _counts_problem(values: list[Any], label: str) -> tuple[int, str] | None:
    """The first token count of ``timings`` objects (one per line) that is no count: not an
    integer (``predicted_n: 1.5``) or past :data:`MAX_TOKENS`."""
    for key in COUNT_TIMINGS:
        found = [v.get(key, _ABSENT) if type(v) is dict else _ABSENT for v in values]
        bad = _problem(_COUNT, found, f"{label}.{key}")
        if bad is not None:
            return bad
    return None


def _inner(
    values: list[Any], label: str, rules: FieldRule | tuple[FieldRule, ...]
) -> tuple[int, str] | None:
    """The first break inside lists or objects (one per line): each element (a list's) or
    value (an object's) checked by ``rules`` (one rule for the values themselves, or the rules
    of the elements' keys)."""
    inside: list[Any] = []
    kinds = set(map(type, values))
    if kinds == {list}:
        inside = list(chain.from_iterable(values))
    elif kinds == {dict}:
        inside = list(chain.from_iterable(map(dict.values, values)))
    else:
        for value in values:
            if type(value) is list:
                inside += value
            elif type(value) is dict:
                inside += value.values()
    if isinstance(rules, FieldRule):
        bad = _problem(rules, inside, "")
        return None if bad is None else _owned(values, bad[0], label, bad[1])
    if not set(map(type, inside)) <= {dict}:
        n = next(n for n, v in enumerate(inside) if type(v) is not dict)
        return _owned(values, n, label, f" = {inside[n]!r:.40} is not a JSON object")
    found = []
    for rule in rules:
        bad = _problem(
            rule, list(map(dict.get, inside, repeat(rule.name), repeat(_ABSENT))), rule.name
        )
        if bad is not None:
            found.append(bad)
    if not found:
        return None
    n, what = min(found)
    return _owned(values, n, label, f" {what}" if what.startswith("without") else f".{what}")


def _owned(values: list[Any], n: int, label: str, what: str) -> tuple[int, str]:
    """(line, message) of the ``n``-th element or value inside ``values``' lists or objects:
    ``label[i]`` for a list's element, ``label.key`` for an object's value."""
    for k, value in enumerate(values):
        size = len(value) if type(value) in (list, dict) else 0
        if n < size:
            where = f"[{n}]" if type(value) is list else f".{list(value)[n]}"
            return k, f"{label}{where}{what}"
        n -= size
    raise AssertionError("no such element")  # pragma: no cover


def _time_problem(values: list[Any], label: str) -> tuple[int, str] | None:
    """The first time of ``values`` (strings, or absent where optional) that breaks the rule
    of :func:`time_problem`; all of them parsed at once first (the common case: all good)."""
    texts = values if set(map(type, values)) == {str} else [v for v in values if type(v) is str]
    try:
        parsed = list(map(datetime.fromisoformat, texts))
        if None not in map(operator.attrgetter("tzinfo"), parsed) and (
            not parsed or (TIME_RANGE[0] <= min(parsed) and max(parsed) <= TIME_RANGE[1])
        ):
            return None
    except (ValueError, OverflowError):
        pass
    for k, v in enumerate(values):
        why = time_problem(v) if type(v) is str else None
        if why is not None:
            return k, f"{label} = {v!r:.60} {why}"
    return None  # pragma: no cover - the fast path refused what the slow one accepts
