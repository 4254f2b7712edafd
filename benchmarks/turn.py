"""Benchmark: CPU of one 1-tool turn against the number of records already in the session.

Builds a session of N records (turns of a user message, a tool call, its result and an
answer, as the loop writes them), then times ``run_turn`` for one more 1-tool turn with a
scripted client (no sockets, no server): the loop's own work (the request's ``messages``,
the tool call, the records and their appends). The request body's serialisation is the
client's and is not part of it. Appends are fsynced, so a tmpfs (``/dev/shm``) is used when
there is one, to time the CPU and not the disk.

    python benchmarks/turn.py [--small 100] [--large 10000] [--repeat 30]

The last line printed is ``growth X.XX``: the median CPU time of a turn at ``--large`` records
divided by the one at ``--small`` (goal: at most 1.5, a per-turn cost that stays flat).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from boxmaker.config import Config
from boxmaker.records import Assistant, Baseline, ToolCall, ToolResult, TurnEnd, Usage, User
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer, call, calls, timings
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn


def get_weather(city: str) -> str:
    """Get the weather.

    Args:
        city: The city.
    """
    return json.dumps({"city": city, "temperature": 21, "sky": "clear"})


def grown_session(folder: str, records: int, registry: Registry) -> Session:
    """A session of about ``records`` records, written in one go."""
    session = Session.create(folder, Baseline(system="sys", tools=registry.definitions()))
    batch: list[object] = []
    i = 0
    while len(batch) < records:
        args = json.dumps({"city": f"City {i}"})
        tc = ToolCall(id=f"c{i}", name="get_weather", arguments=args)
        batch += [
            User(content=f"Weather in City {i}?"),
            Assistant(content=None, reasoning="look it up", tool_calls=(tc,)),
            Usage(timings=timings(10 * i, 20)),
            ToolResult(call=i + 1, tool_call_id=tc.id, name=tc.name, content=get_weather(args)),
            Assistant(content=f"It is 21 in City {i}.", reasoning="read it"),
            Usage(timings=timings(10 * i + 20, 20)),
            TurnEnd(outcome="answered"),
        ]
        i += 1
    session.extend(batch[:records])  # type: ignore[arg-type]
    return session


def turn_cpu(records: int, repeat: int, folder: str) -> float:
    """Median CPU seconds of one 1-tool turn on a session of ``records`` records."""
    registry = Registry()
    registry.add(get_weather)
    session = grown_session(folder, records, registry)
    cpu: list[float] = []
    for k in range(repeat):
        steps = [calls(call("get_weather", {"city": f"X{k}"}, f"t{k}")), answer("done")]
        runtime = Runtime(
            config=Config(), client=ScriptedClient(steps, copy_bodies=False), registry=registry
        )
        start = time.process_time()
        run_turn(session, runtime, f"Weather in X{k}?")
        cpu.append(time.process_time() - start)
    session.close()
    return statistics.median(cpu)


def main() -> None:
    """Time both sizes and print the growth."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=base) as folder:
        small = turn_cpu(args.small, args.repeat, folder)
        large = turn_cpu(args.large, args.repeat, folder)
    print(f"1-tool turn CPU: {small * 1e3:.2f} ms at {args.small} records")
    print(f"1-tool turn CPU: {large * 1e3:.2f} ms at {args.large} records")
    print(f"growth {large / small:.2f}")


if __name__ == "__main__":
    main()
