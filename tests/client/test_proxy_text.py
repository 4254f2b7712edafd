"""A proxy's text before the model's stream is neither reasoning nor budget (issue 35, item 5).

llama-swap streams its loading progress as ``reasoning_content`` before the model's own stream
(mostlygeek/llama-swap#371, ``internal/router/loading.go``: a line of ``━``, ``llama-swap
loading model: NAME``, dots and remarks, ``Done! (N s)``, a line of ``━``, a line of one space,
each line sent in pieces of five characters). Without an ``id`` each chunk is a note; behind
another proxy its chunks may carry an ``id`` and a full chunk's shape, and only its marks tell
them. Either way the thinking cap counts only the model's reasoning, and ``reasoning_end``
never goes out for the proxy's id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from boxmaker.client import Client, Completion
from boxmaker.config import ClientConfig, Config, LoopLimits
from boxmaker.events import CapNotEnforced, ClientEvent, Reasoning, ThinkingCapped
from boxmaker.records import Baseline, Usage
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

MODEL_ID = "chatcmpl-model"
PROXY_ID = "chatcmpl-proxy"
DONE = b"data: [DONE]\n\n"


def pieces(line: str) -> list[str]:
    """A line as llama-swap's ``sendLine`` sends it: pieces of five characters, then "\\n"."""
    return [line[i : i + 5] for i in range(0, len(line), 5)] + ["\n"]


LOADING = [
    *pieces("━━━━━"),
    *pieces("llama-swap loading model: qwen3"),
    ".",
    ".",
    "\n",
    *[p for p in pieces("Reticulating splines...") if p != "\n"],
    " ",
    ".",
    "\n",
    *pieces("Done! (4.12s)"),
    *pieces("━━━━━"),
    " ",
    "\n",
]


def sse(obj: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()


def full_chunk(delta: dict[str, Any], cid: str, finish: str | None = None) -> dict[str, Any]:
    return {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1761700000,
        "model": "qwen3",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def note(text: str) -> dict[str, Any]:
    """llama-swap's own chunk, as ``sendData`` writes it."""
    return {"choices": [{"delta": {"reasoning_content": text}}]}


def llama_cpp(reasoning: int, *, opening: bool = True) -> list[bytes]:
    """llama.cpp's stream: its opening chunk (role and prompt progress), ``reasoning``
    reasoning deltas, an answer."""
    first = full_chunk({"role": "assistant", "content": None}, MODEL_ID)
    first["prompt_progress"] = {"total": 12, "cache": 0, "processed": 12, "time_ms": 3}
    out = [sse(first)] if opening else []
    out += [sse(full_chunk({"reasoning_content": f"m{i}"}, MODEL_ID)) for i in range(reasoning)]
    out += [sse(full_chunk({"content": "Sunny."}, MODEL_ID)), sse(full_chunk({}, MODEL_ID, "stop"))]
    return [*out, DONE]


def chat(body: bytes, budget: int | None) -> tuple[Completion, list[ClientEvent], list[Any]]:
    """One completion of ``body`` with a thinking budget; the events and the control requests."""
    controls: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/control"):
            controls.append(json.loads(request.content))
            return httpx.Response(200, json={"success": True})
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    events: list[ClientEvent] = []
    client = Client(ClientConfig(retry_attempts=0), transport=httpx.MockTransport(handler))
    with client:
        completion = client.chat({"messages": []}, events.append, reasoning_budget=budget)
    return completion, events, controls


def model_reasoning(n: int) -> str:
    return "".join(f"m{i}" for i in range(n))


def test_llama_swaps_block_under_another_id_is_no_reasoning_nor_budget() -> None:
    """The loading block behind a proxy that gives each chunk an id and a full shape: told by
    its marks; the cap counts the model's deltas and ends the model's completion."""
    block = [sse(full_chunk({"reasoning_content": t}, PROXY_ID)) for t in LOADING]
    completion, events, controls = chat(b"".join([*block, *llama_cpp(6)]), budget=3)
    assert completion.proxy_text == "".join(LOADING)
    assert completion.id == MODEL_ID and completion.reasoning == model_reasoning(6)
    assert completion.reasoning_tokens == 6
    assert controls == [{"id": MODEL_ID, "action": "reasoning_end"}]
    assert [e for e in events if isinstance(e, ThinkingCapped)] == [ThinkingCapped(5)]
    shown = "".join(e.text for e in events if isinstance(e, Reasoning))
    assert shown == model_reasoning(6)  # the block was never shown as reasoning


def test_the_blocks_closing_marks_end_it_before_a_stream_without_a_role() -> None:
    """Behind llama-swap, a server whose chunks carry no role: the closing line of marks (and
    the line of one space after it) ends the block."""
    block = [sse(full_chunk({"reasoning_content": t}, PROXY_ID)) for t in LOADING]
    completion, _, _ = chat(b"".join([*block, *llama_cpp(2, opening=False)]), budget=None)
    assert completion.proxy_text == "".join(LOADING)
    assert (completion.reasoning, completion.reasoning_tokens) == ("m0m1", 2)


def test_llama_swaps_notes_without_id_are_no_budget() -> None:
    completion, _, controls = chat(
        b"".join([*(sse(note(t)) for t in LOADING), *llama_cpp(6)]), budget=3
    )
    assert completion.proxy_text == "".join(LOADING) and completion.reasoning_tokens == 6
    assert controls == [{"id": MODEL_ID, "action": "reasoning_end"}]


def test_reasoning_under_a_proxys_own_id_never_gets_reasoning_end() -> None:
    """A proxy's text without marks, under its own id and a full chunk's shape, past the
    budget: it might be the model's until the model's stream opens under another id, so no
    ``reasoning_end`` goes out meanwhile; then it is the proxy's, uncounted."""
    proxy = [sse(full_chunk({"reasoning_content": f"p{i}"}, PROXY_ID)) for i in range(8)]
    completion, _, controls = chat(b"".join([*proxy, *llama_cpp(6)]), budget=2)
    assert completion.proxy_text == "".join(f"p{i}" for i in range(8))
    assert completion.reasoning_tokens == 6
    assert [c["id"] for c in controls] == [MODEL_ID]


def test_a_stream_that_never_opens_cannot_be_ended_and_says_so() -> None:
    """Reasoning under one id in chunks without a role (a server that never opens its
    stream): it could be a proxy's, so the cap sends nothing and says it was not enforced."""
    reasoning = [sse(full_chunk({"reasoning_content": f"r{i}"}, MODEL_ID)) for i in range(8)]
    body = b"".join([*reasoning, sse(full_chunk({"content": "ok"}, MODEL_ID, "stop")), DONE])
    completion, events, controls = chat(body, budget=2)
    assert controls == []
    (warning,) = [e for e in events if isinstance(e, CapNotEnforced)]
    assert "ended before reasoning_end could be sent" in warning.detail
    assert completion.reasoning_tokens == 8


def test_the_turns_thinking_budget_counts_the_models_reasoning_only(tmp_path: Path) -> None:
    block = [sse(full_chunk({"reasoning_content": t}, PROXY_ID)) for t in LOADING]
    body = b"".join([*block, *llama_cpp(3)])
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(404)
        sent.append(json.loads(request.content))
        return httpx.Response(200, content=body, headers={"content-type": "text/event-stream"})

    session = Session.create(tmp_path, Baseline(system="sys"))
    client = Client(ClientConfig(retry_attempts=0), transport=httpx.MockTransport(handler))
    config = Config(loop=LoopLimits(thinking_tokens=50))
    runtime = Runtime(config=config, client=client, registry=Registry())
    assert run_turn(session, runtime, "weather?").content == "Sunny."
    assert sent[0]["thinking_budget_tokens"] == 50
    (usage,) = [r for r in session.records if isinstance(r, Usage)]
    assert usage.reasoning_tokens == 3
