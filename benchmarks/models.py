"""Benchmark: a 3-turn session on each shipped and real model on the embedded server.

Models: the shipped ``tiny-agent`` and its multi-format retraining ``tiny-agent-qwen3`` and
``tiny-agent-llama3`` (Qwen3's and Llama 3.1's real templates; the demo's three prompts with
its two tools: the models whose templates take tools), and the real models of
:data:`boxmaker.model.real.REAL_MODELS` that ``scripts/fetch_models.py`` fetched (three short
prompts, no tools, 16 tokens a reply): SmolLM2-135M-Instruct, Gemma 3 270M, and Gemma again
with ``swa_full=True`` (``--swa-full``, the remedy for its sliding-window ``checkpoint``
losses). One slot, llama-server's other
defaults. For each: generation and prompt tokens/s (llama.cpp's ``timings``), the cache reuse
at each later turn (its first request's ``cache_n`` over the tokens the slot held after the
turn before: prompt and reply) and the losses by cause (``CacheLoss`` records).

    python benchmarks/models.py [--threads 1]

The last line printed is ``real_models N tool_formats M checkpoint_reuse_after_fix X.XX``:
N real models that ran the session, M tool-call formats that llama.cpp parsed into
``tool_calls`` (one per model whose template takes tools and whose model called one: the
three tiny files speak three formats), X the mean reuse of Gemma's later
turns with ``swa_full`` (goals N >= 2, M >= 3, X >= 0.95).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, SamplingConfig
from boxmaker.demo import DEMO_PROMPTS, DEMO_SYSTEM, demo_registry
from boxmaker.errors import TurnLimit
from boxmaker.model import model_file
from boxmaker.model.real import real_model_path
from boxmaker.records import Assistant, Baseline, CacheLoss, Capabilities, TurnEnd, Usage, User
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

PLAIN_PROMPTS = ("What is the capital of France?", "And of Spain?", "And of Italy?")


@dataclass(frozen=True)
class Setup:
    """One row: a model file (``None``: the shipped one) and how the server runs it."""

    label: str
    path: Path | None
    tools: bool
    swa_full: bool = False


@dataclass(frozen=True)
class Result:
    """What one 3-turn session measured."""

    label: str
    generated_per_s: float
    prompt_per_s: float
    reuse: list[float]
    losses: dict[str, int]
    tool_calls: int
    takes_tools: bool
    outcomes: list[str]


def run(setup: Setup, threads: int, folder: Path) -> Result:
    """The session of ``setup`` on its own embedded server."""
    server = EmbeddedServer(
        setup.path, n_ctx=4096, n_parallel=1, n_threads=threads, swa_full=setup.swa_full
    )
    registry = demo_registry() if setup.tools else Registry()
    baseline = (
        Baseline(system=DEMO_SYSTEM, tools=registry.definitions()) if setup.tools else Baseline()
    )
    prompts = DEMO_PROMPTS if setup.tools else PLAIN_PROMPTS
    sampling = SamplingConfig(max_tokens=200 if setup.tools else 16)
    with server, Session.create(folder, baseline) as session:
        config = Config(client=ClientConfig(url=server.url, retry_attempts=0), sampling=sampling)
        with Client(config.client) as client:
            runtime = Runtime(config=config, client=client, registry=registry)
            for prompt in prompts:
                with contextlib.suppress(TurnLimit):
                    run_turn(session, runtime, prompt)
        records = list(session.records)
    usages = [r for r in records if isinstance(r, Usage)]
    firsts: list[Usage] = []  # the first request of each turn
    last: list[Usage] = []  # the last request of each turn
    for index, record in enumerate(records):
        if isinstance(record, User):
            after = [r for r in records[index:] if isinstance(r, Usage | User)][1:]
            if after and isinstance(after[0], Usage):
                firsts.append(after[0])
        if isinstance(record, TurnEnd):
            before = [r for r in records[:index] if isinstance(r, Usage | User)]
            if before and isinstance(before[-1], Usage):
                last.append(before[-1])
    reuse = []
    for previous, first in zip(last, firsts[1:], strict=False):
        t = previous.timings
        held = t["cache_n"] + t["prompt_n"] + t["predicted_n"]
        reuse.append(first.timings["cache_n"] / held if held else 0.0)
    caps = next((r for r in records if isinstance(r, Capabilities)), None)

    def rate(count: str, ms: str) -> float:
        total_ms = sum(u.timings.get(ms, 0.0) for u in usages)
        return sum(u.timings.get(count, 0) for u in usages) / total_ms * 1000 if total_ms else 0.0

    return Result(
        label=setup.label,
        generated_per_s=rate("predicted_n", "predicted_ms"),
        prompt_per_s=rate("prompt_n", "prompt_ms"),
        reuse=reuse,
        losses=dict(collections.Counter(str(r.cause) for r in records if isinstance(r, CacheLoss))),
        tool_calls=sum(len(r.tool_calls) for r in records if isinstance(r, Assistant)),
        takes_tools=bool(caps and caps.supports_tools and caps.supports_tool_calls),
        outcomes=[r.outcome for r in records if isinstance(r, TurnEnd)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    setups = [Setup("tiny-agent (shipped)", None, tools=True)]
    for name in ("qwen3", "llama3"):
        if model_file(name).exists():
            setups.append(Setup(f"tiny-agent-{name} (shipped)", model_file(name), tools=True))
    smollm2, gemma3 = real_model_path("smollm2"), real_model_path("gemma3")
    if smollm2 is None or gemma3 is None:
        print("real models missing: run scripts/fetch_models.py")
    if smollm2 is not None:
        setups.append(Setup("SmolLM2-135M-Instruct", smollm2, tools=False))
    if gemma3 is not None:
        setups.append(Setup("Gemma 3 270M", gemma3, tools=False))
        setups.append(Setup("Gemma 3 270M, swa_full", gemma3, tools=False, swa_full=True))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for number, setup in enumerate(setups):
            result = run(setup, args.threads, Path(tmp) / str(number))
            results.append(result)
            reuse = " ".join(f"{r:.2f}" for r in result.reuse)
            losses = ", ".join(f"{k} {v}" for k, v in sorted(result.losses.items())) or "none"
            print(
                f"{result.label:24} {result.generated_per_s:6.1f} tok/s generated, "
                f"{result.prompt_per_s:7.1f} tok/s prompt; reuse turns 2-3: {reuse}; "
                f"losses: {losses}; tool calls {result.tool_calls}; "
                f"turns ended {', '.join(result.outcomes)}"
            )
    real = {r.label.split(",")[0] for r in results if not r.label.endswith("(shipped)")}
    formats = sum(r.takes_tools and r.tool_calls > 0 for r in results)
    fixed = [r for r in results if r.label.endswith("swa_full")]
    after_fix = sum(fixed[0].reuse) / len(fixed[0].reuse) if fixed and fixed[0].reuse else 0.0
    print(
        f"real_models {len(real)} tool_formats {formats} checkpoint_reuse_after_fix {after_fix:.2f}"
    )


if __name__ == "__main__":
    main()
