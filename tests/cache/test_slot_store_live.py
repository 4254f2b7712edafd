"""Warm forks live on the embedded server: one slot, no RAM prompt cache, slots saved to a
folder. A fork right away finds the slot; after another session used the slot, the saved
slot is restored; a corrupt or missing saved file gives a clear warning and a cold fork;
a server without ``--slot-save-path`` refuses saving. The parent's log never changes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import embedded_only

from boxmaker.cache import ColdFork, SlotStore, warm_fork
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config, SamplingConfig
from boxmaker.demo import demo_registry
from boxmaker.errors import SlotError
from boxmaker.records import Baseline, CacheLoss, ToolResult, Usage
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session
from boxmaker.testing import assert_log_well_formed
from boxmaker.tools import Registry
from boxmaker.turn import Replay, Runtime, continue_fork, run_turn

pytestmark = pytest.mark.live

SYSTEM = "You answer briefly. " * 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedServer, Path]]:
    embedded_only("needs --slot-save-path and one slot")
    slots = tmp_path_factory.mktemp("slots")
    server = EmbeddedServer(n_parallel=1, n_threads=2, cache_ram_mib=0, slot_save_path=slots)
    with server:
        yield server, slots


def first_reuse(fork: Session, before: int) -> float:
    usage = next(r for r in fork.records[before:] if isinstance(r, Usage))
    cache, prompt = usage.timings["cache_n"], usage.timings["prompt_n"]
    return cache / (cache + prompt)


def test_restore_after_the_slot_was_reused_and_a_corrupt_file_forks_cold(
    served: tuple[EmbeddedServer, Path], tmp_path: Path
) -> None:
    server, folder = served
    store = SlotStore(folder)
    with Client(ClientConfig(url=server.url)) as client:
        runtime = Runtime(
            config=Config(sampling=SamplingConfig(max_tokens=16)),
            client=client,
            registry=Registry(),
        )
        parent = Session.create(tmp_path, Baseline(system=SYSTEM))
        run_turn(parent, runtime, "Hello", store.saver(parent, client))
        assert [f.turn for f in store.files(parent.id)] == [1]
        before = parent.path.read_bytes()

        fork = parent.fork(at=1)
        assert warm_fork(fork, client, store).how == "slot"
        n = len(fork.records)
        continue_fork(fork, runtime, "Again")
        assert first_reuse(fork, n) > 0.9

        with Session.create(tmp_path / "other", Baseline(system="Other. " * 60)) as other:
            run_turn(other, runtime, "Hi")  # the one slot now holds another prompt
        fork = parent.fork(at=1)
        start = warm_fork(fork, client, store)
        assert start.how == "restored" and (start.tokens or 0) > 100
        n = len(fork.records)
        continue_fork(fork, runtime, "Again")
        assert first_reuse(fork, n) > 0.9

        with Session.create(tmp_path / "other", Baseline(system="More. " * 60)) as other:
            run_turn(other, runtime, "Hi")
        (folder / SlotStore.name(parent.id, 1)).write_bytes(b"not a slot" * 100)
        fork = parent.fork(at=1)
        with pytest.warns(ColdFork, match="missing or corrupt"):
            assert warm_fork(fork, client, store).how == "cold"
        n = len(fork.records)
        continue_fork(fork, runtime, "Again")  # runs, cold: nothing lost
        assert first_reuse(fork, n) < 0.5
        assert store.remove(parent.id) and not store.files(parent.id)
        # the cold fork filled the slot with the parent's prefix again: a fork finds it there
        assert warm_fork(parent.fork(at=1), client, store).how == "slot"
        with Session.create(tmp_path / "other", Baseline(system="Last. " * 60)) as other:
            run_turn(other, runtime, "Hi")
        with pytest.warns(ColdFork, match="is missing"):
            assert warm_fork(parent.fork(at=1), client, store).how == "cold"
        assert parent.path.read_bytes() == before


def test_a_server_without_slot_saving_refuses_with_a_clear_error(tmp_path: Path) -> None:
    embedded_only("starts a server without --slot-save-path")
    with (
        EmbeddedServer(n_parallel=1, n_threads=2) as server,
        Client(ClientConfig(url=server.url)) as client,
    ):
        runtime = Runtime(
            config=Config(sampling=SamplingConfig(max_tokens=8)),
            client=client,
            registry=Registry(),
        )
        session = Session.create(tmp_path, Baseline(system="Hi."))
        run_turn(session, runtime, "Hello")
        with pytest.raises(SlotError, match="--slot-save-path"):
            SlotStore().save(client, session)


def test_a_live_fork_replays_the_parents_tools_and_keeps_the_cache(
    served: tuple[EmbeddedServer, Path], tmp_path: Path
) -> None:
    server, _ = served
    registry = demo_registry()
    with Client(ClientConfig(url=server.url)) as client:
        runtime = Runtime(
            config=Config(sampling=SamplingConfig(max_tokens=240)),
            client=client,
            registry=registry,
        )
        parent = Session.create(tmp_path, Baseline(tools=registry.definitions()))
        run_turn(parent, runtime, "What is the weather in Paris?")
        ran = [r for r in parent.records if isinstance(r, ToolResult) and r.not_run is None]
        fork = parent.fork(at=1, rerun=True)
        runtime.replay = Replay.of(fork)
        continue_fork(fork, runtime)
        continue_fork(fork, runtime, "And the time there?")
    mine = fork.records[1:]
    results = [r for r in mine if isinstance(r, ToolResult)]
    if ran and results and results[0].name == ran[0].name:  # the model made the same call
        assert results[0].source == "replayed" and results[0].content == ran[0].content
    assert not [r for r in mine if isinstance(r, CacheLoss)]  # each request extended the last
    assert_log_well_formed(fork)
