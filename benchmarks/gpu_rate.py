"""Benchmark: does the batch runner keep a GPU server's slots busy? The runner and a bare
asyncio httpx client side by side on a stand-in GPU-rate server.

The server is :class:`boxmaker.testing.RateServer` in a process of its own: ``N`` slots, a
10 ms prefill, a fixed token rate per slot (``--rate``, 1,000 tokens/s), llama.cpp's chunk
format (one HTTP chunk per event, tool calls, the final ``timings`` event). Each run is one
agent turn: the model calls a tool (``get_weather``), then answers (``--short`` or ``--long``
tokens). The same runs go through:

- ``runner``: :func:`boxmaker.batch.run_batch` (its logs, manifest, tools and events, as a user
  runs it at many slots; ``--executor``, default ``auto``: threads below
  :data:`boxmaker.batch.PROCESSES_FROM` slots, worker processes from there; the line names
  the one used);
- ``bare``: a bare asyncio httpx client doing the same two requests per run, ``N`` at once
  (the tool result a fixed text), reading the stream line by line;
- ``tap``: the bare client through ``boxmaker tap`` (in a process of its own, as agents use
  it; its CPU added to the client's), ``N`` agents at once (goal: ratio at least 0.9, and
  the median first data event of a request at most 1.2x the bare client's).

``--tap-core`` gives the tap a core of its own (Linux: the last CPU; this process, its worker
processes and the stand-in server on the others), as a tap beside a GPU server has: the
measure says whether the tap keeps up with the agents, not whether this machine's cores can
also run the stand-in server and the agents (on 2 cores they keep both busy, and any CPU the
tap adds then delays the first event wherever it runs). The direct runs are pinned alike.

For each, the share of ideal slot use: the sum of the completions' ideal times (the server's
``prompt_ms + predicted_ms``) over ``N`` slots times the wall time (1.0: every slot busy all
the time), completions per second, and the client's CPU per completion (this process and its
worker processes; the server's own CPU is not counted). Each line ends with the runner's share
divided by the bare client's (goal: at least 0.9 at every size) and its CPU per completion
over the bare client's (goal: at most 1.2).

    python benchmarks/gpu_rate.py [--slots 1 16 64] [--answers short long] [--runs 4]

More clients can be measured beside them: add a function to :data:`CLIENTS` that takes a
:class:`Setting` and returns a :class:`Measure`, and name it with ``--clients``; ratios are
printed against ``bare``.

The server and the clients share this machine's cores: state the load (``uptime``) with the
figures, and repeat them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from boxmaker.batch import Task, pick_executor, run_batch
from boxmaker.testing import RateServer
from boxmaker.tools import Registry

PROMPT = "What is the weather in Lisbon?"
WEATHER = json.dumps({"city": "Lisbon", "temperature": 21, "sky": "clear"})


def get_weather(city: str) -> str:
    """Get the weather.

    Args:
        city: The city.
    """
    return WEATHER


def registry() -> Registry:
    """The one tool of the runs."""
    tools = Registry()
    tools.add(get_weather)
    return tools


@dataclass(frozen=True)
class Setting:
    """One measurement's setting: the server's URL and slots, and how many runs."""

    url: str
    slots: int
    runs: int
    executor: str


@dataclass(frozen=True)
class Measure:
    """What one client did: completions, their ideal seconds, wall and CPU seconds, and the
    median time from sending a request to its first data event (ms; ``None``: not measured,
    the runner)."""

    completions: int
    ideal_s: float
    wall_s: float
    cpu_s: float
    first_ms: float | None = None

    def share(self, slots: int) -> float:
        """The share of ideal slot use."""
        return self.ideal_s / (slots * self.wall_s)

    @property
    def cpu_ms(self) -> float:
        """Client CPU per completion, milliseconds."""
        return 1000 * self.cpu_s / max(self.completions, 1)


def _server_cpu(pid: int) -> float:
    """CPU seconds the server's process used so far (Linux ``/proc``; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def runner(setting: Setting) -> Measure:
    """The runs through :func:`run_batch` into a fresh batch folder."""
    tasks = [Task(id=f"run{i:04d}", messages=(PROMPT,)) for i in range(setting.runs)]
    tools = registry()
    with tempfile.TemporaryDirectory(dir=_fast_dir()) as folder:
        cpu, wall = _cpu(), time.perf_counter()
        progress = run_batch(
            tasks, folder, servers=[setting.url], registry=tools, executor=setting.executor
        )
        wall, cpu = time.perf_counter() - wall, _cpu() - cpu
        assert progress.done == setting.runs and not progress.failed, progress.failures
        ideal, completions = 0.0, 0
        for log in Path(folder, "logs").glob("*.jsonl"):
            for line in log.read_bytes().splitlines():
                record = json.loads(line)
                if record.get("type") == "usage":
                    t = record["timings"]
                    ideal += (t["prompt_ms"] + t["predicted_ms"]) / 1000
                    completions += 1
    return Measure(completions, ideal, wall, cpu)


def bare(setting: Setting) -> Measure:
    """The same runs by a bare asyncio httpx client, ``slots`` at once."""
    tools = registry().definitions()
    ideal = 0.0
    completions = 0
    firsts: list[float] = []

    async def complete(client: httpx.AsyncClient, messages: list[dict[str, object]]) -> str | None:
        """One streamed completion; its tool call's id, if it made one."""
        nonlocal ideal, completions
        body = {"messages": messages, "tools": tools, "stream": True}
        body["stream_options"] = {"include_usage": True}
        call_id = None
        sent = time.perf_counter()
        async with client.stream("POST", setting.url + "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    if sent:
                        firsts.append(1000 * (time.perf_counter() - sent))
                        sent = 0.0
                    if '"timings"' in line:
                        t = json.loads(line[6:])["timings"]
                        ideal += (t["prompt_ms"] + t["predicted_ms"]) / 1000
                    elif call_id is None and '"tool_calls"' in line and '"id"' in line:
                        call_id = json.loads(line[6:])["choices"][0]["delta"]["tool_calls"][0]["id"]
        completions += 1
        return call_id

    async def run(client: httpx.AsyncClient, gate: asyncio.Semaphore) -> None:
        async with gate:
            messages: list[dict[str, object]] = [{"role": "user", "content": PROMPT}]
            call_id = await complete(client, messages)
            if call_id is not None:
                call = {"id": call_id, "type": "function"}
                call["function"] = {"name": "get_weather", "arguments": '{"city": "Lisbon"}'}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": call_id, "content": WEATHER})
                await complete(client, messages)

    async def main() -> None:
        limits = httpx.Limits(max_connections=setting.slots + 4, max_keepalive_connections=0)
        async with httpx.AsyncClient(timeout=120, limits=limits) as client:
            gate = asyncio.Semaphore(setting.slots)
            await asyncio.gather(*(run(client, gate) for _ in range(setting.runs)))

    cpu, wall = _cpu(), time.perf_counter()
    asyncio.run(main())
    first = sorted(firsts)[len(firsts) // 2] if firsts else None
    return Measure(completions, ideal, time.perf_counter() - wall, _cpu() - cpu, first)


TAP_CORE: set[int] | None = None
"""The CPUs the tap runs on (``--tap-core``: the last one), ``None``: any, as the others."""


def _pin_tap() -> None:
    """In the tap's process, before it starts: run on :data:`TAP_CORE`."""
    if TAP_CORE is not None:
        os.sched_setaffinity(0, TAP_CORE)


def tap(setting: Setting) -> Measure:
    """The bare client's runs through ``boxmaker tap`` in front of the server (``slots``
    agents at once): the tap in a process of its own, as in use (its CPU is counted with the
    client's: what a tapped agent costs this machine), its logs on the tmpfs; on
    :data:`TAP_CORE` when set."""
    with tempfile.TemporaryDirectory(dir=_fast_dir()) as folder:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "boxmaker.cli", "tap", "--upstream", setting.url]
        argv += ["--port", str(port), "--dir", folder]
        proxy = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_pin_tap
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(url + "/health", timeout=2)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proxy.poll() is not None:
                        raise RuntimeError("boxmaker tap did not start") from None
                    time.sleep(0.05)
            before = _server_cpu(proxy.pid)
            measure = bare(dataclasses.replace(setting, url=url))
            spent = _server_cpu(proxy.pid) - before
        finally:
            proxy.terminate()
            proxy.wait(30)
    return dataclasses.replace(measure, cpu_s=measure.cpu_s + spent)


CLIENTS: dict[str, Callable[[Setting], Measure]] = {"runner": runner, "bare": bare, "tap": tap}
"""The clients measured, by name (``--clients``); ``bare`` is the reference of the ratios."""


def _fast_dir() -> str | None:
    """A tmpfs for the logs when there is one (the runner's fsyncs are then CPU, not disk),
    unless ``--disk`` was given."""
    if os.environ.get("GPU_RATE_DISK"):
        return None
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


def main() -> None:
    """Measure every size and answer length; print one line per client and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--answers", nargs="+", default=["short", "long"])
    parser.add_argument("--short", type=int, default=32, help="tokens of a short answer")
    parser.add_argument("--long", type=int, default=512, help="tokens of a long answer")
    parser.add_argument("--rate", type=float, default=1000.0, help="tokens/s per slot")
    parser.add_argument("--tick", type=float, default=0.005, help="the server's write tick, s")
    parser.add_argument("--runs", type=int, default=4, help="runs per slot (at least 8 in all)")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per client (median)")
    parser.add_argument("--executor", default="auto", help="run_batch's executor")
    parser.add_argument("--clients", nargs="+", default=list(CLIENTS))
    parser.add_argument("--disk", action="store_true", help="logs on disk, not on a tmpfs")
    parser.add_argument(
        "--tap-core", action="store_true", help="the tap on a core of its own (Linux)"
    )
    args = parser.parse_args()
    if args.disk:
        os.environ["GPU_RATE_DISK"] = "1"
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} on {os.cpu_count()} cores")
    if args.tap_core:
        global TAP_CORE
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error("--tap-core needs 2 CPUs at least")
        TAP_CORE = {cpus[-1]}
        os.sched_setaffinity(0, cpus[:-1])  # this process, its workers and the server
        print(f"the tap on CPU {cpus[-1]}; the server and the clients on {cpus[:-1]}")
    for answer in args.answers:
        tokens = args.short if answer == "short" else args.long
        for slots in args.slots:
            server = RateServer(
                slots=slots, tokens_per_s=args.rate, answer_tokens=tokens, tick_s=args.tick
            )
            with server:
                setting = Setting(server.url, slots, max(32, args.runs * slots), args.executor)
                runner(Setting(server.url, slots, min(slots, 4), args.executor))  # warm up
                got: dict[str, Measure] = {}
                served: dict[str, float] = {}
                for name in args.clients:
                    measures = []
                    for _ in range(args.repeat):
                        before = _server_cpu(server.pid)
                        measures.append(CLIENTS[name](setting))
                        served[name] = _server_cpu(server.pid) - before
                    got[name] = sorted(measures, key=lambda m: m.share(slots))[len(measures) // 2]
            base = got.get("bare")
            for name, m in got.items():
                line = (
                    f"{answer:5} {slots:3} slots {name:8} share {m.share(slots):.3f} "
                    f"{m.completions / m.wall_s:7.1f} completions/s "
                    f"{m.cpu_ms:6.2f} ms CPU/completion "
                    f"(server {served[name] / m.wall_s:.0%} of a core)"
                )
                if m.first_ms is not None:
                    line += f" first event {m.first_ms:.1f} ms"
                if name == "runner":
                    used = args.executor
                    line += f" [{pick_executor(slots) if used == 'auto' else used}]"
                if base is not None and name != "bare":
                    line += (
                        f"  ratio {m.share(slots) / base.share(slots):.2f} "
                        f"cpu {m.cpu_ms / base.cpu_ms:.2f}"
                    )
                    if m.first_ms is not None and base.first_ms:
                        line += f" first event {m.first_ms / base.first_ms:.2f}x"
                print(line, flush=True)


if __name__ == "__main__":
    main()
