"""The demo's tools and prompts, shared by ``boxmaker demo``, the notebooks and the tests.

The two tools are the ones the shipped tiny model was trained with (``get_weather`` and
``get_time``, one ``city`` string argument each). Their answers are made-up but stable: derived
from the city name, so a recorded conversation replays with the same tool results.
"""

from __future__ import annotations

import hashlib
import json

from .tools import Registry

__all__ = ["DEMO_PROMPTS", "DEMO_SYSTEM", "demo_registry", "get_time", "get_weather"]

DEMO_SYSTEM = ""
"""The demo's system prompt (empty: the tiny model was trained without one)."""

DEMO_PROMPTS: tuple[str, ...] = (
    "What is the weather in Lisbon?",
    "What time is it in Tokyo?",
    "Tell me the weather in Oslo.",
)
"""The user messages ``boxmaker demo`` sends, one turn each."""

_SKIES = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear")


def _digest(city: str) -> bytes:
    return hashlib.sha256(city.strip().lower().encode("utf-8")).digest()


def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city name.
    """
    d = _digest(city)
    return json.dumps({"city": city, "temperature": d[0] % 46 - 10, "sky": _SKIES[d[1] % 7]})


def get_time(city: str) -> str:
    """Get the current local time in a city.

    Args:
        city: The city name.
    """
    d = _digest(city)
    return json.dumps({"city": city, "time": f"{d[2] % 24:02d}:{d[3] % 60:02d}"})


def demo_registry() -> Registry:
    """A registry with the demo tools ``get_weather(city)`` and ``get_time(city)``.

    Their OpenAI definitions equal the ones the shipped model was trained on.
    """
    registry = Registry()
    registry.add(get_weather)
    registry.add(get_time)
    return registry
