"""Who picks the llama.cpp slot of a chat request (``ClientConfig.slot_choice``): the
client's leases and their pins, or the server (``id_slot`` -1) on a server seen clearing idle
slots. A part of :class:`~boxmaker.client.Client` (:class:`SlotChoice`), kept apart from its
streaming: the rules are in :mod:`boxmaker.client._slots`' leases, launch count and locks.

Why: llama-server's default ``--cache-idle-slots`` (with a unified KV cache) empties every idle
slot when another starts a task, and a request pinned to the emptied slot is not reloaded
from the RAM prompt cache (llama.cpp ``get_available_slot``: ``f_keep`` is 0/0 there); an
unpinned request is.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from ..config import ClientConfig
from ..errors import BoxmakerError, InferError, RequestCancelled
from ..events import ClientEvent, SlotWait
from ._slots import SlotLeases

__all__ = ["SlotChoice"]

log = logging.getLogger("boxmaker.client")

_SURE_KEPT = 2
"""Looks that must find a slot holding its prompt, a task surely started since it ended,
before the pins stay for good (``Client._idle_slot_cleared``)."""

_FAILED_LOOKS = 3
"""Looks at ``GET /slots`` that may fail (other than 404, 501) before the pins stay for good."""


def _emptied(slot: dict[str, Any]) -> bool:
    """A llama.cpp slot (one of ``GET /slots``) that ran a task and holds no prompt now,
    not running one."""
    return "id_task" in slot and not slot.get("is_processing") and slot.get("n_prompt_tokens") == 0


class SlotChoice:
    """The slot of each attempt of :class:`~boxmaker.client.Client` (its base class: what it
    needs of the client is declared below)."""

    config: ClientConfig
    url: str
    last_slot: int | None
    _leases: SlotLeases
    _local: threading.local
    server_json: Callable[..., Any]
    _slot_count: Callable[[threading.Event | None], int | None]

    def _lease(
        self,
        payload: dict[str, Any],
        wanted: int | None,
        on_event: Callable[[ClientEvent], None],
        cancel: threading.Event | None,
    ) -> contextlib.AbstractContextManager[int]:
        """The slot lease of an attempt (:meth:`SlotLeases.lease`): ``wanted``, or the best
        free slot for its ``messages``; waiting is said by a ``SlotWait`` event."""
        return self._leases.lease(
            self.url,
            wanted,
            payload.get("messages"),
            count=lambda: self._slot_count(cancel),
            on_wait=lambda slot: on_event(SlotWait(url=self.url, slot=slot)),
            cancel=cancel,
        )

    @contextlib.contextmanager
    def _slot(
        self,
        payload: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        cancel: threading.Event | None,
    ) -> Iterator[None]:
        """Hold the attempt's slot lease; sets ``payload["id_slot"]`` to the slot held (``-1``
        where the server picks, ``Client.server_picks_slots``). With ``slot_choice`` ``"auto"``
        the attempt's start (its answer's head: llama.cpp answers once the task started) is
        counted for every process's look (:meth:`SlotLeases.launches`)."""
        pin = payload.get("id_slot")
        if pin == -1 and not isinstance(pin, bool):
            yield
            return
        wanted = pin if isinstance(pin, int) and not isinstance(pin, bool) else None
        choice = self.config.slot_choice
        counted = choice == "auto"
        if counted:
            choice = self._leases.choice(self.url) or "auto"
        if choice == "auto":
            with self._unknown_slot(payload, wanted, on_event, cancel):
                yield
            return
        if choice == "server":
            with self._server_slot(payload, on_event, cancel, counted=counted):
                yield
            return
        with self._lease(payload, wanted, on_event, cancel) as slot:
            payload["id_slot"] = slot
            self.last_slot = slot
            with self._on_start(lambda: self._leases.started(self.url, slot) if counted else None):
                yield
            if counted:
                self._leases.ended(self.url, slot)

    @contextlib.contextmanager
    def _on_start(self, then: Callable[[], None]) -> Iterator[None]:
        """Call ``then`` (once) when this thread's attempt gets its answer's head
        (:meth:`_send`), or not at all when it gets none."""
        self._local.started = then
        try:
            yield
        finally:
            self._local.started = None

    @contextlib.contextmanager
    def _server_slot(
        self,
        payload: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        cancel: threading.Event | None,
        *,
        counted: bool,
    ) -> Iterator[None]:
        """The attempt goes out with ``id_slot`` -1 (llama.cpp picks), holding every slot's
        lock shared (:meth:`SlotLeases.any_slot`: no pin runs beside it)."""
        pin = payload.get("id_slot")
        with self._leases.any_slot(
            self.url,
            count=lambda: self._slot_count(cancel),
            on_wait=lambda slot: on_event(SlotWait(url=self.url, slot=slot)),
            cancel=cancel,
        ):
            payload["id_slot"] = -1
            self.last_slot = None
            try:
                with self._on_start(
                    lambda: self._leases.started(self.url, None) if counted else None
                ):
                    yield
            finally:
                payload["id_slot"] = pin

    @contextlib.contextmanager
    def _unknown_slot(
        self,
        payload: dict[str, Any],
        wanted: int | None,
        on_event: Callable[[ClientEvent], None],
        cancel: threading.Event | None,
    ) -> Iterator[None]:
        """``"auto"`` while it is not known whether the server clears idle slots: the slot is
        leased as usual. A request whose slot holds its prompt (its last request there ended
        with an answer, :meth:`SlotLeases.extends`) goes alone (:meth:`SlotLeases.launch`:
        no other request of any process is on its way to start, none starts until this one's
        answer began), so what it sees of its slot stays true until its task starts; it looks
        at the slot (``GET /slots``: llama.cpp's ``id_task``, ``is_processing`` and
        ``n_prompt_tokens``) when a task started since its last request there, in any process
        (:meth:`SlotLeases.contended`): llama.cpp's ``--cache-idle-slots`` clears every idle
        slot when it starts a task. Found empty: the server clears idle slots, it picks from
        now on (this attempt included: :meth:`_server_slot`); found holding its prompt after a
        task surely started while it was idle: the pins stay (``"client"``); a server without
        ``/slots``: the pins stay. Other requests start side by side."""
        messages = payload.get("messages")
        cleared = False
        with self._lease(payload, wanted, on_event, cancel) as slot:
            alone = self._leases.extends(self.url, messages, slot)
            land = self._leases.launch(self.url, alone=alone, cancel=cancel)

            began = [False]

            def start() -> None:
                began[0] = True
                self._leases.started(self.url, slot)
                land()

            try:
                known = self._leases.choice(self.url)  # another request may have looked
                when = self._leases.contended(self.url, slot) if alone and not known else None
                if when is not None:
                    cleared = self._idle_slot_cleared(slot, cancel, sure=when == "after")
                cleared = cleared or self._leases.choice(self.url) == "server"
                if not cleared:
                    payload["id_slot"] = slot
                    self.last_slot = slot
                    try:
                        with self._on_start(start):
                            yield
                    except BaseException:
                        if began[0]:  # its task started: the slot holds some of it now
                            self._leases.ended(self.url, slot)
                            self._leases.forget(self.url, slot)
                        raise
                    self._leases.ended(self.url, slot)
            finally:
                land()
        if cleared:
            with self._server_slot(payload, on_event, cancel, counted=True):
                yield

    def _idle_slot_cleared(self, slot: int, cancel: threading.Event | None, *, sure: bool) -> bool:
        """Look at ``slot`` (``GET /slots``, 3 s at most), a task having started on the server
        since the slot's last request began (``sure``: after it ended): empty after a task
        (``id_task`` given, ``n_prompt_tokens`` 0) means the server clears idle slots (it
        picks from now on, said once in the ``boxmaker.client`` log).

        The pins stay (:meth:`SlotLeases.decide` ``"client"``) on a server without ``/slots``
        (HTTP 404, 501) or whose slots show no ``id_task`` at all, after
        :data:`_SURE_KEPT` sure looks found the slot holding its prompt (one could be a race:
        the other task started in the last step of this slot's), and after
        :data:`_FAILED_LOOKS` looks that failed otherwise (a refused side request, another
        status, a timeout: each holds the other requests' start back while it waits). A slot
        that ran no task since the server started, or busy, tells nothing."""
        try:
            answer = self.server_json("GET", "/slots", timeout_s=3.0, cancel=cancel)
        except RequestCancelled:
            raise
        except BoxmakerError as exc:
            gone = isinstance(exc, InferError) and exc.status in (404, 501)
            if gone or self._leases.looked(self.url, "failed") >= _FAILED_LOOKS:
                self._leases.decide(self.url, "client")
            return False
        seen = [s for s in answer if isinstance(s, dict)] if isinstance(answer, list) else []
        if not any("id_task" in s for s in seen):  # a server that shows no tasks: no telling
            self._leases.decide(self.url, "client")
            return False
        mine = next((s for s in seen if s.get("id") == slot), None)
        if mine is None or "id_task" not in mine or mine.get("is_processing"):
            return False  # restarted since, or another client's request (boxmaker holds it)
        if not _emptied(mine):
            if sure and self._leases.looked(self.url, "kept") >= _SURE_KEPT:
                self._leases.decide(self.url, "client")
            return False
        self._leases.decide(self.url, "server", count=len(seen))
        log.warning(
            "%s cleared idle slot %d (llama-server's --cache-idle-slots with a unified KV "
            "cache): its requests now let the server pick the slot (id_slot -1), so its RAM "
            "prompt cache serves them; start it with --no-cache-idle-slots to keep the pins, "
            "or set client.slot_choice",
            self.url,
            slot,
        )
        return True
