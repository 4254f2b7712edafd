"""Benchmark: is a fork's first prompt served from its parent's prompt cache, and does its
label say what it measured?

For each model and server setting, the embedded llama.cpp server (xllamacpp, one slot,
``--slot-save-path`` in a temporary folder) runs a parent session of two turns, its slot saved
at each turn's end (:meth:`boxmaker.cache.SlotStore.saver`). Then the parent is forked at its
last turn four times, each fork running one new turn, :func:`boxmaker.cache.warm_fork`'s
answer in ``Runtime.warm``:

(a) ``slot``: right away: the slot still holds the parent's prefix;
(b) ``ram``: after another session used the slot, without a saved slot: only the server's
    RAM prompt cache (``--cache-ram``) can still hold it;
(c) ``restored``: after another session used the slot again: the saved slot is restored;
(d) ``cold``: after another session, without a saved slot (the RAM cache may hold it from an
    earlier fork's prompt: then the fork is measured warm, and labelled ``server``).

Each fork's ``Warmed`` record says what its first request reused of the parent's prefix (the
tokens the parent's slot held after the fork turn: prompt and reply) and the label that
follows; the benchmark checks that the label agrees with the measurement (warm labels only at
0.9 or more, :data:`boxmaker.cache.WARM_SHARE`).

Models and settings (``--models``):

- ``shipped``: the shipped char-level model, a parent prompt of ``--tokens`` tokens, no RAM
  prompt cache (``cache_ram_mib=0``: the ``ram`` and ``cold`` forks are cold);
- ``gemma3``: Gemma 3 270M (sliding window 512; fetched by ``scripts/fetch_models.py``), a
  parent of about 420 tokens with two 128-token replies, under three settings: ``checkpoint``
  (llama.cpp's defaults, no prefill: what ``warm_fork`` did before), ``prefill`` (the default
  now: the fork's prefix sent once into the slot found, ``warm_fork(prefill=None)``) and
  ``swa-full`` (``--swa-full``, no prefill); the RAM prompt cache on (llama.cpp's 8 GiB), so
  the ``ram`` and ``cold`` forks show what it gives.

``batch`` (in ``--models``): 16 forks of 4 parents over 2 embedded servers of 2 slots each
(the shipped model, each server its own slot folder, no RAM cache): the parents run as one
batch (their slots saved at turn ends), the forks as another (:func:`boxmaker.batch.run_batch`,
four fork tasks per parent); cache affinity sends each fork first to the slot its parent ran
on. Per fork: its label, the share of the prefix reused, and its prefill against a cold
one's (``prompt_n / (cache_n + prompt_n)`` of its first request: the share of its prompt
processed).

One line per fork, then one summary line per model and setting, then ``forks N labels_agree
M`` and, for the shipped model, ``prefill_ratio R``: the restored fork's prompt processing
(its ``prompt_ms`` plus the restore's ``restore_ms``) over the cold fork's, as before. Goal:
every label agrees; on Gemma 3 with ``prefill`` or ``swa-full``, slot and restored forks reuse
at least 0.9.

Run: ``python benchmarks/fork.py`` (``--models shipped,gemma3,batch``, ``--gemma-settings
checkpoint,prefill,swa-full``, ``--tokens N``, ``--threads N``).
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from boxmaker.cache import WARM_SHARE, ColdFork, SlotStore, WarmStart, describe_warmth, warm_fork
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import TurnError
from boxmaker.model.real import real_model_path
from boxmaker.records import Baseline, Usage, Warmed
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, continue_fork, run_turn

FACT = "The weather service answers in degrees Celsius and names the sky. "
CAPITALS = "You answer questions about European capitals and their history. "
WARM_LABELS = ("slot", "restored", "server")


def system_prompt(tokens: int, tag: str) -> str:
    """A system prompt that makes the parent's prompt about ``tokens`` tokens (the shipped
    model's tokens are about a character each; the tools and the template add the rest)."""
    text = f"{tag}. "
    while len(text) < tokens * 0.85:
        text += FACT
    return text


@dataclass(frozen=True)
class Setup:
    """One model under one server setting."""

    name: str
    model: Path | None  # None: the shipped model
    server: dict[str, Any]
    prefill: bool | None
    system: str
    prompts: tuple[str, str, str]  # the parent's two turns, the fork's turn
    max_tokens: int
    tools: bool


@dataclass(frozen=True)
class Fork:
    """One fork's outcome: what warm_fork did, the Warmed record, its first usage."""

    case: str
    start: WarmStart
    warmed: Warmed
    usage: Usage

    @property
    def agrees(self) -> bool:
        share = self.warmed.share
        if share is None:
            return self.warmed.how == "unknown"
        return (self.warmed.how in WARM_LABELS) == (share >= WARM_SHARE)


def turn(session: Session, runtime: Runtime, text: str, hook: Any = None) -> None:
    with contextlib.suppress(TurnError):  # a reply cut by length, a stray call: a turn
        run_turn(session, runtime, text, hook)


def fork_once(
    case: str,
    parent: Session,
    runtime: Runtime,
    client: Client,
    store: SlotStore | None,
    setup: Setup,
) -> Fork:
    fork = parent.fork(at=2)
    before = len(fork.records)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ColdFork)
        start = warm_fork(fork, client, store, prefill=setup.prefill, config=runtime.config)
    runtime.warm = start
    with contextlib.suppress(TurnError):
        continue_fork(fork, runtime, setup.prompts[2])
    fork.close()
    own = fork.records[before:]
    warmed = next(r for r in own if isinstance(r, Warmed))
    usage = next(r for r in own if isinstance(r, Usage))
    return Fork(case, start, warmed, usage)


def run_setup(setup: Setup, threads: int) -> list[Fork]:
    with tempfile.TemporaryDirectory() as tmp:
        folder, slots = Path(tmp) / "sessions", Path(tmp) / "slots"
        server = EmbeddedServer(
            setup.model, n_parallel=1, n_threads=threads, slot_save_path=slots, **setup.server
        )
        with server, Client(ClientConfig(url=server.url)) as client:
            config = Config(sampling=SamplingConfig(max_tokens=setup.max_tokens))
            registry = demo_registry() if setup.tools else Registry()
            runtime = Runtime(config=config, client=client, registry=registry)
            store = SlotStore(slots)
            tools = registry.definitions()
            parent = Session.create(folder, Baseline(system=setup.system, tools=tools))
            hook = store.saver(parent, client)
            turn(parent, runtime, setup.prompts[0], hook)
            turn(parent, runtime, setup.prompts[1], hook)

            def other(tag: str) -> None:
                text = (tag + ". ") * (len(setup.system) // (len(tag) + 2))
                with Session.create(folder, Baseline(system=text)) as s:
                    turn(s, runtime, "Hello")

            forks = [fork_once("slot", parent, runtime, client, store, setup)]
            other("B")
            forks.append(fork_once("ram", parent, runtime, client, None, setup))
            other("C")
            forks.append(fork_once("restored", parent, runtime, client, store, setup))
            other("D")
            forks.append(fork_once("cold", parent, runtime, client, None, setup))
            return forks


def setups(models: list[str], tokens: int, settings: list[str]) -> list[Setup]:
    out = []
    if "shipped" in models:
        out.append(
            Setup(
                name="shipped",
                model=None,
                # the shipped model's training context; no RAM prompt cache, so that a slot
                # another session used holds nothing of ours and the cold fork is cold
                server={"n_ctx": 4096, "cache_ram_mib": 0},
                prefill=None,
                system=system_prompt(tokens, "A"),
                prompts=("Weather in Paris?", "And the time there?", "And in Oslo?"),
                max_tokens=48,
                tools=True,
            )
        )
    if "gemma3" in models:
        path = real_model_path("gemma3")
        if path is None:
            print("gemma3: not fetched (python scripts/fetch_models.py gemma3): skipped")
        else:
            prompts = ("What is the capital of France?", "And of Spain?", "And of Italy?")
            chosen = [
                (name, server, prefill)
                for name, server, prefill in (
                    ("checkpoint", {}, False),
                    ("prefill", {}, None),
                    ("swa-full", {"swa_full": True}, False),
                )
                if name in settings
            ]
            for name, server, prefill in chosen:
                out.append(
                    Setup(
                        name=f"gemma3 {name}",
                        model=path,
                        server={"n_ctx": 4096, **server},
                        prefill=prefill,
                        system=CAPITALS * 4,
                        prompts=prompts,
                        max_tokens=128,
                        tools=False,
                    )
                )
    return out


def run_batch_forks(threads: int) -> list[tuple[str, Warmed, Usage]]:
    """16 forks of 4 parents over 2 servers (see the module): each fork's ``Warmed`` record and
    first ``Usage``."""
    from boxmaker.batch import ForkTask, Task, run_batch

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        servers = []
        for i in range(2):
            folder = Path(tmp) / f"slots-{i}"
            server = EmbeddedServer(
                n_ctx=2 * 4096, n_parallel=2, n_threads=threads, cache_ram_mib=0,
                slot_save_path=folder,
            )  # fmt: skip
            servers.append(stack.enter_context(server))
        config = Config(sampling=SamplingConfig(max_tokens=32))
        parents = [
            Task(id=f"p{k}", messages=("Weather in Paris?",), system=system_prompt(1500, f"P{k}"))
            for k in range(4)
        ]
        run_batch(parents, Path(tmp) / "parents", servers=servers, registry=Registry(),
                  config=config)  # fmt: skip
        logs = Path(tmp) / "parents" / "logs"
        forks = [
            ForkTask(id=f"p{k}-f{i}", parent=logs / f"p{k}.jsonl", at=1, messages=("And Oslo?",))
            for i in range(4)
            for k in range(4)
        ]
        run_batch(forks, Path(tmp) / "forks", servers=servers, registry=Registry(),
                  config=config)  # fmt: skip
        out = []
        for task in forks:
            with Session.open(Path(tmp) / "forks" / "logs" / f"{task.id}.jsonl") as fork:
                records = fork.records
            warmed = next(r for r in records if isinstance(r, Warmed))
            usage = next(r for r in records[records.index(warmed) - 1 :: -1]
                         if isinstance(r, Usage))  # fmt: skip
            out.append((task.id, warmed, usage))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", default="shipped,gemma3,batch", help="shipped, gemma3, batch (comma)"
    )
    parser.add_argument("--tokens", type=int, default=3000, help="shipped: parent prompt, tokens")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads")
    parser.add_argument(
        "--gemma-settings",
        default="checkpoint,prefill,swa-full",
        help="gemma3's server settings to run (comma)",
    )
    args = parser.parse_args()
    total = agree = 0
    ratio = None
    for setup in setups(args.models.split(","), args.tokens, args.gemma_settings.split(",")):
        forks = run_setup(setup, args.threads)
        for f in forks:
            t = f.usage.timings
            print(
                f"{setup.name:18} {f.case:9} found {f.start.how:9} label {f.warmed.how:8} "
                f"cache_n {t.get('cache_n', 0):6.0f} prompt_n {t.get('prompt_n', 0):6.0f} "
                f"agrees {f.agrees}: {describe_warmth(f.warmed)}"
            )
        shares = " ".join(
            f"{f.case} {f.warmed.share:.2f}" if f.warmed.share is not None else f"{f.case} -"
            for f in forks
        )
        print(f"{setup.name}: {shares}")
        total += len(forks)
        agree += sum(f.agrees for f in forks)
        if setup.name == "shipped":
            by = {f.case: f for f in forks}
            cold_ms = by["cold"].usage.timings.get("prompt_ms", 0.0)
            restored = by["restored"]
            spent = restored.usage.timings.get("prompt_ms", 0.0) + (restored.start.restore_ms or 0)
            ratio = spent / cold_ms if cold_ms else float("nan")
    if "batch" in args.models.split(","):
        ratios = []
        for run, warmed, usage in run_batch_forks(args.threads):
            t = usage.timings
            processed = t.get("prompt_n", 0) / max(1, t.get("cache_n", 0) + t.get("prompt_n", 0))
            ratios.append(processed)
            share = warmed.share
            agrees = (warmed.how in WARM_LABELS) == (share is not None and share >= WARM_SHARE)
            total, agree = total + 1, agree + agrees
            print(f"batch {run:8} label {warmed.how:8} prefill {processed:.3f} agrees {agrees}: "
                  f"{describe_warmth(warmed)}")  # fmt: skip
        print(f"batch: {len(ratios)} forks, prefill ratio max {max(ratios):.3f} "
              f"mean {sum(ratios) / len(ratios):.3f}")  # fmt: skip
    tail = f" prefill_ratio {ratio:.2f}" if ratio is not None else ""
    print(f"forks {total} labels_agree {agree}{tail}")


if __name__ == "__main__":
    main()
