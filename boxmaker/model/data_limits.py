"""The training families of the later phases (5 to 8) of the tiny model (pure Python):
reasoning ended by the thinking budget, answers after a cut, two-tool cycles and answers
after a limit. Their shares are 0 unless ``--mix`` names them (see
:data:`boxmaker.model.data.FAMILIES`), so the first phases draw as before.
"""

from __future__ import annotations

import random

from boxmaker.model.dialogue import (
    BUDGET_MARK,
    BUDGET_ZERO_MARK,
    CUT_MARK,
    REPEAT_RESULTS,
    Conv,
    assistant,
    one_call,
    tool_message,
)
from boxmaker.model.words import (
    random_city,
    time_answer,
    time_question,
    time_result,
    tool_call,
    weather_answer,
    weather_question,
    weather_result,
)
from boxmaker.turn import ALREADY_MADE, NUDGE, LoopGuard

__all__ = [
    "CYCLE_FORMS",
    "budget_mark",
    "fam_after_limit",
    "fam_after_nudge",
    "fam_cut_answer",
    "fam_cycle",
    "fam_think_budget",
]


def budget_mark(rng: random.Random, cut: str) -> str:
    """The mark that ends ``cut`` when the budget ended it (an empty cut: often a budget of 0)."""
    return BUDGET_ZERO_MARK if not cut and rng.random() < 0.6 else BUDGET_MARK


def _cut(rng: random.Random, text: str, empty: float = 0.1) -> str:
    """``text`` cut at a random character (empty with probability ``empty``), no newline last."""
    if rng.random() < empty:
        return ""
    return text[: rng.randint(1, len(text) - 1)].rstrip("\n")


def fam_think_budget(rng: random.Random, conv: Conv) -> None:
    """As ``think_cut``, the reasoning ended by the per-request budget (``</think>`` forced)."""
    city = random_city(rng)
    kind = rng.choice(("weather", "time"))
    tool = "get_weather" if kind == "weather" else "get_time"
    q = weather_question(rng, city) if kind == "weather" else time_question(rng, city)
    if rng.random() < 0.5:
        q = rng.choice(("Think long and hard: ", "Think step by step. ", "Think carefully. ")) + q
    conv.add({"role": "user", "content": q})
    lines = [f"The user wants the {kind} in {city}. I will call {tool}."]
    if rng.random() < 0.5:
        lines += [f"Step {k}: I think about the {kind} in {city}." for k in range(1, 12)]
    cut = _cut(rng, "\n".join(lines))
    conv.add(assistant(cut + budget_mark(rng, cut), calls=[tool_call(rng, tool, city)]), True)
    conv.copies.append(city)


def fam_cut_answer(rng: random.Random, conv: Conv) -> None:
    """A call and its result, then the answer's reasoning cut (by the budget or by
    ``reasoning_end``, often at once: the turn's budget is spent), then the right answer."""
    city = random_city(rng)
    kind = rng.choice(("weather", "time"))
    q = weather_question(rng, city) if kind == "weather" else time_question(rng, city)
    conv.add({"role": "user", "content": q})
    answer = one_call(rng, conv, kind, city, rng.random() < 0.5)
    budget = rng.random() < 0.6
    cut = _cut(rng, f"I have the {kind} for {city}. I will answer.", empty=0.4)
    conv.add(assistant(cut + (budget_mark(rng, cut) if budget else CUT_MARK), answer), True)


CYCLE_FORMS = (
    "Keep checking the {k1} in {c1} and the {k2} in {c2}.",
    "Check the {k1} in {c1} and the {k2} in {c2} again and again.",
    "Keep watching the {k1} in {c1} and the {k2} in {c2}.",
    "Monitor the {k1} in {c1} and the {k2} in {c2}: check both over and over.",
)


def fam_cycle(rng: random.Random, conv: Conv) -> None:
    """Asked to keep checking two things, the model alternates two calls (A, B, A, B ...),
    one call per completion, whatever the results say: a cycle the loop guard must catch."""
    c1, c2 = random_city(rng), random_city(rng)
    k1, k2 = rng.choice((("weather", "time"), ("time", "weather"), ("weather", "weather"),
                         ("time", "time")))  # fmt: skip
    if k1 == k2 and c1 == c2:
        c2 = c2 + "a"
    conv.add({"role": "user", "content": rng.choice(CYCLE_FORMS).format(
        k1=k1, c1=c1, k2=k2, c2=c2)})  # fmt: skip
    pair = ((k1, c1), (k2, c2))
    rounds = rng.randint(2, 7)
    for i in range(rounds):
        kind, city = pair[i % 2]
        tool = "get_weather" if kind == "weather" else "get_time"
        call = tool_call(rng, tool, city)
        reasoning = (f"The user wants me to keep checking the {k1} in {c1} and the {k2} in {c2}."
                     f" I will call {tool} for {city}." if i == 0
                     else f"Next I check the {kind} in {city} again.")  # fmt: skip
        conv.add(assistant(reasoning, calls=[call]), True)
        if i == rounds - 1:
            break
        if i >= 2 and rng.random() < 0.3:
            conv.add(tool_message(call, rng.choice(REPEAT_RESULTS)))
        elif kind == "weather":
            conv.add(tool_message(call, weather_result(rng, city)[0]))
        else:
            conv.add(tool_message(call, time_result(rng, city)[0]))
    conv.copies += [c1, c2]


_LIMIT_DETAILS = (
    "tool_iterations: {n} completions with tool calls in this turn, the cap is {n} "
    "(value {n}, limit {n})",
    "repeated_call: {tool} was called {n} times with the same arguments in this turn "
    "(value {n}, limit {m})",
    "loop: rule cycle: a cycle of 2 calls ({calls}) repeated 2 times (value 4, limit 2)",
    "loop: rule stale_result: {tool} returned the same result {n} times in this turn "
    "(value {n}, limit {n})",
)


def _targets(rng: random.Random, share_two: float) -> tuple[bool, tuple[str, str], tuple[str, str]]:
    """What a looping turn keeps checking: two (kind, city) with probability ``share_two``,
    else one (given twice)."""
    c1 = random_city(rng)
    two = rng.random() < share_two
    c2 = random_city(rng) if two else c1
    k1 = rng.choice(("weather", "time"))
    k2 = rng.choice(("weather", "time")) if two else k1
    return two, (k1, c1), (k2, c2)


def fam_after_limit(rng: random.Random, conv: Conv) -> None:
    """A turn a limit ended (``loop.on_limit = "answer"``): the last call is answered 'not run'
    with the limit's words, and the model answers from the results it has."""
    two, (k1, c1), (k2, c2) = _targets(rng, 0.5)
    if two:
        q = rng.choice(CYCLE_FORMS).format(k1=k1, c1=c1, k2=k2, c2=c2)
    else:
        q = rng.choice(("Keep checking the {k} in {c}.", "Check the {k} in {c} again and again.",
                        "What is the {k} in {c}? Check it several times."))  # fmt: skip
        q = q.format(k=k1, c=c1)
    conv.add({"role": "user", "content": q})
    answers: dict[tuple[str, str], str] = {}
    rounds = rng.randint(2, 5)
    pair = ((k1, c1), (k2, c2))
    for i in range(rounds):
        kind, city = pair[i % 2]
        tool = "get_weather" if kind == "weather" else "get_time"
        call = tool_call(rng, tool, city)
        conv.add(assistant(f"I will check the {kind} in {city}.", calls=[call]))
        if i < rounds - 1:
            if kind == "weather":
                result, temp, sky = weather_result(rng, city)
                answers[(kind, city)] = weather_answer(city, temp, sky)
                copies = [str(temp), sky]
            else:
                result, clock = time_result(rng, city)
                answers[(kind, city)] = time_answer(city, clock)
                copies = [clock]
            conv.add(tool_message(call, result))
            conv.copies += copies
            continue
        calls = f'get_weather {{"city": "{c1}"}}, get_time {{"city": "{c2}"}}'
        detail = rng.choice(_LIMIT_DETAILS).format(n=rounds, m=rounds - 1, tool=tool, calls=calls)
        conv.add(tool_message(call, f"This call was not run: the turn ended ({detail})."))
    said = " ".join(answers[k] for k in pair if k in answers) if two else answers[pair[0]]
    conv.add(assistant("The checks were stopped. I will answer with what I have.", said), True)
    conv.copies += [c1, c2]


def fam_after_nudge(rng: random.Random, conv: Conv) -> None:
    """A looping turn as the loop leaves it with ``on_limit = "answer"``: the first calls ran,
    the later ones were answered as the loop answers them (:data:`ALREADY_MADE`, the guard's
    :data:`NUDGE`), the last one "not run: the turn ended (...)" with
    ``LoopGuard.ANSWER_NOW``; the model answers from the results that ran."""
    two, (k1, c1), (k2, c2) = _targets(rng, 0.7)
    if two:
        conv.add({"role": "user", "content": rng.choice(CYCLE_FORMS).format(
            k1=k1, c1=c1, k2=k2, c2=c2)})  # fmt: skip
    else:
        conv.add({"role": "user", "content": f"Keep checking the {k1} in {c1}."})
    pair = ((k1, c1), (k2, c2)) if two else ((k1, c1),)
    answers: dict[tuple[str, str], str] = {}
    style = rng.choice(("repeat", "nudge", "iterations"))
    rounds = rng.randint(len(pair) + 1, len(pair) + 3)
    for i in range(rounds):
        kind, city = pair[i % len(pair)]
        tool = "get_weather" if kind == "weather" else "get_time"
        call = tool_call(rng, tool, city)
        conv.add(assistant(f"I will check the {kind} in {city}.", calls=[call]))
        last = i == rounds - 1
        if not last and ((kind, city) not in answers or style == "iterations"):
            if kind == "weather":
                result, temp, sky = weather_result(rng, city)
                answers[(kind, city)] = weather_answer(city, temp, sky)
                conv.copies += [str(temp), sky]
            else:
                result, clock = time_result(rng, city)
                answers[(kind, city)] = time_answer(city, clock)
                conv.copies += [clock]
            conv.add(tool_message(call, result))
        elif not last:
            calls = ", ".join(
                f'{"get_weather" if k == "weather" else "get_time"} {{"city":"{c}"}}'
                for k, c in pair
            )
            what = f"a cycle of {len(pair)} calls ({calls}) repeated 2 times"
            said = ALREADY_MADE if style == "repeat" else NUDGE.format(what=what)
            conv.add(tool_message(call, said))
        else:
            detail = {
                "repeat": f"repeated_call: {tool} was called 3 times with the same arguments "
                "in this turn (value 3, limit 2)",
                "nudge": f"loop: rule cycle: a cycle of {len(pair)} calls repeated 2 times "
                "(value 2, limit 1)",
                "iterations": f"tool_iterations: {rounds} completions with tool calls in this "
                f"turn, the cap is {rounds - 1} (value {rounds}, limit {rounds - 1})",
            }[style]
            end = LoopGuard.ANSWER_NOW if rng.random() < 0.85 else ""
            conv.add(tool_message(call, f"This call was not run: the turn ended ({detail}){end}."))
    said_all = " ".join(answers[k] for k in pair if k in answers)
    conv.add(assistant("The checks were stopped. I will answer with what I have.", said_all), True)
    conv.copies += [c1, c2]
