"""Evaluate the tiny agent model through the embedded llama.cpp server, per prompt family.

Usage::

    python scripts/eval_model.py [--model PATH] [--threads 1] [--cities N] [--json OUT]

Runs a fixed prompt set (seeded) at temperature 0 through :class:`boxmaker.server.EmbeddedServer`
with the tools ``get_weather(city)`` and ``get_time(city)`` offered, on real city names held out
from training (``boxmaker.model.data.HELD_OUT_CITIES``), streams every completion and prints,
per family:

- ``calls``: completions whose tool calls are exactly the expected ones (tool name and
  ``{"city": <the city as written in the question>}``, parsed by llama.cpp into
  ``delta.tool_calls``);
- ``values``: final answers that contain every expected value exactly (city, temperature and
  sky, or time);
- family-specific checks: ``small_talk`` (reasoning, an answer, no call), ``think_long``
  (reasoning of at least 300 tokens), ``repeat`` (the same call again after the result),
  ``think_cap`` (``reasoning_control`` + ``reasoning_end`` sent after 40 reasoning tokens ends
  the reasoning before 200 and the model then calls the tool), ``cache`` (the follow-up
  request inside a turn reuses the prompt cache);
- phase 5 (``--families new``): ``think_budget`` (``thinking_budget_tokens`` 5/12/40 on a long
  think: reasoning within the budget, counted with ``/tokenize``, then the call, and no markup
  in the content), ``cut_answer`` (the answer's request with a budget of 0/3/10: right values,
  no markup), ``keep`` (two user turns with ``chat_template_kwargs.preserve_thinking``: the
  next turn reuses the whole cache, calls and values right), ``cycle`` ("Keep checking the
  weather in A and the time in B": W(A), T(B), W(A), T(B)), ``after_limit`` (the last call
  answered "not run: the turn ended (...)", then ``tool_choice`` none: an answer quoting every
  result, no markup), ``after_nudge`` (the same as the loop leaves it live: the guard's nudge,
  then "not run: the turn ended (...); answer the user now ...").

Needs only the base install (httpx, xllamacpp).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from boxmaker.model.data import HELD_OUT_CITIES, TOOLS
from boxmaker.server import EmbeddedServer
from boxmaker.turn._guard import NUDGE, LoopGuard

SKIES = ("sunny", "cloudy", "rainy", "windy", "foggy", "snowy", "clear", "stormy")
SMALL_TALK = (
    "Hello!",
    "Hi there",
    "How are you?",
    "Thank you!",
    "Who are you?",
    "What can you do?",
    "Tell me a joke.",
    "Goodbye!",
    "Good morning!",
    "Nice to meet you.",
)


@dataclass
class Completion:
    """One streamed completion, accumulated."""

    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    finish: str = ""
    timings: dict[str, Any] = field(default_factory=dict)
    completion_id: str = ""
    reasoning_events: int = 0

    def message(self) -> dict[str, Any]:
        """The assistant message to send back (with reasoning_content, as the loop does)."""
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": self.content,
            "reasoning_content": self.reasoning,
        }
        if self.calls:
            msg["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in self.calls
            ]
        return msg


def stream(
    client: httpx.Client,
    url: str,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int = 600,
    on_reasoning: Any = None,
    extra: dict[str, Any] | None = None,
) -> Completion:
    """POST a streamed chat completion at temperature 0 and accumulate its deltas."""
    body: dict[str, Any] = {
        "messages": messages,
        "tools": TOOLS,
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "cache_prompt": True,
        "id_slot": 0,
    }
    body.update(extra or {})
    out = Completion()
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"HTTP {r.status_code}: {r.text}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            ev = json.loads(data)
            if "error" in ev:
                raise RuntimeError(str(ev["error"]))
            out.completion_id = ev.get("id", out.completion_id)
            if ev.get("timings"):
                out.timings = ev["timings"]
            if not ev.get("choices"):
                continue
            choice = ev["choices"][0]
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out.reasoning += delta["reasoning_content"]
                out.reasoning_events += 1
                if on_reasoning is not None:
                    on_reasoning(out)
            if delta.get("content"):
                out.content += delta["content"]
            for tc in delta.get("tool_calls") or []:
                idx = tc["index"]
                while len(out.calls) <= idx:
                    out.calls.append({"id": "", "name": "", "arguments": ""})
                fn = tc.get("function") or {}
                if tc.get("id"):
                    out.calls[idx]["id"] = tc["id"]
                if fn.get("name"):
                    out.calls[idx]["name"] += fn["name"]
                if fn.get("arguments"):
                    out.calls[idx]["arguments"] += fn["arguments"]
            if choice.get("finish_reason"):
                out.finish = choice["finish_reason"]
    return out


def call_ok(c: Completion, name: str, city: str) -> bool:
    """Exactly one call, of ``name``, with arguments exactly ``{"city": city}``."""
    if len(c.calls) != 1 or c.calls[0]["name"] != name:
        return False
    try:
        return bool(json.loads(c.calls[0]["arguments"]) == {"city": city})
    except ValueError:
        return False


def calls_valid(c: Completion) -> bool:
    """Every call's arguments are a JSON object (else llama.cpp rejects the history: HTTP 500)."""
    for call in c.calls:
        try:
            if not isinstance(json.loads(call["arguments"]), dict):
                return False
        except ValueError:
            return False
    return bool(c.calls)


def weather_result(rng: random.Random, city: str) -> tuple[str, list[str]]:
    """A tool result and the values the answer must quote."""
    temp = rng.randint(-9, 9) if rng.random() < 0.3 else rng.randint(-25, 40)
    sky = rng.choice(SKIES)
    key_t = rng.choice(("temperature", "temp_c"))
    key_s = rng.choice(("sky", "condition"))
    return json.dumps({"city": city, key_t: temp, key_s: sky}), [city, str(temp), sky]


def time_result(rng: random.Random, city: str) -> tuple[str, list[str]]:
    """A tool result and the values the answer must quote."""
    clock = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
    return json.dumps({"city": city, "time": clock}), [city, clock]


WEATHER_Q = (
    "What is the weather in {c}?",
    "What's the weather like in {c}?",
    "Tell me the weather in {c}.",
    "How is the weather in {c}?",
)
TIME_Q = (
    "What time is it in {c}?",
    "What is the time in {c}?",
    "Tell me the time in {c}.",
)


class Scores:
    """Per-family counters: name -> [passed, total]."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, list[int]]] = {}
        self.failures: list[str] = []

    def add(self, family: str, check: str, ok: bool, detail: str = "") -> None:
        """Count one check."""
        row = self.rows.setdefault(family, {}).setdefault(check, [0, 0])
        row[0] += int(ok)
        row[1] += 1
        if not ok and len(self.failures) < 80:
            self.failures.append(f"{family}/{check}: {detail[:160]}")


def run_tool_turn(
    client: httpx.Client,
    url: str,
    scores: Scores,
    rng: random.Random,
    family: str,
    question: str,
    plan: list[tuple[str, str]],
) -> None:
    """A question whose answer needs the calls in ``plan`` (one per completion)."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": question}]
    values: list[str] = []
    all_calls_ok = True
    for name, city in plan:
        c = stream(client, url, messages)
        ok = call_ok(c, name, city)
        all_calls_ok = all_calls_ok and ok
        scores.add(family, "calls", ok, f"{question!r} -> {c.calls or c.content!r}")
        if not calls_valid(c):
            scores.add(family, "values", False, f"{question!r}: no usable call")
            return
        messages.append(c.message())
        if name == "get_weather":
            result, vals = weather_result(rng, city)
        else:
            result, vals = time_result(rng, city)
        values += vals
        messages.append({"role": "tool", "tool_call_id": c.calls[0]["id"], "content": result})
    before = c.timings
    final = stream(client, url, messages)
    ok = not final.calls and all(v in final.content for v in values)
    scores.add(family, "values", ok, f"{question!r} {values} -> {final.content!r}")
    if before and final.timings:
        expected = before["cache_n"] + before["prompt_n"]
        scores.add("cache", "follow_up_reuses", final.timings["cache_n"] >= expected - 1,
                   f"cache_n {final.timings['cache_n']} < {expected}")  # fmt: skip


def run_old_families(
    client: httpx.Client, url: str, scores: Scores, rng: random.Random, cities: list[str]
) -> list[int]:
    """The families of the first four phases; returns the think_long reasoning lengths."""
    for i, city in enumerate(cities):
        q = WEATHER_Q[i % len(WEATHER_Q)].format(c=city)
        run_tool_turn(client, url, scores, rng, "weather", q, [("get_weather", city)])
        q = TIME_Q[i % len(TIME_Q)].format(c=city)
        run_tool_turn(client, url, scores, rng, "time", q, [("get_time", city)])
    for i in range(0, len(cities) - 1, 2):
        c1, c2 = cities[i], cities[i + 1]
        q = f"Tell me the weather in {c1} and the time in {c2}."
        plan = [("get_weather", c1), ("get_time", c2)]
        run_tool_turn(client, url, scores, rng, "two_city", q, plan)
    for q in SMALL_TALK:
        c = stream(client, url, [{"role": "user", "content": q}])
        ok = bool(c.reasoning) and bool(c.content) and not c.calls and c.finish == "stop"
        scores.add("small_talk", "answer_no_call", ok, f"{q!r} -> {c.content!r} {c.calls}")
    think_lengths: list[int] = []
    for city in cities[:10]:
        q = f"Think long and hard about the weather in {city}."
        c = stream(client, url, [{"role": "user", "content": q}], max_tokens=1500)
        think_lengths.append(c.reasoning_events)
        scores.add("think_long", "reasoning_300", c.reasoning_events >= 300,
                   f"{city}: {c.reasoning_events} reasoning tokens")  # fmt: skip
        scores.add("think_long", "calls", call_ok(c, "get_weather", city),
                   f"{city}: {c.calls}")  # fmt: skip
    for city in cities[:10]:
        q = f"Keep checking the weather in {city}."
        messages: list[dict[str, Any]] = [{"role": "user", "content": q}]
        c = stream(client, url, messages)
        scores.add("repeat", "calls", call_ok(c, "get_weather", city), f"{c.calls}")
        if not calls_valid(c):
            scores.add("repeat", "same_call_again", False, "no usable first call")
            continue
        messages.append(c.message())
        result, _ = weather_result(rng, city)
        messages.append({"role": "tool", "tool_call_id": c.calls[0]["id"], "content": result})
        again = stream(client, url, messages)
        scores.add("repeat", "same_call_again", call_ok(again, "get_weather", city),
                   f"{again.calls or again.content!r}")  # fmt: skip
    for city in cities[:5]:
        q = f"Think long and hard about the weather in {city}."
        sent = threading.Event()

        def cap(c: Completion, _url: str = url, _sent: threading.Event = sent) -> None:
            if c.reasoning_events >= 40 and not _sent.is_set():
                _sent.set()
                r = httpx.post(f"{_url}/v1/chat/completions/control",
                               json={"id": c.completion_id, "action": "reasoning_end"},
                               timeout=30)  # fmt: skip
                scores.add("think_cap", "control_success", r.json().get("success") is True,
                           r.text)  # fmt: skip

        c = stream(client, url, [{"role": "user", "content": q}], max_tokens=1500,
                   on_reasoning=cap, extra={"reasoning_control": True})  # fmt: skip
        scores.add("think_cap", "ended_early", c.reasoning_events < 200,
                   f"{c.reasoning_events} reasoning tokens")  # fmt: skip
        scores.add("think_cap", "then_calls", call_ok(c, "get_weather", city),
                   f"{c.calls or c.content!r}")  # fmt: skip
    return think_lengths


TAGS = ("<think>", "</think>", "<tool_call>", "}}")


def clean(text: str) -> bool:
    """No reasoning or tool-call markup leaked into an answer."""
    return not any(t in text for t in TAGS)


def n_tokens(client: httpx.Client, url: str, text: str) -> int:
    """Tokens of ``text`` as the server counts them (``POST /tokenize``)."""
    body = {"content": text, "add_special": False, "parse_special": True}
    return len(client.post(f"{url}/tokenize", json=body).json()["tokens"])


def tool_result(rng: random.Random, name: str, city: str) -> tuple[str, list[str]]:
    """A result of ``name`` for ``city`` and the values an answer must quote."""
    return weather_result(rng, city) if name == "get_weather" else time_result(rng, city)


def answer_values(
    client: httpx.Client,
    url: str,
    rng: random.Random,
    messages: list[dict[str, Any]],
    name: str,
    city: str,
    extra: dict[str, Any] | None = None,
) -> tuple[Completion, Completion, list[str]]:
    """One call and its result, then the answer (``extra`` on the answer's request)."""
    c = stream(client, url, messages)
    if not calls_valid(c):
        return c, c, []
    messages.append(c.message())
    result, values = tool_result(rng, name, city)
    messages.append({"role": "tool", "tool_call_id": c.calls[0]["id"], "content": result})
    return c, stream(client, url, messages, extra=extra), values


def as_call(call_id: str, name: str, city: str) -> dict[str, Any]:
    """An OpenAI ``tool_calls[i]`` of ``name`` with ``{"city": city}``."""
    args = json.dumps({"city": city})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def run_new_families(
    client: httpx.Client, url: str, scores: Scores, rng: random.Random, cities: list[str]
) -> None:
    """The families of phase 5: a thinking budget on the call and on the answer, history kept
    (``preserve_thinking``) across user turns, a two-tool cycle, and an answer after a limit."""
    for i, city in enumerate(cities[:12]):
        budget = (5, 12, 40)[i % 3]
        q = f"Think long and hard about the weather in {city}."
        extra = {"thinking_budget_tokens": budget}
        c = stream(client, url, [{"role": "user", "content": q}], max_tokens=400, extra=extra)
        used = n_tokens(client, url, "\n" + c.reasoning)  # the template's "<think>\n" counts
        scores.add("think_budget", "within_budget", used <= budget, f"{used} > {budget}")
        scores.add("think_budget", "then_calls", call_ok(c, "get_weather", city),
                   f"budget {budget}: {c.calls or c.content!r}")  # fmt: skip
        scores.add("think_budget", "clean", clean(c.content), repr(c.content))
    for i, city in enumerate(cities[:12]):
        budget = (0, 3, 10)[i % 3]
        name = "get_weather" if i % 2 == 0 else "get_time"
        q = (WEATHER_Q if name == "get_weather" else TIME_Q)[i % 3].format(c=city)
        messages: list[dict[str, Any]] = [{"role": "user", "content": q}]
        extra = {"thinking_budget_tokens": budget}
        _, final, values = answer_values(client, url, rng, messages, name, city, extra)
        ok = bool(values) and not final.calls and all(v in final.content for v in values)
        scores.add("cut_answer", "values", ok, f"budget {budget}: {values} -> {final.content!r}")
        scores.add("cut_answer", "clean", clean(final.content), repr(final.content))
    kwargs = {"chat_template_kwargs": {"preserve_thinking": True}}
    for i in range(0, min(len(cities), 20) - 1, 2):
        c1, c2 = cities[i], cities[i + 1]
        messages = [{"role": "user", "content": WEATHER_Q[i % 4].format(c=c1)}]
        _, first, values = answer_values(client, url, rng, messages, "get_weather", c1, kwargs)
        messages.append(first.message())
        messages.append({"role": "user", "content": TIME_Q[i % 3].format(c=c2)})
        c = stream(client, url, messages, extra=kwargs)
        scores.add("keep", "calls", call_ok(c, "get_time", c2), f"{c.calls or c.content!r}")
        if first.timings and c.timings:
            expected = first.timings["cache_n"] + first.timings["prompt_n"]
            scores.add("keep", "next_turn_reuses", c.timings["cache_n"] >= expected - 1,
                       f"cache_n {c.timings['cache_n']} < {expected}")  # fmt: skip
        if not calls_valid(c):
            scores.add("keep", "values", False, "no usable call")
            continue
        messages.append(c.message())
        result, values = time_result(rng, c2)
        messages.append({"role": "tool", "tool_call_id": c.calls[0]["id"], "content": result})
        final = stream(client, url, messages, extra=kwargs)
        ok = not final.calls and all(v in final.content for v in values)
        scores.add("keep", "values", ok, f"{values} -> {final.content!r}")
    for i in range(0, min(len(cities), 20) - 1, 2):
        c1, c2 = cities[i], cities[i + 1]
        k2 = "time" if i % 4 == 0 else "weather"
        q = f"Keep checking the weather in {c1} and the {k2} in {c2}."
        plan = [("get_weather", c1), ("get_time" if k2 == "time" else "get_weather", c2)] * 2
        messages = [{"role": "user", "content": q}]
        seen: list[tuple[str, str]] = []
        for name, city in plan:
            c = stream(client, url, messages)
            if not calls_valid(c):
                break
            args = json.loads(c.calls[0]["arguments"])
            seen.append((c.calls[0]["name"], str(args.get("city"))))
            messages.append(c.message())
            result, _ = tool_result(rng, name, city)
            messages.append({"role": "tool", "tool_call_id": c.calls[0]["id"], "content": result})
        scores.add("cycle", "alternates", seen == plan, f"{q!r} -> {seen}")
    for i in range(0, min(len(cities), 20) - 1, 2):
        c1, c2 = cities[i], cities[i + 1]
        q = f"Keep checking the weather in {c1} and the time in {c2}."
        messages = [{"role": "user", "content": q}]
        values = []
        for name, city in (("get_weather", c1), ("get_time", c2)):
            call = as_call(f"call{len(messages)}", name, city)
            messages.append({"role": "assistant", "content": "", "tool_calls": [call],
                             "reasoning_content": f"I will check {city}."})  # fmt: skip
            result, vals = tool_result(rng, name, city)
            values += vals
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        call = as_call("call9", "get_weather", c1)
        messages.append({"role": "assistant", "content": "", "tool_calls": [call],
                         "reasoning_content": f"I will check {c1} again."})  # fmt: skip
        why = (f'loop: rule cycle: a cycle of 2 calls (get_weather {{"city": "{c1}"}}, get_time '
               f'{{"city": "{c2}"}}) repeated 2 times (value 4, limit 2)')  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": "call9",
                         "content": f"This call was not run: the turn ended ({why})."})  # fmt: skip
        final = stream(client, url, messages, extra={"tool_choice": "none"})
        ok = not final.calls and all(v in final.content for v in values)
        scores.add("after_limit", "answers", ok, f"{values} -> {final.content!r}")
        scores.add("after_limit", "clean", clean(final.content), repr(final.content))
    for i in range(0, min(len(cities), 20) - 1, 2):  # as the loop leaves it, live
        c1, c2 = cities[i], cities[i + 1]
        messages = [{"role": "user", "content": f"Keep checking the weather in {c1} and the "
                     f"time in {c2}."}]  # fmt: skip
        values = []
        cycle = f'get_weather {{"city":"{c1}"}}, get_time {{"city":"{c2}"}}'
        answers = (
            None,
            None,
            NUDGE.format(what=f"a cycle of 2 calls ({cycle}) repeated 2 times"),
            f"This call was not run: the turn ended (loop: rule cycle: a cycle of 2 calls "
            f"({cycle}) repeated 2 times (value 2, limit 1)){LoopGuard.ANSWER_NOW}.",
        )
        for k, said in enumerate(answers):
            name, city = (("get_weather", c1), ("get_time", c2))[k % 2]
            call = as_call(f"call{k}", name, city)
            messages.append({"role": "assistant", "content": "", "tool_calls": [call],
                             "reasoning_content": f"I will check {city}."})  # fmt: skip
            if said is None:
                said, vals = tool_result(rng, name, city)
                values += vals
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": said})
        final = stream(client, url, messages, extra={"tool_choice": "none"})
        ok = not final.calls and all(v in final.content for v in values)
        scores.add("after_nudge", "answers", ok, f"{values} -> {final.content!r}")
        scores.add("after_nudge", "clean", clean(final.content), repr(final.content))


def main(argv: list[str] | None = None) -> int:
    """Run the evaluation and print the table; returns 0."""
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default=None, help="GGUF (default: the shipped model)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cities", type=int, default=len(HELD_OUT_CITIES))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the figures to this file")
    ap.add_argument("--show-failures", action="store_true")
    ap.add_argument(
        "--families",
        default="old,new",
        help="'old' (phases 1-4), 'new' (phase 5: budget, cut answer, cycle, after_limit, keep)",
    )
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    cities = list(HELD_OUT_CITIES[: args.cities])
    scores = Scores()
    think_lengths: list[int] = []
    t0 = time.monotonic()
    with EmbeddedServer(args.model, n_ctx=4096, n_threads=args.threads) as server, \
            httpx.Client(timeout=300) as client:  # fmt: skip
        url = server.url
        if "old" in args.families:
            think_lengths = run_old_families(client, url, scores, rng, cities)
        if "new" in args.families:
            run_new_families(client, url, scores, rng, cities)
    minutes = (time.monotonic() - t0) / 60
    figures: dict[str, Any] = {}
    print(f"{'family':<12} {'check':<20} {'passed':>7} {'total':>6} {'rate':>7}")
    for fam, checks in scores.rows.items():
        for check, (p, n) in checks.items():
            print(f"{fam:<12} {check:<20} {p:>7} {n:>6} {p / n:>7.1%}")
            figures[f"{fam}.{check}"] = {"passed": p, "total": n}
    totals = {"calls": [0, 0], "values": [0, 0]}
    for fam in ("weather", "time", "two_city"):
        for k in totals:
            p, n = scores.rows.get(fam, {}).get(k, [0, 0])
            totals[k][0] += p
            totals[k][1] += n
    for k, (p, n) in totals.items():
        print(f"{'ALL tools':<12} {k:<20} {p:>7} {n:>6} {p / max(n, 1):>7.1%}")
        figures[f"all.{k}"] = {"passed": p, "total": n}
    if think_lengths:
        mean = sum(think_lengths) / len(think_lengths)
        print(f"think_long reasoning tokens: mean {mean:.0f}, min {min(think_lengths)}, "
              f"max {max(think_lengths)}")  # fmt: skip
        figures["think_long.reasoning_tokens"] = think_lengths
    print(f"({minutes:.1f} min, {len(cities)} held-out cities)")
    if args.show_failures:
        for f in scores.failures:
            print("FAIL", f)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
