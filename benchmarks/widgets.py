"""Benchmark: what a ChatPanel refresh costs as the session and the streamed answer grow.

Two measurements of CPU time (this thread's, so other processes on a shared machine disturb
them less), each in one process, through the panel's own hook and flush
(:meth:`boxmaker.widgets.ChatPanel.on_event`, :meth:`~boxmaker.widgets.ChatPanel.flush`) with
every widget message serialised to JSON as a kernel would send it (a comm that ``json.dumps``
each message, installed like ipykernel installs its own):

- turns: the milliseconds of all the flushes of one short new turn (its start, ``--flushes``
  streamed fragments each flushed, its end) after 10 and after ``--turns`` earlier turns
  (Markdown answers); the best of five runs (the machine is shared). Goal: independent of the
  earlier turns.
- stream: the microseconds of folding one more streamed fragment and drawing it (one event,
  one flush), in a live turn that already streamed 1,000 and ``--events`` fragments (four
  characters each, some Markdown, a new line now and then); the median of 200 draws, the best
  of three runs. Goal: independent of the answer's length.

The last line printed is ``turns_growth X.XX stream_growth Y.YY`` (cost at ``--turns`` / at
10 turns; cost at ``--events`` / at 1,000 events; about 1 means flat; goal both <= 1.5).

Run: ``python benchmarks/widgets.py`` (``--turns N``, ``--events N``, ``--flushes N``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import comm
from comm.base_comm import BaseComm

from boxmaker.config import Config
from boxmaker.events import Content, Queued
from boxmaker.records import Assistant, Baseline, TurnEnd, Usage, User
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime
from boxmaker.widgets import ChatPanel


class SerializingComm(BaseComm):
    """A comm that serialises every message as a kernel would, and counts the bytes."""

    sent_bytes = 0

    def publish_msg(
        self,
        msg_type: str,
        data: Any = None,
        metadata: Any = None,
        buffers: Any = None,
        **keys: Any,
    ) -> None:
        """JSON-encode the message (what ipykernel's session does before it sends)."""
        SerializingComm.sent_bytes += len(json.dumps({"data": data, "metadata": metadata}))


class NoClient:
    """The panel is driven through its hook here; nothing asks a server."""

    def chat_with_retry(self, *args: Any, **kwargs: Any) -> Any:
        """Never called."""
        raise AssertionError("the benchmark drives the panel through its hook")


def new_panel(directory: str) -> ChatPanel:
    """An empty panel on a new session in ``directory``."""
    session = Session.create(directory, Baseline())
    return ChatPanel(Runtime(config=Config(), client=NoClient(), registry=Registry()), session)


def finished_turn(panel: ChatPanel, i: int) -> None:
    """Feed one finished turn with a Markdown answer of about 1,000 characters."""
    text = f"**Answer {i}**: " + "some *text* with `code` and a [link](https://example.org). " * 16
    for event in (
        User(content=f"question {i}"),
        Queued(),
        Assistant(content=text),
        Usage(timings={"prompt_n": 10, "cache_n": 100, "predicted_n": 50}),
        TurnEnd(outcome="answered"),
    ):
        panel.on_event(event)


def turn_ms(earlier: int, flushes: int) -> float:
    """Milliseconds of all the flushes of one short turn after ``earlier`` finished turns."""
    with tempfile.TemporaryDirectory() as directory:
        panel = new_panel(directory)
        for i in range(earlier):
            finished_turn(panel, i)
        panel.flush()  # the earlier turns are drawn (not measured)
        spent = 0.0
        panel._running = True
        for event in [User(content="one more question"), Queued()] + [
            Content(f"w{j} ") for j in range(flushes)
        ]:
            panel.on_event(event)
            started = time.thread_time()
            panel.flush()
            spent += time.thread_time() - started
        panel.on_event(Assistant(content="".join(f"w{j} " for j in range(flushes))))
        panel.on_event(TurnEnd(outcome="answered"))
        panel._running = False
        started = time.thread_time()
        panel.flush()
        spent += time.thread_time() - started
        panel.session.close()
        return spent * 1000


def fragment(j: int) -> str:
    """The ``j``-th streamed fragment: four characters, Markdown now and then."""
    if j % 50 == 0:
        return "\n\n- "
    return "**w** " if j % 17 == 0 else f"ab{j % 10} "


def event_us(events: int, samples: int = 50) -> float:
    """Microseconds to fold and draw one more fragment after ``events`` streamed fragments."""
    with tempfile.TemporaryDirectory() as directory:
        panel = new_panel(directory)
        panel._running = True
        panel.on_event(User(content="write a long essay"))
        panel.on_event(Queued())
        for j in range(events):
            panel.on_event(Content(fragment(j)))
            if j % 1000 == 999:
                panel.flush()  # the panel flushes now and then while the answer grows
        panel.flush()
        times = []
        for j in range(samples):
            started = time.thread_time()
            panel.on_event(Content(fragment(events + j)))
            panel.flush()
            times.append(time.thread_time() - started)
        panel._running = False
        panel.session.close()
        return statistics.median(times) * 1e6


def main() -> None:
    """Parse the arguments, run both measurements, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--flushes", type=int, default=20)
    args = parser.parse_args()
    comm.create_comm = SerializingComm
    turn_ms(10, args.flushes)  # warm up (first widgets, first Markdown)
    few = min(turn_ms(10, args.flushes) for _ in range(5))  # the best run: least disturbed
    many = min(turn_ms(args.turns, args.flushes) for _ in range(5))
    print(f"one turn's {args.flushes + 3} flushes after 10 turns: {few:.2f} ms")
    print(f"one turn's {args.flushes + 3} flushes after {args.turns} turns: {many:.2f} ms")
    SerializingComm.sent_bytes = 0
    short = min(event_us(1000) for _ in range(3))  # each the median of 200 draws
    long = min(event_us(args.events) for _ in range(3))
    print(f"one fragment folded and drawn after 1,000 fragments: {short:.0f} us")
    print(f"one fragment folded and drawn after {args.events:,} fragments: {long:.0f} us")
    print(f"turns_growth {many / few:.2f} stream_growth {long / short:.2f}")


if __name__ == "__main__":
    main()
