"""Re-record the cassettes under cassettes/ from the embedded llama.cpp server.

Usage: python scripts/record_cassettes.py [--model PATH]

For each recording it starts the embedded server on the shipped model (or PATH), runs the
conversation with the demo tools through the real client and turn loop inside a vcrpy
cassette (record mode ``all``, streamed as it arrives), and writes beside the cassette the
session log the run made (``<name>.session.jsonl``), which the replay tests compare against
record by record.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from boxmaker.cassettes import use_cassette
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, LoopLimits
from boxmaker.demo import DEMO_PROMPTS, DEMO_SYSTEM, ConsoleView, demo_registry
from boxmaker.errors import TurnError
from boxmaker.records import Baseline
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = ROOT / "cassettes"

RECORDINGS: dict[str, tuple[tuple[str, ...], int | None]] = {
    "demo-turns": (DEMO_PROMPTS[:2], None),
    "demo-thinking-cap": (DEMO_PROMPTS[:1], 8),
}
"""Cassette name -> (the user messages of its session, one turn each; the thinking cap,
``loop.thinking_tokens``, or ``None``). The capped one holds reasoning-control requests."""


def record(
    name: str, prompts: tuple[str, ...], thinking_tokens: int | None, model: str | None
) -> Path:
    """Record one conversation; returns the cassette path."""
    cassette = CASSETTES / f"{name}.yaml"
    log_copy = CASSETTES / f"{name}.session.jsonl"
    cassette.unlink(missing_ok=True)
    registry = demo_registry()
    with EmbeddedServer(model, n_ctx=4096, n_threads=1) as server:
        config = Config(
            client=ClientConfig(url=server.url), loop=LoopLimits(thinking_tokens=thinking_tokens)
        )
        with tempfile.TemporaryDirectory() as tmp, use_cassette(cassette, "all"):
            session = Session.create(
                tmp, Baseline(system=DEMO_SYSTEM, tools=registry.definitions()), session_id=name
            )
            with Client(config.client) as client:
                runtime = Runtime(config=config, client=client, registry=registry)
                view = ConsoleView()
                for text in prompts:
                    print(f"\nyou> {text}")
                    try:
                        run_turn(session, runtime, text, view)
                    except TurnError as exc:
                        print(f"  [turn ended: {exc}]")
                    view.end()
            session.close()
            shutil.copyfile(session.path, log_copy)
    print(f"\nwrote {cassette.relative_to(ROOT)} and {log_copy.relative_to(ROOT)}")
    return cassette


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="GGUF to record from (default: shipped)")
    args = parser.parse_args()
    CASSETTES.mkdir(exist_ok=True)
    for name, (prompts, thinking_tokens) in RECORDINGS.items():
        record(name, prompts, thinking_tokens, args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
