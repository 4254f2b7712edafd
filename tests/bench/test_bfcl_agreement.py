"""Agreement: boxmaker's BFCL scorer and BFCL's own evaluation give the same verdict on every
hand-made output, right and wrong, of every category boxmaker runs.

BFCL's own evaluation runs in a process of its own (``bfcl_reference.py``: its eval runner,
its OpenAI function-calling handler, its loader), boxmaker's in this one; both see the same
model results, in the format BFCL's inference records for such a model. The right outputs are
built from BFCL's possible answers; the wrong ones change one thing each.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from extras import need

need("bfcl_eval")
need("mpmath")

from boxmaker.bench import CATEGORIES, Entry, load_entries, model_result, verdict  # noqa: E402
from boxmaker.records import Assistant, Record, ToolCall, TurnEnd, User  # noqa: E402

REFERENCE = Path(__file__).with_name("bfcl_reference.py")
PER_CATEGORY = 3


def _name(entry: Entry, name: str) -> str:
    return name.replace(".", "_")


def _right_call(name: str, params: dict[str, list[Any]]) -> dict[str, str]:
    """One call of a single-turn possible answer: each parameter's first allowed value (an
    optional one left out when "" is allowed)."""
    args = {k: v[0] for k, v in params.items() if v and v[0] != ""}
    return {name.replace(".", "_"): json.dumps(args)}


def _single_turn_cases(entry: Entry) -> list[tuple[str, Any]]:
    if entry.category == "irrelevance":
        doc = entry.functions[0]
        call = {doc["name"].replace(".", "_"): json.dumps({})}
        return [
            ("no call, text", "I cannot help with that using these tools."),
            ("empty content", ""),
            ("no content", None),
            ("a call", [call]),
            ("two calls", [call, call]),
            ("a call with bad JSON", [{doc["name"].replace(".", "_"): "{oops"}]),
        ]
    right = [_right_call(n, p) for answer in entry.ground_truth for n, p in answer.items()]
    first = next(iter(right[0]))
    args = json.loads(right[0][first])
    wrong_value = dict(args)
    key = next(iter(wrong_value), None)
    if key is not None:
        value = wrong_value[key]
        wrong_value[key] = "nonsense" if not isinstance(value, str) else value + "-nonsense"
    missing = {k: v for k, v in args.items() if k != key}
    return [
        ("right", right),
        ("right, reordered", list(reversed(right))),
        ("a wrong value", [{first: json.dumps(wrong_value)}, *right[1:]]),
        ("a parameter missing", [{first: json.dumps(missing)}, *right[1:]]),
        ("a wrong function", [{"no_such_function": right[0][first]}, *right[1:]]),
        ("one call too many", [*right, right[0]]),
        ("no call, text", "The answer is 42."),
        ("arguments not JSON", [{first: "{'a': 1"}, *right[1:]]),
        ("arguments a list", [{first: "[1, 2]"}, *right[1:]]),
    ]


def _fc_call(entry: Entry, text: str) -> dict[str, str]:
    """A ground-truth call text (``cd(folder='x')``) as a function-calling model's call:
    positional arguments named by the function doc's parameter order."""
    node = ast.parse(text, mode="eval").body
    assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
    name = node.func.id
    doc = next(f for f in entry.functions if f["name"] == name)
    order = list(doc["parameters"]["properties"])
    args = {order[i]: ast.literal_eval(a) for i, a in enumerate(node.args)}
    args.update({k.arg: ast.literal_eval(k.value) for k in node.keywords if k.arg})
    return {name: json.dumps(args)}


def _multi_turn_cases(entry: Entry) -> list[tuple[str, Any]]:
    truth = entry.ground_truth
    right = [[[_fc_call(entry, c) for c in turn], "Done."] if turn else ["Done."] for turn in truth]
    one_step = [[[_fc_call(entry, c)] for c in turn] + ["Done."] for turn in truth]
    no_last = [*right[:-1], ["I did nothing."]]
    wrong = json.loads(json.dumps(right))
    first_turn = next(i for i, t in enumerate(truth) if t)
    call = wrong[first_turn][0][0]
    name = next(iter(call))
    args = json.loads(call[name])
    if args:
        key = next(iter(args))
        args[key] = "nonsense_value"
    call[name] = json.dumps(args)
    return [
        ("right, all calls in one step a turn", right),
        ("right, one call a step", one_step),
        ("the last turn without calls", no_last),
        ("a wrong argument", wrong),
        ("force-terminated (a turn short)", right[:-1]),
        ("an inference error", "Error during inference: the run has no completion"),
        ("a step of unparsable arguments", [[[{name: "{oops"}], *t] for t in right]),
        ("an unknown function", [[[{"no_such_function": "{}"}], *t] for t in right]),
    ]


def _cases() -> list[tuple[Entry, str, Any]]:
    out = []
    for category in CATEGORIES:
        for entry in load_entries(category)[:PER_CATEGORY]:
            made = _multi_turn_cases(entry) if entry.multi_turn else _single_turn_cases(entry)
            out += [(entry, why, result) for why, result in made]
    return out


def _bfcl(cases: list[tuple[Entry, str, Any]], tools: list[str]) -> dict[str, Any]:
    payload = {
        "cases": [{"category": e.category, "id": e.id, "result": r} for e, _, r in cases],
        "tools": tools,
    }
    done = subprocess.run(
        [sys.executable, str(REFERENCE)],
        input=json.dumps(payload),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


@pytest.fixture(scope="module")
def reference() -> tuple[list[tuple[Entry, str, Any]], dict[str, Any]]:
    cases = _cases()
    tools = [e.id for c in CATEGORIES for e in load_entries(c)[:PER_CATEGORY]]
    return cases, _bfcl(cases, tools)


def test_every_category_has_right_and_wrong_cases(
    reference: tuple[list[tuple[Entry, str, Any]], dict[str, Any]],
) -> None:
    cases, bfcl = reference
    for category in CATEGORIES:
        verdicts = [
            v["valid"]
            for (e, _, _), v in zip(cases, bfcl["verdicts"], strict=True)
            if e.category == category
        ]
        assert True in verdicts and False in verdicts, category


def test_boxmaker_and_bfcl_give_the_same_verdict_on_every_case(
    reference: tuple[list[tuple[Entry, str, Any]], dict[str, Any]],
) -> None:
    cases, bfcl = reference
    differ = []
    for (entry, why, result), theirs in zip(cases, bfcl["verdicts"], strict=True):
        ours = verdict(entry, result)
        if (ours.valid, ours.error_type) != (theirs["valid"], theirs["error_type"]):
            differ.append((entry.id, why, ours, theirs))
    assert differ == []
    assert len(cases) >= 6 * PER_CATEGORY * 6


def test_the_tools_offered_are_bfcls_own(
    reference: tuple[list[tuple[Entry, str, Any]], dict[str, Any]],
) -> None:
    _, bfcl = reference
    for category in CATEGORIES:
        for entry in load_entries(category)[:PER_CATEGORY]:
            assert entry.tools() == bfcl["tools"][entry.id], entry.id


def test_recorded_calls_become_bfcls_model_result() -> None:
    """The records of a run as BFCL's inference would have recorded the same completions."""
    (single,) = load_entries("simple_python")[:1]
    call = ToolCall(id="a", name="calculate_triangle_area", arguments='{"base": 10, "height": 5}')
    records: list[Record] = [
        User(content=single.turns[0]),
        Assistant(content=None, reasoning="think", tool_calls=(call,)),
        TurnEnd(outcome="tool_iterations"),
    ]
    assert model_result(single, records) == [{"calculate_triangle_area": call.arguments}]
    assert verdict(single, model_result(single, records)).valid
    assert model_result(single, [User(content="q"), TurnEnd(outcome="session_full")]).startswith(
        "Error during inference"
    )
    multi = load_entries("multi_turn_base")[0]
    ls = ToolCall(id="b", name="ls", arguments="{}")
    turns: list[Record] = []
    for i, _ in enumerate(multi.turns):
        turns += [
            User(content=multi.turns[i]),
            Assistant(content=None, reasoning="", tool_calls=(ls,)),
            Assistant(content="done", reasoning="", tool_calls=()),
            TurnEnd(outcome="answered"),
        ]
    assert model_result(multi, turns) == [[[{"ls": "{}"}], "done"]] * len(multi.turns)
    stopped = [*turns[:3], TurnEnd(outcome="tool_iterations"), *turns[4:]]
    assert model_result(multi, stopped) == [[[{"ls": "{}"}], "done"]]  # BFCL's step limit
    full = [*turns[:4], User(content="x"), TurnEnd(outcome="session_full")]
    assert isinstance(model_result(multi, full), str)
