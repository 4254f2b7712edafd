"""Benchmark: CPU of one 1-tool turn against the number of records already in the session.

Builds a session of N records (turns of a user message, a tool call, its result and an
answer, as the loop writes them), then times ``run_turn`` for one more 1-tool turn:

- ``--client scripted`` (the default): a scripted client (no sockets, no server): the loop's
  own work (the request's ``messages``, the tool call, the records and their appends). The
  request body's serialisation is the client's and is not part of it.
- ``--client real``: :class:`boxmaker.client.Client` against the stand-in server
  (:class:`boxmaker.testing.RateServer`, one slot, in a process of its own): the loop and the
  client (slot lease, the request written and sent, the stream read and decoded), this
  process's CPU. Each request carries the whole history (about 670 kB at 10,000 records), so
  copying it into the request and the socket's send grow with the session whatever the
  client does; the client writes each message's JSON once per session, not per request.

Appends are fsynced, so a tmpfs (``/dev/shm``) is used when there is one, to time the CPU and
not the disk.

    python benchmarks/turn.py [--client scripted|real] [--small 100] [--large 10000]

The last line printed is ``growth X.XX``: the median CPU time of a turn at ``--large`` records
divided by the one at ``--small`` (goal: at most 1.5, a per-turn cost that stays flat).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from pathlib import Path

from boxmaker.client import ChatClient, Client
from boxmaker.config import ClientConfig, Config, SlotsConfig
from boxmaker.records import Assistant, Baseline, ToolCall, ToolResult, TurnEnd, Usage, User
from boxmaker.session import Session
from boxmaker.testing import RateServer, ScriptedClient, answer, call, calls, timings
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


def turn_cpu(sizes: list[int], repeat: int, folder: str, url: str | None = None) -> list[float]:
    """Median CPU seconds of one 1-tool turn on a session of each of ``sizes`` records; the
    sessions take turns, so a change of the machine's load weighs on each alike. ``url``:
    the stand-in server for the real client (each session pinned to a slot of its own, as a
    session keeps its slot); ``None``: a scripted client."""
    registry = Registry()
    registry.add(get_weather)
    sessions = [grown_session(folder, n, registry) for n in sizes]
    cpu: list[list[float]] = [[] for _ in sizes]
    client = None if url is None else Client(ClientConfig(url=url))
    configs = [
        Config() if url is None else Config(client=ClientConfig(url=url), slots=SlotsConfig(main=i))
        for i in range(len(sizes))
    ]
    for k in range(repeat + 1):  # the first turn of each: the first request of the session
        for i, session in enumerate(sessions):
            if client is None:
                steps = [calls(call("get_weather", {"city": f"X{k}"}, f"t{k}")), answer("done")]
                chat: ChatClient = ScriptedClient(steps, copy_bodies=False)
            else:
                chat = client
            runtime = Runtime(config=configs[i], client=chat, registry=registry)
            start = time.process_time()
            run_turn(session, runtime, f"Weather in X{k}?")
            if k:
                cpu[i].append(time.process_time() - start)
    for session in sessions:
        session.close()
    if client is not None:
        client.close()
    return [statistics.median(c) for c in cpu]


def main() -> None:
    """Time both sizes and print the growth."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=("scripted", "real"), default="scripted")
    parser.add_argument("--small", type=int, default=100)
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(dir=base))
        url = None
        if args.client == "real":
            server = RateServer(slots=2, prefill_s=0.0, tokens_per_s=100_000, answer_tokens=8)
            url = stack.enter_context(server).url
        small, large = turn_cpu([args.small, args.large], args.repeat, folder, url)
    print(f"1-tool turn CPU ({args.client} client): {small * 1e3:.2f} ms at {args.small} records")
    print(f"1-tool turn CPU ({args.client} client): {large * 1e3:.2f} ms at {args.large} records")
    print(f"growth {large / small:.2f}")


if __name__ == "__main__":
    main()
