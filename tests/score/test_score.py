"""boxmaker.score: targets parsed and refused, every answer matcher and trajectory mode, the
verdicts of agentevals' trajectory matchers on their own examples, scorers that fail."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from boxmaker.errors import ConfigError
from boxmaker.records import Assistant, Record, ToolCall, ToolResult, User
from boxmaker.score import (
    Score,
    Scorer,
    apply,
    calls_of,
    match_answer,
    match_trajectory,
    parse_target,
    target_scorer,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def _run(*steps: list[tuple[str, dict[str, Any]]], answer: str | None = "done") -> list[Record]:
    records: list[Record] = [User(content="q")]
    n = 0
    for step in steps:
        calls = []
        for name, args in step:
            n += 1
            calls.append(ToolCall(id=f"c{n}", name=name, arguments=json.dumps(args)))
        records.append(Assistant(content=None, tool_calls=tuple(calls)))
        records += [
            ToolResult(call=i, tool_call_id=c.id, name=c.name, content="{}")
            for i, c in enumerate(calls, 1)
        ]
    records.append(Assistant(content=answer))
    return records


@pytest.mark.parametrize(
    ("spec", "answer", "ok"),
    [
        ({"exact": "In Lisbon it is 34 C."}, " In Lisbon it is 34 C.\n", True),
        ({"exact": "In Lisbon it is 34 C."}, "In Lisbon it is 35 C.", False),
        ({"contains": "lisbon", "ignore_case": True}, "In Lisbon it is 34 C.", True),
        ({"contains": "lisbon"}, "In Lisbon it is 34 C.", False),
        ({"regex": r"\b34 C\b"}, "In Lisbon it is 34 C.", True),
        ({"regex": r"^34"}, "In Lisbon it is 34 C.", False),
        ({"number": 34, "tolerance": 0.5}, "In Lisbon it is 34.4 C.", True),
        ({"number": 34}, "In Lisbon it is -34 C.", False),
        ({"number": -4}, "It is -4 C.", True),
        ({"number": 34}, "It is warm.", False),
        (
            {"json_subset": {"city": "Lisbon", "t": {"c": 34}}},
            '{"city":"Lisbon","t":{"c":34,"f":93}}',
            True,
        ),
        ({"json_subset": {"city": "Lisbon"}}, '{"city":"Lisboa"}', False),
        ({"json_subset": {"ok": True}}, '{"ok": 1}', False),
        ({"json_subset": [{"a": 1}]}, '[{"a": 1, "b": 2}, {"c": 3}]', True),
        ({"json_subset": {"city": "Lisbon"}}, "not json", False),
    ],
)
def test_every_answer_matcher(spec: dict[str, Any], answer: str, ok: bool) -> None:
    target = parse_target({"answer": spec})
    assert target.answer is not None
    matched, why = match_answer(target.answer, answer)
    assert matched is ok, why
    assert why


def test_no_answer_never_matches() -> None:
    target = parse_target({"answer": {"contains": ""}})
    assert target.answer is not None
    assert match_answer(target.answer, None) == (False, "the run gave no answer")


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ([], "a target is an object"),
        ({}, "needs 'answer', 'calls' or both"),
        ({"answer": {"contains": "x"}, "score": 1}, "unknown target keys ['score']"),
        ({"answer": {"contains": "x", "exact": "y"}}, "exactly one of"),
        ({"answer": {"regex": "("}}, "answer regex '('"),
        ({"answer": {"number": "34"}}, "takes a number"),
        ({"answer": {"contains": "x", "tolerance": 1}}, "'tolerance' is a number >= 0"),
        ({"answer": {"number": 1, "tolerance": -1}}, "'tolerance' is a number >= 0"),
        ({"calls": "get_weather"}, "'calls' is a list"),
        ({"calls": [{"arguments": {}}]}, "call 1: a call is an object with a 'name'"),
        ({"calls": [{"name": "x"}], "match": "exactly"}, "'match' is one of strict"),
        ({"calls": [{"name": "x"}], "arguments": "fuzzy"}, "'arguments' is exact, subset"),
        ({"calls": [{"name": "x", "arguments": {"a": {"$near": 1}}}]}, "argument 'a': a matcher"),
        ({"answer": {"contains": "x"}, "match": "strict"}, "go with 'calls'"),
    ],
)
def test_a_malformed_target_is_refused_naming_the_task(target: Any, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_target(target, "task lisbon")
    assert str(caught.value).startswith("task lisbon: ")
    assert words in str(caught.value)


def _verdict(outputs: list[list[dict[str, Any]]], reference: Any, mode: str, args: str) -> bool:
    target = parse_target({"calls": reference, "match": mode, "arguments": args})
    assert target.trajectory is not None
    steps = [[(c["name"], c["arguments"]) for c in group] for group in outputs]
    return match_trajectory(target.trajectory, steps)[0]


AGENTEVALS = json.loads((DATA / "agentevals_trajectories.json").read_text())


@pytest.mark.parametrize("case", AGENTEVALS["cases"], ids=lambda case: case["name"])
def test_trajectory_verdicts_agree_with_agentevals(case: dict[str, Any]) -> None:
    for mode, expected in case["expected"].items():
        got = _verdict(case["outputs"], case["reference"], mode, case["arguments"])
        assert got is bool(expected), (mode, case["name"])


def test_the_agentevals_vectors_name_their_source() -> None:
    source = AGENTEVALS["source"]
    assert source["repository"] == "langchain-ai/agentevals"
    assert len(source["commit"]) == 40
    assert len(AGENTEVALS["cases"]) == 11


def test_argument_modes_and_matchers() -> None:
    made = [[("get_weather", {"city": "Lisbon", "units": "C"})]]
    assert not _verdict_of(made, [{"name": "get_weather", "arguments": {"city": "Lisbon"}}])
    assert _verdict_of(
        made, [{"name": "get_weather", "arguments": {"city": "Lisbon"}}], arguments="subset"
    )
    assert _verdict_of(
        made,
        [
            {
                "name": "get_weather",
                "arguments": {"city": {"$regex": "^Lis"}, "units": {"$ignore": True}},
            }
        ],
    )
    assert not _verdict_of(
        made, [{"name": "get_weather", "arguments": {"city": {"$regex": "^Par"}, "units": "C"}}]
    )
    near = [[("get_temp", {"c": 20.6})]]
    spec = [{"name": "get_temp", "arguments": {"c": {"$number": 21, "$tolerance": 0.5}}}]
    assert _verdict_of(near, spec)
    spec[0]["arguments"] = {"c": {"$number": 21, "$tolerance": 0.1}}
    assert not _verdict_of(near, spec)
    invalid = [[("get_weather", None)]]  # arguments that were not JSON
    assert not _verdict_of(invalid, [{"name": "get_weather", "arguments": {"city": "x"}}])
    assert _verdict_of(invalid, [{"name": "get_weather"}])  # no arguments given: names only


def _verdict_of(made: Any, spec: Any, *, arguments: str = "exact", mode: str = "strict") -> bool:
    target = parse_target({"calls": spec, "match": mode, "arguments": arguments})
    assert target.trajectory is not None
    return match_trajectory(target.trajectory, made)[0]


def test_a_python_predicate_as_an_argument_matcher() -> None:
    from boxmaker.score import CallTarget, TrajectoryTarget

    target = TrajectoryTarget(
        calls=((CallTarget(name="f", arguments={"n": lambda v: v % 2 == 0}),),), mode="strict"
    )
    assert match_trajectory(target, [[("f", {"n": 4})]])[0]
    assert not match_trajectory(target, [[("f", {"n": 3})]])[0]


def test_matching_pairs_calls_by_a_maximum_matching_not_greedily() -> None:
    # the first call fits both expected calls; a greedy pairing gives it the first one and
    # leaves the second call (Lisbon only) without a partner
    made = [[("f", {"city": "Lisbon"}), ("f", {"city": "Lisbon"})]]
    spec = [
        {"name": "f", "arguments": {"city": {"$regex": "L"}}},
        {"name": "f", "arguments": {"city": "Lisbon"}},
    ]
    assert _verdict_of(made, spec, mode="unordered")


def test_calls_of_groups_by_completion_and_the_target_scorer_needs_every_part() -> None:
    records = _run([("get_weather", {"city": "Lisbon"})], answer="In Lisbon it is 34 C.")
    assert calls_of(records) == [[("get_weather", {"city": "Lisbon"})]]
    both = {
        "answer": {"contains": "34 C"},
        "calls": [{"name": "get_weather", "arguments": {"city": "Lisbon"}}],
    }
    score = apply(target_scorer(parse_target(both)), records)
    assert score.value == 1.0 and score.error is None
    # said as what was made (the newcomer trial: "not made: 0 of 1" read as no call made)
    assert score.explanation == "answer contains '34 C'; made 1 of 1 expected call"
    wrong = {**both, "answer": {"contains": "35 C"}}
    assert apply(target_scorer(parse_target(wrong)), records).value == 0.0
    other = {"calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
    missed = apply(target_scorer(parse_target(other)), records)
    assert (missed.value, missed.explanation) == (0.0, "made 0 of 1 expected call, missing 1")


def test_a_scorer_that_raises_or_answers_nonsense_gives_an_error_score() -> None:
    def boom(records: Any) -> float:
        raise ZeroDivisionError("no runs")

    failed = apply(Scorer(name="boom", fn=boom), [])
    assert math.isnan(failed.value) and failed.error == "ZeroDivisionError: no runs"
    assert apply(Scorer(name="big", fn=lambda r: 2.0), []).error is not None
    assert apply(Scorer(name="text", fn=lambda r: "yes"), []).error is not None  # type: ignore[arg-type,return-value]
    assert apply(Scorer(name="bool", fn=lambda r: True), []).value == 1.0
    partial = apply(Scorer(name="half", fn=lambda r: Score(value=0.5, explanation="x")), [])
    assert (partial.value, partial.explanation) == (0.5, "x")
