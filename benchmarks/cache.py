"""Benchmark: prompt tokens re-processed over the demo's session, history ``drop`` vs ``keep``.

Runs the three prompts of ``boxmaker demo`` as one session on the embedded server (the shipped
model, one slot), once with ``history.reasoning = "drop"`` (today's requests: the template
drops every earlier reasoning at a new user turn) and once with ``"keep"`` (the reasoning is
rendered back), and sums the ``CacheLoss`` records of each: tokens the server had to process
again (``reprocessed_tokens``, the replies included) and the time that cost (``reprocessed_ms``,
as :func:`boxmaker.frames.cache_losses` gives them), and each loss's cause as forensics found it.

    python benchmarks/cache.py [--threads 1]

The last line printed is ``lost_drop N lost_keep M`` (tokens re-processed; goal: M = 0).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, HistoryConfig
from boxmaker.demo import DEMO_PROMPTS, DEMO_SYSTEM, demo_registry
from boxmaker.frames import cache_losses
from boxmaker.records import Baseline
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.turn import Runtime, run_turn


def run_session(url: str, folder: Path, reasoning: str) -> Path:
    """The demo's prompts as one session with ``history.reasoning = reasoning``; its log."""
    config = Config(client=ClientConfig(url=url), history=HistoryConfig(reasoning=reasoning))
    registry = demo_registry()
    baseline = Baseline(system=DEMO_SYSTEM, tools=registry.definitions())
    with Session.create(folder, baseline) as session, Client(config.client) as client:
        runtime = Runtime(config=config, client=client, registry=registry)
        for prompt in DEMO_PROMPTS:
            run_turn(session, runtime, prompt)
        return session.path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    lost: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for reasoning in ("drop", "keep"):
            # --no-reasoning-preserve: the template drops earlier reasoning, which the client's
            # history.reasoning = "keep" undoes (llama-server's default keeps it: nothing lost)
            server = EmbeddedServer(n_ctx=4096, n_threads=args.threads, reasoning_preserve=False)
            with server:
                log = run_session(server.url, Path(tmp) / reasoning, reasoning)
            frame = cache_losses(log)
            lost[reasoning] = int(frame["reprocessed_tokens"].sum(skipna=False))
            ms = float(frame["reprocessed_ms"].sum(skipna=False))
            print(f"{reasoning}: {len(frame)} loss(es), {lost[reasoning]} tokens, {ms:.1f} ms")
            for row in frame.itertuples():
                print(
                    f"  request {row.request}: {row.cause} at token {row.position}, "
                    f"{row.lost_tokens} tokens of the prompt lost, "
                    f"{row.reprocessed_tokens} re-processed"
                )
    print(f"lost_drop {lost['drop']} lost_keep {lost['keep']}")


if __name__ == "__main__":
    main()
