"""Property: every request of a session extends the previous one, byte for byte.

Generated conversations mix user turns, tool calls (good, unknown, invalid JSON), repeats,
every limit, cache outcomes, failures and cancels. On failure hypothesis prints the example
and a ``@reproduce_failure`` blob (``print_blob=True``) so it can be replayed; the seed can be
fixed with ``pytest --hypothesis-seed=N``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from boxmaker.config import Config, LoopLimits
from boxmaker.errors import InferError, RequestCancelled, TurnError
from boxmaker.records import Baseline
from boxmaker.session import Session, messages
from boxmaker.testing import ScriptedClient, Step, answer, call, context_full, timings
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

CITIES = ["Oslo", "Lima", "Xi'an"]
_ids = itertools.count()

arguments = st.one_of(
    st.sampled_from(CITIES).map(lambda c: {"city": c}),
    st.just("{broken"),
    st.just({"town": "x"}),
)
tool_call = st.builds(
    lambda name, args: call(name, args, "unset"),
    st.sampled_from(["weather", "weather", "nope"]),
    arguments,
)
step = st.one_of(
    st.builds(
        lambda cs, r, t: Step(tool_calls=cs, reasoning=r, timings=t),
        st.lists(tool_call, min_size=1, max_size=3),
        st.one_of(st.none(), st.text("abc ", min_size=1, max_size=12)),
        st.builds(timings, st.integers(0, 200), st.integers(1, 200)),
    ),
    st.builds(
        lambda text, r, t: answer(text, reasoning=r, timings=t),
        st.text(max_size=15),
        st.one_of(st.none(), st.text("xyz", min_size=1, max_size=12)),
        st.builds(timings, st.integers(0, 200), st.integers(1, 200)),
    ),
    st.just("context_full"),
    st.just("error"),
    st.just("cancel"),
)
turns = st.lists(
    st.tuples(st.text(min_size=1, max_size=20), st.lists(step, max_size=5)), min_size=1, max_size=5
)
configs = st.builds(
    lambda it, rep, cap, think: Config(
        loop=LoopLimits(
            tool_iterations=it, repeat_detection=rep, tool_result_cap=cap, thinking_tokens=think
        ),
    ),
    st.integers(1, 3),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 40)),
    st.one_of(st.none(), st.integers(0, 8)),
)


def _materialise(s: Any) -> Step:
    if s == "context_full":
        return context_full()
    if s == "error":
        return Step(error=InferError("HTTP 500", status=500, body="boom"))
    if s == "cancel":
        return Step(error=RequestCancelled("cancelled"))
    # llama.cpp gives every call of a session its own id; number them so
    step: Step = s
    step.tool_calls = [dataclasses.replace(c, id=f"call-{next(_ids)}") for c in step.tool_calls]
    return step


def weather(city: str) -> str:
    """Weather."""
    return json.dumps({"city": city, "sky": "clear", "note": "x" * 30})


@settings(
    max_examples=150,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(turns, configs)
def test_every_request_extends_the_previous(
    conversation: list[tuple[str, list[Any]]], config: Config
) -> None:
    registry = Registry()
    registry.add(weather)
    steps: list[Step] = []
    plan: list[tuple[str, int]] = []
    for text, turn_steps in conversation:
        plan.append((text, len(turn_steps)))
        steps.extend(_materialise(s) for s in turn_steps)
    client = ScriptedClient(steps, default=answer("fallback", timings=timings(0, 1)))
    with tempfile.TemporaryDirectory() as tmp:
        session = Session.create(tmp, Baseline(system="sys", tools=registry.definitions()))
        runtime = Runtime(config=config, client=client, registry=registry)
        for text, _ in plan:
            with contextlib.suppress(TurnError):
                run_turn(session, runtime, text)
        reopened = Session.open(session.path, read_only=True).messages()
        # the messages kept incrementally are exactly those rebuilt from the records
        assert session.messages() == messages(session.baseline, session.records) == reopened
        session.close()
    serialised = [[json.dumps(m, ensure_ascii=False) for m in b["messages"]] for b in client.bodies]
    for earlier, later in itertools.pairwise(serialised):
        assert later[: len(earlier)] == earlier
        assert len(later) > len(earlier)
    # the log on disk gives the same messages as the requests saw
    if serialised:
        assert [json.dumps(m, ensure_ascii=False) for m in reopened][: len(serialised[-1])] == (
            serialised[-1]
        )
    # and it is well formed: every tool call has exactly one result
    for i, m in enumerate(reopened):
        for c in m.get("tool_calls", []):
            assert sum(1 for x in reopened[i + 1 :] if x.get("tool_call_id") == c["id"]) == 1
    # every request carries valid JSON arguments
    for b in client.bodies:
        for m in b["messages"]:
            for c in m.get("tool_calls", []):
                assert isinstance(json.loads(c["function"]["arguments"]), dict)
