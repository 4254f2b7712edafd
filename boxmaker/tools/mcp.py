"""MCP servers as the tool port: their tools join the registry, their calls go through the SDK.

:class:`McpPort` connects to one or more MCP servers (the Model Context Protocol: ``tools/list``
and ``tools/call``), each started as a subprocess speaking over stdio or reached over streamable
HTTP, with the official ``mcp`` Python SDK (PyPI ``mcp``, its ``Client``). The SDK is async; the
turn loop is not: the port owns one asyncio event loop in a background thread, holds each
server's connection there, and :meth:`McpPort.request` waits for the answer on the caller's
thread, looking at the turn's cancel switch and the server's timeout every few milliseconds.

How a ``tools/call`` result becomes the port's answer (:func:`mcp_answer`):

- text content (and the text of embedded resources) joined by newlines; with no text, the
  structured content as JSON; other blocks (images, audio, links) as a short placeholder;
- ``isError`` -> :class:`~boxmaker.tools.ToolFailed` with that text;
- otherwise :class:`~boxmaker.tools.ToolOk`, ``untrusted`` from the tool's ``openWorldHint``
  (absent: open world, as the MCP specification says) unless the server's config says,
  ``data_class`` from the server's config;
- a server that dies, errs or does not answer within its ``timeout_s`` (or a cancel) gives
  ``ToolFailed`` with the reason; its connection is dropped and made anew at the next call,
  so the turn goes on. Every answer names the server (``ToolResult.server`` in the log).
- a server that breaks the protocol fails the running call at once, not at the timeout: a
  line that is not JSON-RPC, an answer to a request never sent (:class:`_AnswersChecked`),
  or, over stdio, a line left unfinished with no further byte for the server's
  ``partial_line_s``, or a line longer than its ``max_line_chars`` (boxmaker's stdio
  transport, :mod:`boxmaker.tools._stdio`, the SDK's with a reader that sees the partial line
  and caps a line).

A session made with MCP tools replays without the servers: the log holds every result as a
``ToolResult``, and a cassette the ``tool`` messages, which is what a replay answers from.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.message import SessionMessage
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    JSONRPCError,
    JSONRPCRequest,
    JSONRPCResponse,
    ResourceLink,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
)

from ..config import Config, McpConfig, McpServerConfig
from ..errors import ConfigError, ToolPortError
from ._ports import ToolAnswer, ToolFailed, ToolHints, ToolOk, ToolRequest
from ._registry import Registry
from ._stdio import stdio_transport

__all__ = ["McpPort", "McpTool", "hints_of", "mcp_answer"]

log = logging.getLogger("boxmaker.tools.mcp")

POLL_S = 0.02
"""How often (seconds) a waiting call looks at the cancel switch and the clock."""
CLOSE_TIMEOUT_S = 10.0
"""Longest :meth:`McpPort.close` waits for the servers to shut down (seconds)."""


@dataclass(frozen=True, kw_only=True)
class McpTool:
    """A tool an MCP server offers, as registered: ``name`` in the registry (with the server's
    prefix), ``remote`` its name on ``server``, ``parameters`` its JSON schema as the server
    gave it (``inputSchema``), ``hints`` its annotations."""

    name: str
    remote: str
    server: str
    description: str
    parameters: Mapping[str, Any]
    hints: ToolHints


def hints_of(annotations: ToolAnnotations | None) -> ToolHints:
    """:class:`~boxmaker.tools.ToolHints` from MCP tool annotations; an absent hint takes the
    MCP specification's default (not read-only, destructive, not idempotent, open world)."""
    a = annotations or ToolAnnotations()
    return ToolHints(
        read_only=bool(a.read_only_hint),
        destructive=a.destructive_hint is not False,
        idempotent=bool(a.idempotent_hint),
        open_world=a.open_world_hint is not False,
    )


def mcp_answer(result: CallToolResult, tool: McpTool, server: McpServerConfig) -> ToolAnswer:
    """The port's answer to a ``tools/call`` result (see the module docstring for the rules)."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, EmbeddedResource) and isinstance(
            block.resource, TextResourceContents
        ):
            parts.append(block.resource.text)
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        else:  # an image, audio, a binary resource
            inner = getattr(block, "resource", block)
            mime = getattr(block, "mime_type", None) or getattr(inner, "mime_type", None)
            parts.append(f"[{block.type} content{f' {mime}' if mime else ''}]")
    texts = any(isinstance(b, TextContent | EmbeddedResource) for b in result.content)
    if not texts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return ToolFailed(message=text or f"{tool.remote} reported an error", server=server.name)
    untrusted = tool.hints.open_world if server.untrusted is None else server.untrusted
    return ToolOk(
        content=text, data_class=server.data_class, untrusted=untrusted, server=server.name
    )


class _Link:
    """One connection to one server, held open by a task on the port's event loop."""

    def __init__(self, server: McpServerConfig) -> None:
        self.server = server
        self.client: Client | None = None
        self.closed = threading.Event()
        self.stop: asyncio.Event | None = None
        self.task: asyncio.Task[None] | None = None
        self.cancelled = False  # the connecting task was cancelled: never twice (see _drop)
        self.broken: str | None = None  # the server broke the protocol (the SDK's words)
        # a stdio server's stderr, kept to say why it died; closed by McpPort.close
        self.stderr: TextIO = tempfile.TemporaryFile(  # noqa: SIM115
            "w+", encoding="utf-8", errors="replace"
        )

    def last_words(self) -> str:
        """The last line the server wrote to stderr (a stdio server's traceback ends there)."""
        with contextlib.suppress(OSError, ValueError):
            self.stderr.flush()
            self.stderr.seek(0, os.SEEK_END)
            size = self.stderr.tell()
            self.stderr.seek(max(0, size - 2000))
            lines = [line.strip() for line in self.stderr.read().splitlines() if line.strip()]
            return lines[-1][:200] if lines else ""
        return ""


class _SentIds:
    """The write side of a transport, keeping the id of every request sent (see
    :class:`_AnswersChecked`)."""

    def __init__(self, inner: Any, sent: set[str]) -> None:
        self._inner, self._sent = inner, sent

    async def send(self, item: SessionMessage, /) -> None:
        if isinstance(item.message, JSONRPCRequest):
            self._sent.add(str(item.message.id))
        await self._inner.send(item)

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _SentIds:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return bool(await self._inner.__aexit__(*exc))


class _CheckedAnswers:
    """The read side of a transport: an answer whose id no request sent carries becomes an
    error the port sees (the SDK drops such an answer at debug level, and the call it was
    meant for waited out its whole timeout; issue 23)."""

    def __init__(self, inner: Any, sent: set[str]) -> None:
        self._inner, self._sent = inner, sent

    def _checked(self, item: SessionMessage | Exception) -> SessionMessage | Exception:
        message = item.message if isinstance(item, SessionMessage) else None
        if not isinstance(message, JSONRPCResponse | JSONRPCError) or message.id is None:
            return item  # not an answer, or an error about a line (id null)
        if str(message.id) not in self._sent:
            return ValueError(f"an answer to a request never sent (id {message.id!r})")
        return item

    async def receive(self) -> SessionMessage | Exception:
        return self._checked(await self._inner.receive())

    def __aiter__(self) -> _CheckedAnswers:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        return self._checked(await self._inner.__anext__())

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _CheckedAnswers:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        return bool(await self._inner.__aexit__(*exc))


class _AnswersChecked:
    """An MCP transport (the SDK's ``Transport`` protocol: an async context manager giving
    the read and write streams) around another, whose answers to requests never sent are
    errors (:class:`_CheckedAnswers`)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._sent: set[str] = set()

    async def __aenter__(self) -> tuple[_CheckedAnswers, _SentIds]:
        read, write = await self._inner.__aenter__()
        return _CheckedAnswers(read, self._sent), _SentIds(write, self._sent)

    async def __aexit__(self, *exc: Any) -> bool | None:
        return bool(await self._inner.__aexit__(*exc))


def _reason(exc: BaseException) -> str:
    """A short text of what went wrong, from the first leaf of an exception group."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpPort:
    """A tool port whose tools live in MCP servers (see the module docstring).

    Connects to every server at once and lists its tools (``tools/list``, all pages); call
    :meth:`register` to offer them in a registry. Use as a context manager, or :meth:`close`.

    Args:
        servers: the servers (:class:`~boxmaker.config.McpServerConfig`, or a whole
            :class:`~boxmaker.config.McpConfig` / :class:`~boxmaker.config.Config`).

    Raises:
        ToolPortError: a server could not be started, reached or listed within its
            ``start_timeout_s`` (the servers already started are shut down).
        ConfigError: two servers offer a tool of the same name (give one a ``prefix``).
    """

    def __init__(self, servers: Sequence[McpServerConfig] | McpConfig | Config) -> None:
        if isinstance(servers, Config):
            servers = servers.mcp
        if isinstance(servers, McpConfig):
            servers = servers.servers
        self.servers: tuple[McpServerConfig, ...] = tuple(McpConfig(servers=tuple(servers)).servers)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="boxmaker-mcp", daemon=True
        )
        self._thread.start()
        self._lock = threading.RLock()
        self._links: dict[str, _Link] = {}
        self._opened: list[_Link] = []  # every link made, so close() waits for each to end
        self._tools: dict[str, McpTool] = {}
        self.restarts: dict[str, int] = {s.name: 0 for s in self.servers}
        self.skipped: dict[str, str] = {}
        """Tools :meth:`register` left out (registry name -> why)."""
        """How many times each server's connection was made anew after a failure."""
        try:
            opening = [(s, *self._open(s)) for s in self.servers]
            for server, link, _ in opening:
                self._links[server.name] = link
            for server, link, future in opening:
                listed = self._wait_open(link, future, None)
                if isinstance(listed, str):
                    raise ToolPortError(f"MCP server {server.name!r} could not start: {listed}")
                self._add_tools(server, listed)
        except BaseException:
            self.close()
            raise

    # -- the port --------------------------------------------------------------------------

    @property
    def tools(self) -> Mapping[str, McpTool]:
        """The servers' tools by registry name: the servers in order, each one's tools as listed."""
        return dict(self._tools)

    def register(self, registry: Registry, only: Collection[str] | None = None) -> tuple[str, ...]:
        """Offer the servers' tools in ``registry`` as port tools (the server's description and
        JSON schema), in order; returns the names added.

        Args:
            registry: where the tools go.
            only: registry names of the tools to offer (``None``: all of them).

        A tool whose name or schema the registry refuses (a name with a space, a schema that
        is not one) is left out when ``only`` is ``None``, the others are offered: one bad
        tool does not refuse its server. :attr:`skipped` says which and why, and a warning is
        logged (logger ``boxmaker.tools.mcp``).

        Raises:
            ConfigError: a name is taken in the registry already, a name in ``only`` is not a
                tool of this port, or a tool named in ``only`` is not valid for the registry
                (the message names the server).
        """
        unknown = sorted(set(only or ()) - set(self._tools))
        if unknown:
            raise ConfigError(f"no MCP server of this port offers {', '.join(unknown)}")
        chosen = [t for t in self._tools.values() if only is None or t.name in only]
        for tool in chosen:
            if tool.name in registry:
                raise ConfigError(
                    f"tool {tool.name!r} of MCP server {tool.server!r} is registered already; "
                    "give the server a prefix"
                )
        added: list[str] = []
        for tool in chosen:
            try:
                registry.add_port_tool(tool.name, tool.description, tool.parameters)
            except ValueError as exc:
                if only is not None:
                    raise ConfigError(f"MCP server {tool.server!r}: {exc}") from exc
                self.skipped[tool.name] = f"MCP server {tool.server!r}: {exc}"
                log.warning("left out %r: %s", tool.name, self.skipped[tool.name])
                continue
            added.append(tool.name)
        return tuple(added)

    def hints(self, tool: str) -> ToolHints | None:
        """The annotations of ``tool`` (a registry name); ``None`` for a tool not of this port."""
        found = self._tools.get(tool)
        return found.hints if found else None

    def request(self, request: ToolRequest) -> ToolAnswer:
        """Run one call on the tool's server and map the result (never raises for a server's
        failure: it is a ``ToolFailed`` naming the server, and the server is restarted)."""
        tool = self._tools.get(request.tool)
        if tool is None:
            return ToolFailed(message=f"no MCP server of this port offers {request.tool!r}")
        server = next(s for s in self.servers if s.name == tool.server)
        link = self._live_link(server, request)
        if isinstance(link, str):
            return ToolFailed(message=link, server=server.name)
        call = self._run(self._call(link, tool.remote, dict(request.arguments)))
        deadline = time.monotonic() + server.timeout_s
        cancel = request.cancel
        while True:
            try:
                result = call.result(timeout=POLL_S)
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.is_set():
                    self._drop(link, call)
                    why = "the call was cancelled; the server is restarted for the next call"
                    return ToolFailed(message=f"{server.name}: {why}", server=server.name)
                if link.broken is not None:  # no answer will come: fail now, not at the timeout
                    self._drop(link, call)
                    why = f"broke the protocol ({link.broken[:200]}); it is restarted"
                    return ToolFailed(message=f"{server.name} {why}", server=server.name)
                if time.monotonic() >= deadline:
                    self._drop(link, call)
                    why = (
                        f"no answer within {server.timeout_s:g} s; the server is restarted "
                        "for the next call"
                    )
                    return ToolFailed(message=f"{server.name}: {why}", server=server.name)
                continue
            except BaseException as exc:  # the server died or broke the protocol
                self._drop(link, call)
                said = link.last_words()
                said = f" (the server said: {said})" if said else ""
                if link.broken is not None:  # the transport ended the stream for it
                    why = f"broke the protocol ({link.broken[:200]}){said}; it is restarted"
                    return ToolFailed(message=f"{server.name} {why}", server=server.name)
                why = _reason(exc) + said
                message = f"{server.name} failed during the call: {why}; it is restarted"
                return ToolFailed(message=message, server=server.name)
            return mcp_answer(result, tool, server)

    def close(self) -> None:
        """Shut every server connection down (stdio servers exit), then the event loop."""
        if not self._thread.is_alive():
            return
        with self._lock:
            links, self._links = list(self._opened), {}
        for link in links:
            self._drop(link, None)
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for link in links:
            link.closed.wait(max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(OSError):
                link.stderr.close()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CLOSE_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> McpPort:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- connections ---------------------------------------------------------------------------

    def _run(self, coro: Any) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def _open(self, server: McpServerConfig) -> tuple[_Link, concurrent.futures.Future[Any]]:
        """Start connecting to ``server``; the future gives its tools once listed."""
        link = _Link(server)
        with self._lock:
            ended = [k for k in self._opened if k.closed.is_set()]
            self._opened = [*(k for k in self._opened if not k.closed.is_set()), link]
        for k in ended:  # a link dropped for a restart: its stderr file is not needed any more
            with contextlib.suppress(OSError):
                k.stderr.close()
        return link, self._run(self._start(link))

    def _wait_open(
        self, link: _Link, future: concurrent.futures.Future[Any], request: ToolRequest | None
    ) -> list[Tool] | str:
        """The server's tools, or why it could not start (timeout, cancel, error)."""
        timeout = link.server.start_timeout_s
        deadline = time.monotonic() + timeout
        cancel = request.cancel if request else None
        while True:
            try:
                tools: list[Tool] = future.result(timeout=POLL_S)
                return tools
            except concurrent.futures.TimeoutError:
                if cancel is not None and cancel.is_set():
                    self._drop(link, future)
                    return f"{link.server.name}: the start was cancelled"
                if time.monotonic() >= deadline:
                    self._drop(link, future)
                    return f"{link.server.name}: not ready within {timeout:g} s"
            except BaseException as exc:
                self._drop(link, None)
                said = link.last_words()
                return _reason(exc) + (f" (the server said: {said})" if said else "")

    def _live_link(self, server: McpServerConfig, request: ToolRequest) -> _Link | str:
        """The server's connection, made anew when the last one failed."""
        with self._lock:
            link = self._links.get(server.name)
            if link is not None and not link.closed.is_set():
                return link
            self._links.pop(server.name, None)
            self.restarts[server.name] += 1
            link, future = self._open(server)
            listed = self._wait_open(link, future, request)
            if isinstance(listed, str):
                return f"{server.name} could not be restarted: {listed}"
            self._links[server.name] = link
            return link

    def _drop(self, link: _Link, future: concurrent.futures.Future[Any] | None) -> None:
        """Cancel ``future`` and close ``link`` in the background; the next call reconnects."""
        if future is not None:
            future.cancel()
        with self._lock:
            if self._links.get(link.server.name) is link:
                del self._links[link.server.name]

        def stop() -> None:
            if link.task is None:  # never started
                link.closed.set()
            elif link.client is None:  # still connecting (or done): stop trying
                # Once only: a second native cancel would land inside the SDK's shielded
                # shutdown and leave the server process running.
                if not link.cancelled:
                    link.cancelled = True
                    link.task.cancel()
            elif link.stop is not None:  # connected: leave the context, the SDK shuts down
                link.stop.set()

        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(stop)

    def _add_tools(self, server: McpServerConfig, tools: list[Tool]) -> None:
        for tool in tools:
            name = server.prefix + tool.name
            other = self._tools.get(name)
            if other is not None:
                raise ConfigError(
                    f"tool {name!r} is offered by MCP servers {other.server!r} and "
                    f"{server.name!r}: give one of them a prefix"
                )
            self._tools[name] = McpTool(
                name=name,
                remote=tool.name,
                server=server.name,
                description=tool.description or "",
                parameters=dict(tool.input_schema),
                hints=hints_of(tool.annotations),
            )

    # -- on the event loop ---------------------------------------------------------------------

    async def _start(self, link: _Link) -> list[Tool]:
        ready: asyncio.Future[list[Tool]] = self._loop.create_future()
        link.stop = asyncio.Event()
        link.task = asyncio.create_task(self._hold(link, ready))
        return await ready

    async def _hold(self, link: _Link, ready: asyncio.Future[list[Tool]]) -> None:
        """Open the connection, list the tools, keep it open until ``link.stop`` is set."""
        server = link.server
        target: Any
        if server.url is not None:
            target = server.url
        else:
            params = StdioServerParameters(
                command=server.command[0], args=list(server.command[1:]), cwd=server.cwd
            )
            if sys.platform == "win32":  # the SDK's transport: no partial-line clock there
                transport: Any = stdio_client(params, errlog=link.stderr)
            else:
                transport = stdio_transport(
                    params,
                    errlog=link.stderr,
                    partial_line_s=server.partial_line_s,
                    max_line_chars=server.max_line_chars,
                )
            target = _AnswersChecked(transport)
        try:

            async def on_message(message: Any) -> None:  # the SDK's message_handler
                if isinstance(message, Exception):  # a line not JSON-RPC, an unknown id
                    link.broken = link.broken or _reason(message)

            async with Client(target, cache=None, message_handler=on_message) as client:
                tools: list[Tool] = []
                cursor: str | None = None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    tools.extend(page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                link.client = client
                if not ready.done():
                    ready.set_result(tools)
                assert link.stop is not None
                await link.stop.wait()
        except BaseException as exc:
            if not ready.done():
                why = _reason(exc) if link.broken is None else f"broke the protocol ({link.broken})"
                ready.set_exception(RuntimeError(why))
            if not isinstance(exc, Exception):
                raise
        finally:
            link.client = None
            link.closed.set()

    async def _call(self, link: _Link, name: str, arguments: dict[str, Any]) -> CallToolResult:
        if link.client is None:
            raise RuntimeError("the connection is closed")
        return await link.client.call_tool(name, arguments)
