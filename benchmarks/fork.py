"""Benchmark: is a fork's first prompt served from its parent's prompt cache?

Starts the embedded llama.cpp server (xllamacpp, the shipped model, one slot, no RAM prompt
cache so that a slot another session used holds nothing of ours, ``--slot-save-path`` in a
temporary folder) and runs a parent session of two turns whose prompt is at least
``--tokens`` tokens (a long system prompt), its slot saved at each turn's end
(:meth:`boxmaker.cache.SlotStore.saver`). Then the parent is forked at its last turn three
times, each fork running one new turn:

(a) right away: the slot still holds the parent's prefix (:func:`boxmaker.cache.warm_fork`
    says ``slot``);
(b) after another session (another long system prompt) used the slot: the slot saved at the
    parent's last turn is restored (``restored``);
(c) after the other session used the slot again, without a saved slot: cold (``ColdFork``).

For each, the share of the fork's first prompt served from the cache: ``cache_n / (cache_n +
prompt_n)`` of its first completion (llama.cpp's timings). ``prefill_ratio`` is the
restored fork's prompt processing (its ``prompt_ms`` plus the restore's ``restore_ms``) over
the cold fork's ``prompt_ms``.

The last line printed is ``warm_reuse X.XX restored_reuse Y.YY cold_reuse Z.ZZ prefill_ratio
R``. Goal: warm and restored >= 0.99, cold 0, prefill_ratio <= 0.1.

Run: ``python benchmarks/fork.py`` (``--tokens N``, ``--threads N``).
"""

from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path

from boxmaker.cache import ColdFork, SlotStore, WarmStart, warm_fork
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.records import Baseline, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, continue_fork, run_turn

FACT = "The weather service answers in degrees Celsius and names the sky. "


def system_prompt(tokens: int, tag: str) -> str:
    """A system prompt that makes the parent's prompt about ``tokens`` tokens (the shipped
    model's tokens are about a character each; the tools and the template add the rest)."""
    text = f"{tag}. "
    while len(text) < tokens * 0.85:
        text += FACT
    return text


def first_usage(fork: Session, before: int) -> Usage:
    """The first ``Usage`` the fork appended after its first ``before`` records."""
    return next(r for r in fork.records[before:] if isinstance(r, Usage))


def reuse(usage: Usage) -> float:
    cache, prompt = usage.timings.get("cache_n", 0), usage.timings.get("prompt_n", 0)
    return cache / (cache + prompt) if cache + prompt else 0.0


def run_fork(
    parent: Session, runtime: Runtime, client: Client, store: SlotStore | None
) -> tuple[WarmStart, Usage]:
    fork = parent.fork(at=2)
    before = len(fork.records)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ColdFork)
        start = warm_fork(fork, client, store)
    continue_fork(fork, runtime, "And in Oslo?")
    fork.close()
    return start, first_usage(fork, before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=3000, help="parent prompt, tokens")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, slots = Path(tmp) / "sessions", Path(tmp) / "slots"
        server = EmbeddedServer(
            n_ctx=4096,  # the shipped model's training context
            n_parallel=1,
            n_threads=args.threads,
            cache_ram_mib=0,
            slot_save_path=slots,
        )
        with server, Client(ClientConfig(url=server.url)) as client:
            config = Config(sampling=SamplingConfig(max_tokens=48))
            registry = demo_registry()
            runtime = Runtime(config=config, client=client, registry=registry)
            store = SlotStore(slots)
            tools = registry.definitions()
            parent = Session.create(
                folder, Baseline(system=system_prompt(args.tokens, "A"), tools=tools)
            )
            hook = store.saver(parent, client)
            run_turn(parent, runtime, "Weather in Paris?", hook)
            run_turn(parent, runtime, "And the time there?", hook)
            last = parent.last_usage()
            assert last is not None
            size = int(last.timings.get("cache_n", 0) + last.timings.get("prompt_n", 0))
            print(f"parent: {len(parent.records)} records, last prompt {size} tokens, "
                  f"saved {[f.name for f in store.files(parent.id)]}")  # fmt: skip

            def other(tag: str) -> None:
                with Session.create(folder, Baseline(system=system_prompt(args.tokens, tag))) as s:
                    run_turn(s, runtime, "Hello")

            results = {}
            results["warm"] = run_fork(parent, runtime, client, store)
            other("B")
            results["restored"] = run_fork(parent, runtime, client, store)
            other("C")
            results["cold"] = run_fork(parent, runtime, client, None)
            for name, (start, usage) in results.items():
                t = usage.timings
                print(f"{name:9} {start.how:9} cache_n {t.get('cache_n', 0):6.0f} prompt_n "
                      f"{t.get('prompt_n', 0):6.0f} prompt_ms {t.get('prompt_ms', 0):8.1f} "
                      f"restore_ms {start.restore_ms or 0:6.1f} "
                      f"reuse {reuse(usage):.3f}")  # fmt: skip
            restored_start, restored = results["restored"]
            cold_ms = results["cold"][1].timings.get("prompt_ms", 0.0)
            spent = restored.timings.get("prompt_ms", 0.0) + (restored_start.restore_ms or 0.0)
            ratio = spent / cold_ms if cold_ms else float("nan")
            print(
                f"warm_reuse {reuse(results['warm'][1]):.2f} restored_reuse {reuse(restored):.2f} "
                f"cold_reuse {reuse(results['cold'][1]):.2f} prefill_ratio {ratio:.2f}"
            )


if __name__ == "__main__":
    main()
