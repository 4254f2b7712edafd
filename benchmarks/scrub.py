"""Benchmark: scrubbing a turn's records with a huge api key is linear in the key's size.

Issue 36: a 50 MB ``api_key`` made a turn take 39 s, the key re-quoted for every string
written. Here a turn is ``--strings`` short strings and one that echoes the key, scrubbed
twice (the first pass makes the key's forms; the second, the next record of the same session,
finds them made): for a key of ``--small`` MB and ``--large`` MB (URL-unsafe, so that every
form is made: the key itself, URL-encoded twice, JSON-escaped).

The last line printed is::

    per_mb_ratio X.XX large_turn_s Y.YY again_s Z.ZZ

``per_mb_ratio``: seconds per MB at the large size over those at the small one (1.0: linear;
the old code was linear too per string but multiplied by the strings: 40 strings of a turn
took 77 s at 50 MB); ``large_turn_s``: the first pass at the large size; ``again_s``: the
second.

Run: ``PYTHONPATH=. python benchmarks/scrub.py [--small 5] [--large 50] [--strings 40]``
"""

from __future__ import annotations

import argparse
import time

from boxmaker._secrets import hide_in_json, searchable


def _turn(mb: int, strings: int) -> tuple[float, float]:
    key = "k/" * (mb * 1_000_000 // 2)
    value = {"records": [f"text {i}" for i in range(strings)], "echo": f"key: {key}"}
    secrets = searchable([key])
    started = time.perf_counter()
    hidden = hide_in_json(value, secrets)
    first = time.perf_counter() - started
    assert key not in hidden["echo"]
    started = time.perf_counter()
    hide_in_json(value, searchable([key]))
    return first, time.perf_counter() - started


def main() -> None:
    """Time both sizes and print the ratio line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=5, help="MB (default 5)")
    parser.add_argument("--large", type=int, default=50, help="MB (default 50)")
    parser.add_argument("--strings", type=int, default=40, help="strings a turn (default 40)")
    args = parser.parse_args()
    small, _ = _turn(args.small, args.strings)
    large, again = _turn(args.large, args.strings)
    print(f"{args.small} MB: {small:.2f} s; {args.large} MB: {large:.2f} s, again {again:.2f} s")
    ratio = (large / args.large) / (small / args.small)
    print(f"per_mb_ratio {ratio:.2f} large_turn_s {large:.2f} again_s {again:.2f}")


if __name__ == "__main__":
    main()
