"""The tap's pass-through proxy: an ASGI app served by uvicorn, httpx to the upstream.

Why these: uvicorn is a well-kept HTTP/1.1 server that hands the app each body write as it
comes and reports a client's disconnect (``http.disconnect``); httpx's async transport streams
the upstream's answer as raw bytes (``aiter_raw``: not decoded, not re-chunked). The app is
plain ASGI (no framework): it only moves bytes, so it is short, and nothing between the two
sockets parses or buffers.

The upstream is asked through httpx's connection-pooling transport itself
(``AsyncHTTPTransport``), not an ``AsyncClient``: a client would add its default headers
(``User-Agent``, ``Accept-Encoding``) to a request that lacks them, keep the upstream's
cookies and send them with every agent's requests, and costs about 0.2 ms a request on the way
to the first event (merging, auth and redirect handling a proxy does not want).

What passes: the method, path, query, body and headers of every request (less the hop-by-hop
ones of RFC 9110 7.6.1 and ``Host``, which httpx sets to the upstream's); the status, headers
(less hop-by-hop) and body of every answer, each read forwarded as it arrives (an SSE event
reaches the agent when it reaches the tap). A client that disconnects closes the upstream
connection (llama-server then stops generating); an upstream that is not reached gets the
agent an HTTP 502 whose JSON body says so, in OpenAI's error shape. Chat requests
(:data:`CHAT_PATHS`, :data:`ANTHROPIC_PATHS`, :data:`RESPONSES_PATHS`) are also handed to the
:class:`TapLog` after the answer ended (a queue put: logging never delays the agent), and with
a cassette every exchange the upstream answered is handed to the :class:`TapCassette` the same
way. A request to a route that generates from a prompt (:data:`UNREAD_PATHS`) is forwarded
unlogged, said once per route (:meth:`TapLog.note_route`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import signal
import socket
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from ..config import ClientConfig, TapConfig
from ..errors import BoxmakerError, ConfigError
from ..records import utc_now
from ._cassette import Recorded, TapCassette
from ._guard import (
    Guard,
    Receive,
    Refusal,
    Scope,
    Send,
    guarded_protocol,
    read_body,
    refuse,
    upstream_url,
)
from ._log import Exchange, TapLog
from ._responses import RESPONSES_PATHS
from ._traffic import Traffic
from ._wire import ANTHROPIC_PATHS, CHAT_PATHS, UNREAD_PATHS

__all__ = ["CAUGHT_SIGNALS", "GRACE_S", "HOP_BY_HOP", "UPSTREAM_POOLS", "Tap", "make_app"]

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that belong to one connection, not forwarded (RFC 9110 section 7.6.1)."""

_HOP = frozenset(h.encode() for h in HOP_BY_HOP)
_LOGGED = CHAT_PATHS | ANTHROPIC_PATHS | RESPONSES_PATHS
_TIMEOUTS = {"timeout": {"connect": 10.0, "read": None, "write": 60.0, "pool": None}}


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization" and value[:7].lower() == b"bearer ":
            return value[7:].decode("latin-1").strip() or None
    return None


UPSTREAM_POOLS = 16
"""How many upstream connection pools the tap splits its agents' requests over (see
``make_app``): each agent connection keeps to one."""


def make_app(
    upstream: str,
    log: TapLog | None,
    cassette: TapCassette | None = None,
    traffic: Traffic | None = None,
    *,
    guard: Guard,
) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The ASGI app forwarding each request ``guard`` lets in (:class:`Guard`: origin-form
    targets, ``Host`` naming the tap, no browser's request, bodies capped; any other is
    answered with its refusal) to ``upstream`` (``http://host:port``), handing chat exchanges
    to ``log`` and every exchange the upstream answered to ``cassette`` (``None``: neither);
    each request is counted in ``traffic`` while in flight (the writers prefer a quiet
    moment)."""
    base = httpx.URL(upstream.rstrip("/"))
    pools: list[httpx.AsyncHTTPTransport] = []

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                limits = httpx.Limits(max_connections=None, max_keepalive_connections=16)
                # one TLS context for all the pools (each would load the certificate store)
                tls = ssl.create_default_context()
                pools[:] = [
                    httpx.AsyncHTTPTransport(limits=limits, verify=tls)
                    for _ in range(UPSTREAM_POOLS)
                ]
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                closing, pools[:] = list(pools), []
                for transport in closing:
                    await transport.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def pool_of(scope: Scope) -> httpx.AsyncHTTPTransport:
        """The upstream pool of the agent's connection (by its address and port): httpcore's
        pool scans all its connections on each request, a cost that grew with the square of
        the agents (encode/httpcore#1035: 64 agents ran at 0.07-0.08 of direct); split in
        :data:`UPSTREAM_POOLS`, each scans its share, and one agent connection's requests
        keep to one pool (its kept-alive upstream connection)."""
        client = scope.get("client") or ("", 0)
        return pools[hash((client[0], client[1])) % len(pools)]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        refusal = guard.check(scope)
        if refusal is not None:
            await refuse(send, refusal)
            return
        if traffic is None:
            await handle(scope, receive, send)
            return
        traffic.enter()
        try:
            await handle(scope, receive, send)
        finally:
            traffic.leave()

    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        upstream = pool_of(scope)
        try:
            body = await read_body(receive, guard.max_body_bytes)
        except OverflowError:
            await refuse(send, guard.too_large())
            return
        if body is None:  # the agent went away before its request was whole
            return
        try:
            url = upstream_url(base, scope)
        except httpx.InvalidURL as exc:
            await refuse(send, Refusal(400, f"the request's target cannot be forwarded: {exc}"))
            return
        started = utc_now()
        path: str = scope["path"]
        headers = [
            (k, v)
            for k, v in scope["headers"]
            if k.lower() not in _HOP and k.lower() not in (b"host", b"content-length")
        ]
        logged = log is not None and path in _LOGGED and scope["method"] == "POST"
        if log is not None and path in UNREAD_PATHS and scope["method"] == "POST":
            log.note_route(path, "forwarded, not logged: a prompt, not a conversation")
        if log is not None and logged:
            await log.catch_up()  # the log's writer behind: this agent waits, the log does not
        request = httpx.Request(
            scope["method"], url, headers=headers, content=body, extensions=_TIMEOUTS
        )
        if not logged and cassette is None:
            await _forward(upstream, request, receive, send, keep=False)
            return
        # counted now, so that wait() also waits for an answer still streaming
        if log is not None and logged:
            log.begin()
        if cassette is not None:
            cassette.begin()
        answer: _Answer | None = None
        try:
            answer = await _forward(upstream, request, receive, send, keep=True)
        finally:  # handed over after the answer ended: queue puts, nothing waits
            if log is not None and logged:
                query = scope.get("query_string") or b""
                _to_log(log, answer, path, body, headers, query, started)
            if cassette is not None:
                _to_cassette(cassette, answer, scope["method"], str(url), body, headers)

    return app


def _to_log(
    log: TapLog,
    answer: _Answer | None,
    path: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    query: bytes,
    started: datetime,
) -> None:
    if answer is None:  # the request was cancelled before an answer
        log.drop()
        return
    exchange = Exchange(
        path=path,
        body=body,
        status=answer.status,
        streamed=answer.streamed,
        answer=answer.body,
        error=answer.error,
        disconnected=answer.gone,
        api_key=_bearer(headers),
        headers=tuple(headers),
        query=query,
        started=started,
    )
    log.submit(exchange)


def _to_cassette(
    cassette: TapCassette,
    answer: _Answer | None,
    method: str,
    url: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
) -> None:
    if answer is None or answer.status is None:  # the upstream answered nothing to record
        cassette.drop()
        return
    recorded = Recorded(
        method=method,
        uri=url,
        request_headers=headers,
        request_body=body,
        status=answer.status,
        reason=answer.reason,
        response_headers=answer.headers,
        body=answer.body,
        error=answer.broke,
    )
    cassette.submit(recorded)


@dataclass(frozen=True, kw_only=True)
class _Answer:
    """What :func:`_forward` saw: the upstream's ``status`` (``None``: not reached, the agent
    got a 502), ``reason`` phrase and ``headers``, whether it ``streamed`` SSE, the ``body``
    bytes forwarded (``b""`` unless kept), what went wrong (``error``, in words), the httpx
    error that broke the answer off (``broke``, ``"ReadError: ..."``), and whether the agent
    went away before the answer ended (``gone``)."""

    status: int | None = None
    reason: str | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    streamed: bool = False
    body: bytes = b""
    error: str | None = None
    broke: str | None = None
    gone: bool = False


async def _forward(
    upstream: httpx.AsyncHTTPTransport,
    request: httpx.Request,
    receive: Receive,
    send: Send,
    *,
    keep: bool,
) -> _Answer:
    """Send ``request`` upstream and its answer to the agent, each read as it arrives
    (the agent going away closes the upstream connection)."""
    try:
        response = await upstream.handle_async_request(request)
    except httpx.HTTPError as exc:
        base = f"{request.url.scheme}://{request.url.netloc.decode('latin-1')}"
        why = f"the tap could not reach the upstream {base}: {type(exc).__name__}: {exc}"
        answer = {"error": {"message": why, "type": "tap_upstream_unreachable", "code": 502}}
        head = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 502, "headers": head})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})
        return _Answer(error=why)
    kept: list[bytes] = []
    disconnected = asyncio.Event()
    problem: str | None = None
    broke: str | None = None
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")

    async def forward() -> None:
        out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP]
        await send({"type": "http.response.start", "status": response.status_code, "headers": out})
        # a reader task pulls the upstream's chunks as they come; this loop sends each at once,
        # joined with the others already pulled (events that came in one socket read leave in
        # one write: nothing waits, but a busy tap makes one write, not one per event)
        pulled: asyncio.Queue[bytes | Exception | None] = asyncio.Queue()

        async def pull() -> None:
            try:
                async for chunk in response.aiter_raw():
                    pulled.put_nowait(chunk)
            except Exception as exc:  # handed to the sending loop, which raises it
                pulled.put_nowait(exc)
                return
            pulled.put_nowait(None)

        puller = asyncio.ensure_future(pull())
        try:
            ended = False
            while not ended:
                parts = [await pulled.get()]
                while not pulled.empty():
                    parts.append(pulled.get_nowait())
                data = b"".join(p for p in parts if isinstance(p, bytes))
                if data:
                    if keep:
                        kept.append(data)
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                for part in parts:
                    if isinstance(part, Exception):
                        raise part
                ended = parts[-1] is None
        finally:
            puller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await puller
        await send({"type": "http.response.body", "body": b""})

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected.set()

    forwarding = asyncio.ensure_future(forward())
    watching = asyncio.ensure_future(watch())
    try:
        await asyncio.wait({forwarding, watching}, return_when=asyncio.FIRST_COMPLETED)
        if not forwarding.done():  # the agent went away: stop reading the upstream
            forwarding.cancel()
        try:
            await forwarding
        except asyncio.CancelledError:
            pass
        except httpx.HTTPError as exc:
            broke = f"{type(exc).__name__}: {exc}"
            problem = f"the upstream's answer broke off: {broke}"
        except OSError:  # the agent's socket failed under a write: it is gone
            disconnected.set()
    finally:
        watching.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watching
        await response.aclose()  # closes the upstream connection when cut short
    gone = disconnected.is_set() and not forwarding_done_cleanly(forwarding)
    error = problem or ("the agent disconnected mid-answer" if gone else None)
    reason = response.extensions.get("reason_phrase", b"")
    return _Answer(
        status=response.status_code,
        reason=reason.decode("latin-1") if isinstance(reason, bytes) else None,
        headers=response.headers.raw,
        streamed=streamed,
        body=b"".join(kept),
        error=error,
        broke=broke,
        gone=gone,
    )


def forwarding_done_cleanly(task: asyncio.Future[None]) -> bool:
    """The forwarding task ran to its end (not cancelled, no error)."""
    return task.done() and not task.cancelled() and task.exception() is None


CAUGHT_SIGNALS: tuple[signal.Signals, ...] = tuple(
    sig for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if sig
)
"""The signals :meth:`Tap.serve_forever` stops on, after writing the logs (SIGHUP where the
platform has it)."""

GRACE_S = 10
"""Seconds a stopping tap lets the answers in flight go on before it cuts them (their
exchanges, unanswered, are not logged)."""


class _Server(uvicorn.Server):
    """uvicorn's server with its signals left to :meth:`Tap.serve_forever` (uvicorn catches
    SIGINT and SIGTERM only, and raises the signal again once served: SIGTERM then killed the
    process before the queued exchanges were written, issue 36)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Tap:
    """The tap: a pass-through proxy in front of a llama-server that writes boxmaker session
    logs of the chat traffic (a context manager; a thread of its own).

    It listens on 127.0.0.1 unless ``config.host`` says otherwise, and forwards only what
    its :class:`Guard` lets in (origin-form requests for the upstream's paths, ``Host``
    naming the tap, no browser's request unless allowed, bodies, heads and idle connections
    bounded, at most ``config.max_connections`` connections: :mod:`boxmaker.tap._guard`).

    Args:
        upstream: the llama-server's base URL (``http://host:port``; an OpenAI base URL
            ending in ``/v1`` is taken too).
        directory: where the session logs go (``None``: forward only, log nothing).
        port: the port to listen on; ``0`` picks a free one (read :attr:`url`).
        forensics: explain each cache loss through the upstream (``/apply-template``,
            ``/tokenize``), on the log's writer thread.
        cassette: also record every exchange the upstream answered into this cassette file
            (:class:`TapCassette`: vcrpy's YAML in boxmaker's readable form, scrubbed as
            :func:`boxmaker.cassettes.use_cassette` scrubs, replayable by it); ``None``: no
            cassette. Written on a thread of its own, never delaying the agent.
        config: what the tap accepts and where it listens
            (:class:`~boxmaker.config.TapConfig`; ``None``: its defaults).

    Attributes:
        url: ``"http://127.0.0.1:PORT"``, the address to point the agent at (its OpenAI base
            URL is ``url + "/v1"``); set by :meth:`bind`.
        config: the :class:`~boxmaker.config.TapConfig`.
        log: the :class:`TapLog` (``None`` without a directory).
        cassette: the :class:`TapCassette` (``None`` without one).

    Example::

        with Tap("http://127.0.0.1:8080", directory="logs") as tap:
            run_my_agent(base_url=tap.url + "/v1")
        print(tap.log.sessions)

    Raises:
        BoxmakerError: ``upstream`` is not an http(s) URL with a host (a trailing ``/v1``
            is dropped, as :class:`~boxmaker.config.ClientConfig` drops it), or ``port`` is not
            0 to 65535; (:meth:`start`) the port cannot be bound, or the server did not start
            in 10 s.
    """

    def __init__(
        self,
        upstream: str,
        *,
        directory: str | Path | None = None,
        port: int = 0,
        forensics: bool = True,
        cassette: str | Path | None = None,
        config: TapConfig | None = None,
    ) -> None:
        try:  # the client's own rule for a llama-server's URL (a trailing /v1 dropped)
            base = ClientConfig(url=upstream).url
        except ConfigError:
            raise BoxmakerError(
                f"the tap's upstream {upstream!r} is not an http(s) URL with a host "
                "(the llama-server's base URL: http://127.0.0.1:8080)"
            ) from None
        if not 0 <= port <= 65_535:
            raise BoxmakerError(f"the tap's port {port} is out of range: 0 to 65535")
        self.upstream = base
        self.port = port
        self.config = config if config is not None else TapConfig()
        self.url = ""
        self._traffic = Traffic()
        self.log = (
            TapLog(directory, self.upstream, forensics=forensics, traffic=self._traffic)
            if directory is not None
            else None
        )
        self.cassette = (
            TapCassette(cassette, traffic=self._traffic) if cassette is not None else None
        )
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    def _config(self) -> _Server:
        guard = Guard(self.config, self.port)
        config = uvicorn.Config(
            make_app(self.upstream, self.log, self.cassette, self._traffic, guard=guard),
            http=guarded_protocol(self.config),
            ws="none",
            log_config=None,  # a library leaves the process's logging as it found it
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_keep_alive=max(1, int(self.config.idle_timeout_s)),
            timeout_graceful_shutdown=GRACE_S,
        )
        return _Server(config)

    def bind(self) -> None:
        """Bind the port now (sets :attr:`url` and :attr:`port`), before :meth:`start` or
        :meth:`serve_forever`; a no-op when bound. Raises :class:`BoxmakerError` as
        :meth:`start`."""
        if self._socket is None:
            self._socket = self._bind()

    def _bind(self) -> socket.socket:
        host = self.config.host
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        shown = f"[{host}]" if family == socket.AF_INET6 else host
        # IPPROTO_TCP named, not 0: asyncio sets TCP_NODELAY on an accepted connection only
        # when the socket says it is TCP (base_events._set_nodelay); without it Nagle holds
        # an event written right after the head until the agent's delayed ACK (about 40 ms)
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((host, self.port))
        except OSError as exc:
            sock.close()
            raise BoxmakerError(f"the tap cannot listen on {shown}:{self.port}: {exc}") from exc
        sock.listen(128)
        self.port = int(sock.getsockname()[1])
        if ipaddress.ip_address(host).is_unspecified:  # every interface: reached on loopback
            shown = "[::1]" if family == socket.AF_INET6 else "127.0.0.1"
        self.url = f"http://{shown}:{self.port}"
        return sock

    def start(self) -> Tap:
        """Listen and serve on a background thread; returns ``self``."""
        self.bind()
        assert self._socket is not None
        self._server = self._config()
        self._thread = threading.Thread(
            target=self._server.run,
            kwargs={"sockets": [self._socket]},
            daemon=True,
            name="boxmaker-tap",
        )
        self._thread.start()
        for _ in range(1000):
            if self._server.started or not self._thread.is_alive():
                break
            threading.Event().wait(0.01)
        if not self._server.started:
            self.stop()
            raise BoxmakerError("the tap's server did not start in 10 s")
        return self

    def serve_forever(self) -> signal.Signals | None:
        """Listen and serve on this thread (the command line's way) until SIGINT (Ctrl-C),
        SIGTERM or SIGHUP, each caught alike: then stop taking connections, let the answers
        in flight end (:data:`GRACE_S` at most), write every exchange queued, end the turns
        left open and close the logs and the cassette, and return the signal (``None`` when
        the server stopped on its own). A second signal ends the wait for the answers in
        flight; the logs are written all the same (only SIGKILL stops that, and then every
        exchange answered more than :data:`~boxmaker.tap.LOG_WITHIN_S` before is in the
        logs). Signals are caught only on the main thread."""
        self.bind()
        assert self._socket is not None
        server = self._config()
        self._server = server
        stopped: list[signal.Signals] = []

        def on_signal(number: int, frame: object) -> None:
            if not stopped:
                stopped.append(signal.Signals(number))
            if server.should_exit:
                server.force_exit = True
            server.should_exit = True

        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, on_signal) for sig in CAUGHT_SIGNALS}
        try:
            server.run(sockets=[self._socket])
        finally:
            self._socket.close()
            self._socket = None
            self._close_records()  # still under the tap's handlers: a signal now waits too
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return stopped[0] if stopped else None

    def stop(self) -> None:
        """Stop serving, write what is queued, end open turns and close the logs and the
        cassette."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._close_records()

    def _close_records(self) -> None:
        self._traffic.close()  # nothing flies now: the writers drain without waiting
        if self.log is not None:
            self.log.close()
        if self.cassette is not None:
            self.cassette.close()

    def __enter__(self) -> Tap:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
