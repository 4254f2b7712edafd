"""Who picks the slot (issue 39 item 3): llama-server's default ``--cache-idle-slots`` (with
a unified KV cache) clears every idle slot when another starts a task, and a request pinned
to the emptied slot is not reloaded from the RAM cache, so there the client lets the server
pick (``id_slot`` -1); elsewhere it keeps its pins.

A stand-in server models what llama.cpp's ``get_available_slot`` and ``/slots`` do (tokens
are messages here), the client runs for real against it; the shared locks are the real
``flock`` ones.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.cache import SlotStore
from boxmaker.client import Client
from boxmaker.client._slots import SlotLeases
from boxmaker.config import ClientConfig
from boxmaker.errors import ConfigError, InferError, RequestCancelled, SlotError, StreamCut
from boxmaker.events import ClientEvent
from boxmaker.records import Baseline
from boxmaker.session import Session

URL = "http://llama.test"


class _Llama:
    """llama.cpp's slot choice, in messages: a pinned request runs in its slot (reusing what
    the slot holds of its prompt, nothing when the slot was emptied); an unpinned one goes to
    the idle slot sharing most of its prompt, else to the least recently used one, loaded
    from the RAM cache. Starting a task saves every idle slot to the RAM cache and, with
    ``clears``, empties it (``--cache-idle-slots``)."""

    def __init__(self, slots: int, *, clears: bool, has_slots: bool = True) -> None:
        self.clears = clears
        self.has_slots = has_slots
        self.held: list[list[Any]] = [[] for _ in range(slots)]
        self.task: list[int | None] = [None] * slots
        self.used = [0] * slots
        self.ram: list[list[Any]] = []
        self.tick = 0
        self.sent: list[int] = []  # each chat request's id_slot
        self.looks = 0

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/slots":
            self.looks += 1
            if not self.has_slots:
                return httpx.Response(501, json={"error": {"message": "no slots endpoint"}})
            return httpx.Response(200, json=self._slots())
        if request.url.path == "/props":
            return httpx.Response(200, json={"total_slots": len(self.held)})
        body = json.loads(request.read())
        messages, pin = body["messages"], body["id_slot"]
        self.sent.append(pin)
        slot = pin if pin >= 0 else self._pick(messages)
        if any(m.get("content") == "too long" for m in messages):  # llama.cpp's 400: the
            self.tick += 1  # task was made in the slot, which holds nothing
            self.held[slot], self.task[slot] = [], self.tick
            error = {"error": {"code": 400, "message": "exceeds the available context size"}}
            return httpx.Response(400, json=error)
        reused = _common(self.held[slot], messages)
        if pin < 0 and reused == 0:
            reused = max((_common(m, messages) for m in self.ram), default=0)
        self.tick += 1
        reply = {"role": "assistant", "content": "ok"}  # the slot holds prompt and reply
        self.held[slot], self.task[slot] = [*messages, reply], self.tick
        self.used[slot] = self.tick
        for other in range(len(self.held)):  # the task starts: every idle slot saved, cleared
            if other != slot and self.held[other]:
                self.ram.append(self.held[other])
                if self.clears:
                    self.held[other] = []
        if any(m.get("content") == "cut" for m in messages):  # the head, then a cut stream

            def cut() -> Iterator[bytes]:
                yield b'data: {"choices":[{"index":0,"delta":{"content":"o"}}]}\n\n'
                raise httpx.RemoteProtocolError("peer closed connection")

            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=cut())
        chunk = {
            "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
            "timings": {"cache_n": reused, "prompt_n": len(messages) - reused},
        }
        text = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, text=text)

    def _pick(self, messages: list[Any]) -> int:
        best = max(range(len(self.held)), key=lambda s: _common(self.held[s], messages))
        if _common(self.held[best], messages) > 0:
            return best
        return min(range(len(self.held)), key=lambda s: self.used[s])

    def _slots(self) -> list[dict[str, Any]]:
        slots = []
        for i, held in enumerate(self.held):
            slot: dict[str, Any] = {"id": i, "n_ctx": 4096, "is_processing": False}
            if self.task[i] is not None:
                slot.update(id_task=self.task[i], n_prompt_tokens=len(held))
            slots.append(slot)
        return slots


def _common(a: list[Any], b: list[Any]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _client(server: _Llama, leases: SlotLeases, choice: str = "auto") -> Client:
    config = ClientConfig(url=URL, retry_attempts=0, slot_choice=choice)
    return Client(config, transport=httpx.MockTransport(server.handler), leases=leases)


def _turn(client: Client, messages: list[Any], slot: int | None = None) -> int:
    """One request; the prompt tokens (messages here) it reused."""
    body: dict[str, Any] = {"messages": messages}
    if slot is not None:
        body["id_slot"] = slot
    events: list[ClientEvent] = []
    done = client.chat_with_retry(body, events.append)
    messages.append({"role": "assistant", "content": done.content})
    assert done.timings is not None
    return int(done.timings["cache_n"])


def _two_sessions(client: Client) -> tuple[list[Any], list[Any], list[int]]:
    """Session a on slot 0, then b on slot 1 (its task starts while a's slot is idle), then
    each's next turn; the reuse of those two next turns."""
    a = [{"role": "user", "content": "Paris"}]
    b = [{"role": "user", "content": "Lima"}]
    _turn(client, a, 0)
    _turn(client, b, 1)
    a.append({"role": "user", "content": "more"})
    b.append({"role": "user", "content": "more"})
    return a, b, [_turn(client, a, 0), _turn(client, b, 1)]


def test_a_server_that_clears_idle_slots_picks_them_and_the_prompts_are_reused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = _Llama(2, clears=True)
    client = _client(server, SlotLeases(tmp_path))
    assert not client.server_picks_slots
    with caplog.at_level(logging.WARNING, logger="boxmaker.client"):
        a, _b, reused = _two_sessions(client)
    # a's slot was emptied when b started: seen, and the server picked (RAM cache)
    assert server.sent == [0, 1, -1, -1]
    assert reused == [len(a) - 2, 2]  # all but the new user message (and the reply to come)
    assert client.server_picks_slots and client.last_slot is None
    assert server.looks == 1
    assert "--no-cache-idle-slots" in caplog.text and "cleared idle slot 0" in caplog.text


def test_the_pin_would_have_lost_the_prompt_there(tmp_path: Path) -> None:
    """The same traffic with the pins kept (``slot_choice="client"``): the loss the issue
    measured on upstream defaults; the client never looks."""
    server = _Llama(2, clears=True)
    client = _client(server, SlotLeases(tmp_path), "client")
    _a, _b, reused = _two_sessions(client)
    assert server.sent == [0, 1, 0, 1] and reused == [0, 0] and server.looks == 0


def test_a_server_that_keeps_idle_slots_keeps_the_pins(tmp_path: Path) -> None:
    server = _Llama(2, clears=False)
    client = _client(server, SlotLeases(tmp_path))
    _a, _b, reused = _two_sessions(client)
    assert server.sent == [0, 1, 0, 1] and reused == [2, 2]
    assert server.looks == 2  # two looks told: kept while another task started (one: a race?)
    assert not client.server_picks_slots and client.last_slot == 1


def test_without_a_slots_endpoint_the_pins_stay(tmp_path: Path) -> None:
    server = _Llama(2, clears=True, has_slots=False)
    client = _client(server, SlotLeases(tmp_path))
    _a, _b, reused = _two_sessions(client)
    assert server.sent == [0, 1, 0, 1] and reused == [0, 0]  # named by forensics instead
    assert server.looks == 1 and not client.server_picks_slots


def test_server_choice_sends_every_request_unpinned(tmp_path: Path) -> None:
    server = _Llama(2, clears=True)
    client = _client(server, SlotLeases(tmp_path), "server")
    _a, _b, reused = _two_sessions(client)
    assert server.sent == [-1, -1, -1, -1] and reused == [2, 2] and server.looks == 0
    assert client.server_picks_slots


def test_a_slot_cannot_be_saved_where_the_server_picks(tmp_path: Path) -> None:
    server = _Llama(2, clears=True)
    client = _client(server, SlotLeases(tmp_path), "server")
    session = Session.create(tmp_path / "logs", Baseline(system="s"))
    _turn(client, [{"role": "user", "content": "Paris"}])
    with pytest.raises(SlotError, match=r"picks the slot.*--no-cache-idle-slots"):
        SlotStore().save(client, session)
    with pytest.raises(SlotError, match=r"picks the slot"):  # a slot named: another's now
        SlotStore().save(client, session, slot=0)


def test_an_unknown_slot_choice_is_refused() -> None:
    with pytest.raises(ConfigError, match="slot_choice = 'sometimes'"):
        ClientConfig(slot_choice="sometimes")


def _two() -> int:
    return 2


def _quiet(_slot: int | None) -> None:
    pass


def test_a_request_the_server_places_and_a_pin_never_run_together(tmp_path: Path) -> None:
    """The shared locks of :meth:`SlotLeases.any_slot` against a pin's own lock, both
    ways; requests the server places share them."""
    leases = SlotLeases(tmp_path)
    pinned = threading.Event()
    placed = leases.any_slot(URL, count=_two, on_wait=_quiet)
    with placed, leases.any_slot(URL, count=_two, on_wait=_quiet):  # two at once
        cancel = threading.Event()

        def pin() -> None:
            try:
                with leases.lease(URL, 1, [], cancel=cancel, count=_two, on_wait=_quiet):
                    pinned.set()
            except RequestCancelled:
                pass

        waiter = threading.Thread(target=pin)
        waiter.start()
        assert not pinned.wait(0.3)  # slot 1 waits while the server may place a request there
    assert pinned.wait(5)
    waiter.join(5)
    with leases.lease(URL, 0, [], count=_two, on_wait=_quiet):
        stop = threading.Event()
        stop.set()
        waiting = leases.any_slot(URL, cancel=stop, count=_two, on_wait=_quiet)
        with pytest.raises(RequestCancelled), waiting:
            pass  # and the other way round


def test_sessions_in_two_processes_see_each_others_tasks(tmp_path: Path) -> None:
    """Two processes (two lease tables over one lock folder): the second's task empties the
    first's idle slot; the first's follow-up sees that through the launches counted in the
    lock folder, looks, and lets the server pick."""
    server = _Llama(2, clears=True)
    first = _client(server, SlotLeases(tmp_path))
    second = _client(server, SlotLeases(tmp_path))
    a = [{"role": "user", "content": "Paris"}]
    b = [{"role": "user", "content": "Lima"}]
    _turn(first, a, 0)
    _turn(second, b, 1)
    a.append({"role": "user", "content": "more"})
    assert _turn(first, a, 0) == 2
    assert server.sent == [0, 1, -1] and server.looks == 1 and first.server_picks_slots


def test_a_failed_request_is_no_sign_that_the_server_clears_idle_slots(tmp_path: Path) -> None:
    """llama.cpp leaves a slot whose request it refused holding nothing: that is no slot
    cleared while idle, and the pins stay."""
    server = _Llama(3, clears=False)
    client = _client(server, SlotLeases(tmp_path))
    too_long = [{"role": "user", "content": "too long"}]
    for slot in (2, 1, 2):
        with pytest.raises(InferError):
            _turn(client, list(too_long), slot)
        _turn(client, [{"role": "user", "content": f"other {slot}"}], 0 if slot == 2 else 1)
    assert not client.server_picks_slots and -1 not in server.sent


def test_a_request_that_never_started_is_not_counted_as_a_task(tmp_path: Path) -> None:
    """Only an answer's head counts a task as started (llama.cpp answers once it started
    one): a request refused before that does not make a later look "sure"."""
    leases = SlotLeases(tmp_path)
    before = leases.launches(URL)
    server = _Llama(2, clears=True)
    client = _client(server, leases)
    with pytest.raises(InferError):
        _turn(client, [{"role": "user", "content": "too long"}], 0)
    _turn(client, [{"role": "user", "content": "Paris"}], 1)
    assert leases.launches(URL) == before + 1


def test_a_follow_up_cut_after_its_task_started_is_not_taken_for_a_kept_slot(
    tmp_path: Path,
) -> None:
    """The cut attempt's task started (counted) in the session's own slot, which now holds
    its prompt: the resent follow-up must not look and call that a slot kept."""
    leases = SlotLeases(tmp_path)
    server = _Llama(2, clears=True)
    client = _client(server, leases)
    a = [{"role": "user", "content": "Paris"}]
    _turn(client, a, 0)
    with pytest.raises(StreamCut):
        _turn(client, [*a, {"role": "user", "content": "cut"}], 0)
    _turn(client, [*a, {"role": "user", "content": "more"}], 0)
    assert server.looks == 0 and leases.choice(URL) is None


def test_a_slot_that_ran_no_task_since_a_restart_tells_nothing(tmp_path: Path) -> None:
    leases = SlotLeases(tmp_path)
    server = _Llama(2, clears=True)
    client = _client(server, leases)
    a = [{"role": "user", "content": "Paris"}]
    _turn(client, a, 0)
    server.held, server.task = [[], []], [None, None]  # restarted: slot 0 shows no id_task
    _turn(client, [{"role": "user", "content": "Lima"}], 1)
    a.append({"role": "user", "content": "more"})
    assert _turn(client, a, 0) == 0  # the restart lost it; nothing is decided from that
    assert server.looks == 1 and leases.choice(URL) is None
