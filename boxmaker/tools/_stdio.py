"""boxmaker's stdio transport for MCP servers: the SDK's, with a reader that sees half a line.

The ``mcp`` SDK's ``stdio_client`` keeps the unfinished end of a server's stdout (the bytes
after its last newline) in a local buffer: a server that writes half a JSON-RPC message and
goes silent left the call waiting for its whole timeout, and nothing outside could tell
(issue 23). :func:`stdio_transport` is that transport written again with the same behaviour,
except that its reader times a partial line: when bytes of an unfinished line are held and no
further byte comes for ``partial_line_s`` seconds, it hands the session a
:class:`PartialLineError` (which the port's ``message_handler`` sees, as it sees a line that
is not JSON) and ends the read stream, so every call waiting on the server fails at once. A
long message written slowly still goes through: the timer starts again at each chunk. And it
caps a line: one that grows past ``max_line_chars`` is handed over as a
:class:`LineTooLongError` the same way, and the rest of stdout is read and dropped (issue 36:
a 500 MB line was held whole, 1.3 GB).

Everything else follows ``mcp.client.stdio`` (mcp 2.3) on POSIX: the server runs in a new
session (its own process group) with the SDK's default environment, stdout is read one line
at a time with no read-ahead while a delivery waits, each written message is one line of
JSON, stderr goes to ``errlog``, and shutdown runs shielded with every wait bounded: close the
read side and drain stdout, give the writer ``WRITER_FLUSH_S`` to flush, close stdin, wait
``EXIT_WAIT_S`` for the server to exit, then SIGTERM its process group and SIGKILL it after
``FORCE_KILL_S`` (the SDK's ``terminate_posix_process_tree``), wait ``KILL_REAP_S`` to see it
die. The SDK's Windows parts (job objects, the executable lookup) are left out: on Windows the
port uses the SDK's own ``stdio_client``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import TextIO

import anyio
import anyio.lowlevel
from anyio.abc import AsyncResource, ObjectReceiveStream, Process
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import StdioServerParameters, get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage
from mcp.types import jsonrpc_message_adapter

__all__ = ["MAX_LINE_CHARS", "LineTooLongError", "PartialLineError", "stdio_transport"]

log = logging.getLogger("boxmaker.tools.mcp")

EXIT_WAIT_S = 2.0
"""Seconds a server has to exit by itself once its stdin is closed (the SDK's)."""
FORCE_KILL_S = 2.0
"""Seconds between SIGTERM to the server's process group and SIGKILL (the SDK's)."""
KILL_REAP_S = 2.0
"""Seconds to see a killed server die; only an unkillable one runs it out (the SDK's)."""
WRITER_FLUSH_S = 0.5
"""Seconds the writer has at shutdown to flush the messages it accepted (the SDK's)."""
EXIT_POLL_S = 0.01
"""How often (seconds) shutdown looks whether the server has exited (the SDK's)."""
EXCERPT = 80
"""Characters of a partial line that :class:`PartialLineError` shows."""

Item = SessionMessage | Exception
"""What the read stream carries: a message, or why a line was not one."""
Streams = tuple[MemoryObjectReceiveStream[Item], MemoryObjectSendStream[SessionMessage]]


MAX_LINE_CHARS = 16 * 1024 * 1024
"""Default cap on one line of a server's stdout, in characters (16 Mi: the client's cap on
one SSE event); :attr:`boxmaker.config.McpServerConfig.max_line_chars` sets it per server."""


class LineTooLongError(ValueError):
    """A stdio server wrote a line longer than the cap (no newline within it). The message
    shows the line's first :data:`EXCERPT` characters, its length so far and the cap."""


class PartialLineError(ValueError):
    """A stdio server left a line unfinished: no newline, and no further byte for the grace
    (or its stdout ended). The message shows the line's first :data:`EXCERPT` characters and
    its length so far."""


def _partial(buffer: str, why: str) -> PartialLineError:
    more = "..." if len(buffer) > EXCERPT else ""
    return PartialLineError(f"{why}: {buffer[:EXCERPT]!r}{more} ({len(buffer)} characters)")


def _parse_line(line: str) -> SessionMessage | Exception:
    """One stdout line as a message, or the parse error as a value for the session."""
    try:
        message = jsonrpc_message_adapter.validate_json(line, by_name=False)
    except ValueError as exc:
        log.warning("a line from an MCP server is not a JSON-RPC message: %s", exc)
        return exc
    return SessionMessage(message)


def _too_long(buffer: str, size: int, cap: int) -> LineTooLongError:
    more = "..." if len(buffer) > EXCERPT else ""
    return LineTooLongError(
        f"a line longer than {cap} characters (max_line_chars), not read further: "
        f"{buffer[:EXCERPT]!r}{more} ({size} characters so far)"
    )


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters,
    *,
    errlog: TextIO,
    partial_line_s: float,
    max_line_chars: int = MAX_LINE_CHARS,
) -> AsyncIterator[Streams]:
    """Start ``server`` and yield the read and write streams the SDK's ``ClientSession``
    (and ``Client``) take, as ``mcp.client.stdio.stdio_client`` does.

    Args:
        server: the command, arguments, extra environment, working directory and encoding.
        errlog: where the server's stderr goes (a real file: it is the child's fd 2).
        partial_line_s: seconds an unfinished line may wait for its next byte; then the read
            stream yields a :class:`PartialLineError` and ends.
        max_line_chars: the longest line read, in characters; a longer one makes the read
            stream yield a :class:`LineTooLongError` and end (the rest is drained unread).

    Raises:
        OSError: the server could not be started.
    """
    process = await anyio.open_process(
        [server.command, *server.args],
        env=get_default_environment() | (server.env or {}),
        stderr=errlog,
        cwd=server.cwd,
        start_new_session=True,
    )
    # No awaits until the task group is entered: a cancel in the gap would leak the process.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[Item](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)
    shutting_down = False
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout is not None, "the server is started with a stdout pipe"
        stdout = TextReceiveStream(
            process.stdout, encoding=server.encoding, errors=server.encoding_error_handler
        )
        try:
            async with read_stream_writer:
                try:
                    await _read_lines(stdout, read_stream_writer, partial_line_s, max_line_chars)
                finally:
                    # The session sees the end now (waiting calls fail), not after the drain,
                    # which lasts until shutdown when the reading stopped at a partial line.
                    read_stream_writer.close()
                    await _drain_stdout(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed stdout under the read
        except (anyio.BrokenResourceError, ConnectionError):
            if not shutting_down:  # noise at shutdown, a real failure otherwise
                log.exception("reading an MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        assert process.stdin is not None, "the server is started with a stdin pipe"
        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    message = session_message.message
                    text = message.model_dump_json(by_alias=True, exclude_unset=True)
                    data = (text + "\n").encode(server.encoding, server.encoding_error_handler)
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still live: end the read stream, so no request waits forever.
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def shutdown() -> None:
        read_stream.close()  # the reader drains, so a server stuck writing can read stdin
        write_stream.close()
        with anyio.move_on_after(WRITER_FLUSH_S) as flush:
            await writer_done.wait()
        if flush.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await _stop_server_process(process)
        for stream in (read_stream, write_stream, read_stream_writer, write_stream_reader):
            await stream.aclose()
        await anyio.lowlevel.checkpoint()  # the unblocked tasks leave by their except paths

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            with anyio.CancelScope(shield=True):  # even when the caller is cancelled
                await shutdown()
            tg.cancel_scope.cancel()  # a kill survivor's open pipe could still block a task
    await anyio.lowlevel.cancel_shielded_checkpoint()


async def _read_lines(
    stdout: ObjectReceiveStream[str],
    out: MemoryObjectSendStream[Item],
    partial_line_s: float,
    max_line_chars: int | None = MAX_LINE_CHARS,
) -> None:
    """Send each line of ``stdout`` to ``out`` as it completes (one at a time, no read-ahead
    while a delivery waits); an unfinished line with no byte for ``partial_line_s`` seconds,
    or at the end of stdout, is sent as a :class:`PartialLineError`, and a line that grows
    past ``max_line_chars`` characters (``None``: no cap) as a :class:`LineTooLongError`;
    either ends the reading.

    The unfinished line is held in the pieces it came in and joined once it ends, so a long
    line costs time in proportion to its length (the SDK joins the whole buffer to each chunk),
    and memory no more than the cap and one read.
    """
    held: list[str] = []  # the unfinished line's pieces
    size = 0  # characters in held
    cap = math.inf if max_line_chars is None else max_line_chars
    while True:
        # Only the wait for the next byte of an unfinished line is timed, never a delivery.
        with anyio.move_on_after(partial_line_s if held else math.inf) as waiting:
            try:
                chunk = await stdout.receive()
            except anyio.EndOfStream:
                if held:
                    why = "stdout ended in the middle of a line"
                    await _deliver(out, _partial("".join(held), why))
                return
        if waiting.cancelled_caught:
            why = f"a line left unfinished, no byte for {partial_line_s:g} s"
            await _deliver(out, _partial("".join(held), why))
            return
        if "\n" not in chunk:
            if chunk:
                held.append(chunk)
                size += len(chunk)
                if size > cap:
                    await _deliver(out, _too_long(held[0], size, int(cap)))
                    return
            continue
        first, *lines = chunk.split("\n")
        rest = lines.pop()
        for line in ["".join([*held, first]), *lines]:  # held: at most the cap, one read more
            if len(line) > cap:
                await _deliver(out, _too_long(line, len(line), int(cap)))
                return
            if not await _deliver(out, _parse_line(line)):
                return
        held, size = ([rest], len(rest)) if rest else ([], 0)
        if size > cap:
            await _deliver(out, _too_long(rest, size, int(cap)))
            return


async def _deliver(out: MemoryObjectSendStream[Item], item: SessionMessage | Exception) -> bool:
    """Send ``item``; ``False`` when the session is gone (only the drain remains)."""
    try:
        await out.send(item)
    except (anyio.ClosedResourceError, anyio.BrokenResourceError):
        return False
    return True


async def _drain_stdout(process: Process) -> None:
    """Read and drop the rest of the server's stdout until shutdown closes it, so a server
    flushing its output does not block on a full pipe and miss its chance to exit."""
    assert process.stdout is not None
    with (
        anyio.CancelScope(shield=True),
        suppress(
            anyio.EndOfStream,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
            ConnectionError,
            OSError,
        ),
    ):
        while True:
            await process.stdout.receive()


async def _stop_server_process(process: Process) -> None:
    """Close stdin, wait for the server to exit, else SIGTERM then SIGKILL its process group
    (the order of the MCP specification's shutdown; the times are the SDK's)."""
    assert process.stdin is not None and process.stdout is not None
    await _close_pipe(process.stdin)
    if not await _exited(process, EXIT_WAIT_S):
        await terminate_posix_process_tree(process, FORCE_KILL_S)
        if not await _exited(process, KILL_REAP_S):
            log.warning("MCP server process %d is alive after SIGKILL; left as it is", process.pid)
    await _close_pipe(process.stdout)  # a survivor may hold the pipe open: end the reader
    _close_subprocess_transport(process)


async def _close_pipe(stream: AsyncResource) -> None:
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.aclose()


async def _exited(process: Process, timeout: float) -> bool:
    """Whether the server exited within ``timeout`` seconds, by its return code (not
    ``process.wait()``, which also waits for the pipes' end: a child holding them would make
    an exited server look hung)."""
    deadline = anyio.current_time() + timeout
    while process.returncode is None:
        if anyio.current_time() >= deadline:
            return False
        await anyio.sleep(EXIT_POLL_S)
    return True


def _close_subprocess_transport(process: Process) -> None:
    """Close asyncio's subprocess transport, which a descendant holding a pipe keeps open (it
    warns when collected); nothing public reaches it, hence the attributes (as the SDK does)."""
    transport = getattr(getattr(process, "_process", None), "_transport", None)
    close = getattr(transport, "close", None)
    if callable(close):
        with suppress(PermissionError):  # re-killing a setuid child on Python <= 3.12
            close()
