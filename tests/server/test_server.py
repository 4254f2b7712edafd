"""The embedded llama.cpp server (boxmaker.server) on the shipped model and a random one."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from boxmaker.errors import ServerError
from boxmaker.model import default_model_path
from boxmaker.server import EmbeddedServer

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _stream_chat(url: str, body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """POST a streamed chat completion; return the parsed events and whether [DONE] came."""
    events: list[dict[str, Any]] = []
    done = False
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                break
            events.append(json.loads(data))
    return events, done


def test_missing_model_raises_server_error_naming_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    server = EmbeddedServer(missing)
    with pytest.raises(ServerError, match=r"nope\.gguf"):
        server.start()
    assert server.url == ""
    assert not server.running


def test_default_model_path_is_shipped_file() -> None:
    assert EmbeddedServer().model_path == default_model_path()
    assert default_model_path().name == "tiny-agent.gguf"
    assert default_model_path().is_file()


def test_stop_before_start_is_a_no_op() -> None:
    server = EmbeddedServer()
    server.stop()
    server.stop()
    assert server.url == ""


@pytest.mark.live
def test_start_health_stream_and_stop() -> None:
    server = EmbeddedServer(n_ctx=2048, n_threads=1)
    assert server.start() is server
    url = server.url
    try:
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1])
        assert port > 0
        health = httpx.get(f"{url}/health", timeout=10)
        assert health.status_code == 200
        assert health.json() == {"status": "ok"}

        body = {
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": TOOLS,
            "stream": True,
            "max_tokens": 24,
            "temperature": 0,
            "cache_prompt": True,
            "stream_options": {"include_usage": True},
        }
        events, done = _stream_chat(url, body)
        assert done
        first = events[0]["choices"][0]["delta"]
        assert first["role"] == "assistant"
        assert events[0]["id"].startswith("chatcmpl-")
        finishes = [
            e["choices"][0]["finish_reason"]
            for e in events
            if e["choices"] and e["choices"][0]["finish_reason"]
        ]
        assert len(finishes) == 1
        assert finishes[0] in {"stop", "length", "tool_calls"}
        last = events[-1]
        assert last["choices"] == []
        timings = last["timings"]
        assert timings["prompt_n"] > 50
        assert 1 <= timings["predicted_n"] <= 24
        assert last["usage"]["completion_tokens"] == timings["predicted_n"]

        # Without stream_options.include_usage the timings ride on the finish_reason chunk
        # and no usage chunk follows; the same prompt is now served from the cache.
        del body["stream_options"]
        events, done = _stream_chat(url, body)
        assert done
        last = events[-1]
        assert last["choices"][0]["finish_reason"] in {"stop", "length", "tool_calls"}
        assert "usage" not in last
        assert last["timings"]["cache_n"] >= timings["prompt_n"] - 1

        slots = httpx.get(f"{url}/slots", timeout=10).json()
        assert [s["n_ctx"] for s in slots] == [2048] * 4  # llama-server's 4 slots, unified
        used = [s for s in slots if "params" in s]  # the slot that served (no id_slot sent)
        assert used[0]["params"]["chat_format"] == "peg-native"
        assert used[0]["params"]["reasoning_format"] == "deepseek"
    finally:
        server.stop()
    assert server.url == ""
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    server.stop()  # idempotent


@pytest.mark.live
def test_context_manager_and_restart_on_same_port() -> None:
    with EmbeddedServer(n_ctx=1024, n_threads=1) as server:
        url = server.url
        port = int(url.rsplit(":", 1)[1])
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
    with EmbeddedServer(n_ctx=1024, n_threads=1, port=port) as again:
        assert again.url == url
        assert httpx.get(f"{url}/health", timeout=10).json() == {"status": "ok"}


@pytest.mark.live
def test_two_slots_serve_in_parallel(tmp_path: Path) -> None:
    with EmbeddedServer(n_ctx=2048, n_parallel=2, n_threads=1) as server:
        slots = httpx.get(f"{server.url}/slots", timeout=10).json()
        assert [s["id"] for s in slots] == [0, 1]
        assert [s["n_ctx"] for s in slots] == [1024, 1024]


def test_a_file_that_is_no_gguf_is_said_before_loading(tmp_path: Path) -> None:
    """Issue 37: a bad model file and a busy port got the same start-up error."""
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    with pytest.raises(ServerError, match=r"bad\.gguf is not a GGUF model file \(it starts"):
        EmbeddedServer(bad, n_threads=1).start()


def test_a_port_in_use_is_said_before_loading() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ServerError, match=rf"port {port} on 127\.0\.0\.1 is in use"):
            EmbeddedServer(n_threads=1, port=port).start()


@pytest.mark.live
def test_unloadable_file_raises_server_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 60)  # the magic, then nothing llama.cpp can read
    with pytest.raises(ServerError, match=r"bad\.gguf \(a port in use, or a file llama"):
        EmbeddedServer(bad, n_threads=1).start()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_threads": 0}, "n_threads = 0 is out of range: it must be from 1 to 512"),
        ({"n_threads": -3}, "n_threads = -3 is out of range"),
        ({"n_threads": 100_000}, "n_threads = 100000 is out of range"),
        ({"n_ctx": 1}, "n_ctx = 1 is out of range: it must be from 16 to 16777216"),
        ({"n_ctx": 2**31}, "n_ctx = 2147483648 is out of range"),
        ({"n_parallel": 0}, "n_parallel = 0 is out of range: it must be from 1 to 256"),
        ({"n_parallel": 4096}, "n_parallel = 4096 is out of range"),
        ({"port": 65_536}, "port = 65536 is out of range: it must be from 0 to 65535"),
        ({"port": -1}, "port = -1 is out of range"),
        ({"n_threads": True}, "n_threads = True is out of range"),
    ],
)
def test_numbers_llama_cpp_would_abort_on_are_refused_first(
    kwargs: dict[str, Any], message: str
) -> None:
    """llama.cpp aborts the process on ``n_threads = 0`` and ``n_ctx = 1`` and hangs on
    ``n_parallel = 0``: the constructor refuses them before anything is loaded."""
    with pytest.raises(ServerError) as info:
        EmbeddedServer(**kwargs)
    assert message in str(info.value)


def test_defaults_are_llama_servers() -> None:
    """Issue 24: xllamacpp builds its parameters without llama-server's ``common/arg.cpp``
    (1 slot, no unified KV, preservation off); the embedded server sets llama-server's."""
    params = EmbeddedServer()._params()
    assert (params.n_parallel, params.kv_unified) == (4, True)
    assert params.cache_ram_mib == 8192
    assert params.swa_full is False
    assert params.default_template_kwargs == {"preserve_reasoning": "true"}
    # but idle slots are kept: boxmaker pins each session's requests to its slot, which
    # llama-server's --cache-idle-slots empties (issue 39)
    assert params.cache_idle_slots is False
    assert EmbeddedServer(cache_idle_slots=True)._params().cache_idle_slots is True


def test_explicit_slots_are_not_unified_unless_asked() -> None:
    """llama-server unifies the KV cache only for its automatic slot count."""
    assert EmbeddedServer(n_parallel=2)._params().kv_unified is False
    assert EmbeddedServer(n_parallel=2, kv_unified=True)._params().kv_unified is True
    params = EmbeddedServer(
        swa_full=True, cache_ram_mib=0, ctx_checkpoints=3, reasoning_preserve=False
    )._params()
    assert (params.swa_full, params.cache_ram_mib, params.n_ctx_checkpoints) == (True, 0, 3)
    assert params.default_template_kwargs == {"preserve_reasoning": "false"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cache_ram_mib": -2}, "cache_ram_mib = -2 is out of range: it must be from -1"),
        ({"ctx_checkpoints": -1}, "ctx_checkpoints = -1 is out of range: it must be from 0"),
    ],
)
def test_cache_numbers_out_of_range_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ServerError, match=message):
        EmbeddedServer(**kwargs)


_REASONED = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "A1", "reasoning_content": "EARLIER-REASONING"},
    {"role": "user", "content": "again"},
]


@pytest.mark.live
@pytest.mark.parametrize("preserve", [True, False])
def test_default_slots_share_one_context_and_keep_reasoning(preserve: bool) -> None:
    """4 slots each up to the whole ``n_ctx`` (unified), and the template keeps an earlier
    turn's reasoning unless ``reasoning_preserve=False`` (the shipped template supports it)."""
    with EmbeddedServer(n_ctx=2048, n_threads=1, reasoning_preserve=preserve) as server:
        slots = httpx.get(f"{server.url}/slots", timeout=10).json()
        assert [s["n_ctx"] for s in slots] == [2048] * 4
        body = {"messages": _REASONED}
        prompt = httpx.post(f"{server.url}/apply-template", json=body, timeout=10).json()
        assert ("EARLIER-REASONING" in prompt["prompt"]) is preserve
