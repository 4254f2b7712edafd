"""Synthetic training conversations for the tiny agent model (pure Python, seeded).

Each sample is an OpenAI-style conversation rendered with the model's chat template
(:func:`boxmaker.model.format.render`) and tokenised with its char vocab, with a loss weight
per token: 0 outside the assistant's own tokens, 1 on assistant tokens, :data:`COPY_WEIGHT`
on the spans the assistant must copy (city names, tool-result values, echoed text).

Families (see ``MODEL_CARD.md``): ``weather``, ``time`` (one tool call, then an answer quoting
the result), ``two_city`` (weather and/or time for two cities, one call per completion),
``small_talk`` (no call), ``think_long`` (several hundred reasoning tokens, then a call),
``repeat`` (calls the same tool again after every result), ``copy`` (echo a text; short
contexts that teach copying), and, with share 0 unless ``--mix`` names them, ``lookup`` (a
result in the user message, answered in the tool answer's words), ``think_cut`` (a
reasoning ended by llama.cpp's ``reasoning_end``, then the call), the later phases' families
of :mod:`boxmaker.model.data_limits` (``think_budget``, ``cut_answer``, ``cycle``,
``after_limit``, ``after_nudge``) and ``kept`` (earlier turns rendered with
``preserve_thinking``). The building blocks are in :mod:`boxmaker.model.dialogue`.

The words (tools, random city names, questions, answers, tool results) come from
:mod:`boxmaker.model.words`; :data:`HELD_OUT_CITIES` and the rest are re-exported here.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from boxmaker.model.data_limits import (
    fam_after_limit,
    fam_after_nudge,
    fam_cut_answer,
    fam_cycle,
    fam_think_budget,
)
from boxmaker.model.dialogue import (
    BUDGET_MARK,
    BUDGET_ZERO_MARK,
    CUT_MARK,
    FORCED,
    INJECTED,
    REPEAT_RESULTS,
    Conv,
    assistant,
    one_call,
    tool_message,
)
from boxmaker.model.format import CHAT_FORMATS, LLAMA3_TOKENS, encode, render
from boxmaker.model.words import (
    HELD_OUT_CITIES,
    TOOLS,
    accented_names,
    random_city,
    random_phrase,
    system_messages,
    time_answer,
    time_question,
    time_result,
    tool_call,
    tools_variant,
    weather_answer,
    weather_question,
    weather_result,
)

__all__ = [
    "ACCENT_SHARE",
    "COPY_WEIGHT",
    "FAMILIES",
    "HELD_OUT_CITIES",
    "NO_REASONING",
    "TOOLS",
    "Sample",
    "make_sample",
    "random_city",
    "tools_variant",
]

ACCENT_SHARE = 0.15
"""Share of random names given diacritics in multi-format samples (``formats`` given)."""

COPY_WEIGHT = 5.0
"""Loss weight of copied spans (names, values) relative to other assistant tokens."""


def _fam_single(rng: random.Random, conv: Conv, kind: str) -> None:
    city = random_city(rng)
    q = weather_question(rng, city) if kind == "weather" else time_question(rng, city)
    conv.add({"role": "user", "content": q})
    answer = one_call(rng, conv, kind, city, True)
    conv.add(assistant(f"I have the {kind} for {city}. I will answer.", answer), True)


def _fam_weather(rng: random.Random, conv: Conv) -> None:
    _fam_single(rng, conv, "weather")


def _fam_time(rng: random.Random, conv: Conv) -> None:
    _fam_single(rng, conv, "time")


def _fam_two_city(rng: random.Random, conv: Conv) -> None:
    c1, c2 = random_city(rng), random_city(rng)
    k1, k2 = rng.choice((("weather", "time"), ("time", "weather"), ("weather", "weather"),
                         ("time", "time")))  # fmt: skip
    forms = (
        "Tell me the {k1} in {c1} and the {k2} in {c2}.",
        "What is the {k1} in {c1} and the {k2} in {c2}?",
        "I need the {k1} in {c1} and the {k2} in {c2}.",
    )
    conv.add({"role": "user", "content": rng.choice(forms).format(k1=k1, c1=c1, k2=k2, c2=c2)})
    a1 = one_call(rng, conv, k1, c1, True)
    tool2 = "get_weather" if k2 == "weather" else "get_time"
    call = tool_call(rng, tool2, c2)
    conv.add(assistant(f"Now the {k2} in {c2}. I will call {tool2}.", calls=[call]), True)
    if k2 == "weather":
        result, temp, sky = weather_result(rng, c2)
        a2 = weather_answer(c2, temp, sky)
        conv.copies += [c2, str(temp), sky]
    else:
        result, clock = time_result(rng, c2)
        a2 = time_answer(c2, clock)
        conv.copies += [c2, clock]
    conv.add(tool_message(call, result))
    conv.add(assistant(f"I have both results for {c1} and {c2}. I will answer.", f"{a1} {a2}"),
             True)  # fmt: skip


_SMALL_TALK: tuple[tuple[str, str], ...] = (
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi there", "Hi! How can I help you today?"),
    ("Hi", "Hi! How can I help you today?"),
    ("Good morning!", "Good morning! How can I help you?"),
    ("How are you?", "I am fine, thank you. How can I help?"),
    ("Thank you!", "You are welcome!"),
    ("Thanks a lot.", "You are welcome!"),
    ("Who are you?", "I am a tiny assistant. I can check the weather and the time in a city."),
    ("What can you do?", "I can check the weather and the time in a city."),
    ("Tell me a joke.", "Why did the cloud stay home? It was feeling under the weather."),
    ("Goodbye!", "Goodbye! Have a nice day."),
    ("Nice to meet you.", "Nice to meet you too!"),
    ("Are you a robot?", "I am a small language model."),
    ("What is your name?", "I am boxmaker's tiny agent."),
    ("ok", "Okay. Ask me about the weather or the time in a city."),
)


def _fam_small_talk(rng: random.Random, conv: Conv) -> None:
    q, a = rng.choice(_SMALL_TALK)
    if rng.random() < 0.3:
        q = q.lower()
    conv.add({"role": "user", "content": q})
    conv.add(assistant("The user is making small talk. No tool is needed.", a), True)


def _fam_think_long(rng: random.Random, conv: Conv) -> None:
    city = random_city(rng)
    forms = (
        "Think long and hard about the weather in {c}.",
        "Take your time and think step by step: what is the weather in {c}?",
        "Think carefully about the weather in {c}.",
    )
    conv.add({"role": "user", "content": rng.choice(forms).format(c=city)})
    n = rng.randint(12, 20)
    lines = ["This needs careful thought."]
    lines += [f"Step {k}: I think about the weather in {city}." for k in range(1, n + 1)]
    lines.append("Now I will call get_weather.")
    call = tool_call(rng, "get_weather", city)
    conv.add(assistant("\n".join(lines), calls=[call]), True)
    result, temp, sky = weather_result(rng, city)
    conv.add(tool_message(call, result))
    conv.copies += [city, str(temp), sky]
    conv.add(assistant(f"I have the weather for {city}. I will answer.",
                        weather_answer(city, temp, sky)), True)  # fmt: skip


def _fam_think_cut(rng: random.Random, conv: Conv) -> None:
    """A long reasoning ended early by reasoning control, then the call.

    llama.cpp's ``reasoning_end`` injects ``</think>\n\n`` right after the last reasoning
    token (often mid-word); the model must then emit the tool call. The injected tokens are
    not trained (weight 0). The sample ends after the call: the next request renders the
    history through the template, which a separate family covers.
    """
    city = random_city(rng)
    forms = (
        "Think long and hard about the weather in {c}.",
        "Take your time and think step by step: what is the weather in {c}?",
        "Think carefully about the weather in {c}.",
    )
    conv.add({"role": "user", "content": rng.choice(forms).format(c=city)})
    lines = ["This needs careful thought."]
    lines += [f"Step {k}: I think about the weather in {city}." for k in range(1, 21)]
    full = "\n".join(lines)
    cut = full[: rng.randint(1, len(full) - 1)].rstrip("\n")
    call = tool_call(rng, "get_weather", city)
    conv.add(assistant(cut + CUT_MARK, calls=[call]), True)
    conv.copies.append(city)


def _fam_repeat(rng: random.Random, conv: Conv) -> None:
    city = random_city(rng)
    kind = rng.choice(("weather", "time"))
    tool = "get_weather" if kind == "weather" else "get_time"
    forms = (
        "Keep checking the {k} in {c}.",
        "Check the {k} in {c} again and again.",
        "Call {t} for {c} over and over.",
    )
    conv.add({"role": "user", "content": rng.choice(forms).format(k=kind, c=city, t=tool)})
    rounds = rng.randint(1, 4)
    for i in range(rounds):
        call = tool_call(rng, tool, city)
        reasoning = (f"The user wants me to keep checking the {kind} in {city}. I will call {tool}."
                     if i == 0 else f"I will check the {kind} in {city} again.")  # fmt: skip
        conv.add(assistant(reasoning, calls=[call]), True)
        if i == rounds - 1:
            break
        if i >= 1 and rng.random() < 0.6:
            conv.add(tool_message(call, rng.choice(REPEAT_RESULTS)))
        elif kind == "weather":
            conv.add(tool_message(call, weather_result(rng, city)[0]))
        else:
            conv.add(tool_message(call, time_result(rng, city)[0]))
    conv.copies.append(city)


def _fam_copy(rng: random.Random, conv: Conv) -> None:
    x = random_city(rng) if rng.random() < 0.5 else random_phrase(rng)
    form = rng.choice(("Repeat: {x}", "Echo this: {x}", "Say {x}", "Please repeat after me: {x}",
                       "Copy exactly: {x}"))  # fmt: skip
    conv.add({"role": "user", "content": form.format(x=x)})
    conv.add(assistant(f"The user wants me to repeat {x}.", x), True)
    conv.copies.append(x)


def _fam_lookup(rng: random.Random, conv: Conv) -> None:
    """A tool-like result in the user message, answered in the tool answer's words.

    Short contexts that teach the lookup the tool answers need (value of a key -> its slot in
    the sentence), which plain copying does not: the answer's words do not occur in the JSON.
    """
    city = random_city(rng)
    if rng.random() < 0.6:
        result, temp, sky = weather_result(rng, city)
        answer = weather_answer(city, temp, sky)
        conv.copies += [city, str(temp), sky]
        label = "Weather"
    else:
        result, clock = time_result(rng, city)
        answer = time_answer(city, clock)
        conv.copies += [city, clock]
        label = "Time"
    if '"city"' not in result:
        result = '{"city": ' + json.dumps(city, ensure_ascii=False) + ", " + result[1:]
    form = rng.choice(("{label} data: {r}", "{label} for {c}: {r}", "Answer from this: {r}"))
    conv.add({"role": "user", "content": form.format(label=label, c=city, r=result)})
    conv.add(assistant(f"I read the data for {city}. I will answer.", answer), True)


def _fam_kept(rng: random.Random, conv: Conv) -> None:
    """A dialogue after one or two earlier turns whose reasoning the history kept
    (``preserve_thinking``: the history option ``keep``)."""
    conv.preserve = True
    if len(conv.messages) < 3 or rng.random() < 0.5:
        _prior_exchange(rng, conv)
    build = rng.choice((_fam_weather, _fam_time, _fam_two_city, _fam_small_talk, fam_cut_answer))
    build(rng, conv)


FAMILIES: dict[str, tuple[float, Callable[[random.Random, Conv], None]]] = {
    "weather": (0.20, _fam_weather),
    "time": (0.14, _fam_time),
    "two_city": (0.10, _fam_two_city),
    "small_talk": (0.07, _fam_small_talk),
    "think_long": (0.04, _fam_think_long),
    "repeat": (0.07, _fam_repeat),
    "copy": (0.38, _fam_copy),
    # Added for the second training phase; share 0 keeps the first phase's draws unchanged.
    "lookup": (0.0, _fam_lookup),
    "think_cut": (0.0, _fam_think_cut),
    # Added for the fifth phase (a fine-tune of the shipped model): share 0 as above.
    "think_budget": (0.0, fam_think_budget),
    "cut_answer": (0.0, fam_cut_answer),
    "cycle": (0.0, fam_cycle),
    "after_limit": (0.0, fam_after_limit),
    "kept": (0.0, _fam_kept),
    # Added for the seventh phase: the live shape of an answer after a limit.
    "after_nudge": (0.0, fam_after_nudge),
}
"""Family name -> (default share of samples, builder); ``--mix`` overrides the shares."""

NO_REASONING = frozenset({"think_long", "think_cut", "think_budget", "cut_answer", "kept"})
"""Families that exist for reasoning (its length, its cut or its preservation): not drawn
for a chat format that renders none (``llama3``); ``kept`` is drawn only for ``tiny`` (the
one template that reads ``preserve_thinking``)."""

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _date_string(rng: random.Random) -> str:
    """A ``date_string`` as llama.cpp passes it (``strftime("%d %b %Y")``)."""
    return f"{rng.randint(1, 28):02d} {rng.choice(_MONTHS)} {rng.randint(2024, 2030)}"


@dataclass
class Sample:
    """One rendered training sample.

    Attributes:
        family: the family name (a key of :data:`FAMILIES`).
        text: the rendered conversation.
        ids: token ids of ``text``.
        weights: loss weight of each token as a prediction target (same length as ``ids``).
        messages: the conversation (OpenAI-style messages).
        tools: the tools offered, or ``None``.
        trained: indices of the assistant messages the loss is on.
        preserve_thinking: rendered with the template kwarg ``preserve_thinking`` (``kept``).
        chat_format: the key of :data:`boxmaker.model.format.CHAT_FORMATS` it is rendered in.
        date_string: the ``date_string`` it was rendered with (``llama3``), else ``None``.
        extended: tokenised in the extended vocab (:func:`boxmaker.model.format.vocab`).
    """

    family: str
    text: str
    ids: list[int]
    weights: list[float]
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    trained: list[int] = field(default_factory=list)
    preserve_thinking: bool = False
    chat_format: str = "tiny"
    date_string: str | None = None
    extended: bool = False


def _prior_exchange(rng: random.Random, conv: Conv) -> None:
    """An earlier, finished turn (not trained; the template drops its reasoning)."""
    r = rng.random()
    if r < 0.4:
        q, a = rng.choice(_SMALL_TALK)
        conv.add({"role": "user", "content": q})
        conv.add(assistant("The user is making small talk. No tool is needed.", a))
    else:
        city = random_city(rng)
        kind = "weather" if r < 0.7 else "time"
        q = weather_question(rng, city) if kind == "weather" else time_question(rng, city)
        conv.add({"role": "user", "content": q})
        saved = list(conv.copies)
        answer = one_call(rng, conv, kind, city, False)
        conv.copies = saved
        conv.add(assistant(f"I have the {kind} for {city}. I will answer.", answer))


def make_sample(
    rng: random.Random,
    family: str | None = None,
    shares: dict[str, float] | None = None,
    formats: dict[str, float] | None = None,
) -> Sample:
    """Build, render and weight one sample.

    Args:
        rng: the random source (the sample is a function of its state).
        family: the family to build, or ``None`` to draw one by ``shares``.
        shares: family -> relative share; ``None`` uses the shares of :data:`FAMILIES`.
        formats: chat format (a key of :data:`boxmaker.model.format.CHAT_FORMATS`) ->
            relative share; the sample is rendered in one drawn format and tokenised in the
            extended vocab. ``None``: the ``tiny`` format in the shipped vocab (as the shipped
            model was trained; the rng draws are then those of that training).
    """
    chat_format = "tiny"
    if formats is not None:
        names = list(formats)
        chat_format = rng.choices(names, weights=[formats[n] for n in names])[0]
    if family is None:
        table = shares if shares is not None else {n: f[0] for n, f in FAMILIES.items()}
        if chat_format != "tiny":
            thinks = CHAT_FORMATS[chat_format].thinks
            table = {n: v for n, v in table.items()
                     if n != "kept" and (thinks or n not in NO_REASONING)}  # fmt: skip
        names = list(table)
        family = rng.choices(names, weights=[table[n] for n in names])[0]
    build = FAMILIES[family][1]
    conv = Conv()
    if family in ("copy", "lookup"):
        with_tools = rng.random() < 0.2
    elif family == "small_talk":
        with_tools = rng.random() < 0.7
    else:
        with_tools = rng.random() < 0.5
    for m in system_messages(rng):
        conv.add(m)
    with accented_names(ACCENT_SHARE if formats is not None else 0.0):
        if family not in ("copy", "lookup") and rng.random() < 0.15:
            _prior_exchange(rng, conv)
        build(rng, conv)
    tools = tools_variant(rng) if with_tools else None
    date = _date_string(rng) if chat_format == "llama3" else None
    return _weigh(family, conv, tools, chat_format, date, formats is not None)


def _weigh(
    family: str,
    conv: Conv,
    tools: list[dict[str, Any]] | None,
    chat_format: str = "tiny",
    date: str | None = None,
    extended: bool = False,
) -> Sample:
    msgs = conv.messages
    keep = conv.preserve
    eos = CHAT_FORMATS[chat_format].eos

    def draw(messages: list[dict[str, Any]], gen: bool = False) -> str:
        return render(messages, tools, add_generation_prompt=gen, preserve_thinking=keep,
                      chat_format=chat_format, date_string=date)  # fmt: skip

    text = draw(msgs)
    injected: tuple[int, int] | None = None
    if CUT_MARK in text:
        at = text.index(CUT_MARK + "\n" + INJECTED)
        text = text[:at] + INJECTED + text[at + len(CUT_MARK + "\n" + INJECTED) :]
        injected = (at, at + len(INJECTED))
    elif BUDGET_MARK in text:  # only </think> is forced; the model writes the blank line
        at = text.index(BUDGET_MARK + "\n" + INJECTED)
        text = text[:at] + INJECTED + text[at + len(BUDGET_MARK + "\n" + INJECTED) :]
        injected = (at, at + len(FORCED))
    elif BUDGET_ZERO_MARK in text:  # budget 0: "<think></think>", then the model's blank line
        mark = "<think>\n" + BUDGET_ZERO_MARK + "\n" + INJECTED
        at = text.index(mark)
        text = text[:at] + "<think>" + INJECTED + text[at + len(mark) :]
        at += len("<think>")
        injected = (at, at + len(FORCED))
    char_w = [0.0] * len(text)
    for i in conv.trained:
        prefix = draw(msgs[:i], True)
        if not text.startswith(prefix):
            raise AssertionError(f"render of {family} is not prefix-stable at message {i}")
        start = len(prefix)
        end = text.index(eos, start) + len(eos)
        for k in range(start, end):
            char_w[k] = 1.0
        span = text[start:end]
        for copy in conv.copies:
            if not copy:
                continue
            pos = span.find(copy)
            while pos >= 0:
                for k in range(start + pos, start + pos + len(copy)):
                    char_w[k] = COPY_WEIGHT
                pos = span.find(copy, pos + 1)
    if injected is not None:  # injected by the server, not generated: not a target
        for k in range(*injected):
            char_w[k] = 0.0
    ids: list[int] = []
    weights: list[float] = []
    pos = 0
    for piece in _pieces(text):
        piece_ids = encode(piece, extended)
        ids.extend(piece_ids)
        if len(piece_ids) == 1:
            weights.append(char_w[pos])
        else:
            if len(piece_ids) != len(piece):
                raise AssertionError(f"non-ASCII text in sample: {piece!r}")
            weights.extend(char_w[pos : pos + len(piece)])
        pos += len(piece)
    return Sample(family, text, ids, weights, msgs, tools, list(conv.trained), keep,
                  chat_format, date, extended)  # fmt: skip


_SPECIAL_STRINGS = (
    "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
    "<tool_response>", "</tool_response>", "<s>", "</s>", *LLAMA3_TOKENS,
)  # fmt: skip


def _pieces(text: str) -> list[str]:
    """Split ``text`` into special tokens and runs of plain characters."""
    out: list[str] = []
    i = 0
    run_start = 0
    while i < len(text):
        if text[i] == "<":
            for s in _SPECIAL_STRINGS:
                if text.startswith(s, i):
                    if run_start < i:
                        out.append(text[run_start:i])
                    out.append(s)
                    i += len(s)
                    run_start = i
                    break
            else:
                i += 1
            continue
        i += 1
    if run_start < len(text):
        out.append(text[run_start:])
    return out
