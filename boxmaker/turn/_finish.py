"""How a completion's end decides the turn: an answer, more tool calls, or an end that is no
answer. One function, :func:`ending`, asked by :func:`boxmaker.turn.run_turn` after each
completion (step 4/5 of the spec).

- ``finish_reason`` other than ``stop``, ``length`` or ``tool_calls`` (vLLM's ``abort`` and
  ``error``; OpenAI's ``content_filter``): not an answer. The turn ends ``server_stopped``
  (the detail names the finish reason); its tool calls are not run.
- ``length`` with tool calls: the completion was cut by ``max_tokens``, so a call's arguments
  may be cut too (not valid JSON). No call is run: each gets a result telling the model it was
  cut by max_tokens (``not_run="length"``), and the turn ends ``length`` with a detail that
  names the calls and whether their arguments are whole JSON. The model is never fed "not
  valid JSON" for a cut call, so the repeat rule never has to stop it.
- no tool calls, but content that holds a tool call written as text (the server's parser did
  not know the model's format, :func:`boxmaker.tools.find_text_tool_call`): not taken as the
  answer; the turn ends ``tool_call_in_content``, the detail naming the format and the
  llama-server flag or template that fixes it.
- otherwise no tool calls: ``answered`` (``length``: cut at ``max_tokens``).

Pure logic: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..client import Completion
from ..errors import TurnNotAnswered
from ..records import Record, ToolCall, TurnEnd
from ..tools import find_text_tool_call
from ._guard import not_run_results

__all__ = ["ANSWER_FINISHES", "Ending", "ending"]

ANSWER_FINISHES = frozenset({None, "stop", "length", "tool_calls"})
"""The ``finish_reason`` values of a completion that answered (``None``: the stream ended with
``[DONE]`` and no reason, as some builds do)."""


@dataclass(frozen=True)
class Ending:
    """The end of the turn after a completion.

    Attributes:
        records: what to append after the completion's ``Assistant`` and ``Usage`` (not-run
            results, then the ``TurnEnd``).
        error: raise it after appending (the turn ended without an answer), or ``None``
            (the turn returns the completion's content).
    """

    records: list[Record] = field(default_factory=list)
    error: TurnNotAnswered | None = None


def ending(completion: Completion, first_call: int) -> Ending | None:
    """Whether ``completion`` ends the turn, and how (see the module docstring).

    Args:
        completion: the completion just recorded.
        first_call: the session's next tool-call number (for not-run results).

    Returns:
        ``None`` when the turn goes on to run the completion's tool calls, else the
        :class:`Ending`.
    """
    calls, reason = completion.tool_calls, completion.finish_reason
    if reason not in ANSWER_FINISHES:
        detail = (
            f'finish_reason "{reason}": the server ended the completion for another reason '
            "than stop, length or tool_calls; not an answer"
        )
        why = f'the server ended the completion with finish_reason "{reason}"'
        results = not_run_results(calls, first_call, why, "server_stopped")
        error = TurnNotAnswered("server_stopped", detail)
        return Ending([*results, TurnEnd(outcome="server_stopped", detail=detail)], error)
    if calls and reason == "length":
        why = 'the completion was cut by max_tokens (finish_reason "length") while writing it'
        results = not_run_results(calls, first_call, why, "length")
        return Ending([*results, TurnEnd(outcome="length", detail=_cut_detail(calls))])
    if calls:
        return None
    found = find_text_tool_call(completion.content)
    if found is not None:
        detail = f"{found.describe()}, not parsed by the server: {found.fix}"
        error = TurnNotAnswered("tool_call_in_content", detail)
        return Ending([TurnEnd(outcome="tool_call_in_content", detail=detail)], error)
    return Ending([TurnEnd(outcome="length" if reason == "length" else "answered")])


def _cut_detail(calls: Sequence[ToolCall]) -> str:
    """The log's words for tool calls of a completion cut by ``max_tokens``."""
    parts = [f"{c.name or '(no name)'} ({_whole(c.arguments)})" for c in calls]
    return (
        f"cut by max_tokens with {len(calls)} tool call(s), none run, the model told so: "
        + ", ".join(parts)
    )


def _whole(arguments: str) -> str:
    try:
        json.loads(arguments)
    except ValueError:
        return f"arguments cut after {len(arguments)} characters, not valid JSON"
    return "arguments whole JSON"
