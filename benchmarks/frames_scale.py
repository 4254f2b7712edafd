"""Benchmark: the frames past memory: the pandas engine against the DuckDB engine.

Writes generated session logs (benchmarks/frames.py's ``make_log``: turns of a user message,
tool-call completions with usage and tool results, a final answer, cache losses and limit
hits; in the current schema, so no upgrade runs) holding about N request (``Usage``) records
each size (the first 48 logs generated, the others copies of them under their own session
ids), then, each in a fresh process (its own peak RSS), computes the ``requests`` and
``turns`` frames:

- pandas: ``boxmaker.frames.load(dir)`` (all in memory), for sizes up to ``--pandas-max``;
- DuckDB: ``boxmaker.frames.connect(dir, memory_limit=...)`` and ``COPY requests`` /
  ``COPY turns`` to Parquet (the frames never in Python memory).

    PYTHONPATH=. python benchmarks/frames_scale.py [--sizes 1000000,10000000,50000000] [--dir DIR]

Each size's logs take about 900 bytes per request record on disk (check ``df`` first). Every
log is still checked by the session's own reader (``read_log``, in Python) in both engines:
validity is one rule; the DuckDB path checks in worker processes, one per CPU
(``frames.connect(workers=None)``), the pandas path in its one process.

Last line: ``duckdb_vs_pandas X.XX rss_<largest>_mb Y``: pandas' wall time over DuckDB's at the
smallest size (above 1: DuckDB faster) and the DuckDB path's peak RSS at the largest size (its
process's, plus its largest worker's once per CPU).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
LOG_LINES = 4000


def _make_log() -> object:
    spec = importlib.util.spec_from_file_location("frames_bench", HERE / "frames.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_log


DISTINCT = 48
"""Logs generated afresh per size; the rest are copies of them under their own session ids
(the check and the frames cost the same per record; writing 50M records from scratch would
take longer than reading them)."""


def write_logs(folder: Path, requests: int, seed: int = 7) -> tuple[int, int]:
    """Logs in ``folder`` until they hold ``requests`` Usage records: (requests, lines)."""
    from boxmaker.records import SCHEMA_VERSION

    make_log = _make_log()
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    made = lines = n = 0
    made_from: list[tuple[bytes, int, int]] = []  # (text, usage records, lines)
    while made < requests:
        sid = f"s{n:08d}"
        path = folder / f"{sid}.jsonl"
        if n < DISTINCT:
            make_log(path, sid, LOG_LINES, rng, SCHEMA_VERSION)  # type: ignore[operator]
            text = path.read_bytes()
            made_from.append((text, text.count(b'"type":"usage"'), text.count(b"\n")))
        else:
            text, _, _ = made_from[n % DISTINCT]
            head, rest = text.split(b"\n", 1)
            old = json.loads(head)["session_id"].encode()
            path.write_bytes(head.replace(old, sid.encode(), 1) + b"\n" + rest)
        made += made_from[n % DISTINCT][1]
        lines += made_from[n % DISTINCT][2]
        n += 1
    return made, lines


def child(engine: str, folder: str, memory_limit: str) -> None:
    """One measurement, in this process: prints ``wall_s rss_mb rows``."""
    import boxmaker.frames as frames

    t0 = time.perf_counter()
    if engine == "pandas":
        loaded = frames.load(folder)
        rows = len(loaded.requests) + len(loaded.turns)
    else:
        out = Path(tempfile.mkdtemp(prefix="boxmaker-scale-"))
        con = frames.connect(folder, memory_limit=memory_limit)
        try:
            for name in ("requests", "turns"):
                con.execute(f"COPY (SELECT * FROM {name}) TO '{out / name}.parquet'")
            rows = sum(
                con.execute(f"SELECT count(*) FROM '{out / n}.parquet'").fetchone()[0]  # type: ignore[index]
                for n in ("requests", "turns")
            )
        finally:
            con.close()
            shutil.rmtree(out, ignore_errors=True)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the DuckDB path's worker processes (they have exited): the largest one's peak, counted
    # once per CPU as an upper bound of what they held at once
    worker = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    workers = len(os.sched_getaffinity(0)) if worker else 0
    print(json.dumps({"wall_s": wall, "rss_mb": rss + workers * worker, "rows": rows}))


def measure(engine: str, folder: Path, memory_limit: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, __file__, "--child", engine, str(folder), "--memory-limit", memory_limit],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:  # the child's own error said, not only its exit status
        sys.exit(f"{engine} on {folder} failed ({out.returncode}):\n{out.stderr[-4000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _line(m: dict[str, float]) -> str:
    return f"{m['wall_s']:8.1f} s  {m['rss_mb']:7.0f} MiB peak RSS  {m['rows']:,.0f} rows"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1000000,10000000,50000000", help="request records, comma"
    )
    parser.add_argument("--pandas-max", type=int, default=2_000_000)
    parser.add_argument("--memory-limit", default="1GB", help="DuckDB's memory_limit")
    parser.add_argument("--dir", default=None, help="where to write the logs (a temp dir)")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.memory_limit)
        return
    import boxmaker

    print(f"boxmaker {boxmaker.__file__}")
    root = Path(args.dir or tempfile.mkdtemp(prefix="boxmaker-scale-"))
    sizes = [int(s) for s in args.sizes.split(",")]
    ratio = float("nan")
    rss = float("nan")
    try:
        for size in sizes:
            folder = root / str(size)
            t0 = time.perf_counter()
            made, lines = write_logs(folder, size)
            disk = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
            print(
                f"{size:>11,} requests: {made:,} usage records, {lines:,} lines, "
                f"{disk:,.0f} MiB ({time.perf_counter() - t0:.0f} s to write)"
            )
            duck = measure("duckdb", folder, args.memory_limit)
            print(f"  duckdb  {_line(duck)}")
            if size <= args.pandas_max:
                pand = measure("pandas", folder, args.memory_limit)
                print(f"  pandas  {_line(pand)}")
                if size == sizes[0]:
                    ratio = pand["wall_s"] / duck["wall_s"]
            rss = duck["rss_mb"]
            shutil.rmtree(folder)
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)
    print(f"duckdb_vs_pandas {ratio:.2f} rss_{sizes[-1] // 1_000_000}m_mb {rss:.0f}")


if __name__ == "__main__":
    main()
