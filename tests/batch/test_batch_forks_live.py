"""A batch of forks on the embedded llama.cpp server (the shipped model, one slot): a two-turn
parent forked at turn 1 under two grid settings, each fork's new turn run live and warm."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from boxmaker.batch import ForkTask, Task, frames, manifest, run_batch
from boxmaker.batch._manifest import read_manifest
from boxmaker.demo import demo_registry
from boxmaker.records import Forked, TurnEnd, Usage, User
from boxmaker.server import EmbeddedServer
from boxmaker.session import Session

pytestmark = pytest.mark.live

TOOLS = demo_registry()
PARENT = ("What is the weather in Lisbon?", "What time is it in Tokyo?")
GRID = {"loop.tool_result_cap": [8, 4000]}


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    with EmbeddedServer(n_ctx=4096, n_parallel=1, n_threads=1) as s:
        yield s


def test_forks_at_turn_one_under_two_settings_run_warm_on_the_one_slot(
    server: EmbeddedServer, tmp_path: Path
) -> None:
    first = run_batch(
        [Task(id="parent", messages=PARENT)], tmp_path / "p", servers=[server], registry=TOOLS
    )
    assert (first.done, first.failed) == (1, 0)
    parent = tmp_path / "p" / "logs" / "parent.jsonl"
    with Session.open(parent, read_only=True) as session:
        parent_records = session.records
    turn_two = [i for i, r in enumerate(parent_records) if isinstance(r, User)][1]
    turn_one_usage = [r for r in parent_records[:turn_two] if isinstance(r, Usage)][-1]
    prefix = turn_one_usage.timings["cache_n"] + turn_one_usage.timings["prompt_n"]

    batch = tmp_path / "forks"
    task = ForkTask(id="tokyo", parent=parent, at=1)
    progress = run_batch([task], batch, servers=[server], registry=TOOLS, grid=GRID)
    assert (progress.done, progress.failed, progress.slots) == (2, 0, 1)
    runs = manifest(batch)
    assert sorted(runs["loop.tool_result_cap"]) == [8, 4000]
    assert list(runs["state"]) == ["done", "done"] and list(runs["turns"]) == [1, 1]
    assert list(runs["slot"]) == [0, 0]
    assert list(runs["warm"]) == ["slot", "slot"]  # the one slot held the parent's prefix
    requests = {}
    for run, entry in read_manifest(batch).items():
        with Session.open(batch / "logs" / f"{run}.jsonl", read_only=True) as fork:
            records = fork.records
        forked = records[0]
        assert isinstance(forked, Forked)
        assert (forked.parent_session, forked.turn, forked.record) == ("parent", 1, turn_two + 1)
        assert forked.settings == entry["settings"]
        assert list(records[1 : forked.record]) == list(parent_records[:turn_two])
        own = records[forked.record :]
        assert isinstance(own[0], User) and own[0].content == PARENT[1]
        assert isinstance(own[-1], TurnEnd) and own[-1].outcome == "answered"
        usages = [r for r in own if isinstance(r, Usage)]
        assert usages and all(u.timings["predicted_n"] > 0 for u in usages)
        requests[run] = len(usages)
        # the fork's first request reused the parent's whole turn-1 prompt from the slot
        reused, processed = usages[0].timings["cache_n"], usages[0].timings["prompt_n"]
        assert reused >= prefix > 0
        # its new turn is the parent's turn 2 again, which the slot still held: all but a token
        assert reused / (reused + processed) > 0.9
    forks = frames(batch, "forks")
    assert dict(zip(forks["session"], forks["requests"], strict=True)) == requests
    assert set(forks["parent_session"]) == {"parent"} and set(forks["fork_turn"]) == {1}
    summary = frames(batch, "summary")
    assert set(summary["fork_turn"]) == {1}
