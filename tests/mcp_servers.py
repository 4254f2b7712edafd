"""A small MCP server for the tests and notebook 07, built on the SDK's server API (``MCPServer``,
FastMCP's name in mcp 2): the demo's ``get_weather`` and ``get_time``, and tools that fail on
purpose.

Run it as ``python mcp_servers.py stdio`` (an MCP server on stdin/stdout; ``stdio-demo``: the
demo's two tools only) or
``python mcp_servers.py http PORT`` (streamable HTTP on ``http://127.0.0.1:PORT/mcp``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parent.parent))  # this checkout's boxmaker, when run as a server

import anyio  # noqa: E402
from mcp.server.mcpserver import MCPServer  # noqa: E402
from mcp.types import ToolAnnotations  # noqa: E402

from boxmaker.demo import get_time, get_weather  # noqa: E402


def build(faults: bool = True) -> MCPServer:
    """The server: ``get_weather`` (read-only, closed world), ``get_time`` (no annotations:
    open world and destructive by the MCP defaults), and with ``faults`` ``forget_city``
    (destructive), ``fail`` (``isError``), ``crash`` (the process exits mid-call) and ``hang``
    (never answers)."""
    server = MCPServer("demo", log_level="WARNING")
    closed = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    server.add_tool(get_weather, annotations=closed)
    server.add_tool(get_time)
    if not faults:
        return server

    @server.tool(annotations=ToolAnnotations(destructive_hint=True, open_world_hint=False))
    def forget_city(city: str) -> str:
        """Forget everything known about a city."""
        return f"forgot {city}"

    @server.tool()
    def fail(city: str) -> str:
        """Always fails."""
        raise ValueError(f"no weather station in {city}")

    @server.tool()
    def crash(city: str) -> str:
        """The server process exits in the middle of the call."""
        sys.stderr.write(f"crashing on {city}\n")
        sys.stderr.flush()
        os._exit(3)

    @server.tool()
    async def hang(city: str) -> str:
        """Never answers."""
        await anyio.sleep(3600)
        return city

    return server


def stdio_command(faults: bool = True) -> tuple[str, ...]:
    """The command that runs this server over stdio (only the demo's two tools without
    ``faults``)."""
    return (sys.executable, str(HERE), "stdio" if faults else "stdio-demo")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_http() -> tuple[subprocess.Popen[bytes], str]:
    """Start the server over streamable HTTP on a free port; returns the process and its URL
    once it accepts connections. Stop it with ``process.kill()``.

    Raises:
        RuntimeError: it did not listen within 60 s.
    """
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, str(HERE), "http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return process, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"the MCP test server did not listen on port {port}")


if __name__ == "__main__":
    if sys.argv[1].startswith("stdio"):
        build(faults=sys.argv[1] == "stdio").run()
    else:
        build().run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
