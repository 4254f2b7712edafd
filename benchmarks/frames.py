"""Benchmark: ``boxmaker.frames.requests`` against ``pandas.read_json(lines=True)``.

Makes a corpus of session logs in a temporary directory (default 1,000 logs of 1,000 records,
1,000,000 records in all, shaped like the loop writes them: turns of a user message, tool-call
completions with their usage and tool results, a final answer, an occasional cache loss and
limit hit), then times, in one run, reading every log with ``pandas.read_json(lines=True)``
(concatenated into one frame) and with ``requests()`` over the directory.

    PYTHONPATH=. python benchmarks/frames.py [--logs N] [--records N] [--schema 1|2]

``--schema 1`` (the default, so figures compare across versions) writes logs as schema 1 did
(the frames upgrade them on read, :mod:`boxmaker.session`); ``--schema 2`` as the loop
writes them now (``not_run`` on tool results, a ``turn_end`` record ending each turn). The
first line names the ``boxmaker`` measured: a script's own folder, not the current one, is
on ``sys.path``, so without ``PYTHONPATH=.`` an installed copy may be measured instead.

The last line printed is ``speedup X.XX``: read_json's wall time divided by ``requests()``'s
(above 1: ``requests()`` is faster). CPU times are printed too: on a busy machine they say
more than the wall times.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

import pandas as pd

import boxmaker
from boxmaker.frames import requests


def _dumps(obj: dict[str, object]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _stamp(i: int) -> str:
    return f"2026-11-30T07:{(i // 60000) % 60:02d}:{(i // 1000) % 60:02d}.{i % 1000:03d}123Z"


def make_log(
    path: Path, session_id: str, records: int, rng: random.Random, schema: int = 1
) -> None:
    """Write one session log of ``records`` records after the baseline, in ``schema``."""
    extra: dict[str, object] = {"not_run": None} if schema >= 2 else {}
    lines = [
        _dumps(
            {
                "type": "baseline",
                "schema": schema,
                "session_id": session_id,
                "system": "You are a helpful assistant.",
                "tools": [],
                "time": _stamp(0),
            }
        )
    ]
    call = cache = 0
    i = 1
    while len(lines) <= records:
        city = rng.choice(("Oslo", "Lisbon", "Tokyo", "Lima"))
        lines.append(_dumps({"type": "user", "content": f"Weather in {city}?", "time": _stamp(i)}))
        for _ in range(rng.randint(0, 3)):
            call += 1
            lines.append(
                _dumps(
                    {
                        "type": "assistant",
                        "content": None,
                        "reasoning": "I should call the tool. " * rng.randint(1, 6),
                        "tool_calls": [
                            {"id": f"c{call}", "name": "get_weather", "arguments": '{"city":"x"}'}
                        ],
                        "time": _stamp(i + 1),
                    }
                )
            )
            prompt = rng.randint(10, 200)
            lines.append(_usage(cache, prompt, rng, _stamp(i + 2)))
            if rng.random() < 0.05:
                lines.append(
                    _dumps({"type": "cache_loss", "expected": cache + 40, "reused": cache,
                            "time": _stamp(i + 2)})
                )  # fmt: skip
            cache += prompt + 50
            lines.append(
                _dumps(
                    {
                        "type": "tool_result",
                        "call": call,
                        "tool_call_id": f"c{call}",
                        "name": "get_weather",
                        "content": '{"city": "x", "temperature": 3, "sky": "clear"}',
                        "data_class": "public",
                        "untrusted": False,
                        "truncated": False,
                        **extra,
                        "time": _stamp(i + 3),
                    }
                )
            )
            i += 3
        if rng.random() < 0.03:
            lines.append(
                _dumps({"type": "limit_hit", "kind": "thinking_cap", "detail": "capped",
                        "time": _stamp(i)})
            )  # fmt: skip
        lines.append(
            _dumps(
                {
                    "type": "assistant",
                    "content": "The weather is mild. " * rng.randint(1, 8),
                    "reasoning": None,
                    "tool_calls": [],
                    "time": _stamp(i + 1),
                }
            )
        )
        lines.append(_usage(cache, 30, rng, _stamp(i + 2)))
        if schema >= 2:
            lines.append(
                _dumps({"type": "turn_end", "outcome": "answered", "detail": "", "status": None,
                        "time": _stamp(i + 2)})
            )  # fmt: skip
        i += 3
    path.write_text("\n".join(lines[: records + 1]) + "\n", encoding="utf-8")


def _usage(cache: int, prompt: int, rng: random.Random, stamp: str) -> str:
    predicted = rng.randint(5, 120)
    return _dumps(
        {
            "type": "usage",
            "timings": {
                "cache_n": cache,
                "prompt_n": prompt,
                "prompt_ms": prompt * 0.12,
                "prompt_per_token_ms": 0.12,
                "prompt_per_second": 8333.3,
                "predicted_n": predicted,
                "predicted_ms": predicted * 0.95,
                "predicted_per_token_ms": 0.95,
                "predicted_per_second": 1052.6,
            },
            "reasoning_tokens": rng.randint(0, 40),
            "thinking_capped": False,
            "prompt_tokens": cache + prompt,
            "completion_tokens": predicted,
            "time": stamp,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=1000, help="session logs to make")
    parser.add_argument("--records", type=int, default=1000, help="records per log")
    parser.add_argument("--schema", type=int, choices=(1, 2), default=1, help="log schema")
    args = parser.parse_args()
    print(f"boxmaker from {Path(boxmaker.__file__).parent}")
    rng = random.Random(5)
    with tempfile.TemporaryDirectory(prefix="boxmaker-bench-") as tmp:
        folder = Path(tmp)
        started = time.perf_counter()
        for n in range(args.logs):
            make_log(folder / f"s{n:05d}.jsonl", f"s{n:05d}", args.records, rng, args.schema)
        made = time.perf_counter() - started
        total = args.logs * args.records
        print(f"corpus: {args.logs} logs, {total} records, schema {args.schema} ({made:.1f} s)")
        files = sorted(folder.glob("*.jsonl"))

        started, cpu = time.perf_counter(), time.process_time()
        plain = pd.concat([pd.read_json(f, lines=True) for f in files], ignore_index=True)
        read_json_s = time.perf_counter() - started
        cpu = time.process_time() - cpu
        rows = len(plain)
        print(f"pandas.read_json(lines=True): {read_json_s:.2f} s ({cpu:.2f} s CPU), {rows} rows")
        del plain

        started, cpu = time.perf_counter(), time.process_time()
        frame = requests(folder)
        requests_s = time.perf_counter() - started
        cpu = time.process_time() - cpu
        print(
            f"boxmaker.frames.requests():   {requests_s:.2f} s ({cpu:.2f} s CPU), {len(frame)} rows"
        )
    print(f"speedup {read_json_s / requests_s:.2f}")


if __name__ == "__main__":
    main()
