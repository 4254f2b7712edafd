"""What a right run looks like: answer and trajectory targets, read from a task's JSON.

A batch task (:class:`boxmaker.batch.Task`) may carry a ``target`` object::

    {"answer": {"contains": "Lisbon"}}
    {"answer": {"number": 21, "tolerance": 0.5}}
    {"calls": [{"name": "get_weather", "arguments": {"city": "Lisbon"}}],
     "match": "superset", "arguments": "exact"}

``answer`` holds one matcher of the run's last answer: ``exact``, ``contains``, ``regex`` (Python
:mod:`re`, searched), ``number`` (the first number in the answer within ``tolerance``) or
``json_subset`` (the answer parsed as JSON holds these keys with these values, at any depth).
``calls`` lists the tool calls expected; ``match`` says how the run's calls are compared
(``strict``: the same calls completion by completion, in order, each completion's calls in any
order; ``unordered``: the same calls in any order; ``subset``: the run made no call that is not
expected; ``superset``: the run made every expected call, and maybe more), the terms and the
verdicts of LangChain's ``agentevals`` trajectory matchers. ``arguments`` says how arguments are
compared when a call gives them (``exact``, the default: equal as JSON; ``ignore``: names only).
One argument can carry its own matcher: ``{"$ignore": true}``, ``{"$regex": "^Lis"}``,
``{"$number": 21, "$tolerance": 1}``, or, from Python, any callable taking the value.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias, get_args

from ..errors import ConfigError

__all__ = [
    "ANSWER_MATCHERS",
    "TRAJECTORY_MODES",
    "AnswerTarget",
    "ArgumentMatcher",
    "CallTarget",
    "Target",
    "TrajectoryTarget",
    "parse_target",
]

AnswerMatcher: TypeAlias = Literal["exact", "contains", "regex", "number", "json_subset"]
ANSWER_MATCHERS: tuple[AnswerMatcher, ...] = get_args(AnswerMatcher)
"""The ways an answer can be matched, in the order they are tried when parsing."""

TrajectoryMode: TypeAlias = Literal["strict", "unordered", "subset", "superset"]
TRAJECTORY_MODES: tuple[TrajectoryMode, ...] = get_args(TrajectoryMode)
"""The trajectory match modes (agentevals' names)."""

ArgumentMatcher: TypeAlias = Callable[[Any], bool]
"""A predicate on one argument's value (parsed from JSON)."""


@dataclass(frozen=True, kw_only=True)
class AnswerTarget:
    """One matcher of the run's last answer (the content of its last assistant message).

    Attributes:
        kind: one of :data:`ANSWER_MATCHERS`.
        value: the text (``exact``, ``contains``), the pattern (``regex``), the number
            (``number``) or the object (``json_subset``).
        tolerance: for ``number``: the largest difference still right (absolute), else 0.
        ignore_case: compare ``exact`` / ``contains`` / ``regex`` without case.
    """

    kind: AnswerMatcher
    value: Any
    tolerance: float = 0.0
    ignore_case: bool = False


@dataclass(frozen=True, kw_only=True)
class CallTarget:
    """One expected tool call.

    Attributes:
        name: the tool's name.
        arguments: expected arguments; each value is compared exactly (as parsed JSON)
            unless it is an :data:`ArgumentMatcher`; ``None``: the arguments are not compared.
            Arguments the call makes that are not named here are compared only in ``exact``
            mode of :class:`TrajectoryTarget` (then they must be absent).
    """

    name: str
    arguments: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class TrajectoryTarget:
    """The tool calls a right run makes.

    Attributes:
        calls: the expected calls, grouped by completion for ``strict`` (a tuple of
            completions, each a tuple of calls); for the other modes the grouping is ignored.
        mode: one of :data:`TRAJECTORY_MODES`.
        arguments: ``"exact"`` (arguments given in a call target must equal the call's, and
            the call has no others), ``"subset"`` (the named arguments must match; others are
            allowed) or ``"ignore"`` (tool names only).
    """

    calls: tuple[tuple[CallTarget, ...], ...]
    mode: TrajectoryMode = "superset"
    arguments: Literal["exact", "subset", "ignore"] = "exact"


@dataclass(frozen=True, kw_only=True)
class Target:
    """What a right run looks like: an answer target, a trajectory target, or both (a run is
    right when each given part matches)."""

    answer: AnswerTarget | None = None
    trajectory: TrajectoryTarget | None = None
    raw: Mapping[str, Any] = field(default_factory=dict)


def parse_target(data: Any, where: str = "target") -> Target:
    """A :class:`Target` from its JSON form (see the module docstring).

    Args:
        data: the task's ``target`` object.
        where: names the task in error messages (``"task lisbon"``).

    Raises:
        ConfigError: an unknown key or matcher, a bad regex, a number that is not one, calls
            that are not a list of ``{"name", "arguments"?}`` objects; the message names
            ``where`` and the offending part.
    """
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: a target is an object, not {type(data).__name__}")
    unknown = set(data) - {"answer", "calls", "match", "arguments"}
    if unknown:
        raise ConfigError(f"{where}: unknown target keys {sorted(unknown)}")
    if "answer" not in data and "calls" not in data:
        raise ConfigError(f"{where}: a target needs 'answer', 'calls' or both")
    answer = _answer_of(data["answer"], where) if "answer" in data else None
    trajectory = _trajectory_of(data, where) if "calls" in data else None
    if trajectory is None and ("match" in data or "arguments" in data):
        raise ConfigError(f"{where}: 'match' and 'arguments' go with 'calls'")
    return Target(answer=answer, trajectory=trajectory, raw=dict(data))


def _answer_of(spec: Any, where: str) -> AnswerTarget:
    if not isinstance(spec, Mapping):
        raise ConfigError(f'{where}: \'answer\' is an object such as {{"contains": "..."}}')
    kinds = [k for k in ANSWER_MATCHERS if k in spec]
    extra = set(spec) - set(ANSWER_MATCHERS) - {"tolerance", "ignore_case"}
    if len(kinds) != 1 or extra:
        raise ConfigError(
            f"{where}: 'answer' takes exactly one of {', '.join(ANSWER_MATCHERS)}"
            f" (and 'tolerance', 'ignore_case'); got {sorted(spec)}"
        )
    kind = kinds[0]
    value = spec[kind]
    tolerance = spec.get("tolerance", 0.0)
    ignore_case = spec.get("ignore_case", False)
    if not isinstance(ignore_case, bool):
        raise ConfigError(f"{where}: 'ignore_case' must be true or false")
    if kind in ("exact", "contains", "regex") and not isinstance(value, str):
        raise ConfigError(f"{where}: answer '{kind}' takes a string")
    if kind == "regex":
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(f"{where}: answer regex {value!r}: {exc}") from exc
    if kind == "number" and not _is_number(value):
        raise ConfigError(f"{where}: answer 'number' takes a number, not {value!r}")
    if "tolerance" in spec and (kind != "number" or not _is_number(tolerance) or tolerance < 0):
        raise ConfigError(f"{where}: 'tolerance' is a number >= 0, with 'number' only")
    if kind == "json_subset" and not isinstance(value, Mapping | list):
        raise ConfigError(f"{where}: answer 'json_subset' takes an object or a list")
    return AnswerTarget(kind=kind, value=value, tolerance=float(tolerance), ignore_case=ignore_case)


def _trajectory_of(data: Mapping[str, Any], where: str) -> TrajectoryTarget:
    mode = data.get("match", "superset")
    if mode not in TRAJECTORY_MODES:
        raise ConfigError(f"{where}: 'match' is one of {', '.join(TRAJECTORY_MODES)}, not {mode!r}")
    arguments = data.get("arguments", "exact")
    if arguments not in ("exact", "subset", "ignore"):
        raise ConfigError(f"{where}: 'arguments' is exact, subset or ignore, not {arguments!r}")
    calls = data["calls"]
    if isinstance(calls, str | bytes) or not isinstance(calls, Sequence):
        raise ConfigError(f"{where}: 'calls' is a list of calls (or of lists of calls)")
    steps: list[tuple[CallTarget, ...]] = []
    for number, item in enumerate(calls, 1):
        group = item if isinstance(item, list | tuple) else [item]
        steps.append(tuple(_call_of(call, f"{where}: call {number}") for call in group))
    return TrajectoryTarget(calls=tuple(steps), mode=mode, arguments=arguments)


def _call_of(spec: Any, where: str) -> CallTarget:
    if isinstance(spec, CallTarget):
        return spec
    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str):
        raise ConfigError(f"{where}: a call is an object with a 'name' string")
    extra = set(spec) - {"name", "arguments"}
    if extra:
        raise ConfigError(f"{where}: unknown call keys {sorted(extra)}")
    arguments = spec.get("arguments")
    if arguments is not None and not isinstance(arguments, Mapping):
        raise ConfigError(f"{where}: 'arguments' of a call is an object")
    if arguments is not None:
        arguments = {k: _argument_of(v, f"{where}: argument {k!r}") for k, v in arguments.items()}
    return CallTarget(name=spec["name"], arguments=arguments)


def _argument_of(value: Any, where: str) -> Any:
    """An argument's expected value, or a matcher for the ``$``-forms."""
    if not isinstance(value, Mapping) or not any(str(k).startswith("$") for k in value):
        return value
    if value.keys() == {"$ignore"} and value["$ignore"] is True:
        return _Ignore()
    if value.keys() == {"$regex"} and isinstance(value["$regex"], str):
        try:
            return _Regex(re.compile(value["$regex"]))
        except re.error as exc:
            raise ConfigError(f"{where}: {exc}") from exc
    if set(value) <= {"$number", "$tolerance"} and "$number" in value:
        number, tolerance = value["$number"], value.get("$tolerance", 0)
        if _is_number(number) and _is_number(tolerance) and tolerance >= 0:
            return _Near(float(number), float(tolerance))
    raise ConfigError(
        f'{where}: a matcher is {{"$ignore": true}}, {{"$regex": ...}} or '
        f'{{"$number": x, "$tolerance": t}}, not {dict(value)!r}'
    )


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


@dataclass(frozen=True)
class _Ignore:
    """Any value matches."""

    def __call__(self, value: Any) -> bool:
        return True


@dataclass(frozen=True)
class _Regex:
    """A string value the pattern is found in."""

    pattern: re.Pattern[str]

    def __call__(self, value: Any) -> bool:
        return isinstance(value, str) and self.pattern.search(value) is not None


@dataclass(frozen=True)
class _Near:
    """A number within the tolerance."""

    number: float
    tolerance: float

    def __call__(self, value: Any) -> bool:
        return _is_number(value) and abs(float(value) - self.number) <= self.tolerance
