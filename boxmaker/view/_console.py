"""A turn printed live on a terminal: :class:`ConsoleView` (a hook), and the usage table of a
session's requests (:func:`format_usage_table`). Model text goes through
:func:`terminal_safe`, so a model or tool cannot send escape sequences to the terminal."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from ..events import (
    Content,
    Progress,
    Queued,
    Reasoning,
    Retrying,
    ThinkingCapped,
    ToolCallStarted,
    TurnEvent,
)
from ..records import Approval, Assistant, CacheLoss, LimitHit, Record, ToolCall, ToolResult, Usage
from ._render import terminal_safe

__all__ = ["USAGE_COLUMNS", "ConsoleView", "format_usage_table", "usage_rows"]


class ConsoleView:
    """An ``on_event`` hook that prints a turn live to a text stream.

    Reasoning is printed dim (when the stream is a terminal), content as it streams, tool
    calls and results on their own lines, limits and cache losses flagged. Every text that
    comes from the model, a tool or the server passes through
    :func:`~boxmaker.view.terminal_safe` first, so it cannot move the cursor, clear the
    screen or retitle the window: the only escape sequences written are the view's own dim
    and reset.

    Args:
        out: the text stream (default ``sys.stdout``).
    """

    def __init__(self, out: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        tty = hasattr(self.out, "isatty") and self.out.isatty()
        self._dim, self._reset = ("\x1b[2m", "\x1b[0m") if tty else ("", "")
        self._mode = ""
        self._calls: dict[str, ToolCall] = {}  # the calls the model asked for, by id
        self._shown: set[int] = set()  # the session call numbers whose call line is printed

    def _switch(self, mode: str, header: str) -> None:
        if self._mode != mode:
            self.out.write(f"\n{header}" if header else "\n")
            self._mode = mode

    def __call__(self, event: TurnEvent | Record) -> None:
        """Print one event."""
        w, safe = self.out.write, terminal_safe
        if isinstance(event, Queued):
            self._switch("status", "  [queued]")
        elif isinstance(event, Progress) and event.processed >= event.total:
            self._switch("status", f"  [prompt {event.total} tokens, {event.cache} cached]")
        elif isinstance(event, Reasoning):
            self._switch("reasoning", f"{self._dim}think> ")
            w(safe(event.text))
        elif isinstance(event, Content):
            self._switch("content", f"{self._reset}model> ")
            w(safe(event.text))
        elif isinstance(event, Assistant):
            self._calls.update((c.id, c) for c in event.tool_calls)
        elif isinstance(event, ToolCallStarted):
            call = safe(f"{event.name}{event.arguments}")
            self._switch("tool", f"{self._reset}  call #{event.call} {call}")
            self._shown.add(event.call)
        elif isinstance(event, Approval):
            said = f": {safe(event.reason)}" if event.reason else ""
            self._switch("approval", f"{self._reset}  [{event.decision} by {safe(event.by)}{said}]")
            self._mode = ""
        elif isinstance(event, ToolResult):
            asked = self._calls.get(event.tool_call_id)
            if event.call not in self._shown and asked is not None:  # not run: no start event
                call = safe(f"{asked.name}{asked.arguments}")
                self._switch("tool", f"{self._reset}  call #{event.call} {call}")
            self._shown.add(event.call)
            flag = " (truncated)" if event.truncated else ""
            self._switch("result", f"  result{flag}: {safe(event.content[:200])}")
            self._mode = ""
        elif isinstance(event, ThinkingCapped):
            self._switch("limit", f"{self._reset}  [thinking cap: {event.reasoning_tokens} tokens]")
        elif isinstance(event, LimitHit):
            detail = safe(f"{event.kind}: {event.detail}")
            self._switch("limit", f"{self._reset}  [limit {detail}]")
            self._mode = ""
        elif isinstance(event, CacheLoss):
            why = f", {event.cause} at token {event.position}" if event.cause else ""
            self._switch(
                "cache",
                f"  [cache loss: {event.reused} of {event.expected} cached prompt tokens reused"
                f"{why}]",
            )
            self._mode = ""
        elif isinstance(event, Retrying):
            reason = safe(event.reason)
            self._switch("status", f"  [retry {event.attempt} in {event.delay_s:.1f} s: {reason}]")
            self._mode = ""
        elif isinstance(event, Usage) and event.finish_reason == "length":
            self._switch("limit", f"{self._reset}  [cut at max_tokens]")
            self._mode = ""
        self.out.flush()

    def end(self) -> None:
        """Finish the current line (call after a turn)."""
        self.out.write(self._reset + "\n")
        self._mode = ""
        self.out.flush()


USAGE_COLUMNS = ("prompt_n", "cache_n", "predicted_n", "reasoning", "prompt_ms", "predicted_ms")


def usage_rows(records: Sequence[Record]) -> list[tuple[int | float, ...]]:
    """One row per completion: ``prompt_n``, ``cache_n``, ``predicted_n`` (tokens), reasoning
    tokens, ``prompt_ms``, ``predicted_ms`` (milliseconds), from the ``Usage`` records."""
    rows: list[tuple[int | float, ...]] = []
    for r in records:
        if isinstance(r, Usage):
            t = r.timings
            rows.append(
                (
                    int(t.get("prompt_n", 0)),
                    int(t.get("cache_n", 0)),
                    int(t.get("predicted_n", 0)),
                    float("nan") if r.reasoning_tokens is None else r.reasoning_tokens,  # unknown
                    round(float(t.get("prompt_ms", 0.0)), 1),
                    round(float(t.get("predicted_ms", 0.0)), 1),
                )
            )
    return rows


def format_usage_table(records: Sequence[Record]) -> str:
    """:func:`usage_rows` as a fixed-width text table with a header and a request number."""
    header = ("request", *USAGE_COLUMNS)
    lines = [header] + [(str(i), *map(str, row)) for i, row in enumerate(usage_rows(records), 1)]
    widths = [max(len(line[c]) for line in lines) for c in range(len(header))]
    return "\n".join(
        "  ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)) for line in lines
    )
