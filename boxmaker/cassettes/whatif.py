"""The what-if replay: run the loop again on a recorded session with other limits.

This module is the layer above :mod:`boxmaker.turn`: it builds a session, a runtime and a
tool port from a cassette (:func:`~boxmaker.cassettes.recorded_session`), replays
each completion from the cassette, and reports which limits fire and when. It returns a
:class:`WhatIf`; ``boxmaker replay`` prints it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..client import Client
from ..config import ClientConfig, LoopLimits
from ..errors import CassetteError, SessionFull, TurnError, TurnInferError, TurnLimit
from ..events import Queued
from ..records import Baseline, LimitHit, ToolResult, TurnEnd
from ..session import Session
from ..tools import Registry, ToolAnswer, ToolFailed, ToolOk, ToolRequest, canonical_arguments
from ..turn import Runtime, run_turn
from ._inspection import recorded_session, unreadable_as_cassette_error
from ._matching import short
from ._transport import UnrecordedRequest, use_cassette

__all__ = ["WhatIf", "what_if"]


class _RecordedPort:
    """A tool port answering each call with the result the cassette recorded for the same
    tool and arguments (in order); a call never recorded fails, saying so."""

    def __init__(self, results: Mapping[tuple[str, str], list[str]]) -> None:
        self._results = {key: list(values) for key, values in results.items()}
        self.missing: list[str] = []

    def request(self, request: ToolRequest) -> ToolAnswer:
        """The recorded result of this tool with these arguments, else ``ToolFailed``."""
        key = (request.tool, canonical_arguments(json.dumps(dict(request.arguments))))
        values = self._results.get(key)
        if not values:
            self.missing.append(f"{request.tool} {key[1]}")
            return ToolFailed(message=f"no result recorded for {request.tool} with {key[1]}")
        return ToolOk(content=values.pop(0) if len(values) > 1 else values[0])


_DEFAULT_LIMITS = LoopLimits()
_CAP_KEYS = ("reasoning_control", "thinking_budget_tokens")
"""Request-body keys a thinking cap adds, left out of matching so a cap can be armed or not."""


def _limits_text(limits: LoopLimits) -> str:
    """The limits in force, one phrase each (``none``: off)."""

    def value(v: int | None) -> str:
        return "none" if v is None else str(v)

    repeat = "off"
    if limits.repeat_detection:
        answered, ends = limits.repeat_answered_at, limits.repeat_ends_turn_at
        repeat = f"on (answered at {value(answered)}, ends the turn at {value(ends)})"
    return (
        f"tool_iterations {value(limits.tool_iterations)}, repeat_detection {repeat}, "
        f"tool_result_cap {value(limits.tool_result_cap)}, "
        f"thinking_tokens {value(limits.thinking_tokens)}"
    )


def _guard_text(limits: LoopLimits) -> str:
    """The loop guard's other knobs (:mod:`boxmaker.turn`), one phrase each."""

    def value(v: int | None) -> str:
        return "none" if v is None else str(v)

    caps = ", ".join(f"{k} {v}" for k, v in limits.tool_call_caps.items()) or "none"
    return (
        f"cycle_length {value(limits.cycle_length)} x {limits.cycle_repeats} repeats, "
        f"stale_results_at {value(limits.stale_results_at)}, "
        f"repeat_exempt {', '.join(limits.repeat_exempt) or 'none'}, tool_call_caps {caps}, "
        f"on_limit {limits.on_limit}"
    )


@dataclass
class WhatIf:
    """The outcome of :func:`what_if`.

    Attributes:
        lines: the report, one line each: the limits in force, the tools used, the loop
            guard's knobs, then per turn
            each limit that fired (turn, completion within the turn, kind, detail; the loop
            guard's names its rule), each call the guard answered without running (a nudge:
            ``not_run`` ``repeat`` or ``loop``), and how the turn ended, and where the replay
            stopped, if it did.
        stopped: why the replay stopped early (the loop needed traffic the cassette does not
            hold), ``None`` when every turn ran.
        hits: ``(turn, completion, kind, detail)`` of each limit that fired.
        played: recorded interactions the replay used (of ``total``); ``0`` with ``stopped``
            set: the loop's very first request matched nothing (a cassette of other traffic
            than boxmaker's loop, such as a tapped agent's).
        total: recorded interactions in the cassette.
    """

    lines: list[str] = field(default_factory=list)
    stopped: str | None = None
    hits: list[tuple[int, int, str, str]] = field(default_factory=list)
    played: int = 0
    total: int = 0


def what_if(
    path: str | os.PathLike[str],
    limits: LoopLimits = _DEFAULT_LIMITS,
    *,
    registry: Registry | None = None,
) -> WhatIf:
    """Run the loop again on a recorded session with other limits; say which fire and when.

    The user messages, system prompt, tools and sampling come from the cassette
    (:func:`~boxmaker.cassettes.recorded_session`); the limits are ``limits``, the same object
    as ``config.loop``, each field meaning what it means there (``None``: that limit off).
    Tools: ``registry``'s run when it is given (it must hold every recorded tool), else a port
    answers each call from the results recorded in the cassette. Each completion is replayed
    from the cassette (record mode ``none``; ``reasoning_control`` and
    ``thinking_budget_tokens`` are left out of matching, so a cap can be armed or not; the
    recorded server's reasoning is replayed as it was, so a cap below it fires through the
    client's ``reasoning_end`` fallback); the replay stops, with the reason, at the first
    request the cassette does not hold, since what the model would answer to it is unknown (a
    thinking cap that fires where the recording had none, a tool result cut differently, a turn
    that goes on where the recorded one ended...).

    Args:
        path: the cassette.
        limits: the loop limits to replay with (default: ``LoopLimits()``, the defaults).
        registry: the tools to run (e.g. ``boxmaker.demo.demo_registry()`` for a demo
            recording); ``None``: the recorded results answer.

    Raises:
        CassetteError: not a readable cassette, no chat request in it, or a recorded tool
            that ``registry`` does not hold.
    """
    recorded = recorded_session(path)
    config = dataclasses.replace(
        recorded.config,
        client=ClientConfig(url="http://127.0.0.1:9", retry_attempts=4),
        loop=limits,
    )
    with unreadable_as_cassette_error(path, "a recorded tool cannot be offered"):
        names = [str((t.get("function") or {}).get("name")) for t in recorded.tools]
    port: _RecordedPort | None = None
    if registry is not None:
        if missing := sorted(set(names) - set(registry.names)):
            raise CassetteError(f"{path}: the registry given has no tool {', '.join(missing)}")
        tools_text = f"the registry given ({', '.join(names)})"
    else:
        registry = Registry()
        with unreadable_as_cassette_error(path, "a recorded tool cannot be offered"):
            for t in recorded.tools:
                fn = t.get("function") or {}
                registry.add_port_tool(
                    str(fn.get("name")),
                    str(fn.get("description") or ""),
                    fn.get("parameters") or {},
                )
        port = _RecordedPort(recorded.results)
        tools_text = f"results recorded in the cassette ({', '.join(names) or 'none'})"
    report = WhatIf()
    report.lines += [
        f"what-if replay of {path}: {len(recorded.users)} turn(s), "
        f"{recorded.chat_requests} chat request(s) recorded",
        f"limits: {_limits_text(limits)}",
        f"tools: {tools_text}",
        f"loop guard: {_guard_text(limits)}",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        session = Session.create(tmp, Baseline(system=recorded.system, tools=recorded.tools))
        with (
            use_cassette(path, "none", strict=False, ignore_body_keys=_CAP_KEYS) as c,
            Client(config.client, sleep=lambda s: None) as client,
        ):
            runtime = Runtime(config=config, client=client, registry=registry, port=port)
            for number, text in enumerate(recorded.users, 1):
                completions = [0]
                head = f"turn {number} ({short(text)})"

                def on_event(
                    event: Any, turn: int = number, count: list[int] = completions
                ) -> None:
                    if isinstance(event, Queued):
                        count[0] += 1
                    elif isinstance(event, LimitHit):
                        report.hits.append((turn, count[0], event.kind, event.detail))
                        report.lines.append(
                            f"turn {turn}, completion {count[0]}: {event.kind} fired: "
                            f"{event.detail}"
                        )
                    elif isinstance(event, ToolResult) and event.not_run in ("repeat", "loop"):
                        report.lines.append(
                            f"turn {turn}, completion {count[0]}: {event.not_run} nudge on "
                            f"{event.name} (call {event.call} not run): {short(event.content)}"
                        )
                    elif isinstance(event, TurnEnd) and event.outcome == "answered_after_limit":
                        report.lines.append(
                            f"turn {turn}, completion {count[0]}: answered after the limit "
                            "(on_limit answer)"
                        )

                try:
                    run_turn(session, runtime, text, on_event)
                    report.lines.append(f"{head}: answered after {completions[0]} completion(s)")
                except UnrecordedRequest as exc:
                    if exc.path.endswith("/control"):  # during the current completion
                        where = completions[0]
                        why = (
                            f"the thinking cap fires in completion {where} "
                            f"(reasoning_end after {limits.thinking_tokens} reasoning tokens of "
                            "the turn), where the recording went on reasoning: what the model "
                            "does after reasoning_end is not in the cassette"
                        )
                    else:  # the next completion's request, refused before any event
                        where = completions[0] + 1
                        why = f"the loop needs traffic the cassette does not hold: {exc}"
                    report.stopped = f"{head}, completion {where}: {why}"
                    report.lines.append(f"stopped at {report.stopped}")
                    break
                except (TurnLimit, SessionFull) as exc:
                    report.lines.append(f"{head}: ended by {type(exc).__name__}: {exc}")
                except TurnInferError as exc:
                    report.lines.append(f"{head}: the completion failed: {exc}")
                except TurnError as exc:
                    report.lines.append(f"{head}: ended: {exc}")
            played = c.play_count
            total = len(c.data)
            capped = sum(
                1
                for i, (request, _) in enumerate(c.data)
                if request.path.endswith("/control") and c.play_counts[i] == 0
            )
        session.close()
    if port is not None and port.missing:
        report.lines.append(f"tool calls with no recorded result: {', '.join(port.missing)}")
    if capped and report.stopped is None:
        report.lines.append(
            f"note: the recording's thinking cap ended reasoning early {capped} time(s); this "
            "replay streams those completions as recorded (the cassette cannot show what an "
            "uncapped model would have reasoned)"
        )
    report.lines.append(f"played {played} of {total} recorded interactions")
    report.played, report.total = played, total
    return report
