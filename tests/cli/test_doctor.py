"""``boxmaker doctor`` without a model: an unreachable server, a key that is needed."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from fake_llama import Reply, Script

from boxmaker.cli import main
from boxmaker.cli._commands import pool_warning
from boxmaker.cli.doctor import diagnose


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_is_one_failed_check() -> None:
    report = diagnose(f"http://127.0.0.1:{_free_port()}", timeout_s=5.0)
    assert [(c.name, c.ok) for c in report.checks] == [("reachable", False)]
    assert "--url" in report.checks[0].fix and not report.ok


def test_a_needed_key_that_is_missing_says_so() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        return httpx.Response(401, json={"error": {"code": 401, "message": "Invalid API Key"}})

    report = diagnose("http://llama:8080/", transport=httpx.MockTransport(handler))
    assert report.url == "http://llama:8080"
    key = report.check("api key")
    assert (key.ok, key.seen) == (False, "HTTP 401 without a key")
    assert "--api-key" in key.fix
    assert report.to_json()["ok"] is False
    with pytest.raises(KeyError):
        report.check("timings")


def test_cli_doctor_json_and_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--url", f"http://127.0.0.1:{_free_port()}", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["checks"][0]["name"] == "reachable"


def test_a_server_that_is_no_llama_server_ends_with_a_failed_check() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, text="ok")
        return httpx.Response(200, text="<html>a web server</html>")

    report = diagnose("http://web:80", transport=httpx.MockTransport(handler))
    assert [c.name for c in report.checks] == ["reachable", "api key", "answers"]
    answers = report.check("answers")
    assert answers.ok is False and "unexpected answer" in answers.seen
    assert "llama-server" in answers.fix


class _Forever(httpx.SyncByteStream):
    """The same bytes for ever (a server that never stops)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.sent = 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            self.sent += 1
            yield self.data


def _endless(data: bytes) -> tuple[httpx.MockTransport, _Forever]:
    stream = _Forever(data)

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            return httpx.Response(200, json={"chat_template_caps": {"supports_tools": True}})
        if request.url.path == "/slots":
            return httpx.Response(200, json=[{"id": 0}])
        if request.url.path.startswith("/slots/"):  # llama-server without --slot-save-path
            error = {"code": 501, "message": "This server does not support slots action.",
                     "type": "not_supported_error"}  # fmt: skip
            return httpx.Response(501, json={"error": error})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    return httpx.MockTransport(handler), stream


def test_a_server_that_streams_for_ever_ends_the_report() -> None:
    """Issue 23: doctor hung on it (killed at 180 s); now the probe stops at its bound."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"id":"c"}\n\n'
    transport, stream = _endless(event)
    report = diagnose("http://llama:8080", transport=transport)
    bounded = report.check("bounded")
    assert bounded.ok is False and not report.ok
    assert "more than 224 events for max_tokens 160" in bounded.seen
    assert stream.sent == 225
    saving = report.check("slot saving")
    assert saving.ok is None and "start llama-server with --slot-save-path" in saving.seen


def test_a_server_that_streams_its_slot_answer_for_ever_cannot_hold_the_doctor() -> None:
    transport, stream = _endless(b": ping\n\n")

    def slots_stream(request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/slots/"):
            return httpx.Response(400, stream=stream)
        return transport.handle_request(request)

    report = diagnose(
        "http://llama:8080", transport=httpx.MockTransport(slots_stream), probe_deadline_s=0.2
    )
    assert report.check("slot saving").seen.startswith("unknown: HTTP 400")


def test_a_server_that_only_pings_meets_the_probe_deadline() -> None:
    transport, _ = _endless(b": ping\n\n")
    report = diagnose("http://llama:8080", transport=transport, probe_deadline_s=0.2)
    assert "sent no data event for 0.2 s" in report.check("bounded").seen


# Tool calls written in content, as a server whose parser does not know the model's format
# streams them; each cut into 3-character deltas so every tag is split across deltas.
TEXT_CALLS = {
    "gpt-oss harmony": (
        "<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city":"Paris"}<|call|>'
    ),
    "Qwen3-Coder XML": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "</function>\n</tool_call>"
    ),
    "Hermes <tool_call>": (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    ),
    "Llama 3.x JSON": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
    "Mistral [TOOL_CALLS]": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
}


@pytest.mark.parametrize("label", sorted(TEXT_CALLS))
def test_tool_calls_parsed_names_the_format_left_in_content(label: str) -> None:
    text = TEXT_CALLS[label]
    pieces = [text[i : i + 3] for i in range(0, len(text), 3)]
    cid = "chatcmpl-doctor"

    def sse(delta: dict[str, object], finish: str | None = None) -> str:
        obj = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], "id": cid}
        return f"data: {json.dumps(obj)}\n\n"

    body = "".join([*(sse({"content": p}) for p in pieces), sse({}, "stop"), "data: [DONE]\n\n"])

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/props":
            caps = {"supports_tool_calls": True}
            return httpx.Response(200, json={"total_slots": 1, "chat_template_caps": caps})
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "n_ctx": 8192}])
        if path.endswith("/control"):
            return httpx.Response(200, json={"success": False})
        return httpx.Response(200, text=body, headers={"Content-Type": "text/event-stream"})

    check = diagnose("http://llama:8080", transport=httpx.MockTransport(handler)).check(
        "tool calls parsed"
    )
    assert check.ok is False
    assert check.seen == f"a {label} tool call to get_weather written in content"
    assert "--jinja" in check.fix and "template" in check.fix


def _server(props: dict[str, object], slots: int) -> httpx.MockTransport:
    """/health, /props, /slots as given; chat requests answered by the fake's script."""
    script = Script([Reply(content="ok")])
    settings = props["default_generation_settings"]
    assert isinstance(settings, dict)
    n_ctx = settings["n_ctx"]

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json=props)
        if request.url.path == "/slots":
            return httpx.Response(200, json=[{"id": i, "n_ctx": n_ctx} for i in range(slots)])
        return script.handler(request)

    return httpx.MockTransport(handler)


_CAPS = {"supports_tools": False, "supports_tool_calls": False, "supports_system_role": True}


@pytest.mark.parametrize(
    ("extra", "seen", "fix"),
    [
        (
            {"kv_unified": True},
            "4 slot(s) sharing one pool of 2048 tokens (unified KV): 4 sessions at once hold "
            '512 tokens each before llama.cpp fails every running request ("Context size has '
            'been exceeded"; boxmaker waits and retries)',
            "-np N for the N sessions run at once and -c N x 4096 or more (e.g. -np 4 -c 16384)",
        ),
        (
            {"kv_unified": False},
            "4 slot(s) x 2048 tokens (n_ctx 8192 in all)",
            "each slot gets -c / -np tokens: raise -c to 16384 or more, or lower -np",
        ),
        (
            {},
            "4 slot(s), each up to 2048 tokens: n_ctx 2048 shared if the KV cache is unified "
            "(llama-server's default without -np), else 8192 in all (/props does not say which)",
            "raise -c to 16384 or more, or lower -np (with a unified KV: the slots share -c",
        ),
    ],
)
def test_slots_with_a_unified_kv_share_one_context(
    extra: dict[str, object], seen: str, fix: str
) -> None:
    """Issue 24: ``-c 4096`` with llama-server's 4 unified slots was said to be 16384 shared."""
    props = {
        "total_slots": 4,
        "default_generation_settings": {"n_ctx": 2048},
        "chat_template_caps": _CAPS,
        **extra,
    }
    report = diagnose("http://llama", transport=_server(props, 4))
    slots = report.check("slots and context")
    assert (slots.ok, slots.seen) == (False, seen)
    assert fix in slots.fix


def test_llama_servers_default_pool_is_too_small_for_a_session_per_slot() -> None:
    """Issue 35: upstream's default, 4 slots sharing one 4,096-token pool: four sessions of
    ~1,030 tokens fill it, and llama.cpp fails every running request."""
    props = {
        "total_slots": 4,
        "default_generation_settings": {"n_ctx": 4096},
        "chat_template_caps": _CAPS,
        "kv_unified": True,
    }
    slots = diagnose("http://llama", transport=_server(props, 4)).check("slots and context")
    assert slots.ok is False and "4 sessions at once hold 1024 tokens each" in slots.seen
    assert "-np 4 -c 16384" in slots.fix


def test_a_template_without_tools_is_not_told_to_add_jinja() -> None:
    """--jinja is on by default; the template itself takes no tools (SmolLM2, Gemma 3)."""
    props = {
        "total_slots": 1,
        "default_generation_settings": {"n_ctx": 8192},
        "chat_template_caps": _CAPS,
    }
    report = diagnose("http://llama", transport=_server(props, 1))
    template = report.check("chat template")
    assert template.ok is False
    assert "--jinja" not in template.fix and "takes no tools" in template.fix
    caps = report.check("capabilities")
    assert caps.seen.startswith("tools no, tool calls no, parallel calls ?, system role yes")
    assert "kv_unified ?, n_swa ?" in caps.seen
    assert report.check("slots and context").seen == "1 slot(s) x 8192 tokens (n_ctx 8192)"


def test_serve_warns_of_slots_sharing_one_pool() -> None:
    text = pool_warning(4, 4096)
    assert "the 4 slots share one KV pool of 4096 tokens" in text
    assert "4 sessions at once hold 1024 tokens each" in text and "-np N -c N*T" in text


# --- issue 35 item 4: cache_n unknown, crossing told from nondeterminism, a slow server ---------


class _Paced(httpx.SyncByteStream):
    """``chunks`` with ``pause_s`` before each, holding ``lock`` (if any) while it streams."""

    def __init__(self, chunks: list[bytes], pause_s: float, lock: threading.Lock | None) -> None:
        self.chunks, self.pause_s, self.lock = chunks, pause_s, lock

    def __iter__(self) -> Iterator[bytes]:
        if self.lock is not None:
            self.lock.acquire()
        try:
            for data in self.chunks:
                time.sleep(self.pause_s)
                yield data
        finally:
            if self.lock is not None:
                self.lock.release()


def _doctor_server(
    answer: Callable[[int], tuple[list[bytes], float]],
    *,
    lock: threading.Lock | None = None,
) -> httpx.MockTransport:
    """A llama-server for the doctor: /health, /props, /slots; chat request ``n`` (1, 2, ...)
    streams ``answer(n)``'s chunks with its pause before each."""
    served = [0]

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/props":
            settings = {"n_ctx": 8192}
            return httpx.Response(
                200, json={"total_slots": 1, "default_generation_settings": settings}
            )
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "n_ctx": 8192}])
        if path.startswith("/slots/"):
            return httpx.Response(501, json={"error": {"code": 501, "message": "no"}})
        if path.endswith("/control"):
            return httpx.Response(200, json={"success": False})
        served[0] += 1
        chunks, pause = answer(served[0])
        stream = _Paced(chunks, pause, lock)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    return httpx.MockTransport(handler)


def _sse(obj: dict[str, object]) -> bytes:
    return f"data: {json.dumps(obj)}\n\n".encode()


def _answer(text: str, timings: dict[str, object], pieces: int = 1) -> list[bytes]:
    """A llama.cpp answer: ``text`` in ``pieces`` content deltas, then ``timings``."""
    step = max(1, len(text) // pieces)
    parts = [text[i : i + step] for i in range(0, len(text), step)]
    chunks = [_sse({"id": "c", "choices": [{"index": 0, "delta": {"content": p}}]}) for p in parts]
    end = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    return [*chunks, _sse({**end, "timings": timings}), b"data: [DONE]\n\n"]


@pytest.mark.parametrize(
    ("second", "ok", "said"),
    [
        ({"prompt_n": 1, "predicted_n": 2}, True, "no cache_n in the timings; prompt_n 1 of 24"),
        ({"prompt_n": 24, "predicted_n": 2}, False, "prompt_n 24 of 24 prompt tokens processed"),
        ({"predicted_n": 2}, None, "neither cache_n nor prompt_n: cannot tell"),
        ({"cache_n": 23, "prompt_n": 1}, True, "cache_n 23 of 24 prompt tokens"),
    ],
)
def test_cache_reuse_is_judged_from_what_the_timings_report(
    second: dict[str, object], ok: bool | None, said: str
) -> None:
    """A build whose timings have no ``cache_n`` was told "not reused, keep cache_prompt on"
    while its processed prompt fell from 24 tokens to 1."""
    first: dict[str, object] = {"prompt_n": 24, "predicted_n": 2}

    def answer(n: int) -> tuple[list[bytes], float]:
        return _answer("Hi.", first if n == 1 else second), 0.0

    report = diagnose("http://llama", transport=_doctor_server(answer))
    check = report.check("cache reused")
    assert (check.ok, said in check.seen) == (ok, True), check.seen


def test_a_slow_server_is_slow_not_endless() -> None:
    """The first probe streams 25 deltas 0.03 s apart (0.8 s), past a probe deadline of 0.3 s
    that a fixed deadline would have called "never ends": its own pace allows it."""

    def answer(n: int) -> tuple[list[bytes], float]:
        return _answer("x" * 25, {"prompt_n": 5}, pieces=25), 0.03 if n == 1 else 0.0

    report = diagnose(
        "http://llama", transport=_doctor_server(answer), probe_deadline_s=0.3, probe_tokens=30
    )
    names = [c.name for c in report.checks]
    assert "bounded" not in names and "speed" not in names
    assert report.check("timings").ok is True and report.check("slot shared").ok is None


def test_answers_that_differ_while_queued_are_not_crossing() -> None:
    """SmolLM2 at temperature 0: 0 of 6 pairs overlapped, yet answers differed from the answer
    alone (cache-state numerics); the doctor said they crossed."""
    slot = threading.Lock()  # the server queues a second request to the slot

    def answer(n: int) -> tuple[list[bytes], float]:
        return _answer(f"answer {n}", {"prompt_n": 5}, pieces=3), 0.01

    shared = diagnose("http://llama", transport=_doctor_server(answer, lock=slot)).check(
        "slot shared"
    )
    assert "were queued (6 of 6 pairs)" in shared.seen
    assert "in 6 pair(s) an answer differed from the answer alone without running together" in (
        shared.seen
    )
    assert "not crossing" in shared.seen


def test_pairs_that_generate_at_the_same_time_ran_together() -> None:
    def answer(n: int) -> tuple[list[bytes], float]:
        return _answer("same answer", {"prompt_n": 5}, pieces=4), 0.02

    shared = diagnose("http://llama", transport=_doctor_server(answer)).check("slot shared")
    assert "ran in it together (6 of 6 pairs generated at the same time" in shared.seen


# --- issue 39: does a fork find its parent's prefix, does a session keep its slot -------------


def _cache_server(follow_ups: list[int], *, n_swa: int = 512) -> httpx.MockTransport:
    """Two slots that save to files; every first reply holds 30 tokens (a prompt of 20 and
    a reply of 11, its last never decoded), the ``n``-th follow-up ("Why?") reuses
    ``follow_ups[n]`` of them."""
    served = [0]

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if path == "/props":
            settings = {"n_ctx": 8192}
            props = {"total_slots": 2, "n_swa": n_swa, "default_generation_settings": settings}
            return httpx.Response(200, json=props)
        if path == "/slots":
            return httpx.Response(200, json=[{"id": i, "n_ctx": 8192} for i in (0, 1)])
        if path.startswith("/slots/"):
            if json.loads(request.content).get("filename", "").startswith(".."):
                return httpx.Response(400, json={"error": {"message": "Invalid filename"}})
            return httpx.Response(200, json={"n_saved": 30, "n_restored": 30})
        if path.endswith("/control"):
            return httpx.Response(200, json={"success": False})
        body = json.loads(request.content)
        timings: dict[str, object] = {"cache_n": 0, "prompt_n": 20, "predicted_n": 11}
        if body["messages"][-1]["content"] == "Why?":
            assert body["messages"][1] == {"role": "assistant", "content": "Caching."}
            reused = follow_ups[served[0]]
            served[0] += 1
            timings = {"cache_n": reused, "prompt_n": 40 - reused, "predicted_n": 3}
        stream = _Paced(_answer("Caching.", timings), 0.0, None)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=stream)

    return httpx.MockTransport(handler)


WARM_CHECKS = ("fork from a slot", "fork from a saved slot", "idle slot kept")


def test_a_fork_and_an_idle_slot_that_keep_their_prefix_pass() -> None:
    report = diagnose("http://llama", transport=_cache_server([30, 29, 30], n_swa=0))
    fork, saved, idle = (report.check(n) for n in WARM_CHECKS)
    assert fork.ok and "30 of 30 held tokens reused (1.00)" in fork.seen
    assert saved.ok and "29 of 30 held tokens reused (0.97)" in saved.seen
    assert idle.ok and "slot 0 kept its prompt while slot 1 ran (30 tokens reused)" in idle.seen


def test_a_sliding_window_fork_and_a_cleared_idle_slot_are_told_with_the_flag() -> None:
    """Gemma 3 without --swa-full reused 241 of 373 from a slot and 0 after a restore;
    llama-server's --cache-idle-slots emptied a pinned session's slot when another slot
    started a task: 0 of 1,020 reused."""
    report = diagnose("http://llama", transport=_cache_server([21, 0, 0]))
    fork, saved, idle = (report.check(n) for n in WARM_CHECKS)
    assert fork.ok is False and "21 of 30 held tokens reused (0.70)" in fork.seen
    assert "n_swa 512" in fork.fix and "--swa-full" in fork.fix
    assert saved.ok is False and "0 of 30" in saved.seen and "--swa-full" in saved.fix
    assert idle.ok is False and "--no-cache-idle-slots" in idle.fix
    assert report.ok is False
