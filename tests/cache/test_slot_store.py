"""Saved slots and warm forks on the shared fake server (a socket): the slot that still holds
the prefix, a restore after the slot was reused, a server without ``--slot-save-path``, a
missing saved file; every case leaves the logs as they were."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_llama import FakeLlama, Reply, running

from boxmaker.cache import ColdFork, SlotStore, warm_fork
from boxmaker.client import Client, SlotLeases
from boxmaker.config import ClientConfig, Config
from boxmaker.errors import SlotError
from boxmaker.records import Baseline
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, continue_fork, run_turn


@pytest.fixture
def server() -> Iterator[FakeLlama]:
    with running([Reply(content="Answer.")]) as fake:
        yield fake


def client_of(server: FakeLlama, leases: SlotLeases) -> Client:
    return Client(ClientConfig(url=server.url, retry_attempts=0), leases=leases)


def parent_of(tmp_path: Path, client: Client, store: SlotStore | None) -> Session:
    session = Session.create(tmp_path, Baseline(system="Be brief."))
    runtime = Runtime(config=Config(), client=client, registry=Registry())
    hook = store.saver(session, client) if store is not None else None
    run_turn(session, runtime, "One", hook)
    run_turn(session, runtime, "Two", hook)
    return session


def test_a_fork_right_away_finds_the_slot_that_holds_its_prefix(
    server: FakeLlama, tmp_path: Path
) -> None:
    leases = SlotLeases(tmp_path / "locks")
    (tmp_path / "locks").mkdir()
    with client_of(server, leases) as client:
        parent = parent_of(tmp_path, client, None)
        fork = parent.fork(at=2)
        assert warm_fork(fork, client).how == "slot"
        # before turn 2's answer: the slot's longer prompt starts with the fork's messages
        earlier = parent.fork(at=2, rerun=True)
        assert warm_fork(earlier, client).how == "slot"
        assert client.holder([{"role": "user", "content": "Something else"}]) is None


def test_saved_at_each_turn_end_and_restored_after_the_slot_was_reused(
    server: FakeLlama, tmp_path: Path
) -> None:
    server.slot_files = {}
    store = SlotStore()
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        parent = parent_of(tmp_path, client, store)
    assert server.slot_files == {f"{parent.id}.turn-1.bin": 0, f"{parent.id}.turn-2.bin": 0}
    before = parent.path.read_bytes()
    with client_of(server, SlotLeases(locks)) as other:  # another process: knows no slot
        other_session = Session.create(tmp_path / "other")
        run_turn(other_session, Runtime(config=Config(), client=other, registry=Registry()), "x")
        fork = parent.fork(at=1)
        start = warm_fork(fork, other, store)
        assert (start.how, start.slot, start.file, start.tokens) == (
            "restored", 0, f"{parent.id}.turn-1.bin", 40)  # fmt: skip
        assert other.holder([*fork.messages(), {"role": "user", "content": "Three"}]) == 0
        continue_fork(fork, Runtime(config=Config(), client=other, registry=Registry()), "Three")
    assert server.bodies[-1]["id_slot"] == 0
    assert parent.path.read_bytes() == before


def test_a_server_without_slot_saving_gives_a_cold_fork_with_a_warning(
    server: FakeLlama, tmp_path: Path
) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        parent = parent_of(tmp_path, client, None)
        with pytest.raises(SlotError, match="--slot-save-path"):
            SlotStore().save(client, parent)
    fork = parent.fork(at=2)
    records = fork.records
    with (
        client_of(server, SlotLeases(locks)) as fresh,
        pytest.warns(ColdFork, match="cannot save or restore slots"),
    ):
        start = warm_fork(fork, fresh, SlotStore())
    assert start.how == "cold" and "--slot-save-path" in start.detail
    assert fork.records == records


def test_a_missing_saved_slot_is_a_clear_error_and_a_cold_fork(
    server: FakeLlama, tmp_path: Path
) -> None:
    server.slot_files = {}
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        parent = parent_of(tmp_path, client, None)  # nothing saved
    fork = parent.fork(at=2)
    with client_of(server, SlotLeases(locks)) as fresh:
        with pytest.raises(SlotError, match="missing or corrupt"):
            SlotStore().restore(fresh, parent.id, 2, 0)
        with pytest.warns(ColdFork, match="missing or corrupt"):
            assert warm_fork(fork, fresh, SlotStore()).how == "cold"
        (tmp_path / "slots").mkdir()
        local = SlotStore(tmp_path / "slots")
        with pytest.raises(SlotError, match="is missing"):
            local.restore(fresh, parent.id, 2, 0)
        with pytest.warns(ColdFork, match="no slot store"):
            assert warm_fork(fork, fresh).how == "cold"
        before = parent.fork(at=1, rerun=True)
        with pytest.warns(ColdFork, match="nothing was saved"):
            assert warm_fork(before, fresh, SlotStore()).how == "cold"


def test_saved_slots_are_listed_by_session_and_turn_and_removed_with_the_session(
    tmp_path: Path,
) -> None:
    tmp_path = tmp_path / "slots"
    tmp_path.mkdir()
    store = SlotStore(tmp_path)
    for name in ("a.turn-2.bin", "a.turn-10.bin", "b.turn-1.bin", "a.turn-x.bin", "other.txt"):
        (tmp_path / name).write_bytes(b"x")
    assert [(f.session, f.turn) for f in store.files()] == [("a", 2), ("a", 10), ("b", 1)]
    assert [f.name for f in store.remove("a")] == ["a.turn-2.bin", "a.turn-10.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.turn-x.bin", "b.turn-1.bin",
                                                          "other.txt"]  # fmt: skip
    assert SlotStore().files() == [] and SlotStore.name("s", 3) == "s.turn-3.bin"


def test_a_pinned_fork_counts_only_its_own_slot_and_restores_into_it(
    server: FakeLlama, tmp_path: Path
) -> None:
    server.slot_files = {}
    store = SlotStore()
    (tmp_path / "locks").mkdir()
    with client_of(server, SlotLeases(tmp_path / "locks")) as client:
        parent = parent_of(tmp_path, client, store)  # slot 0 holds the parent's prompt
        fork = parent.fork(at=1)
        assert warm_fork(fork, client, store, slot=0, pinned=True).how == "slot"
        start = warm_fork(fork, client, store, slot=1, pinned=True)  # slot 0 is another run's
        assert (start.how, start.slot, start.file) == ("restored", 1, f"{parent.id}.turn-1.bin")
        assert client.holder(fork.messages(), [1]) == 1
        with pytest.raises(SlotError, match="needs the slot"):
            warm_fork(fork, client, store, pinned=True)


def test_a_store_takes_a_plain_string_or_any_path_like_folder(
    server: FakeLlama, tmp_path: Path
) -> None:
    folder = tmp_path / "slots"
    folder.mkdir()
    (folder / "a.turn-1.bin").write_bytes(b"x")
    for given in (str(folder), folder, _PathLike(folder)):
        store = SlotStore(given)
        assert store.folder == folder and store == SlotStore(folder)
        assert [(f.session, f.turn, f.path) for f in store.files()] == [
            ("a", 1, folder / "a.turn-1.bin")]  # fmt: skip
    server.slot_files = {}
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        parent = parent_of(tmp_path, client, None)  # nothing saved
    fork = parent.fork(at=2)
    # a plain string raised TypeError here: now a cold fork, with the warning
    with client_of(server, SlotLeases(locks)) as fresh, pytest.warns(ColdFork, match="is missing"):
        start = warm_fork(fork, fresh, SlotStore(str(folder)))
    assert start.how == "cold" and str(folder) in start.detail


class _PathLike:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __fspath__(self) -> str:
        return str(self.path)


def test_a_folder_the_store_cannot_use_is_refused_at_once(
    server: FakeLlama, tmp_path: Path
) -> None:
    with pytest.raises(SlotError, match="does not exist"):
        SlotStore(tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(SlotError, match="is not a folder"):
        SlotStore(str(tmp_path / "file"))
    # the server saves elsewhere than the folder given: said at the first save
    server.slot_files = {}
    locks = tmp_path / "locks"
    locks.mkdir()
    (tmp_path / "slots").mkdir()
    store = SlotStore(tmp_path / "slots")
    with client_of(server, SlotLeases(locks)) as client:
        parent = parent_of(tmp_path, client, None)
        with pytest.raises(SlotError, match=r"but not in .*--slot-save-path"):
            store.save(client, parent)


def test_check_says_whether_the_server_saves_slots_without_writing_a_file(
    server: FakeLlama, tmp_path: Path
) -> None:
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        with pytest.raises(SlotError, match="--slot-save-path"):
            SlotStore().check(client)
        server.slot_files = {}
        SlotStore().check(client)
    assert server.slot_files == {}


def test_a_saver_pinned_to_a_slot_saves_that_slot(server: FakeLlama, tmp_path: Path) -> None:
    server.slot_files = {}
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        session = Session.create(tmp_path, Baseline(system="Be brief."))
        runtime = Runtime(config=Config(), client=client, registry=Registry())
        run_turn(session, runtime, "One", SlotStore().saver(session, client, slot=1))
    assert server.slot_files == {f"{session.id}.turn-1.bin": 1}


def test_a_prefill_sends_the_forks_prefix_once_into_the_slot_found(
    server: FakeLlama, tmp_path: Path
) -> None:
    """On a sliding-window model the slot found is prefilled with the fork's messages
    (``max_tokens`` 0, pinned to it), so a checkpoint ends where the fork begins; its cost is
    kept. Not on a model without a sliding window (``None``: the server's ``n_swa``), never
    for a cold fork."""
    locks = tmp_path / "locks"
    locks.mkdir()
    with client_of(server, SlotLeases(locks)) as client:
        parent = parent_of(tmp_path, client, None)
        fork = parent.fork(at=2)
        sent = len(server.bodies)
        start = warm_fork(fork, client)  # the fake's /props states no n_swa: no prefill
        assert (start.how, start.prefilled, len(server.bodies)) == ("slot", None, sent)
        start = warm_fork(fork, client, prefill=True)
        assert (start.how, start.slot, start.prefilled, start.prefill_ms) == ("slot", 0, 10, 1.0)
        (body,) = server.bodies[sent:]
        assert (body["max_tokens"], body["id_slot"]) == (0, 0)
        assert body["messages"] == fork.messages()
    with client_of(server, SlotLeases(locks)) as fresh, pytest.warns(ColdFork):
        assert warm_fork(fork, fresh, prefill=True).prefilled is None
    assert len(server.bodies) == sent + 1
