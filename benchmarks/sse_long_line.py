"""Benchmark: one huge SSE line is decoded in linear time (issue 23).

Feeds the client's ``SSEDecoder`` (no cap) one ``data:`` line of ``N`` MB in 64 KiB
reads, then its blank line, for two sizes, and prints the CPU seconds per MB of each (
:func:`time.process_time`, best of ``--repeat``). Linear time gives a ratio near 1 (the
quadratic decoder it replaces: 1.6 s for 20 MB and 22 s for 40 MB, a ratio near 7).

The last line printed is::

    per_mb_ratio R.RR (small S MB: a s/MB, large L MB: b s/MB)

Goal: ``per_mb_ratio <= 1.5``.

Run: ``PYTHONPATH=. python benchmarks/sse_long_line.py [--small 16] [--large 128] [--repeat 3]``
"""

from __future__ import annotations

import argparse
import time

from boxmaker.client._stream._sse import SSEDecoder

READ = 65536


def seconds(mb: int) -> float:
    """CPU seconds to decode one line of ``mb`` MB in 64 KiB reads."""
    piece = b"x" * READ
    reads = mb * (1 << 20) // READ
    decoder = SSEDecoder(max_event_bytes=None)
    start = time.process_time()
    decoder.feed(b"data: ")
    for _ in range(reads):
        decoder.feed(piece)
    events = decoder.feed(b"\n\n")
    spent = time.process_time() - start
    assert len(events[0][1]) == reads * READ
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=16)
    parser.add_argument("--large", type=int, default=128)
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
