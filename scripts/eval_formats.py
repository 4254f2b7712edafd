"""Evaluate the multi-format tiny models: tool-call exactness per chat format, through the
embedded llama.cpp server and its own tool-call parsers.

Usage::

    python scripts/eval_formats.py [--formats tiny,qwen3,llama3] [--cities N] [--threads 1]

For each format (``tiny``: the shipped ``tiny-agent.gguf`` and its template; ``qwen3``,
``llama3``: the retrained files of :data:`boxmaker.model.MODEL_FILES`) one embedded server
with its file, one slot, the tools ``get_weather(city)``/``get_time(city)`` offered; at
temperature 0, on real city names held out from training (``HELD_OUT_CITIES`` and, as a row
of its own, the accented ``HELD_OUT_ACCENTED``):

- ``calls``: completions whose tool calls, as llama.cpp's parser for the template returned
  them in ``delta.tool_calls``, are exactly the expected one (name and ``{"city": ...}``);
- ``values``: answers after the tool result that contain every expected value;
- ``two_city``: the two calls and the answer of "the weather in A and the time in B";
- ``small_talk``: an answer, no call;
- ``errors``: requests the server answered with an error (the parser rejected the output).

Prints one line per format and check, then ``format_exact FORMAT calls P/N values P/N``.
Needs only the base install (httpx, xllamacpp).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_model import (  # the script beside this one
    SMALL_TALK,
    TIME_Q,
    WEATHER_Q,
    Scores,
    call_ok,
    calls_valid,
    stream,
)

from boxmaker.model import model_file
from boxmaker.model.words import HELD_OUT_ACCENTED, HELD_OUT_CITIES
from boxmaker.server import EmbeddedServer

SKIES = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy")


def weather_result(rng: random.Random, city: str) -> tuple[str, list[str]]:
    """A tool result (JSON with non-ASCII letters kept, as the training data writes it) and
    the values the answer must quote."""
    temp = rng.randint(-9, 9) if rng.random() < 0.3 else rng.randint(-25, 40)
    sky = rng.choice(SKIES)
    text = json.dumps({"city": city, "temperature": temp, "sky": sky}, ensure_ascii=False)
    return text, [city, str(temp), sky]


def time_result(rng: random.Random, city: str) -> tuple[str, list[str]]:
    """A tool result and the values the answer must quote."""
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return json.dumps({"city": city, "time": clock}, ensure_ascii=False), [city, clock]


def _turn(
    client: httpx.Client,
    url: str,
    scores: Scores,
    rng: random.Random,
    family: str,
    question: str,
    plan: list[tuple[str, str]],
) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    values: list[str] = []
    for name, city in plan:
        try:
            c = stream(client, url, messages, max_tokens=200)
        except RuntimeError as exc:
            scores.add(family, "errors", False, f"{question!r}: {exc}")
            scores.add(family, "calls", False, f"{question!r}: server error")
            return
        scores.add(family, "calls", call_ok(c, name, city), f"{question!r} -> "
                   f"{c.calls or c.content!r}")  # fmt: skip
        if not calls_valid(c):
            scores.add(family, "values", False, f"{question!r}: no usable call")
            return
        messages.append(c.message())
        result, vals = (weather_result if name == "get_weather" else time_result)(rng, city)
        values += vals
        messages.append({"role": "tool", "tool_call_id": c.calls[0]["id"], "content": result})
    try:
        final = stream(client, url, messages, max_tokens=200)
    except RuntimeError as exc:
        scores.add(family, "errors", False, f"{question!r}: {exc}")
        scores.add(family, "values", False, "server error")
        return
    ok = not final.calls and all(v in final.content for v in values)
    scores.add(family, "values", ok, f"{question!r} {values} -> {final.content!r}")


def evaluate(chat_format: str, path: Path, cities: list[str], threads: int, seed: int) -> Scores:
    """The checks of the module docstring on the file ``path`` in ``chat_format``."""
    rng = random.Random(seed)
    scores = Scores()
    server = EmbeddedServer(path, n_ctx=4096, n_parallel=1, n_threads=threads)
    with server, httpx.Client(timeout=300) as client:
        url = server.url
        for label, names in (("held_out", cities), ("accented", list(HELD_OUT_ACCENTED))):
            for i, city in enumerate(names):
                q = WEATHER_Q[i % len(WEATHER_Q)].format(c=city)
                _turn(client, url, scores, rng, label, q, [("get_weather", city)])
                q = TIME_Q[i % len(TIME_Q)].format(c=city)
                _turn(client, url, scores, rng, label, q, [("get_time", city)])
        for i in range(0, len(cities) - 1, 2):
            c1, c2 = cities[i], cities[i + 1]
            q = f"Tell me the weather in {c1} and the time in {c2}."
            _turn(client, url, scores, rng, "two_city", q, [("get_weather", c1), ("get_time", c2)])
        for q in SMALL_TALK:
            try:
                c = stream(client, url, [{"role": "user", "content": q}], max_tokens=200)
            except RuntimeError as exc:
                scores.add("small_talk", "answer_no_call", False, f"{q!r}: {exc}")
                continue
            ok = bool(c.content) and not c.calls and c.finish == "stop"
            scores.add("small_talk", "answer_no_call", ok, f"{q!r} -> {c.content!r} {c.calls}")
    return scores


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation for each format and print the table; returns 0."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--formats", default="tiny,qwen3,llama3")
    ap.add_argument("--cities", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--show-failures", action="store_true")
    ap.add_argument(
        "--dir",
        default="",
        help="evaluate DIR/tiny-agent-FORMAT.gguf instead of the shipped files (a training "
        "run's output)",
    )
    args = ap.parse_args(argv)
    cities = list(HELD_OUT_CITIES[: args.cities])
    summary = []
    for fmt in args.formats.split(","):
        t0 = time.monotonic()
        path = Path(args.dir) / f"tiny-agent-{fmt}.gguf" if args.dir else model_file(fmt)
        scores = evaluate(fmt, path, cities, args.threads, args.seed)
        for fam, checks in scores.rows.items():
            for check, (p, n) in checks.items():
                print(f"{fmt:<7} {fam:<11} {check:<15} {p:>4}/{n:<4} {p / n:>7.1%}")
        calls = [0, 0]
        values = [0, 0]
        for fam in ("held_out", "two_city"):
            for k, acc in (("calls", calls), ("values", values)):
                p, n = scores.rows.get(fam, {}).get(k, [0, 0])
                acc[0] += p
                acc[1] += n
        summary.append(f"format_exact {fmt} calls {calls[0]}/{calls[1]} "
                       f"values {values[0]}/{values[1]}")  # fmt: skip
        print(f"({fmt}: {(time.monotonic() - t0) / 60:.1f} min)", flush=True)
        if args.show_failures:
            for f in scores.failures[:30]:
                print("FAIL", fmt, f)
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
