"""httpx client for llama-server: one streamed chat completion, retries, events.

One request is one ``POST {url}/v1/chat/completions`` with ``stream: true``: llama.cpp answers
with Server-Sent Events (the WHATWG "server-sent events" format), one ``data: {json}`` event
per chunk and a final ``data: [DONE]``. The chunks follow the OpenAI chat-completions streaming
format (``choices[0].delta`` with ``content``, ``tool_calls``) plus llama.cpp's additions
(``delta.reasoning_content``, ``prompt_progress``, ``timings``; see llama.cpp's
``tools/server/README.md``).

Decoding the stream (bytes -> events -> :class:`~boxmaker.client.Completion`) lives in
:mod:`boxmaker.client`, shared with the cassette reader; this module keeps the HTTP request,
errors, the thinking cap, cancellation and retries.

Example::

    from boxmaker.client import Client

    with Client() as client:                       # http://127.0.0.1:8080
        completion = client.chat_with_retry(
            {"messages": [{"role": "user", "content": "Hi"}], "id_slot": 0},
            on_event=print,
        )
        print(completion.content, completion.timings.get("cache_n"))

Every failure is an :class:`~boxmaker.errors.InferError` (HTTP status, body and llama.cpp's
parsed ``error`` object kept); :func:`~boxmaker.client.is_context_full` tells llama.cpp's
"prompt does not fit" apart from the rest.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterator
from types import TracebackType
from typing import Any, Protocol

import httpx

from .. import _json
from ..config import ClientConfig
from ..errors import BoxmakerError, InferError, RequestCancelled, StreamCut, StreamStopped
from ..events import ClientEvent, Queued, Retrying
from ..records import Capabilities
from ._cancel import CancelWatch, cancellable
from ._caps import capabilities_of
from ._choice import SlotChoice
from ._encoded import request_body
from ._errors import http_error
from ._pool import PooledTransport, pooled
from ._retry import RETRIED_STATUSES, retry_after_s, retry_delay_s
from ._reuse import ConnectionTrace
from ._side import side_json
from ._slots import LEASES, SlotLeases
from ._stream._decoder import Completion, StreamDecoder
from ._thinking_cap import IGNORED_BUDGET_MARGIN, ThinkingCap

log = logging.getLogger("boxmaker.client")

__all__ = ["IGNORED_BUDGET_MARGIN", "ChatClient", "Client"]

_QUEUED = Queued()
_UNPOOLED = httpx.Limits(max_keepalive_connections=0)  # httpx's transport: a cancel finds the
# socket of each request on its new connection (boxmaker.client._cancel)
_JSON_SSE_HEADERS = {"Accept": "text/event-stream", "Content-Type": "application/json"}


# --------------------------------------------------------------------------------------------
# the client


class _Retryable(Exception):
    """Internal: a failure that may be retried: before any event (connection refused, HTTP
    503), or a full KV pool (``InferError.pool_full``, also mid-stream: the events of the
    failed attempt came, a ``Retrying`` event follows them). Never leaves this module:
    :meth:`Client._chat` raises :attr:`error` instead."""

    def __init__(self, error: InferError, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.error = error
        self.reason = reason
        self.retry_after = retry_after  # seconds the server's Retry-After asked for


class _StaleConnection(Exception):
    """Internal: the request went out on a reused connection the server had closed, and no
    byte of an answer came (:mod:`boxmaker.client._reuse`); it is sent once more."""


class ChatClient(Protocol):
    """What the turn loop needs of a client: :class:`Client` is one; tests use fakes."""

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
    ) -> Completion:
        """Stream one chat completion, retrying what can be retried."""
        ...


class Client(SlotChoice):
    """Synchronous httpx client for llama-server's OpenAI-compatible chat endpoint.

    Args:
        config: where the server is and how hard to try (:class:`~boxmaker.config.ClientConfig`);
            ``None`` uses the defaults (``http://127.0.0.1:8080``).
        transport: an httpx transport to use instead of the network (``httpx.MockTransport``
            in tests, a recording transport for cassettes).
        sleep: called with the retry delay in seconds; ``None`` uses :func:`time.sleep`, or
            waits on the ``cancel`` event when one is given (so cancelling cuts the wait).
        leases: the slot leases to take (``None``: the process's own, shared by every
            client; see below).

    Attributes:
        url: the server's base URL, without trailing ``/`` (``config.url``).
        config: the client config in use.

    Timeouts: connecting may take ``config.connect_timeout_s`` seconds; once connected, the
    request fails if the server sends no byte for ``config.idle_timeout_s`` seconds (an idle
    timeout per read, not a total one: a stream that keeps sending never times out), or no
    data event for ``config.silence_timeout_s`` seconds (SSE comments such as ``: ping``
    are bytes but not data). The ``Authorization: Bearer`` header is sent only when
    ``config.api_key`` is set.

    One :class:`httpx.Client` serves the stream, the reasoning-control request sent while the
    stream is open, and the side requests. For an ``http://`` server (no proxy in the
    environment) its transport is :class:`~boxmaker.client._pool.PooledTransport`: one pool of
    kept-alive connections for the client, reused across requests, each streamed body read in
    large blocks; a cancel reaches the socket of a kept connection too (the transport names it
    when it takes one). Otherwise httpx's own transport, keeping no idle connection (each
    request opens its own, so a cancel finds its socket). Make one client per server and
    share it: use as a context manager, or call :meth:`close`. A client may be shared by
    threads (the pool is thread-safe); each :meth:`chat` call keeps its state local.

    Slots: llama.cpp runs a request pinned to a busy slot next to the running one and the
    answers cross, so each attempt holds a lease on its (URL, slot) while in flight, in this
    process and, through a lock file, across processes (:mod:`boxmaker.client._slots`). A
    body without ``id_slot`` (or ``None``) gets the free slot that holds its prompt cache
    (slot 0 while nothing contends); an ``id_slot`` of 0 or more is a pin that waits for its
    slot (:class:`~boxmaker.events.SlotWait` says so); ``-1`` (llama.cpp picks an idle slot)
    is sent as it is, without a lease. On a server that clears idle slots (llama-server's
    default ``--cache-idle-slots`` with a unified KV cache) a pin loses the prompt cache, so
    there (``config.slot_choice``, :attr:`server_picks_slots`) every request goes out with
    ``-1``, holding all the server's slot locks shared (no pin runs beside it).
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] | None = None,
        leases: SlotLeases | None = None,
    ) -> None:
        self.config = config if config is not None else ClientConfig()
        self._leases = leases if leases is not None else LEASES
        self.url = self.config.url.rstrip("/")
        self._chat_url = f"{self.url}/v1/chat/completions"
        self._control_url = f"{self.url}/v1/chat/completions/control"
        self._sleep = sleep
        self._unseen_warned = False  # CapNotEnforced for "no reasoning seen" was emitted
        self._reasoning_seen = False  # a completion of this client had reasoning
        self._caps: Capabilities | None = None  # GET /props, read once (capabilities())
        self._caps_read = False
        self._local = threading.local()  # .cancel: this thread's cancelling() block
        self.last_slot: int | None = None  # the slot of this client's latest request
        headers = {}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        connect = self.config.connect_timeout_s
        idle = self.config.idle_timeout_s
        self._pool: PooledTransport | None = None
        if transport is None and pooled(self.url):
            transport = self._pool = PooledTransport(_unpooled)
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(connect=connect, read=idle, write=idle, pool=connect),
            limits=_UNPOOLED,
            transport=transport,
        )
        self._chat_target = httpx.URL(self._chat_url)  # the chat request, built once
        self._chat_headers = httpx.Headers(self._http.headers)
        self._chat_headers.update(_JSON_SSE_HEADERS)
        self._timeouts = self._http.timeout.as_dict()

    # -- public API ---------------------------------------------------------------------------

    def chat(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
        tool_call_deltas: bool = True,
    ) -> Completion:
        """Run one streamed chat completion (one attempt, no retry).

        Args:
            body: the request body (OpenAI chat-completions / llama.cpp): ``messages``,
                ``tools``, ``id_slot``, sampling (``temperature``, ``max_tokens``, ``seed``),
                ``chat_template_kwargs``... It is not modified. The client adds
                ``stream: true``, ``return_progress: true``, ``cache_prompt: true``,
                ``stream_options.include_usage: true`` (so the last chunk carries ``usage``)
                and, when ``reasoning_budget`` is given, ``thinking_budget_tokens`` (the
                budget) and ``reasoning_control: true``; these override the same keys of
                ``body``.
            on_event: called in order with each :data:`~boxmaker.events.ClientEvent`, on the
                calling thread, while the stream is read (keep it quick; an exception it
                raises closes the stream and propagates; a
                :class:`~boxmaker.errors.StreamStopped` gets the completion so far in its
                ``completion``).
            reasoning_budget: reasoning tokens this completion may use, sent as llama.cpp's
                ``thinking_budget_tokens``: the server's sampler ends reasoning exactly (at
                most ``budget - 1`` reasoning deltas come, none for a budget of 0 or 1).
                When the answer (content, a tool call or the finish) starts after
                ``budget - 1`` to ``budget`` reasoning deltas, the completion counts as capped
                (:class:`~boxmaker.events.ThinkingCapped` is emitted, ``thinking_capped``
                set; a model that stops thinking by itself at exactly that count looks the
                same). Fallback for servers that ignore the field: once the reasoning
                deltas reach ``budget +`` :data:`IGNORED_BUDGET_MARGIN` while reasoning goes
                on, :meth:`reasoning_end` is sent once, ``ThinkingCapped`` is emitted and
                the stream is read on (the server ends reasoning and continues).
                When the cap cannot be enforced (``reasoning_end`` refused or failed, more
                reasoning than the budget without a chance to end it, or, once per client,
                no reasoning seen at all for a budget of 2 or more),
                :class:`~boxmaker.events.CapNotEnforced` is emitted once and the completion's
                ``cap_warning`` says why. With ``config.send_thinking_budget`` off, no
                ``thinking_budget_tokens`` is sent and ``reasoning_end`` goes once ``budget``
                deltas (at least 1) came.
                ``None``: no cap, no budget and no reasoning control.
            cancel: when set, the request ends within about 0.1 s whatever the server does
                (silent before answering, stalled mid-stream, sending only ``: ping``
                comments): the connection is shut down (llama.cpp then stops generating) and
                :class:`~boxmaker.errors.RequestCancelled` is raised, never another
                :class:`InferError`. Checked before the request, after each chunk and each
                read, and by a watch thread that interrupts a blocked read (on transports
                without sockets, such as ``httpx.MockTransport``, only between reads).
            tool_call_deltas: pass :class:`~boxmaker.events.ToolCallDelta` events to
                ``on_event``; ``False`` skips making them (a caller that drops them, as the
                turn loop does, saves one object per tool-call chunk). The completion's
                ``tool_calls`` are the same either way.

        Returns:
            The :class:`Completion`. A 200 answer of ``Content-Type: application/json`` (a
            server or proxy that ignored ``stream: true``) is read as one whole
            ``chat.completion``: the same completion, its events all at once.

        Raises:
            InferError: connection failed (``status`` None), idle timeout or silence
                timeout (``status`` None), HTTP status other than 200 (``status``,
                ``body`` and llama.cpp's ``error`` kept; see :func:`is_context_full` for a
                full context), a malformed chunk, an error object inside the stream
                (``status`` = its ``code``), one SSE event past ``config.max_event_bytes``.
                A refused ``reasoning_end`` is no error: the
                completion goes on and :class:`~boxmaker.events.CapNotEnforced` says so.
            StreamCut: the stream ended or broke before ``finish_reason`` / ``[DONE]``.
            RequestCancelled: ``cancel`` was set.
        """
        return self._chat(
            body, on_event, reasoning_budget, cancel, retries=0, tool_call_deltas=tool_call_deltas
        )

    def chat_with_retry(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        *,
        reasoning_budget: int | None = None,
        cancel: threading.Event | None = None,
        tool_call_deltas: bool = True,
    ) -> Completion:
        """:meth:`chat`, retrying when the server cannot be reached or is loading.

        Retried: connection failures (refused, connect timeout) and HTTP 503 (llama.cpp's
        ``"Loading model"``), 429, 502 and 504 (proxies while a model loads or past a
        concurrency limit), at most ``config.retry_attempts`` times after the first
        attempt. Retry ``k`` (1, 2, ...) waits what the answer's ``Retry-After`` asks
        (seconds or an HTTP date), else ``config.retry_base_delay_s * 2**(k-1)`` seconds;
        at most ``config.retry_max_delay_s`` either way. It is announced by
        :class:`~boxmaker.events.Retrying` ``(attempt=k, delay_s, reason)`` before the wait;
        ``reason`` names the status, the server's message and its ``Retry-After``.
        These failures happen before any other event, so a retried attempt has emitted
        nothing. Retried too: a full KV pool (``InferError.pool_full``: llama.cpp's
        "Context size has been exceeded." while this prompt fits its slot; slots sharing a
        unified KV cache filled it), as an HTTP error or mid-stream (the failed attempt's
        events came before the ``Retrying`` event; the next attempt streams anew); when it
        persists, the error names the pool and the fix. Every other error is raised at once.

        Arguments, return value: as :meth:`chat`.

        Raises:
            InferError: as :meth:`chat`; when every attempt failed, the last attempt's error
                (same ``status``, ``body``, ``error``) with a message that says how many
                attempts were made.
            RequestCancelled: ``cancel`` was set, also during a retry wait.
        """
        return self._chat(
            body,
            on_event,
            reasoning_budget,
            cancel,
            retries=self.config.retry_attempts,
            tool_call_deltas=tool_call_deltas,
        )

    def reasoning_end(self, completion_id: str) -> bool:
        """Ask llama-server to end the reasoning of a running completion now.

        Sends ``POST {url}/v1/chat/completions/control`` with ``{"id": completion_id,
        "action": "reasoning_end"}`` (llama.cpp reasoning control; the completion must have
        been requested with ``reasoning_control: true``).

        Returns:
            The answer's ``success`` field: ``False`` when the server did not accept it
            (e.g. ``"no active completion for this id"``).

        Raises:
            InferError: connection failure, HTTP status other than 200, or an answer that is
                not a JSON object.
        """
        return self._control(completion_id)[0]

    def server_json(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        timeout_s: float,
        cancel: threading.Event | None = None,
    ) -> Any:
        """A side request to this client's server (its transport and key): one JSON request
        to ``path`` (e.g. llama.cpp's ``/apply-template``, ``/tokenize``, ``/props``), marked
        with the ``boxmaker.side_request`` extension (``boxmaker.client.ServerJson``).

        Args:
            method: ``"GET"`` or ``"POST"``; path: from the base URL (``/tokenize``).
            body: the JSON body (``None``: none); timeout_s: the request's timeout, seconds.
            cancel: ends the request within about 0.1 s when set (whatever the server does);
                ``None``: the cancel of the :meth:`cancelling` block this thread is in, if any
                (the turn's: so cache forensics' requests stop with the turn).

        Returns:
            The parsed JSON answer.

        Raises:
            InferError: no connection, or an HTTP status other than 200 (status, body and
                the ``error`` object kept; a transport that refuses side requests answers
                ``error.type`` ``side_request_refused``).
            RequestCancelled: the cancel was set.
            BoxmakerError: an answer that is not JSON.
        """
        watch = cancel if cancel is not None else getattr(self._local, "cancel", None)
        return side_json(self._http, self.url, method, path, body, timeout_s, watch)

    @contextlib.contextmanager
    def cancelling(self, cancel: threading.Event) -> Iterator[None]:
        """Within the block, this thread's side requests on this client (:meth:`server_json`,
        :meth:`capabilities`, from any caller: the turn's first ``GET /props``, cache
        forensics) end within about 0.1 s once ``cancel`` is set. :func:`boxmaker.turn.run_turn`
        holds one for its turn's cancel."""
        before = getattr(self._local, "cancel", None)
        self._local.cancel = cancel
        try:
            yield
        finally:
            self._local.cancel = before

    def capabilities(self, cancel: threading.Event | None = None) -> Capabilities | None:
        """What the server's chat template and slots can do (``GET {url}/props``), read once
        per client and kept.

        Args:
            cancel: as :meth:`server_json`'s: when it ends the request, ``None`` is returned
                and nothing is kept (the next call asks again).

        Returns:
            The :class:`~boxmaker.records.Capabilities` the answer states, or ``None`` when
            the server does not say (``/props`` off or missing, not JSON, a connection failure,
            a cassette that refuses side requests: nothing is assumed then, and nothing raised).
        """
        if not self._caps_read:
            try:
                answer = self.server_json("GET", "/props", timeout_s=30.0, cancel=cancel)
            except RequestCancelled:
                return None
            except (BoxmakerError, httpx.HTTPError, ValueError) as exc:  # a status, no answer
                log.info("GET /props at %s failed: %s", self.url, exc)
                answer = None
            self._caps, self._caps_read = capabilities_of(answer), True
        return self._caps

    def close(self) -> None:
        """Close the connection pool. The client cannot be used afterwards."""
        self._http.close()

    def __enter__(self) -> Client:
        """Return the client itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client (see :meth:`close`)."""
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    # -- internals ----------------------------------------------------------------------------

    def _chat(
        self,
        body: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
        *,
        retries: int,
        tool_call_deltas: bool,
    ) -> Completion:
        payload = {
            **body,
            "stream": True,
            "return_progress": True,
            "cache_prompt": True,
            "stream_options": {**body.get("stream_options", {}), "include_usage": True},
        }
        if reasoning_budget is not None:
            if self.config.send_thinking_budget:
                payload["thinking_budget_tokens"] = reasoning_budget
            payload["reasoning_control"] = True
        attempt = 0
        while True:
            if cancel is not None and cancel.is_set():
                raise RequestCancelled("request cancelled before it was sent")
            try:
                with self._slot(payload, on_event, cancel):
                    return self._attempt(
                        payload, on_event, reasoning_budget, cancel, tool_call_deltas
                    )
            except _Retryable as failure:
                error = failure.error
                if attempt >= retries:
                    if retries == 0:
                        raise error from error.__cause__
                    raise InferError(
                        f"{error} (gave up after {attempt + 1} attempts)",
                        status=error.status,
                        body=error.body,
                        error=error.error,
                        context_full=error.context_full,
                        pool_full=error.pool_full,
                    ) from error.__cause__
                attempt += 1
                delay = retry_delay_s(attempt, self.config, failure.retry_after)
                on_event(Retrying(attempt=attempt, delay_s=delay, reason=failure.reason))
                self._wait(delay, cancel)

    @property
    def server_picks_slots(self) -> bool:
        """Whether this client's requests now let llama.cpp pick the slot (``id_slot`` -1):
        ``config.slot_choice`` ``"server"``, or ``"auto"`` once the server was seen clearing
        an idle slot (see :attr:`~boxmaker.config.ClientConfig.slot_choice`)."""
        choice = self.config.slot_choice
        if choice == "auto":
            return self._leases.choice(self.url) == "server"
        return choice == "server"

    def holder(self, messages: Any, slots: Collection[int] | None = None) -> int | None:
        """The slot whose prompt cache (its last request, of this process, on this client's
        server) holds ``messages`` as a prefix, or ``messages`` holds its; ``None`` when none
        is known (always where the server picks the slots, :attr:`server_picks_slots`: the
        client's view of its slots is then out of date). ``slots``: look only at these."""
        if self.server_picks_slots:
            return None
        return self._leases.holder(self.url, messages, slots)

    def note_slot(self, slot: int, messages: Any) -> None:
        """Take ``slot`` as holding ``messages`` from now on (a slot restored from a file, or
        one whose longer prompt starts with them), so an unpinned request that extends them
        is sent there."""
        self._leases.note(self.url, slot, messages)

    def pick_slot(self, messages: Any) -> int:
        """The slot an unpinned request of ``messages`` would be sent to now."""
        return self._leases.pick(self.url, messages)

    def slot_action(
        self,
        slot: int,
        action: str,
        filename: str | None = None,
        *,
        holds: Any = None,
        timeout_s: float = 120.0,
    ) -> dict[str, Any]:
        """llama.cpp's ``POST /slots/{slot}?action=save|restore|erase`` (with
        ``{"filename": ...}`` for save and restore; the server needs ``--slot-save-path``),
        holding the slot's lease so no completion runs on it meanwhile.

        Args:
            slot: the slot (``id_slot``); action: ``"save"``, ``"restore"`` or ``"erase"``.
            filename: the file in the server's slot folder (a plain name, no folders).
            holds: the ``messages`` the slot holds afterwards (a restore: the prompt saved),
                so an unpinned request that extends them is sent to this slot; ``None``:
                what the client knew of the slot is kept (a save changes nothing there).
            timeout_s: seconds for the answer (a large slot takes a while to write).

        Returns:
            The server's answer (save: ``n_saved`` tokens, ``n_written`` bytes,
            ``timings.save_ms``; restore: ``n_restored``, ``n_read``, ``timings.restore_ms``).

        Raises:
            InferError: the server refused (HTTP 501 ``not_supported_error``: no
                ``--slot-save-path``; HTTP 400: an invalid name, or a file missing, corrupt
                or too large for the KV cache), or could not be reached.
        """
        path = f"/slots/{slot}?action={action}"
        body = None if filename is None else {"filename": filename}
        with self._leases.lease(
            self.url,
            slot,
            holds,
            count=self._slot_count,
            on_wait=lambda _slot: None,
            remember=False,
        ):
            answer = self.server_json("POST", path, body, timeout_s=timeout_s)
            if holds is not None:  # only once the server said it holds them
                self._leases.note(self.url, slot, holds)
        return answer if isinstance(answer, dict) else {}

    def _slot_count(self, cancel: threading.Event | None = None) -> int | None:
        """``GET /props`` ``total_slots`` (llama.cpp's slot count), ``None`` if unknown.

        Raises:
            RequestCancelled: ``cancel`` was set (within about 0.1 s: a server that answers
                with pings only cannot hold it).
        """
        try:
            with cancellable(cancel, f"GET /props at {self.url}") as watched:
                answer = self._http.get(f"{self.url}/props", extensions=watched)
                total = answer.json().get("total_slots") if answer.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return total if isinstance(total, int) and not isinstance(total, bool) else None

    def _wait(self, delay: float, cancel: threading.Event | None) -> None:
        if self._sleep is None and cancel is not None:
            if cancel.wait(delay):
                raise RequestCancelled("request cancelled while waiting to retry")
            return
        (self._sleep or time.sleep)(delay)
        if cancel is not None and cancel.is_set():
            raise RequestCancelled("request cancelled while waiting to retry")

    def _attempt(
        self,
        payload: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
        tool_call_deltas: bool,
    ) -> Completion:
        watch = None if cancel is None else CancelWatch(cancel)
        try:
            return self._request(
                payload, on_event, reasoning_budget, cancel, watch, tool_call_deltas
            )
        finally:
            if watch is not None:
                watch.stop()

    def _request(
        self,
        payload: dict[str, Any],
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
        watch: CancelWatch | None,
        tool_call_deltas: bool,
    ) -> Completion:
        content = _request_body(payload)
        send = functools.partial(
            self._send, content, on_event, reasoning_budget, cancel, watch, tool_call_deltas
        )
        try:
            return send()
        except _StaleConnection:  # sent on a reused connection the server had closed: once more
            return send(again=True)

    def _send(
        self,
        content: bytes,
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
        watch: CancelWatch | None,
        tool_call_deltas: bool,
        *,
        again: bool = False,
    ) -> Completion:
        started = False
        trace = ConnectionTrace(None if watch is None else watch.trace)
        try:
            with self._stream(content, trace) as response:
                started = True
                if watch is not None:
                    watch.add(response.extensions.get("network_stream"))
                if response.status_code != 200:
                    response.read()
                    error = http_error(
                        response.status_code,
                        response.text,
                        "chat completion",
                        response.reason_phrase,
                    )
                    if response.status_code in RETRIED_STATUSES or error.pool_full:
                        raise _retryable(error, response)
                    raise error
                then = getattr(self._local, "started", None)
                if then is not None:  # the task started (slot choice, _on_start)
                    self._local.started = None
                    then()
                on_event(_QUEUED)
                if _is_json(response):  # one whole chat.completion to a streamed request
                    return self._read_whole(response, on_event, tool_call_deltas)
                try:
                    done = self._read(
                        response, on_event, reasoning_budget, cancel, tool_call_deltas
                    )
                except InferError as exc:
                    if exc.pool_full:  # the KV pool filled mid-stream: wait, then again
                        raise _Retryable(exc, _pool_reason(exc)) from exc
                    raise
                self._reasoning_seen = self._reasoning_seen or done.reasoning_tokens > 0
                return done
        except httpx.TransportError as exc:
            if cancel is not None and cancel.is_set():  # the watch shut the connection
                raise RequestCancelled("request cancelled; connection closed") from exc
            if not again and trace.stale(exc):
                raise _StaleConnection from exc
            raise self._transport_error(exc, started) from exc

    @contextlib.contextmanager
    def _stream(self, content: bytes, trace: ConnectionTrace) -> Iterator[httpx.Response]:
        """The chat request's streamed answer, closed at the end of the block. With the pooled
        transport, the request goes to it directly: the same request as through
        :class:`httpx.Client` (its headers and timeouts), without the client's machinery
        around one request (URL joining, cookie jar, auth and redirect steps), which cost as
        much as reading a short answer."""
        if self._pool is None:
            extensions = {"trace": trace}
            with self._http.stream(
                "POST", self._chat_url, content=content, headers=_JSON_SSE_HEADERS,
                extensions=extensions,
            ) as response:  # fmt: skip
                yield response
            return
        request = httpx.Request(
            "POST",
            self._chat_target,
            headers=self._chat_headers,
            content=content,
            extensions={"timeout": self._timeouts, "trace": trace},
        )
        response = self._pool.handle_request(request)
        response.request = request
        try:
            yield response
        finally:
            response.close()

    def _transport_error(self, exc: httpx.TransportError, started: bool) -> Exception:
        """The error to raise for an httpx transport error of the chat request."""
        if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
            error = InferError(f"cannot connect to llama-server at {self.url}: {exc}")
            error.__cause__ = exc
            return _Retryable(error, f"connection failed: {exc}")
        if isinstance(exc, httpx.ReadTimeout):
            return InferError(
                f"llama-server at {self.url} sent nothing for {self.config.idle_timeout_s} s "
                "(idle timeout, ClientConfig.idle_timeout_s)"
            )
        if started:
            return StreamCut(
                f"stream cut: the connection to llama-server broke mid-stream: {exc!r}"
            )
        return InferError(f"request to llama-server at {self.url} failed: {exc!r}")

    def _read(
        self,
        response: httpx.Response,
        on_event: Callable[[ClientEvent], None],
        reasoning_budget: int | None,
        cancel: threading.Event | None,
        tool_call_deltas: bool,
    ) -> Completion:
        decoder = StreamDecoder(
            tool_call_deltas=tool_call_deltas, max_event_bytes=self.config.max_event_bytes
        )
        chunks = decoder.chunks
        budget = reasoning_budget
        cap = (
            None
            if budget is None
            else ThinkingCap(
                budget,
                self.config.send_thinking_budget,
                lambda completion_id: self._control(completion_id, cancel),
                self._first_unseen,
                reasons=self._caps.reasoning if self._caps else None,
            )
        )

        def between() -> None:  # after each chunk: the thinking cap and cancel checks
            if cap is not None:
                cap.check(chunks, on_event)
            if cancel is not None and cancel.is_set():
                raise _cancelled(response, chunks.chunks)

        check = None if budget is None and cancel is None else between
        silence = self.config.silence_timeout_s
        clock = time.monotonic
        quiet_since: float | None = clock()  # first read after the last data event, or None
        seen = 0  # chunks when the last data event came
        feed_sse = decoder.sse.feed
        emit = decoder.emit
        try:
            for raw in _reads(response):
                emit(feed_sse(raw), on_event, check)
                if cancel is not None and cancel.is_set():  # a read of comments, or the watch
                    raise _cancelled(response, chunks.chunks)
                if chunks.done:
                    return chunks.finish()
                if silence is not None:
                    if chunks.chunks != seen:
                        seen = chunks.chunks
                        quiet_since = None
                    elif quiet_since is None:
                        quiet_since = clock()
                    elif clock() - quiet_since > silence:
                        response.close()
                        raise InferError(
                            f"llama-server at {self.url} sent no data event for {silence} s, "
                            "only SSE comments (silence timeout, ClientConfig.silence_timeout_s)"
                        )
            emit(decoder.sse.flush(), on_event, check)
        except StreamStopped as stop:  # the hook closed the stream: what arrived goes with it
            stop.completion = chunks.partial()
            response.close()
            raise
        if cancel is not None and cancel.is_set():
            raise _cancelled(response, chunks.chunks)
        return chunks.finish()

    def _read_whole(
        self,
        response: httpx.Response,
        on_event: Callable[[ClientEvent], None],
        tool_call_deltas: bool,
    ) -> Completion:
        """A 200 answer of ``Content-Type: application/json`` (a server or proxy that ignores
        ``stream: true``): one OpenAI ``chat.completion``, read as one completion."""
        response.read()
        decoder = StreamDecoder(tool_call_deltas=tool_call_deltas)
        try:
            for event in decoder.feed_completion(response.text):
                on_event(event)
        except StreamStopped as stop:  # the whole answer is what arrived
            stop.completion = decoder.chunks.partial()
            raise
        return decoder.chunks.finish()

    def _first_unseen(self) -> bool:
        """Whether "no reasoning seen" is still to be said: once per client, and never after
        a completion of this client had reasoning (the server then shows it: a completion
        without reasoning is the model's choice, e.g. an answer after a tool result)."""
        if self._reasoning_seen:
            return False
        first, self._unseen_warned = not self._unseen_warned, True
        return first

    def _control(
        self, completion_id: str, cancel: threading.Event | None = None
    ) -> tuple[bool, str]:
        try:
            with cancellable(cancel, "reasoning_end") as watched:
                response = self._http.post(
                    self._control_url,
                    json={"id": completion_id, "action": "reasoning_end"},
                    extensions=watched,
                )
        except httpx.HTTPError as exc:
            raise InferError(
                f"reasoning control request to llama-server at {self.url} failed: {exc!r}"
            ) from exc
        if response.status_code != 200:
            raise http_error(
                response.status_code, response.text, "reasoning control", response.reason_phrase
            )
        text = response.text
        answer = _loads_or_text(text)
        if not isinstance(answer, dict):
            raise InferError(
                f"reasoning control: llama-server's answer is not a JSON object: {text[:500]}",
                status=200,
                body=text,
            )
        return answer.get("success") is True, text


def _unpooled() -> httpx.BaseTransport:
    """httpx's own transport, keeping no idle connection (the pool's fallback)."""
    return httpx.HTTPTransport(limits=_UNPOOLED)


def _request_body(payload: dict[str, Any]) -> bytes:
    """The JSON body of a chat request: compact UTF-8 as httpx's ``json=`` writes it (by
    orjson when it can, :func:`boxmaker._json.dumps`); a text no UTF-8 can hold (a lone
    surrogate, say in a user's message) is written with ``\\u`` escapes instead, so the
    request goes out and the server judges it, never a bare ``UnicodeEncodeError``.

    Raises:
        ValueError: a ``NaN`` or infinite float in ``payload`` (as httpx's ``json=``).
    """
    content = request_body(payload)  # the session's messages written once, not each time
    if content is not None:
        return content
    content = _json.dumps(payload)
    if content is not None:
        return content
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False).encode()


def _reads(response: httpx.Response) -> Iterator[bytes]:
    """The body's reads: ``iter_raw`` (the same bytes as ``iter_bytes`` without its layers)
    unless a ``Content-Encoding`` must be undone or the body was read (a replayed cassette)."""
    if response.is_stream_consumed or "content-encoding" in response.headers:
        return response.iter_bytes()
    return response.iter_raw()


def _cancelled(response: httpx.Response, chunks: int) -> RequestCancelled:
    """Close ``response`` (a cancelled stream); the error to raise."""
    response.close()
    return RequestCancelled(f"request cancelled after {chunks} chunks; stream closed")


def _loads_or_text(text: str) -> Any:
    """``text`` parsed, or ``text`` itself when it is not JSON or nests too deeply for
    :func:`json.loads` (a ``RecursionError``: the answer of a hostile or broken server)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return text


def _is_json(response: httpx.Response) -> bool:
    """Whether a 200 answer is one JSON document rather than an event stream."""
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return bool(kind == "application/json")


def _retryable(error: InferError, response: httpx.Response) -> _Retryable:
    """A retried HTTP status: the reason the ``Retrying`` event gives (status, the server's
    message, its ``Retry-After``) and the wait it asks for."""
    header = response.headers.get("retry-after")
    after = retry_after_s(header)
    reason = f"HTTP {response.status_code}: {_short(error)}"
    if error.pool_full:
        reason = _pool_reason(error)
    if after is not None:
        reason += f" (Retry-After: {header})"
    return _Retryable(error, reason, after)


def _pool_reason(error: InferError) -> str:
    """The ``Retrying`` reason of a full KV pool: the server's words and what is awaited."""
    return (
        f"llama-server's KV pool is full ({_short(error)}): this request fits its slot, the "
        "other slots' requests hold the pool; waiting for room"
    )


def _short(error: InferError) -> str:
    if error.error and isinstance(error.error.get("message"), str):
        return str(error.error["message"])
    return error.body[:200]
