"""Matching a run against its target: the last answer and the tool-call trajectory (pure).

The calls compared are the model's calls as logged (every :class:`~boxmaker.records.Assistant`
record's ``tool_calls``, one group per completion), whether or not the loop ran them: the
target says what the agent should have asked for. Calls are paired with expected calls by a
maximum bipartite matching, so a call that fits several expected calls never takes the place
another call needed (greedy pairing would miss such matches).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..records import Assistant, Record
from ._targets import AnswerTarget, CallTarget, TrajectoryTarget

__all__ = ["Call", "answer_of", "calls_of", "match_answer", "match_trajectory"]

Call = tuple[str, Any]
"""A call as made: the tool's name and its arguments parsed from JSON (``None`` if they are
not valid JSON)."""

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def answer_of(records: Sequence[Record]) -> str | None:
    """The content of the last assistant message with content, ``None`` if there is none."""
    for record in reversed(records):
        if isinstance(record, Assistant) and record.content:
            return record.content
    return None


def calls_of(records: Sequence[Record]) -> list[list[Call]]:
    """The model's tool calls, one list per completion that made any, in log order."""
    steps: list[list[Call]] = []
    for record in records:
        if isinstance(record, Assistant) and record.tool_calls:
            steps.append([(c.name, _parsed(c.arguments)) for c in record.tool_calls])
    return steps


def _parsed(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return None


def match_answer(target: AnswerTarget, answer: str | None) -> tuple[bool, str]:
    """Whether ``answer`` matches, and why (one sentence, the values named).

    Raises:
        nothing: an answer that cannot be read the matcher's way (no number, not JSON) does
            not match.
    """
    if answer is None:
        return False, "the run gave no answer"
    value = target.value
    text, wanted = answer, value
    if target.ignore_case and isinstance(value, str):
        text, wanted = answer.casefold(), value.casefold()
    if target.kind == "exact":
        ok = text.strip() == wanted.strip()
        return ok, f"answer {'is' if ok else 'is not'} exactly {value!r}"
    if target.kind == "contains":
        ok = wanted in text
        return ok, f"answer {'contains' if ok else 'does not contain'} {value!r}"
    if target.kind == "regex":
        flags = re.IGNORECASE if target.ignore_case else 0
        ok = re.search(value, answer, flags) is not None
        return ok, f"regex {value!r} {'found' if ok else 'not found'} in the answer"
    if target.kind == "number":
        found = _NUMBER.search(answer)
        if found is None:
            return False, "no number in the answer"
        number = float(found.group(0))
        ok = math.isfinite(number) and abs(number - float(value)) <= target.tolerance
        return ok, f"first number {found.group(0)} vs {value} (tolerance {target.tolerance:g})"
    try:
        parsed = json.loads(answer)
    except ValueError:
        return False, "the answer is not JSON"
    ok = _contains(parsed, value)
    return ok, f"answer JSON {'holds' if ok else 'does not hold'} the expected subset"


def _contains(actual: Any, wanted: Any) -> bool:
    """``wanted`` is a subset of ``actual``: objects by key (recursively), lists item by item
    (each wanted item in some actual item), other values equal."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and _contains(actual[k], v) for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return isinstance(actual, list) and all(
            any(_contains(a, w) for a in actual) for w in wanted
        )
    return bool(actual == wanted and type(actual) is type(wanted)) or (
        _both_numbers(actual, wanted) and actual == wanted
    )


def _both_numbers(a: Any, b: Any) -> bool:
    return all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))


def _fits(expected: CallTarget, call: Call, arguments: str) -> bool:
    name, args = call
    if name != expected.name:
        return False
    if arguments == "ignore" or expected.arguments is None:
        return True
    if not isinstance(args, Mapping):
        return False
    if arguments == "exact" and set(args) != set(expected.arguments):
        return False
    for key, want in expected.arguments.items():
        if key not in args:
            return False
        value = args[key]
        if callable(want):
            if not want(value):
                return False
        elif not (value == want and (type(value) is type(want) or _both_numbers(value, want))):
            return False
    return True


def _matching(expected: Sequence[CallTarget], calls: Sequence[Call], arguments: str) -> int:
    """The size of a maximum matching of expected calls to calls (Kuhn's augmenting paths)."""
    edges = [[j for j, c in enumerate(calls) if _fits(e, c, arguments)] for e in expected]
    owner: list[int | None] = [None] * len(calls)

    def augment(i: int, seen: set[int]) -> bool:
        for j in edges[i]:
            if j in seen:
                continue
            seen.add(j)
            holder = owner[j]
            if holder is None or augment(holder, seen):
                owner[j] = i
                return True
        return False

    return sum(augment(i, set()) for i in range(len(expected)))


def _n(count: int, word: str) -> str:
    """``count`` and ``word``, plural unless one: ``1 call``, ``2 calls``, ``0 calls``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def match_trajectory(target: TrajectoryTarget, steps: Sequence[Sequence[Call]]) -> tuple[bool, str]:
    """Whether the run's calls (``steps``: one list per completion, see :func:`calls_of`)
    match, by the target's mode, and why."""
    expected = [c for group in target.calls for c in group]
    calls = [c for group in steps for c in group]
    mode, args = target.mode, target.arguments
    if mode == "strict":
        if len(steps) != len(target.calls):
            seen, wanted = _n(len(steps), "completion"), len(target.calls)
            return False, f"{seen} with calls, {wanted} expected"
        for number, (group, made) in enumerate(zip(target.calls, steps, strict=True), 1):
            if len(group) != len(made) or _matching(group, made, args) != len(group):
                return False, f"completion {number}: the calls differ from the expected"
        same = f"{_n(len(calls), 'call')} in {_n(len(steps), 'completion')}"
        return True, f"as expected: {same}"
    paired = _matching(expected, calls, args)
    if mode == "unordered":
        ok = paired == len(expected) == len(calls)
        return ok, f"{paired} of {_n(len(expected), 'expected call')} paired, {len(calls)} made"
    if mode == "subset":
        ok = paired == len(calls)
        return ok, f"unexpected: {len(calls) - paired} of {_n(len(calls), 'call')} made"
    ok = paired == len(expected)
    said = f"made {paired} of {_n(len(expected), 'expected call')}"
    return ok, said if ok else f"{said}, missing {len(expected) - paired}"
