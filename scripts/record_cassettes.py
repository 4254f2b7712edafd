"""Re-record the cassettes under cassettes/ from the embedded llama.cpp server.

Usage: python scripts/record_cassettes.py [--model PATH] [NAME ...]

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
from boxmaker.demo import DEMO_PROMPTS, DEMO_SYSTEM, demo_registry
from boxmaker.errors import TurnError
from boxmaker.records import Baseline
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn
from boxmaker.view import ConsoleView

ROOT = Path(__file__).resolve().parent.parent
CASSETTES = ROOT / "cassettes"

LOOP_PROMPT = "Keep checking the weather in Paris and the time in London."
"""The model card's cycling prompt: the model alternates get_weather and get_time."""

RECORDINGS: dict[str, tuple[tuple[str, ...], LoopLimits]] = {
    "demo-turns": (DEMO_PROMPTS[:2], LoopLimits()),
    "demo-thinking-cap": (DEMO_PROMPTS[:1], LoopLimits(thinking_tokens=8)),
    "loop-cycle": (
        (LOOP_PROMPT,),
        LoopLimits(tool_iterations=5, repeat_detection=False, cycle_length=None),
    ),
}
"""Cassette name -> (the user messages of its session, one turn each; the loop limits). The
capped one sends its budget as ``thinking_budget_tokens``; ``loop-cycle`` is a looping turn
recorded with the loop guard off (every call ran, until the tool-iteration limit), for
``boxmaker replay`` with other guard settings."""


def record(name: str, prompts: tuple[str, ...], loop: LoopLimits, model: str | None) -> Path:
    """Record one conversation; returns the cassette path."""
    cassette = CASSETTES / f"{name}.yaml"
    log_copy = CASSETTES / f"{name}.session.jsonl"
    cassette.unlink(missing_ok=True)
    registry = demo_registry()
    with EmbeddedServer(model, n_ctx=4096, n_threads=1) as server:
        config = Config(client=ClientConfig(url=server.url), loop=loop)
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
    CASSETTES.mkdir(exist_ok=True)
    parser.add_argument("names", nargs="*", help=f"which ones (default: all of {list(RECORDINGS)})")
    args = parser.parse_args()
    for name in args.names or RECORDINGS:
        prompts, loop = RECORDINGS[name]
        record(name, prompts, loop, args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
