"""Benchmark: one huge line from a stdio MCP server is read in linear time (issue 23).

Feeds the line reader of boxmaker's stdio transport (``boxmaker.tools._stdio._read_lines``)
one JSON-RPC answer of ``N`` MB (a text result) in 64 KiB pieces, as a server's stdout
arrives, and prints the CPU seconds per MB for two sizes (:func:`time.process_time`, best of
``--repeat``; the JSON parse is included). Linear time gives a ratio near 1 (measured 1.5
to 1.6: the parse and the allocations of a 64 MB string cost a little more per MB); the
SDK's reader, which joins its whole buffer to each new piece, grows with the square of the
size (its split alone, measured apart: 0.04 s/MB at 8 MB, 0.17 s/MB at 32 MB), a ratio
near 8 for these sizes.

The last line printed is::

    per_mb_ratio R.RR (small S MB: a s/MB, large L MB: b s/MB)

Goal: ``per_mb_ratio <= 2.0``.

Run: ``PYTHONPATH=. python benchmarks/mcp_long_line.py [--small 8] [--large 64] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import json
import time

import anyio
from mcp.shared.message import SessionMessage

from boxmaker.tools._stdio import _read_lines

READ = 65536


def seconds(mb: int) -> float:
    """CPU seconds to read one answer line of about ``mb`` MB in 64 KiB pieces."""
    head = json.dumps({"jsonrpc": "2.0", "id": 1, "result": {"text": ""}})[:-3]
    line = head + "x" * (mb * (1 << 20)) + '"}}\n'
    pieces = [line[i : i + READ] for i in range(0, len(line), READ)]

    async def run() -> float:
        send, receive = anyio.create_memory_object_stream[str](len(pieces))
        out_send, out = anyio.create_memory_object_stream[SessionMessage | Exception](1)
        async with send, receive, out_send, out:
            for piece in pieces:
                send.send_nowait(piece)
            send.close()
            start = time.process_time()
            await _read_lines(receive, out_send, 5.0, None)  # uncapped: the reading is measured
            spent = time.process_time() - start
            item = out.receive_nowait()
            assert isinstance(item, SessionMessage), item
            return spent

    return anyio.run(run)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=8)
    parser.add_argument("--large", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    small = min(seconds(args.small) for _ in range(args.repeat)) / args.small
    large = min(seconds(args.large) for _ in range(args.repeat)) / args.large
    print(
        f"per_mb_ratio {large / small:.2f} (small {args.small} MB: {small:.4f} s/MB, "
        f"large {args.large} MB: {large:.4f} s/MB)"
    )


if __name__ == "__main__":
    main()
