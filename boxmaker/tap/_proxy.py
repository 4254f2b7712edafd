"""The tap's pass-through proxy: an ASGI app served by uvicorn, aiohttp to the upstream.

Why these: uvicorn is a well-kept HTTP/1.1 server that hands the app each body write as it
comes and reports a client's disconnect (``http.disconnect``); aiohttp's client streams the
upstream's answer as it arrives (``iter_any``: what its C parser has de-chunked so far, all of
it, in one read) from one pool of kept-alive connections whose cost does not grow with their
number. httpx did the same until issue 38 measured it: its pool (httpcore 1.0) scans every
connection on each request (encode/httpcore#1035), and with 64 agents the tap spent about
4 ms of CPU per completion and reached 0.5-0.6 of direct requests/s; through aiohttp it
spends about 1 ms (``benchmarks/gpu_rate.py``). The app is plain ASGI (no framework): it only
moves bytes, so it is short, and nothing between the two sockets parses or buffers.

The session asks as a proxy must: no header of its own (``User-Agent``, ``Accept``,
``Accept-Encoding`` and ``Content-Type`` are not added to a request that lacks them), no
cookie kept (an upstream's cookie would go out with every agent's requests), no redirect
followed, no answer decompressed (the agent gets the bytes the upstream sent).

What passes: the method, path, query, body and headers of every request (less the hop-by-hop
ones of RFC 9110 7.6.1 and ``Host``, which is set to the upstream's); the status, headers
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
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import uvicorn
import yarl

from ..config import ClientConfig, TapConfig
from ..errors import BoxmakerError, ConfigError
from ..records import utc_now
from ._cassette import Recorded, TapCassette
from ._guard import (
    CUT,
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

__all__ = ["CAUGHT_SIGNALS", "GRACE_S", "HOP_BY_HOP", "Tap", "make_app"]

LOGGER = logging.getLogger("boxmaker.tap")

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
"""Headers that belong to one connection, not forwarded (RFC 9110 section 7.6.1; with
``Proxy-Connection``, its older spelling), nor those a ``Connection`` header names."""

_HOP = frozenset(h.encode() for h in HOP_BY_HOP)
_NOT_FORWARDED = _HOP | {b"host", b"content-length", b"expect"}
"""The request headers the tap does not pass on: hop-by-hop ones, ``Host`` and
``Content-Length`` (set for the upstream), ``Expect`` (uvicorn answered the agent's
``100-continue`` already, and the body is read whole before it goes upstream: forwarded, it
made the upstream's client hold the body back for a ``100`` the upstream need not send)."""


def end_to_end(
    headers: Iterable[tuple[bytes, bytes]], drop: frozenset[bytes]
) -> list[tuple[bytes, bytes]]:
    """``headers`` (raw, names as they came) less those named in ``drop`` (lower case) and
    those a ``Connection`` header names (RFC 9110 section 7.6.1: ``Connection: close,
    X-Hop`` makes ``X-Hop`` a header of this connection alone)."""
    headers = list(headers)
    named = {
        token.strip().lower()
        for name, value in headers
        if name.lower() == b"connection"
        for token in value.split(b",")
    }
    gone = drop | named if named else drop
    return [(k, v) for k, v in headers if k.lower() not in gone]


_LOGGED = CHAT_PATHS | ANTHROPIC_PATHS | RESPONSES_PATHS
_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=10.0)
"""Ten seconds to connect to the upstream, no clock on its answer (a long generation is
silent until its first token)."""
_NOT_ADDED = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_BODILESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


def _bearer(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            parts = value.split(None, 1)  # any white space, as _secrets reads it
            if len(parts) == 2 and parts[0].lower() == b"bearer":
                return parts[1].decode("latin-1").strip() or None
    return None


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
    # credentials in the URL (user:password@) never go upstream, into an answer or a log:
    # the agents' own Authorization is what the upstream sees (Tap refuses such a URL)
    base = yarl.URL(upstream.rstrip("/")).with_user(None)
    sessions: list[aiohttp.ClientSession] = []

    async def lifespan(receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                # one pool for every agent: no limit on its connections (the agents' own
                # count is capped by the guard), each kept alive for the next request
                connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
                sessions[:] = [
                    aiohttp.ClientSession(
                        connector=connector,
                        cookie_jar=aiohttp.DummyCookieJar(),
                        skip_auto_headers=_NOT_ADDED,
                        auto_decompress=False,
                        timeout=_TIMEOUT,
                    )
                ]
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                closing, sessions[:] = list(sessions), []
                for session in closing:
                    await session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

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
        upstream = sessions[0]
        try:
            body = await read_body(receive, guard.max_body_bytes)
        except OverflowError:
            await refuse(send, guard.too_large())
            return
        if body is None:  # the agent went away before its request was whole
            return
        try:
            url = upstream_url(base, scope)
        except ValueError as exc:
            await refuse(send, Refusal(400, f"the request's target cannot be forwarded: {exc}"))
            return
        started = utc_now()
        path: str = scope["path"]
        headers = end_to_end(scope["headers"], _NOT_FORWARDED)
        try:  # aiohttp sends str values as UTF-8: a value that is not UTF-8 cannot pass as it is
            texts = [(k.decode("latin-1"), v.decode("utf-8")) for k, v in headers]
        except UnicodeDecodeError:
            why = "a request header value that is not UTF-8 cannot be forwarded as it came"
            await refuse(send, Refusal(400, why))
            return
        logged = log is not None and path in _LOGGED and scope["method"] == "POST"
        if log is not None and path in UNREAD_PATHS and scope["method"] == "POST":
            log.note_route(path, "forwarded, not logged: a prompt, not a conversation")
        if log is not None and logged:
            await log.catch_up()  # the log's writer behind: this agent waits, the log does not
        request = _Request(scope["method"], url, texts, body, scope.get("client"))
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
        encoding=next(
            (v.decode("latin-1") for k, v in answer.headers if k.lower() == b"content-encoding"),
            "",
        ),
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


@dataclass(frozen=True)
class _Request:
    """A request to forward: its ``method``, the upstream's ``url`` (:func:`upstream_url`),
    the agent's ``headers`` less hop-by-hop ones, ``Host``, ``Content-Length`` and ``Expect``
    (names as latin-1, values as UTF-8 text, as aiohttp sends them), and its ``body``;
    ``agent``: the agent's address (ASGI's ``client``: host, port), for what the tap says of
    it."""

    method: str
    url: yarl.URL
    headers: list[tuple[str, str]]
    body: bytes
    agent: tuple[str, int] | None = None


@dataclass(frozen=True, kw_only=True)
class _Answer:
    """What :func:`_forward` saw: the upstream's ``status`` (``None``: not reached, the agent
    got a 502), ``reason`` phrase and ``headers``, whether it ``streamed`` SSE, the ``body``
    bytes forwarded (``b""`` unless kept), what went wrong (``error``, in words), the error
    that broke the answer off (``broke``, named as httpx names it, ``"RemoteProtocolError:
    ..."``, the name a cassette replays), and whether the agent went away before the answer
    ended (``gone``)."""

    status: int | None = None
    reason: str | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    streamed: bool = False
    body: bytes = b""
    error: str | None = None
    broke: str | None = None
    gone: bool = False


_UPSTREAM_ERRORS = (aiohttp.ClientError, OSError)
"""What asking the upstream or reading its answer raises (aiohttp's errors; a socket's,
``TimeoutError`` among them)."""


def broke_name(exc: BaseException) -> str:
    """``"Name: message"`` of an error that broke an upstream's answer off, named as httpx
    names it (the cassette's ``error``, which :mod:`boxmaker.cassettes` replays as that httpx
    error): an answer cut short by the upstream (``aiohttp.ClientPayloadError``, a closed
    connection) is a ``RemoteProtocolError``, unless a socket error (a reset) broke it, a
    ``ReadError`` as any other socket error; a timeout is a ``ReadTimeout``."""
    causes: list[BaseException] = []
    cause = exc.__cause__
    while cause is not None and len(causes) < 8:
        causes.append(cause)
        cause = cause.__cause__
    reset = any(isinstance(c, OSError) for c in causes)
    if isinstance(exc, aiohttp.ClientPayloadError) and reset:
        name = "ReadError"  # the connection reset under the body, as httpx names it
    elif isinstance(exc, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError):
        name = "RemoteProtocolError"
    elif isinstance(exc, TimeoutError):
        name = "ReadTimeout"
    else:
        name = "ReadError"
    return f"{name}: {exc or type(exc).__name__}"


async def _forward(
    upstream: aiohttp.ClientSession,
    request: _Request,
    receive: Receive,
    send: Send,
    *,
    keep: bool,
) -> _Answer:
    """Send ``request`` upstream and its answer to the agent, each read as it arrives
    (the agent going away closes the upstream connection, before the answer's head or
    during its body)."""
    body = request.body if request.body or request.method not in _BODILESS else None
    kept: list[bytes] = []
    problem: str | None = None
    broke: str | None = None
    # the answer is forwarded on this task; a watcher cancels it when the agent goes away,
    # from the moment the request goes up (llama-server says nothing of a completion that is
    # not streamed until it ends: the agent gone before that, the upstream connection is
    # closed and the generation stops); one task more a request, not two and a wait on both
    me = asyncio.current_task()
    state = {"gone": False, "ended": False}

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not state["ended"] and me is not None:
            state["gone"] = True
            me.cancel()

    watching = asyncio.ensure_future(watch())
    try:
        response = await upstream.request(
            request.method, request.url, headers=request.headers, data=body, allow_redirects=False
        )
    except asyncio.CancelledError:
        await _stop(watching, state)
        if not _agent_went(state, me):
            raise  # the tap stopping, not the agent going away
        return _Answer(error="the agent disconnected before the upstream answered", gone=True)
    except _UPSTREAM_ERRORS as exc:
        await _stop(watching, state)
        url = request.url
        base = f"{url.scheme}://{url.raw_authority}"
        if isinstance(exc, aiohttp.ClientResponseError):  # it answered, not in HTTP/1.1
            why = f"the tap could not read the answer of the upstream {base}: {exc}"
            kind = "tap_upstream_unreadable"
        else:
            why = f"the tap could not reach the upstream {base}: {type(exc).__name__}: {exc}"
            kind = "tap_upstream_unreachable"
        answer = {"error": {"message": why, "type": kind, "code": 502}}
        head = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 502, "headers": head})
        await send({"type": "http.response.body", "body": json.dumps(answer).encode()})
        return _Answer(error=why)
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    try:
        out = end_to_end(response.raw_headers, _HOP)
        await send({"type": "http.response.start", "status": response.status, "headers": out})
        # each read is all that came since the last one (events that came together leave in
        # one write: nothing waits, but a busy tap makes one write, not one per event)
        async for data in response.content.iter_any():
            if keep:
                kept.append(data)
            await send({"type": "http.response.body", "body": data, "more_body": True})
        state["ended"] = True
        await send({"type": "http.response.body", "body": b""})
    except asyncio.CancelledError:
        if not _agent_went(state, me):
            raise  # the tap stopping, not the agent going away
    except (aiohttp.ClientError, TimeoutError) as exc:  # before OSError: both are
        broke = broke_name(exc)
        problem = f"the upstream's answer broke off: {broke}"
        LOGGER.warning(
            "%s %s for %s: %s; the agent got it cut short",
            request.method,
            request.url.path,
            _host_port(*request.agent) if request.agent else "?",
            problem,
        )
        CUT.set(True)  # uvicorn's own words for the cut left out (_guard's HTTP_LOGGER)
    except OSError:  # the agent's socket failed under a write: it is gone
        state["gone"] = True
    finally:
        await _stop(watching, state)
        if problem is None and not state["gone"] and response.content.is_eof():
            response.release()  # read to its end: the connection goes back to the pool
        else:
            response.close()  # cut short: the upstream connection is closed
    gone = bool(state["gone"])
    error = problem or ("the agent disconnected mid-answer" if gone else None)
    return _Answer(
        status=response.status,
        reason=response.reason,
        headers=list(response.raw_headers),
        streamed=streamed,
        body=b"".join(kept),
        error=error,
        broke=broke,
        gone=gone,
    )


def _host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets (``[::1]:8089``), as a URL writes it."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _agent_went(state: dict[str, bool], me: asyncio.Task[Any] | None) -> bool:
    """Inside ``except CancelledError``: whether the watcher cancelled this task because the
    agent went away (the cancel is then taken back); ``False``: the tap is stopping."""
    if not state["gone"]:
        return False
    if me is not None:
        me.uncancel()
    return True


async def _stop(watching: asyncio.Future[None], state: dict[str, bool]) -> None:
    """The request is over (answered, failed or cut): its watcher stops, cancelling nothing."""
    state["ended"] = True
    watching.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watching


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
            is dropped, as :class:`~boxmaker.config.ClientConfig` drops it) or carries
            credentials (``user:password@``; the message does not show them), or ``port`` is not
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
        parsed = yarl.URL(base)
        if parsed.user is not None or parsed.password is not None:
            raise BoxmakerError(
                f"the tap's upstream {str(parsed.with_user(None))!r} was given with credentials "
                "(user:password@): the tap sends none of its own, each agent's Authorization "
                "header goes upstream as it came; give the URL without them"
            )
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
            # a proxy: the upstream's Server and Date go to the agent, not uvicorn's beside
            # them; no X-Forwarded-* header is believed (the tap names no client by them)
            server_header=False,
            date_header=False,
            proxy_headers=False,
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
            where = _host_port(host, self.port)
            raise BoxmakerError(f"the tap cannot listen on {where}: {exc}") from exc
        sock.listen(128)
        self.port = int(sock.getsockname()[1])
        if ipaddress.ip_address(host).is_unspecified:  # every interface: reached on loopback
            host = "::1" if family == socket.AF_INET6 else "127.0.0.1"
        self.url = "http://" + _host_port(host, self.port)
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
