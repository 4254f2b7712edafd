"""The words of the tiny model's training data: tools, random names, questions and answers.

Pure Python, seeded by the caller's ``random.Random``. City names are random (letters or
made-up syllables, some two words, some with an apostrophe, hyphen or "St. "), never real:
real names are held out for evaluation (:data:`HELD_OUT_CITIES`, used by
``scripts/eval_model.py``). :mod:`boxmaker.model.data` builds conversations from them.
"""

from __future__ import annotations

import contextlib
import json
import random
import string
import unicodedata
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

__all__ = [
    "HELD_OUT_ACCENTED",
    "HELD_OUT_CITIES",
    "TOOLS",
    "accented_names",
    "random_city",
    "random_phrase",
    "system_messages",
    "time_answer",
    "time_question",
    "time_result",
    "tool_call",
    "tools_variant",
    "weather_answer",
    "weather_question",
    "weather_result",
]

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Get the current local time in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city name."}},
                "required": ["city"],
            },
        },
    },
]
"""The tools the model is trained and evaluated with (descriptions vary in training)."""

HELD_OUT_CITIES: tuple[str, ...] = (
    "Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Lisbon", "Oslo", "Cairo",
    "Lima", "Quito", "Nairobi", "Sydney", "Toronto", "Chicago", "Boston", "Seattle", "Denver",
    "Dublin", "Vienna", "Prague", "Warsaw", "Athens", "Helsinki", "Stockholm", "Moscow",
    "Istanbul", "Mumbai", "Delhi", "Beijing", "Shanghai", "Seoul", "Bangkok", "Hanoi",
    "Jakarta", "Manila", "Santiago", "Bogota", "Caracas", "Havana", "Montreal", "Vancouver",
    "Rio de Janeiro", "Buenos Aires", "New York", "Los Angeles", "San Francisco", "Mexico City",
    "Cape Town", "Tel Aviv", "Hong Kong", "Kuala Lumpur", "Ho Chi Minh City", "Abu Dhabi",
    "St. Louis", "Xi'an", "Winston-Salem", "Aix-en-Provence", "Reykjavik", "Zurich",
)  # fmt: skip
"""Real city names never produced by :func:`random_city`; the evaluation uses them."""

HELD_OUT_ACCENTED: tuple[str, ...] = (
    "Reykjav\u00edk", "S\u00e3o Paulo", "Z\u00fcrich", "Krak\u00f3w", "M\u00e1laga",
    "Besan\u00e7on", "Bras\u00edlia", "G\u00f6teborg", "\u0141\u00f3d\u017a", "M\u00fcnchen",
    "Bogot\u00e1", "Mont\u00e9al", "Malm\u00f6", "A Coru\u00f1a", "\u0130zmir", "Bra\u0219ov",
    "Dubrovn\u00edk", "Troms\u00f8", "K\u00f8benhavn", "San Jos\u00e9",
)  # fmt: skip
"""Real city names with diacritics, held out like :data:`HELD_OUT_CITIES` (the retrained
multi-format files are evaluated on them; their letters are in the extended vocab)."""

_HELD_OUT_LOWER = {c.lower() for c in HELD_OUT_CITIES + HELD_OUT_ACCENTED}

_ACCENT_SHARE: ContextVar[float] = ContextVar("accent_share", default=0.0)
_ACCENTS: dict[str, str] = {}


def _accent_table() -> dict[str, str]:
    """Base letter -> the letters of the extended vocab that decompose to it."""
    if not _ACCENTS:
        from boxmaker.model.format import ACCENTED

        extra = {"\u00df": "s", "\u00e6": "a", "\u00c6": "A", "\u00f8": "o", "\u00d8": "O",
                 "\u0142": "l", "\u0141": "L", "\u0131": "i", "\u00f0": "d", "\u00d0": "D",
                 "\u00fe": "t", "\u00de": "T"}  # fmt: skip
        for ch in ACCENTED:
            base = extra.get(ch) or unicodedata.normalize("NFD", ch)[0]
            _ACCENTS[base] = _ACCENTS.get(base, "") + ch
    return _ACCENTS


@contextlib.contextmanager
def accented_names(share: float) -> Iterator[None]:
    """Within the block, :func:`random_city` puts diacritics into ``share`` of its names
    (1-3 letters each, from the extended vocab's :data:`boxmaker.model.format.ACCENTED`);
    outside it (share 0) it draws exactly what it drew for the shipped model."""
    token = _ACCENT_SHARE.set(share)
    try:
        yield
    finally:
        _ACCENT_SHARE.reset(token)


def _accent(rng: random.Random, name: str) -> str:
    table = _accent_table()
    chars = list(name)
    spots = [i for i, c in enumerate(chars) if c in table]
    for i in rng.sample(spots, min(len(spots), rng.randint(1, 3))):
        chars[i] = rng.choice(table[chars[i]])
    return "".join(chars)


_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"
_SKIES = (
    "sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy", "overcast",
    "drizzle", "hail", "mild", "humid", "partly cloudy", "light rain", "heavy snow",
)  # fmt: skip


def _syllable_word(rng: random.Random, lo: int, hi: int) -> str:
    n = rng.randint(lo, hi)
    out = ""
    while len(out) < n:
        syl = rng.choice(_CONSONANTS) + rng.choice(_VOWELS)
        if rng.random() < 0.3:
            syl += rng.choice(_CONSONANTS)
        out += syl
    return out[:n]


def _letter_word(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(lo, hi)))


def _word(rng: random.Random, lo: int, hi: int) -> str:
    if rng.random() < 0.5:
        return _letter_word(rng, lo, hi)
    return _syllable_word(rng, lo, hi)


def _case(rng: random.Random, w: str) -> str:
    r = rng.random()
    if r < 0.75:
        return w.capitalize()
    if r < 0.85:
        return w.upper()
    if r < 0.95:
        return w
    return "".join(c.upper() if rng.random() < 0.5 else c for c in w)


def random_city(rng: random.Random) -> str:
    """A made-up city name: 3-14 letters, 25% two words, ~12% with ' - or "St. "."""
    while True:
        r = rng.random()
        if r < 0.25:
            name = _case(rng, _word(rng, 2, 7)) + " " + _case(rng, _word(rng, 2, 7))
        else:
            name = _case(rng, _word(rng, 3, 14))
        p = rng.random()
        if p < 0.04:
            w = _word(rng, 2, 6)
            name = name + "'" + w
        elif p < 0.08:
            name = name + "-" + _case(rng, _word(rng, 2, 7))
        elif p < 0.12:
            name = rng.choice(("St. ", "Ft. ", "Mt. ")) + name
        elif p < 0.14:
            name = name + " " + str(rng.randint(1, 99))
        share = _ACCENT_SHARE.get()
        if share and rng.random() < share:
            name = _accent(rng, name)
        if name.lower() not in _HELD_OUT_LOWER and 3 <= len(name) <= 24:
            return name


def random_phrase(rng: random.Random) -> str:
    """A short random phrase of 1-4 made-up words (text the ``copy`` family echoes)."""
    parts = []
    for _ in range(rng.randint(1, 4)):
        r = rng.random()
        if r < 0.6:
            parts.append(_case(rng, _word(rng, 1, 9)))
        elif r < 0.85:
            parts.append(str(rng.randint(0, 9999) if rng.random() < 0.6 else rng.randint(0, 9)))
        else:
            parts.append(
                rng.choice(("-", "'", ":", ".", ",", "!", "?", "/", "+", "#")).join(
                    (_word(rng, 1, 5), _word(rng, 1, 5))
                )
            )
    return " ".join(parts)


def _temperature(rng: random.Random) -> int:
    if rng.random() < 0.35:
        return rng.randint(-9, 9)
    return rng.randint(-30, 45)


def _sky(rng: random.Random) -> str:
    if rng.random() < 0.6:
        return rng.choice(_SKIES)
    return _letter_word(rng, 3, 10) if rng.random() < 0.5 else _syllable_word(rng, 3, 10)


def _clock(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"


def tools_variant(rng: random.Random) -> list[dict[str, Any]]:
    """The two tools with randomly varied descriptions, order, and sometimes one left out."""
    descs_w = (
        "Get the current weather in a city.", "Get the weather for a city.",
        "Returns the current weather (temperature and sky) of a city.", "", "Weather lookup.",
    )  # fmt: skip
    descs_t = (
        "Get the current local time in a city.", "Get the time in a city.",
        "Returns the local time of a city.", "", "Clock lookup.",
    )  # fmt: skip
    out = []
    for name, descs in (("get_weather", descs_w), ("get_time", descs_t)):
        fn: dict[str, Any] = {"name": name}
        d = rng.choice(descs)
        if d:
            fn["description"] = d
        prop: dict[str, Any] = {"type": "string"}
        if rng.random() < 0.5:
            prop["description"] = rng.choice(("The city name.", "City name", "A city."))
        fn["parameters"] = {
            "type": "object",
            "properties": {"city": prop},
            "required": ["city"],
        }
        out.append({"type": "function", "function": fn})
    if rng.random() < 0.2:
        out.reverse()
    return out


def system_messages(rng: random.Random) -> list[dict[str, Any]]:
    """The conversation's opening: no system message, or one of a few system prompts
    (OpenAI ``{"role": "system", "content"}``), as a list of 0 or 1 messages."""
    r = rng.random()
    if r < 0.5:
        return []
    text = rng.choice((
        "You are a helpful assistant.", "You are a helpful assistant with tools.",
        "You are a small agent. Use the tools when needed.", "Be brief.",
        "You answer questions about weather and time.",
    ))  # fmt: skip
    return [{"role": "system", "content": text}]


def tool_call(rng: random.Random, name: str, city: str) -> dict[str, Any]:
    """An OpenAI ``tool_calls[i]`` object calling ``name`` with ``{"city": city}``, with a random
    12-character id."""
    call_id = "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(12))
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps({"city": city}, ensure_ascii=False)},
    }


def weather_result(rng: random.Random, city: str) -> tuple[str, int, str]:
    """A ``get_weather`` tool result for ``city`` with varied keys: ``(json_text, temperature
    in degrees Celsius, sky)``, the values the answer must quote."""
    temp = _temperature(rng)
    sky = _sky(rng)
    obj: dict[str, Any] = {}
    if rng.random() < 0.6:
        obj["city"] = city
    obj[rng.choice(("temperature", "temp", "temp_c"))] = temp
    obj[rng.choice(("sky", "condition", "conditions"))] = sky
    if rng.random() < 0.3:
        obj["humidity"] = rng.randint(5, 100)
    if rng.random() < 0.2:
        obj["unit"] = "C"
    items = list(obj.items())
    if rng.random() < 0.3:
        rng.shuffle(items)
    return json.dumps(dict(items), ensure_ascii=False), temp, sky


def time_result(rng: random.Random, city: str) -> tuple[str, str]:
    """A ``get_time`` tool result for ``city`` with varied keys: ``(json_text, clock)``,
    ``clock`` the ``HH:MM`` the answer must quote."""
    clock = _clock(rng)
    obj: dict[str, Any] = {}
    if rng.random() < 0.6:
        obj["city"] = city
    obj[rng.choice(("time", "local_time"))] = clock
    if rng.random() < 0.3:
        obj["timezone"] = f"UTC{rng.choice('+-')}{rng.randint(0, 12)}"
    items = list(obj.items())
    if rng.random() < 0.3:
        rng.shuffle(items)
    return json.dumps(dict(items), ensure_ascii=False), clock


def _end(rng: random.Random, mark: str) -> str:
    return mark if rng.random() < 0.85 else rng.choice(("", "?", ".", "!", " ?"))


def weather_question(rng: random.Random, city: str) -> str:
    """One phrasing of a weather question about ``city``."""
    forms = (
        ("What is the weather in ", "?"), ("What's the weather like in ", "?"),
        ("How is the weather in ", "?"), ("Weather in ", "?"),
        ("Tell me the weather in ", "."), ("Is it raining in ", "?"),
        ("Can you check the weather in ", "?"), ("weather for ", ""),
    )  # fmt: skip
    head, mark = rng.choice(forms)
    return head + city + _end(rng, mark)


def time_question(rng: random.Random, city: str) -> str:
    """One phrasing of a time question about ``city``."""
    forms = (
        ("What time is it in ", "?"), ("What is the time in ", "?"),
        ("Tell me the time in ", "."), ("Time in ", "?"),
        ("What's the local time in ", "?"), ("Can you check the time in ", "?"),
        ("current time in ", ""),
    )  # fmt: skip
    head, mark = rng.choice(forms)
    return head + city + _end(rng, mark)


def weather_answer(city: str, temp: int, sky: str) -> str:
    """The answer sentence after a weather result."""
    return f"In {city} it is {temp} C and {sky}."


def time_answer(city: str, clock: str) -> str:
    """The answer sentence after a time result."""
    return f"In {city} it is {clock}."
