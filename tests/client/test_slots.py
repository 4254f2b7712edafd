"""Slot leases: never two requests in flight on one llama.cpp slot (issue 22, section 1).

Threads through the real client and a fake server that holds its first answer open, the lease
table alone for the choice of a slot, and a second process (killed for real) for the lock
across processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import Reply, Script

from boxmaker.client import Client
from boxmaker.client._slots import SlotLeases, lock_folder
from boxmaker.config import ClientConfig
from boxmaker.errors import RequestCancelled
from boxmaker.events import ClientEvent, SlotWait

URL = "http://llama.test"
ROOT = Path(__file__).resolve().parents[2]


def _messages(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


class _Server:
    """A MockTransport handler: ``slots`` in ``/props``; each chat answer waits for
    ``release``; records ``(id_slot, in flight on that slot at once)``."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots
        self.release = threading.Event()
        self.started = threading.Semaphore(0)
        self.props = 0
        self.seen: list[tuple[int, int]] = []
        self._running: dict[int, int] = {}
        self._lock = threading.Lock()

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            self.props += 1
            props = {} if self.slots is None else {"total_slots": self.slots}
            return httpx.Response(200, json=props)
        slot = json.loads(request.read())["id_slot"]
        with self._lock:
            self._running[slot] = self._running.get(slot, 0) + 1
            self.seen.append((slot, self._running[slot]))
        self.started.release()
        text = 'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}'

        def body() -> Iterator[bytes]:  # the head at once (llama.cpp's: the task started)
            self.release.wait(10)
            with self._lock:
                self._running[slot] -= 1
            yield f"{text}\n\ndata: [DONE]\n\n".encode()

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def _client(server: _Server, leases: SlotLeases) -> Client:
    return Client(
        ClientConfig(url=URL, retry_attempts=0),
        transport=httpx.MockTransport(server.handler),
        leases=leases,
    )


def _run(client: Client, body: dict[str, Any], events: list[ClientEvent]) -> threading.Thread:
    thread = threading.Thread(
        target=client.chat_with_retry, args=(body, events.append), daemon=True
    )
    thread.start()
    return thread


def test_a_second_request_pinned_to_a_busy_slot_waits_for_it(tmp_path: Path) -> None:
    server, leases = _Server(slots=1), SlotLeases(tmp_path)
    client = _client(server, leases)
    first: list[ClientEvent] = []
    second: list[ClientEvent] = []
    a = _run(client, {"messages": _messages("Paris"), "id_slot": 0}, first)
    assert server.started.acquire(timeout=5)
    b = _run(client, {"messages": _messages("Lima"), "id_slot": 0}, second)
    assert not server.started.acquire(timeout=0.3)  # the second is not sent while 0 is held
    assert second == [SlotWait(url=URL, slot=0)]
    server.release.set()
    a.join(5)
    b.join(5)
    assert server.seen == [(0, 1), (0, 1)]  # one request at a time on slot 0
    assert server.props == 0  # a pin needs no slot count


def test_the_default_takes_another_free_slot_and_keeps_each_session_on_its_own(
    tmp_path: Path,
) -> None:
    server, leases = _Server(slots=2), SlotLeases(tmp_path)
    client = _client(server, leases)
    a = _run(client, {"messages": _messages("Paris")}, [])
    assert server.started.acquire(timeout=5)
    b = _run(client, {"messages": _messages("Lima")}, [])
    assert server.started.acquire(timeout=5)  # not waiting: slot 1 was free
    server.release.set()
    a.join(5)
    b.join(5)
    assert sorted(server.seen) == [(0, 1), (1, 1)] and server.props == 1
    # each session's next request goes back to the slot holding its prompt (cache warm)
    for text, slot in (("Lima", 1), ("Paris", 0), ("Lima", 1)):
        with leases.lease(
            URL, None, _messages(text, "more"), count=lambda: 2, on_wait=print
        ) as got:
            assert got == slot
    # a new conversation takes the slot used least recently
    with leases.lease(URL, None, _messages("Oslo"), count=lambda: 2, on_wait=print) as got:
        assert got == 0


def test_an_unknown_slot_count_means_one_slot_and_requests_wait(tmp_path: Path) -> None:
    server, leases = _Server(slots=None), SlotLeases(tmp_path)
    client = _client(server, leases)
    second: list[ClientEvent] = []
    a = _run(client, {"messages": _messages("Paris")}, [])
    assert server.started.acquire(timeout=5)
    b = _run(client, {"messages": _messages("Lima")}, second)
    assert not server.started.acquire(timeout=0.3)
    assert second == [SlotWait(url=URL, slot=None)] and server.props == 1
    server.release.set()
    a.join(5)
    b.join(5)
    assert server.seen == [(0, 1), (0, 1)]


def test_cancel_ends_the_wait_for_a_slot(tmp_path: Path) -> None:
    leases = SlotLeases(tmp_path)
    cancel = threading.Event()
    waits: list[int | None] = []
    with leases.lease(URL, 0, [], count=lambda: 1, on_wait=waits.append):
        threading.Timer(0.2, cancel.set).start()
        with (
            pytest.raises(RequestCancelled, match=r"waiting for a slot of http://llama\.test"),
            leases.lease(URL, 0, [], count=lambda: 1, on_wait=waits.append, cancel=cancel),
        ):
            raise AssertionError("the slot was given twice")
    assert waits == [0]
    with leases.lease(URL, 0, [], count=lambda: 1, on_wait=waits.append) as slot:
        assert slot == 0  # released by the first holder, and not taken by the cancelled one


def test_the_client_releases_the_slot_when_a_request_fails(tmp_path: Path) -> None:
    leases = SlotLeases(tmp_path)
    script = Script([Reply(status=500, error={"error": {"message": "boom"}}), Reply()])
    client = Client(
        ClientConfig(url=URL, retry_attempts=0),
        transport=httpx.MockTransport(script.handler),
        leases=leases,
    )
    with pytest.raises(Exception, match="boom"):
        client.chat({"messages": _messages("a")}, lambda e: None)
    assert client.chat({"messages": _messages("a")}, lambda e: None).content == "ok"
    assert [b["id_slot"] for b in script.bodies] == [0, 0]


def test_minus_one_is_sent_as_it_is_without_a_lease(tmp_path: Path) -> None:
    leases = SlotLeases(tmp_path)
    script = Script([Reply()])
    client = Client(
        ClientConfig(url=URL), transport=httpx.MockTransport(script.handler), leases=leases
    )
    with leases.lease(URL, 0, [], count=lambda: 1, on_wait=print):  # slot 0 held
        client.chat({"messages": _messages("a"), "id_slot": -1}, lambda e: None)
    assert script.bodies[0]["id_slot"] == -1


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from boxmaker.client._slots import SlotLeases
    leases = SlotLeases(Path(sys.argv[1]))
    with leases.lease(sys.argv[2], 0, [], count=lambda: 1, on_wait=print):
        print("held", flush=True)
        time.sleep(60)
    """
)


def test_a_slot_held_by_another_process_waits_and_a_sigkill_leaves_no_stale_lock(
    tmp_path: Path,
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path), URL],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        leases = SlotLeases(tmp_path)
        waits: list[int | None] = []
        got: list[int] = []

        def take() -> None:
            with leases.lease(URL, 0, [], count=lambda: 1, on_wait=waits.append) as slot:
                got.append(slot)

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        taker.join(0.5)
        assert taker.is_alive() and waits == [0] and got == []  # the other process holds 0
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(5)
        taker.join(5)
        assert got == [0]  # the kernel dropped the dead process's lock
    finally:
        holder.kill()
        holder.wait(5)
        if holder.stdout is not None:
            holder.stdout.close()


def test_the_lock_folder_is_the_runtime_folder_else_a_private_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    assert lock_folder() == tmp_path / "boxmaker" / "slots"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    folder = lock_folder()
    assert folder == tmp_path / "tmp" / f"boxmaker-{os.getuid()}" / "slots"
    assert folder.parent.stat().st_mode & 0o777 == 0o700  # no other user can hold our locks
