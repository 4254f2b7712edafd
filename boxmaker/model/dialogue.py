"""The building blocks of the tiny model's training conversations (pure Python): a
conversation being built (:class:`Conv`), its messages, one tool call with its result, and the
marks that stand for text llama.cpp injects when it ends a reasoning early.

Used by :mod:`boxmaker.model.data` (the families of phases 1-4, sampling and weighting) and
:mod:`boxmaker.model.data_limits` (the families of the later phases).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from boxmaker.model.words import (
    time_answer,
    time_result,
    tool_call,
    weather_answer,
    weather_result,
)

__all__ = [
    "BUDGET_MARK",
    "BUDGET_ZERO_MARK",
    "CUT_MARK",
    "FORCED",
    "INJECTED",
    "REPEAT_RESULTS",
    "Conv",
    "assistant",
    "one_call",
    "tool_message",
]


@dataclass
class Conv:
    """A conversation being built: its messages, the indexes of those trained on, the spans
    the model must copy, and whether it renders with ``preserve_thinking``."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    trained: list[int] = field(default_factory=list)
    copies: list[str] = field(default_factory=list)
    preserve: bool = False  # rendered with preserve_thinking (the history option "keep")

    def add(self, msg: dict[str, Any], train: bool = False) -> None:
        """Append ``msg`` (an OpenAI-style message); ``train``: the loss is on it."""
        if train:
            self.trained.append(len(self.messages))
        self.messages.append(msg)


def assistant(
    reasoning: str, content: str = "", calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """An assistant message with ``reasoning_content`` (and ``tool_calls`` when given)."""
    msg: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if calls:
        msg["tool_calls"] = calls
    return msg


def tool_message(call: dict[str, Any], content: str) -> dict[str, Any]:
    """The ``tool`` message answering ``call`` (an OpenAI ``tool_calls[i]``) with ``content``."""
    return {"role": "tool", "tool_call_id": call["id"], "content": content}


def one_call(rng: random.Random, conv: Conv, kind: str, city: str, train: bool) -> str:
    """Add a ``kind`` ("weather" or "time") call for ``city`` (``train``: the loss is on it)
    and its result; returns the answer sentence (not added)."""
    tool = "get_weather" if kind == "weather" else "get_time"
    call = tool_call(rng, tool, city)
    what = "weather" if kind == "weather" else "time"
    conv.add(
        assistant(f"The user wants the {what} in {city}. I will call {tool}.", calls=[call]),
        train,
    )
    if kind == "weather":
        result, temp, sky = weather_result(rng, city)
        conv.add(tool_message(call, result))
        conv.copies += [city, str(temp), sky]
        return weather_answer(city, temp, sky)
    result, clock = time_result(rng, city)
    conv.add(tool_message(call, result))
    conv.copies += [city, clock]
    return time_answer(city, clock)


CUT_MARK = "\x00"
"""Ends a reasoning that llama.cpp cut (reasoning_end): rendered as ``</think>\n\n`` right
after the cut text, as llama.cpp injects it (measured through the prompt cache)."""
INJECTED = "</think>\n\n"
"""What ``reasoning_end`` injects after the cut reasoning."""


BUDGET_MARK = "\x01"
"""Ends a reasoning that llama.cpp's ``thinking_budget_tokens`` cut: the sampler forces
``</think>`` alone (measured: logprob -21 at the forced token, then the model's own ``\n``);
the model must write the ``\n\n`` and go on."""
FORCED = "</think>"
"""What the thinking budget forces (not a training target)."""
BUDGET_ZERO_MARK = "\x02"
"""A budget of 0 tokens: the sampler forces ``</think>`` right after ``<think>`` (no newline
between them, measured), the model writes the ``\n\n``."""


REPEAT_RESULTS = (  # what a repeated call may be answered in the training data
    "This call was already made with these arguments in this turn.",
    "Already called with the same arguments in this turn; see the result above.",
    "The call was not run: it repeats an earlier call of this turn.",
)
