"""Benchmark: reading, checking and replaying a cassette cost time linear in its size.

Issue 36: a cassette of 200,000 interactions (a long ``boxmaker tap --cassette`` recording)
took 67-72 s of CPU and 1.5 GB to ``cassette show`` or ``check``, and ``replay`` had not
finished at 300 s: ``show`` looked for each interaction's reasoning-control target among
every chat, and replay tried every recorded request against every request sent, parsing both
bodies (n**2 each); the YAML was composed whole before anything was built.

A cassette of ``--small`` and of ``--large`` interactions is made (one recorded chat
exchange with a short llama.cpp stream, written by :class:`boxmaker.cassettes.CassetteWriter`,
repeated with a new user message each time), then each size is, in a process of its own
(peak memory is that process's): shown (``transcript``), checked (``check_prefix``), and
replayed (every recorded request sent again inside ``use_cassette(path, "none")``).

The last line printed is::

    show_ratio X.XX check_ratio Y.YY replay_ratio Z.ZZ large_rss_mb M

each ratio the time per interaction at the large size over the small one (1.0: linear;
quadratic code gives about large/small), and the largest peak memory at the large size.

Run: ``PYTHONPATH=. python benchmarks/cassette_scale.py [--small 2000] [--large 20000]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from boxmaker.cassettes import CassetteWriter
from boxmaker.testing import Reply, Stall

_HEAD = "version: 1\ninteractions:\n"
_URL = "http://127.0.0.1:8080/v1/chat/completions"


def make(path: Path, n: int) -> None:
    """A cassette of ``n`` chat interactions, each with its own user message."""
    one = path.with_suffix(".one.yaml")
    events = b"".join(e for e in Reply(content="Sunny.").events() if not isinstance(e, Stall))
    body = json.dumps({"messages": [{"role": "user", "content": "QQQ"}], "stream": True})
    with CassetteWriter(one) as writer:
        writer.add(method="POST", uri=_URL, request_headers=[], request_body=body.encode(),
                   status=200, response_headers=[("content-type", "text/event-stream")],
                   body=events)  # fmt: skip
    item = one.read_text()[len(_HEAD) :]
    with path.open("w", encoding="utf-8") as fh:
        fh.write(_HEAD)
        for i in range(n):
            fh.write(item.replace("QQQ", f"question {i}"))


CHILD = """
import json, resource, sys, time
import httpx
from boxmaker.cassettes import check_prefix, load_interactions, transcript, use_cassette
what, path = sys.argv[1], sys.argv[2]
started = time.process_time()
if what == "show":
    transcript(path)
elif what == "check":
    check_prefix(path)
else:
    bodies = [i["request"]["body"] for i in load_interactions(path)]
    with use_cassette(path, "none"), httpx.Client() as client:
        for body in bodies:
            client.post("http://127.0.0.1:9/v1/chat/completions", content=body).read()
print(time.process_time() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def measure(what: str, path: Path) -> tuple[float, float]:
    """CPU seconds and peak RSS (MB) of one operation in a process of its own."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, what, str(path)], capture_output=True, text=True, check=True
    )
    seconds, rss_kb = done.stdout.split()
    return float(seconds), int(rss_kb) / 1024


def main() -> None:
    """Make both sizes, time each operation, print the ratio line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=2000, help="interactions (default 2000)")
    parser.add_argument("--large", type=int, default=20000, help="interactions (default 20000)")
    args = parser.parse_args()
    ratios: dict[str, float] = {}
    rss = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {}
        for n in (args.small, args.large):
            path = Path(tmp) / f"c{n}.yaml"
            make(path, n)
            sizes[n] = path
        for what in ("show", "check", "replay"):
            small, _ = measure(what, sizes[args.small])
            large, peak = measure(what, sizes[args.large])
            rss = max(rss, peak)
            per = (large / args.large) / (small / args.small)
            ratios[what] = per
            print(
                f"{what}: {args.small} in {small:.2f} s, {args.large} in {large:.2f} s "
                f"({large / args.large * 1000:.2f} ms each, peak {peak:.0f} MB)",
                flush=True,
            )
    print(
        f"show_ratio {ratios['show']:.2f} check_ratio {ratios['check']:.2f} "
        f"replay_ratio {ratios['replay']:.2f} large_rss_mb {rss:.0f}"
    )


if __name__ == "__main__":
    main()
