"""``boxmaker fork`` on a live server (issue 39): the ``cache:`` line it prints is what the
fork's first request measured (its ``cache_n`` against the parent's prefix), whether the
parent's slot was still there, restored from its saved file, or neither."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import embedded_only

from boxmaker.cache import SlotStore, held_tokens
from boxmaker.cli import main
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, SamplingConfig
from boxmaker.records import Baseline, Usage, Warmed
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

pytestmark = pytest.mark.live

SYSTEM = "You answer briefly. " * 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedServer, Path]]:
    embedded_only("needs --slot-save-path, one slot and no RAM prompt cache")
    slots = tmp_path_factory.mktemp("slots")
    server = EmbeddedServer(n_parallel=1, n_threads=2, cache_ram_mib=0, slot_save_path=slots)
    with server:
        yield server, slots


def _fork(parent: Path, url: str, slots: Path, capsys: pytest.CaptureFixture[str]) -> str:
    before = set(parent.parent.glob("*.jsonl"))
    args = ["fork", str(parent), "--at", "1", "--say", "Again", "--url", url]
    assert main([*args, "--slot-save-path", str(slots), "--set", "sampling.max_tokens=16"]) == 0
    out = capsys.readouterr().out
    (path,) = set(parent.parent.glob("*.jsonl")) - before
    with Session.open(path, read_only=True) as fork:
        assert fork.forked is not None
        copies, own = fork.records[: fork.forked.record], fork.records[fork.forked.record :]
    last = next(r for r in reversed(copies) if isinstance(r, Usage))
    first = next(r for r in own if isinstance(r, Usage))
    (warmed,) = [r for r in own if isinstance(r, Warmed)]
    prefix, reused = held_tokens(last.timings), int(first.timings["cache_n"])
    assert (warmed.prefix, warmed.reused) == (prefix, reused)
    assert prefix is not None
    used = min(reused, prefix)
    said = f"{used} of {prefix} prefix tokens reused ({used / prefix:.2f})"
    (line,) = [x for x in out.splitlines() if x.startswith("cache: ")]
    assert said in line
    return line


def test_the_fork_message_is_the_forks_first_cache_n(
    served: tuple[EmbeddedServer, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, slots = served
    store = SlotStore(slots)
    with Client(ClientConfig(url=server.url)) as client:
        runtime = Runtime(
            config=Config(sampling=SamplingConfig(max_tokens=16)),
            client=client,
            registry=Registry(),
        )
        parent = Session.create(tmp_path, Baseline(system=SYSTEM))
        run_turn(parent, runtime, "Hello", store.saver(parent, client))
        parent.close()
        # this process's leases know slot 0 holds the parent's prefix: measured warm
        assert re.match(
            r"cache: slot 0 held the parent's prefix: ",
            _fork(parent.path, server.url, slots, capsys),
        )
        with Session.create(tmp_path / "other", Baseline(system="Other. " * 60)) as other:
            run_turn(other, runtime, "Hi")  # the one slot now holds another prompt
    line = _fork(parent.path, server.url, slots, capsys)
    assert line.startswith(f"cache: restored {parent.id}.turn-1.bin into slot 0: ")
    with (
        Client(ClientConfig(url=server.url)) as client,
        Session.create(tmp_path / "other", Baseline(system="More. " * 60)) as other,
    ):
        run_turn(other, Runtime(config=runtime.config, client=client, registry=Registry()), "Hi")
    (slots / SlotStore.name(parent.id, 1)).unlink()  # nothing to restore: measured cold
    line = _fork(parent.path, server.url, slots, capsys)
    assert line.startswith("cache: cold: ") and "is missing" in line
