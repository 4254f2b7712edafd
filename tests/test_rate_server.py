"""``boxmaker.testing.RateServer`` places an unpinned request as llama.cpp does: on the idle
slot whose last request shares the most leading messages with it (else the least recently
used), and counts ``cache_n`` only where the slot held that request's prefix. A review found
it placing by prompt length alone: a follow-up went to another conversation's slot, whose
cache it reported as its own hit."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx

from boxmaker.testing import RateServer


def _ask(url: str, messages: list[dict[str, Any]], out: list[tuple[int, int]]) -> None:
    body = {"messages": messages, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"timings"' in line:
                t = json.loads(line[6:])["timings"]
                out.append((t["cache_n"], t["cache_n"] + t["prompt_n"]))


def test_a_follow_up_goes_back_to_its_own_slot_and_only_its_prefix_counts() -> None:
    a = [{"role": "user", "content": "A " * 50}]
    b = [{"role": "user", "content": "B " * 300}]
    with RateServer(slots=2, answer_tokens=20, tokens_per_s=200) as server:
        got_a: list[tuple[int, int]] = []
        got_b: list[tuple[int, int]] = []
        first = threading.Thread(target=_ask, args=(server.url, a, got_a))
        first.start()
        time.sleep(0.05)  # A on one slot, B on the other, at once
        second = threading.Thread(target=_ask, args=(server.url, b, got_b))
        second.start()
        first.join()
        second.join()
        (a_cache, a_prompt), (b_cache, b_prompt) = got_a[0], got_b[0]
        assert a_cache == b_cache == 0
        follow: list[tuple[int, int]] = []
        more = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "A " * 300}]
        _ask(server.url, a + more, follow)
        assert follow[0][0] == a_prompt + 20  # A's slot: its prompt and its answer reused
        other: list[tuple[int, int]] = []
        _ask(server.url, [{"role": "user", "content": "C " * 400}], other)
        assert other[0][0] == 0  # nothing shared: the least recent slot (B's), no hit
        again: list[tuple[int, int]] = []
        _ask(server.url, b + more, again)  # B's slot now holds C: no hit for B either
        assert again[0][0] == 0 and b_prompt > 0
