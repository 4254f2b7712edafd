"""The tap on real sockets: the fake llama-server (tests/fake_llama.py) upstream, the tap in
front of it, httpx as the agent. Bytes pass unchanged, events as they come, disconnects
reach the upstream; the logs are boxmaker's own, one session per conversation; the faults
(upstream down, an HTTP error, not JSON, two agents at once, a full disk) forward anyway."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import SSE_HEAD, FakeLlama, Raw, Reply, Stall, chunk, running

from boxmaker import frames
from boxmaker.cache import TemplateServer
from boxmaker.cassettes import use_cassette
from boxmaker.cli import main
from boxmaker.records import Assistant, CacheLoss, ToolResult, TurnEnd, Usage, User
from boxmaker.session import Session
from boxmaker.tap import Tap, _log, what_if_log
from boxmaker.testing import assert_log_well_formed

CHAT = "/v1/chat/completions"
SYSTEM: dict[str, Any] = {"role": "system", "content": "You are terse."}
ASK: dict[str, Any] = {"role": "user", "content": "What is the weather in Oslo?"}
CALL = Reply(
    content="", reasoning="I should look.", tool_calls=[("c1", "get_weather", '{"city": "Oslo"}')]
)
ANSWER = Reply(content="Sunny.")


def _echo(call_id: str = "c1", args: str = '{"city":"Oslo"}') -> list[dict[str, Any]]:
    """The agent's next messages after a call: the reply as it echoes it, the result."""
    fn = {"name": "get_weather", "arguments": args}
    return [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": fn}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": '{"sky": "sunny"}'},
    ]


@contextlib.contextmanager
def tapped(script: list[Any], tmp_path: Path, **kw: Any) -> Iterator[tuple[FakeLlama, Tap]]:
    with running(script) as up, Tap(up.url, directory=tmp_path / "logs", **kw) as tap:
        yield up, tap


def _sessions(tap: Tap) -> list[Session]:
    assert tap.log is not None
    out = []
    for path in tap.log.sessions:
        with Session.open(path, read_only=True) as s:
            out.append(s)
    return out


def _post(url: str, messages: list[dict[str, Any]], **extra: Any) -> httpx.Response:
    return httpx.post(url + CHAT, json={"messages": messages, "stream": True, **extra}, timeout=10)


def test_answers_reach_the_agent_byte_for_byte_and_the_request_reaches_upstream_unchanged(
    tmp_path: Path,
) -> None:
    with tapped([CALL], tmp_path) as (up, tap):
        body = json.dumps({"messages": [ASK], "stream": True}, indent=3).encode()  # odd spacing
        through = httpx.post(tap.url + CHAT + "?x=1", content=body, headers={"X-Mine": "kept"})
        direct = httpx.post(up.url + CHAT + "?x=1", content=body, headers={"X-Mine": "kept"})
        health = httpx.get(tap.url + "/health")
        models = httpx.get(tap.url + "/v1/models")
    assert through.status_code == direct.status_code == 200
    assert through.content == direct.content and b"data: [DONE]" in through.content
    assert through.headers["content-type"] == "text/event-stream"
    first, second = up.requests[0], up.requests[1]
    assert first.split(b"\r\n\r\n", 1)[1] == body == second.split(b"\r\n\r\n", 1)[1]
    assert first.startswith(b"POST /v1/chat/completions?x=1 HTTP/1.1")
    assert b"x-mine: kept" in first.lower()
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert models.status_code == 200 and up.requests[-1].startswith(b"GET /v1/models")


def test_each_event_is_forwarded_as_it_arrives(tmp_path: Path) -> None:
    first = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    finish = b'{"id":"x","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}'
    rest = b"data: " + finish + b"\n\ndata: [DONE]\n\n"
    script = [Raw([SSE_HEAD, chunk(first), Stall(), chunk(rest), b"0\r\n\r\n"], hold=False)]
    with (
        tapped(script, tmp_path) as (up, tap),
        httpx.stream("POST", tap.url + CHAT, json={"messages": [ASK], "stream": True}) as r,
    ):
        reads = r.iter_raw()
        got = next(reads)  # arrives while the upstream still holds the rest
        assert got == first and not up.release.is_set()
        up.release.set()
        assert b"".join(reads) == rest


def test_a_conversation_with_a_tool_call_is_one_well_formed_session(tmp_path: Path) -> None:
    with tapped([CALL, ANSWER], tmp_path, forensics=False) as (_, tap):
        assert _post(tap.url, [SYSTEM, ASK]).status_code == 200
        assert _post(tap.url, [SYSTEM, ASK, *_echo()]).status_code == 200
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    assert session.baseline.system == "You are terse."
    kinds = [type(r).__name__ for r in session.records]
    assert kinds == [
        "User",
        "Assistant",
        "Usage",
        "ToolResult",
        "Assistant",
        "Usage",
        "CacheLoss",
        "TurnEnd",
    ]
    user, call, usage, result, answer = session.records[:5]
    assert isinstance(user, User) and user.content == ASK["content"]
    assert isinstance(call, Assistant) and call.reasoning == "I should look."
    assert [(c.id, c.name, c.arguments) for c in call.tool_calls] == [
        ("c1", "get_weather", '{"city": "Oslo"}')
    ]
    assert (
        isinstance(usage, Usage)
        and usage.timings["prompt_n"] == 10
        and usage.finish_reason == "tool_calls"
    )
    assert isinstance(result, ToolResult) and (result.call, result.name, result.content) == (
        1,
        "get_weather",
        '{"sky": "sunny"}',
    )
    assert isinstance(answer, Assistant) and answer.content == "Sunny."
    loss = session.records[6]
    assert isinstance(loss, CacheLoss) and (loss.expected, loss.reused, loss.cause) == (10, 0, None)
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and end.outcome == "answered"


def test_a_loss_is_explained_or_says_why_not(tmp_path: Path) -> None:
    # the fake serves no /apply-template: the loss is kept, its detail says forensics failed
    with tapped([CALL, ANSWER], tmp_path) as (_, tap):
        _post(tap.url, [ASK])
        _post(tap.url, [ASK, *_echo()])
    (session,) = _sessions(tap)
    (loss,) = [r for r in session.records if isinstance(r, CacheLoss)]
    assert loss.detail is not None and loss.detail.startswith("forensics failed")
    assert loss.reprocessed == 10


def test_an_upstream_that_stalls_forensics_holds_the_log_back_no_longer_than_its_bound(
    tmp_path: Path,
) -> None:
    """The upstream takes the forensics' side requests and never answers: the loss is
    written within :data:`~boxmaker.tap.FORENSICS_S` (plus the writer's own time), unexplained,
    saying why; each side request waited 30 s before, and a kill lost what was answered
    seconds before it."""
    with tapped([CALL, ANSWER], tmp_path) as (up, tap):
        for path in ("/apply-template", "/tokenize", "/props"):
            up.paths[path] = Raw([])  # accepted, held open, silent
        _post(tap.url, [ASK])
        _post(tap.url, [ASK, *_echo()])
        assert tap.log is not None and tap.log.wait(5)
        assert tap.log.slowest_s < _log.FORENSICS_S + 0.5
    (session,) = _sessions(tap)
    (loss,) = [r for r in session.records if isinstance(r, CacheLoss)]
    assert loss.detail is not None and loss.detail.startswith("forensics failed"), loss.detail
    assert loss.cause is None and loss.reprocessed == 10


def test_two_agents_at_once_with_the_same_task_get_two_sessions(tmp_path: Path) -> None:
    with tapped([CALL, CALL, ANSWER], tmp_path, forensics=False) as (_, tap):
        threads = [threading.Thread(target=_post, args=(tap.url, [SYSTEM, ASK])) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert tap.log is not None and tap.log.wait()
        for _ in range(2):
            _post(tap.url, [SYSTEM, ASK, *_echo()])
    sessions = _sessions(tap)
    assert len(sessions) == 2
    for s in sessions:
        assert_log_well_formed(s)
        assert [type(r).__name__ for r in s.records].count("Assistant") == 2


def test_a_new_question_is_a_new_turn_and_other_conversations_new_sessions(tmp_path: Path) -> None:
    with tapped([ANSWER], tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [ASK])
        _post(
            tap.url,
            [
                ASK,
                {"role": "assistant", "content": "Sunny."},
                {"role": "user", "content": "And Rome?"},
            ],
        )
        _post(tap.url, [{"role": "user", "content": "Something else."}])
    first, other = _sessions(tap)
    assert [r.outcome for r in first.records if isinstance(r, TurnEnd)] == ["answered", "answered"]
    assert [r.content for r in first.records if isinstance(r, User)] == [
        ASK["content"],
        "And Rome?",
    ]
    assert [r.content for r in other.records if isinstance(r, User)] == ["Something else."]


def test_a_request_that_is_not_json_is_forwarded_not_logged(tmp_path: Path) -> None:
    with tapped([ANSWER], tmp_path) as (up, tap):
        r = httpx.post(tap.url + CHAT, content=b"{not json")
        assert r.status_code == 200
        assert tap.log is not None and tap.log.wait()
        assert up.requests[0].endswith(b"{not json")
        assert (tap.log.skipped, tap.log.sessions, tap.log.problems) == (1, [], [])


def test_an_upstream_that_is_down_answers_502_and_is_logged(tmp_path: Path) -> None:
    with running([ANSWER]) as up:
        url = up.url
    with Tap(url, directory=tmp_path) as tap:
        r = _post(tap.url, [ASK])
    assert r.status_code == 502
    assert (
        r.json()["error"]["type"] == "tap_upstream_unreachable"
        and url in r.json()["error"]["message"]
    )
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and (end.outcome, end.status) == ("infer_error", None)
    assert url in end.detail


def test_an_upstream_error_is_forwarded_as_it_is_and_logged_with_its_status(tmp_path: Path) -> None:
    error = {"error": {"code": 500, "message": "boom"}}
    with tapped([Reply(status=500, error=error)], tmp_path) as (_, tap):
        r = _post(tap.url, [ASK])
    assert (r.status_code, r.json()) == (500, error)
    (session,) = _sessions(tap)
    end = session.records[-1]
    assert isinstance(end, TurnEnd) and (end.outcome, end.status) == ("infer_error", 500)
    assert "boom" in end.detail


def test_a_failed_request_sent_again_is_a_turn_of_its_own(tmp_path: Path) -> None:
    """An upstream 500 ends the turn ``infer_error``; the agent sends the same request again:
    its answer opens a new turn (the request's last user message), so the failed turn keeps
    its outcome. Before, the answer went into the ended turn, which ended twice, and every
    view showed it ``answered``, the error nowhere."""
    error = {"error": {"code": 500, "message": "boom"}}
    with tapped([ANSWER, Reply(status=500, error=error), ANSWER], tmp_path, forensics=False) as (
        _,
        tap,
    ):
        first = [ASK, {"role": "assistant", "content": "Sunny."}]
        again = [*first, {"role": "user", "content": "And tomorrow?"}]
        assert [_post(tap.url, m).status_code for m in ([ASK], again, again)] == [200, 500, 200]
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    kinds = [type(r).__name__ for r in session.records]
    assert kinds == [
        *("User", "Assistant", "Usage", "TurnEnd", "User", "TurnEnd"),
        *("User", "Assistant", "Usage", "CacheLoss", "TurnEnd"),
    ]
    users = [r.content for r in session.records if isinstance(r, User)]
    assert users == [ASK["content"], "And tomorrow?", "And tomorrow?"]
    turns = frames.load(session.path.parent).turns
    assert turns.outcome.tolist() == ["answered", "infer_error", "answered"]


def test_an_agent_that_disconnects_mid_stream_closes_the_upstream_and_the_turn(
    tmp_path: Path,
) -> None:
    first = b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    script = [Raw([SSE_HEAD, chunk(first)], hold=True)]  # then silent until the client goes
    with tapped(script, tmp_path) as (up, tap):
        with httpx.stream("POST", tap.url + CHAT, json={"messages": [ASK], "stream": True}) as r:
            assert next(r.iter_raw()) == first
        assert up.disconnected.wait(5)  # the tap closed its upstream connection
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    answer, end = session.records[1], session.records[-1]
    assert isinstance(answer, Assistant) and answer.content == "Hi"
    assert isinstance(end, TurnEnd) and end.outcome == "cancelled"


def test_a_turn_left_open_is_closed_when_the_tap_stops(tmp_path: Path) -> None:
    with tapped([CALL], tmp_path) as (_, tap):
        _post(tap.url, [ASK])
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    result = session.records[-2]
    assert isinstance(result, ToolResult) and result.not_run == "cancelled"


def test_anthropic_messages_are_logged_too(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {"usage": {"input_tokens": 7}}},
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": ""},
        },
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Look."},
        },
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"city": "Oslo"}'},
        },
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use"},
            "usage": {"output_tokens": 5},
        },
        {"type": "message_stop"},
    ]
    stream = b"".join(
        chunk(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n".encode()) for e in events
    )
    with tapped([Raw([SSE_HEAD, stream, b"0\r\n\r\n"], hold=False)], tmp_path) as (_, tap):
        body = {
            "system": "Be brief.",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Oslo?"}]}],
            "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
            "stream": True,
        }
        assert httpx.post(tap.url + "/v1/messages", json=body).status_code == 200
    (session,) = _sessions(tap)
    assert session.baseline.system == "Be brief."
    assert dict(session.baseline.tools[0])["function"]["name"] == "get_weather"
    user, call, usage = session.records[:3]
    assert isinstance(user, User) and user.content == "Oslo?"
    assert isinstance(call, Assistant) and call.reasoning == "Look."
    assert [(c.id, c.name, c.arguments) for c in call.tool_calls] == [
        ("t1", "get_weather", '{"city": "Oslo"}')
    ]
    assert isinstance(usage, Usage) and (
        usage.prompt_tokens,
        usage.completion_tokens,
        usage.finish_reason,
    ) == (7, 5, "tool_calls")


def test_what_if_on_a_tapped_log_names_the_limit_that_would_have_stopped_the_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages: list[dict[str, Any]] = [ASK]
    with tapped([CALL], tmp_path, forensics=False) as (_, tap):
        for n in range(3):  # the agent calls the same tool with the same arguments, again
            _post(tap.url, messages)
            messages = [*messages, *_echo(call_id="c1")]
            messages[-2]["tool_calls"][0]["id"] = messages[-1]["tool_call_id"] = f"c{n}"
    (session,) = _sessions(tap)
    report = what_if_log(session.path)
    assert [(t, c, kind) for t, c, kind, _ in report.hits] == [(1, 2, "repeat")]
    assert main(["replay", str(session.path)]) == 0
    assert "turn 1, completion 2: repeat fires" in capsys.readouterr().out


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_disk_forwards_anyway_and_says_so_once(tmp_path: Path) -> None:
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], check=False
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        big = {"role": "user", "content": "x" * 40_000}  # more than the disk holds
        with running([ANSWER]) as up, Tap(up.url, directory=disk) as tap:
            answers = [_post(tap.url, [big, {"role": "user", "content": str(n)}]) for n in range(3)]
            assert tap.log is not None and tap.log.wait()
            problems = list(tap.log.problems)
            counted = (tap.log.written, tap.log.failed)  # boxmaker tap says "0 written; 3 not"
        assert [r.status_code for r in answers] == [200, 200, 200]
        assert counted == (3, 3)
        assert all(b"data: [DONE]" in r.content for r in answers)
        assert len(problems) == 1 and "cannot write the logs" in problems[0]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_a_request_that_rewrote_earlier_history_continues_its_session(tmp_path: Path) -> None:
    with tapped([CALL, ANSWER], tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [ASK])
        history = [ASK, *_echo()]
        _post(tap.url, history)
        edited = [dict(m) for m in history]
        edited[2]["content"] = "(result cleared)"  # the harness compacted an old tool result
        more = [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Rome?"}]
        _post(tap.url, [*edited, *more])
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    assert [r.content for r in session.records if isinstance(r, User)] == [ASK["content"], "Rome?"]
    assert [r.content for r in session.records if isinstance(r, ToolResult)] == ['{"sky": "sunny"}']


def test_a_session_view_follows_a_tapped_session_as_it_grows(tmp_path: Path) -> None:
    from boxmaker.widgets import SessionView

    with tapped([CALL, ANSWER], tmp_path, forensics=False) as (_, tap):
        assert tap.log is not None
        _post(tap.url, [ASK])
        assert tap.log.wait()
        view = SessionView(tap.log.sessions[0])  # the turn still open: the agent runs the tool
        assert len(view.transcript.turns) == 1 and "Sunny." not in view.html()
        assert view.refresh() == 0
        _post(tap.url, [ASK, *_echo()])
        assert tap.log.wait()
        assert view.refresh() == 5  # the result, the answer, its usage and loss, the end
    assert len(view.transcript.turns) == 1 and "Sunny." in view.html()
    assert "(8 records)" in view.widget.children[0].value


def test_a_reply_sent_back_altered_is_not_logged_twice(tmp_path: Path) -> None:
    with tapped([ANSWER], tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [ASK])
        altered = {"role": "assistant", "content": "It is sunny."}  # the harness rewrote it
        _post(tap.url, [ASK, altered, {"role": "user", "content": "Rome?"}])
    (session,) = _sessions(tap)
    assert [r.content for r in session.records if isinstance(r, Assistant)] == ["Sunny."] * 2


def test_the_command_serves_until_interrupted_and_names_its_logs_and_cassette(
    tmp_path: Path,
) -> None:
    import signal
    import socket
    import sys
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with running([ANSWER]) as up:
        logs, cassette = str(tmp_path / "logs"), tmp_path / "tapped.yaml"
        command = [sys.executable, "-m", "boxmaker.cli", "tap", "--upstream", up.url,
                   "--port", str(port), "--dir", logs, "--no-forensics",
                   "--cassette", str(cassette)]  # fmt: skip
        tap = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            assert tap.stdout is not None
            head = tap.stdout.readline()
            assert head.startswith(
                f"boxmaker tap: listening on http://127.0.0.1:{port} (this machine only) -> "
                f"{up.url}"
            )
            assert tap.stdout.readline().rstrip().endswith(f"; cassette {cassette}")
            for _ in range(100):
                with contextlib.suppress(httpx.TransportError):
                    r = _post(f"http://127.0.0.1:{port}", [ASK])
                    break
                time.sleep(0.05)
            assert r.status_code == 200 and b"data: [DONE]" in r.content
        finally:
            tap.send_signal(signal.SIGINT)
            out, _ = tap.communicate(timeout=30)
    assert tap.returncode == 0
    (log,) = (tmp_path / "logs").glob("*.jsonl")
    assert str(log) in out
    with Session.open(log, read_only=True) as session:
        assert_log_well_formed(session)
    assert f"{cassette}: 1 interaction(s) recorded" in out
    with use_cassette(cassette, "none"):  # the answer the agent got, replayed
        assert _post("http://127.0.0.1:9", [ASK]).content == r.content


def test_the_command_says_at_once_when_its_upstream_does_not_answer(tmp_path: Path) -> None:
    """Issue 37: the tap started without checking its upstream; the agent's first request got
    a 502 and the researcher no word. It still serves (the upstream may start later)."""
    import signal
    import socket
    import sys
    import time

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    upstream = f"http://127.0.0.1:{dead}"
    command = [sys.executable, "-m", "boxmaker.cli", "tap", "--upstream", upstream]
    command += ["--port", "0", "--dir", str(tmp_path / "logs")]
    tap = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        assert tap.stdout is not None
        lines = [tap.stdout.readline() for _ in range(3)]
        assert lines[2].startswith("  warning: the upstream does not answer GET /health (")
        assert "start llama-server there, or give the right --upstream" in lines[2]
        url = lines[0].split("listening on ", 1)[1].split()[0]
        for _ in range(100):  # still serving: the agent gets the upstream's absence as a 502
            with contextlib.suppress(httpx.TransportError):
                assert httpx.get(f"{url}/health", timeout=5).status_code == 502
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the tap never answered")
    finally:
        tap.send_signal(signal.SIGINT)
        tap.communicate(timeout=30)
    assert tap.returncode == 0


def test_the_listening_socket_says_tcp_so_each_agent_connection_has_nagle_off() -> None:
    import socket

    # asyncio sets TCP_NODELAY on an accepted connection only when the listening socket's
    # proto is IPPROTO_TCP; with 0, Nagle held an event sent right after the head until the
    # agent's delayed ACK (about 40 ms to the first event)
    tap = Tap("http://127.0.0.1:9")
    tap.bind()
    try:
        sock = tap._socket
        assert sock is not None and sock.proto == socket.IPPROTO_TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        tap.stop()


def test_a_turn_the_agent_abandons_is_abandoned_not_answered(tmp_path: Path) -> None:
    # the agent sent the call's result, then a new question, never asking for the answer
    later = {"role": "user", "content": "Never mind. And Rome?"}
    with tapped([CALL, ANSWER], tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [ASK])
        _post(tap.url, [ASK, *_echo(), later])
    (session,) = _sessions(tap)
    assert_log_well_formed(session)
    ends = [r for r in session.records if isinstance(r, TurnEnd)]
    assert [e.outcome for e in ends] == ["abandoned", "answered"]
    assert ends[0].detail == (
        "the agent sent a new user message after the results of its calls, "
        "without asking for an answer"
    )
    assert list(frames.turns(tmp_path / "logs")["outcome"]) == ["abandoned", "answered"]
    summary = frames.summary(tmp_path / "logs")
    assert (summary["answered_turns"].tolist(), summary["abandoned_turns"].tolist()) == ([1], [1])


def test_a_new_question_before_the_results_cancels_and_an_own_answer_answers(
    tmp_path: Path,
) -> None:
    with tapped([CALL, ANSWER], tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [ASK])
        echo = _echo()[0]  # the reply, not its result
        _post(tap.url, [ASK, echo, {"role": "user", "content": "Rome?"}])
    (session,) = _sessions(tap)
    ends = [r for r in session.records if isinstance(r, TurnEnd)]
    assert (ends[0].outcome, ends[0].detail) == (
        "cancelled",
        "the agent sent a user message before the results of its calls",
    )
    # a few-shot example the agent wrote itself answers its turn
    shots = [ASK, {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Rome?"}]
    with tapped([ANSWER], tmp_path / "shots", forensics=False) as (_, tap):
        _post(tap.url, shots)
    (session,) = _sessions(tap)
    ends = [r for r in session.records if isinstance(r, TurnEnd)]
    assert [(e.outcome, e.detail) for e in ends] == [
        ("answered", "the agent wrote the answer itself"),
        ("answered", ""),
    ]


def test_user_messages_one_after_the_other_are_one_turn(tmp_path: Path) -> None:
    context = {"role": "user", "content": "<context>a repository</context>"}
    with tapped([ANSWER], tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [SYSTEM, context, ASK])
    (session,) = _sessions(tap)
    assert [type(r).__name__ for r in session.records] == ["User", "Assistant", "Usage", "TurnEnd"]
    user = session.records[0]
    assert isinstance(user, User)
    assert user.content == f"{context['content']}\n\n{ASK['content']}"


def _json_reply(answer: dict[str, Any]) -> Raw:
    body = json.dumps(answer).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
    return Raw([head % len(body), body], hold=False)


def test_a_whole_chat_answer_counts_reasoning_as_the_server_sent_it(tmp_path: Path) -> None:
    message = {"role": "assistant", "content": "Sunny.", "reasoning_content": "Look it up. " * 9}
    answer: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 30, "completion_tokens": 70},
        "timings": {"cache_n": 0, "prompt_n": 30, "predicted_n": 70},
    }
    counted = {**answer, "usage": {**answer["usage"], "completion_tokens_details": {
        "reasoning_tokens": 63}}}  # fmt: skip
    script = [_json_reply(counted), _json_reply(answer)]
    with tapped(script, tmp_path, forensics=False) as (_, tap):
        _post(tap.url, [ASK], stream=False)
        _post(tap.url, [{"role": "user", "content": "Another question."}], stream=False)
    usages = [r for s in _sessions(tap) for r in s.records if isinstance(r, Usage)]
    # 63 as the server counted it; unknown when it did not (one piece of reasoning is no
    # count: the tap logged 1 for each before)
    assert [u.reasoning_tokens for u in usages] == [63, None]
    assert [(u.prompt_tokens, u.completion_tokens) for u in usages] == [(30, 70), (30, 70)]


def test_anthropic_thinking_is_counted_and_the_prompt_includes_its_cached_part(
    tmp_path: Path,
) -> None:
    answer = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "Look."}, {"type": "text", "text": "Hi."}],
        "stop_reason": "end_turn",
        # llama.cpp: input_tokens is the prompt less its cached part
        "usage": {"input_tokens": 4, "cache_read_input_tokens": 26, "output_tokens": 9},
    }
    body = {"messages": [{"role": "user", "content": "Hi?"}], "max_tokens": 50}
    with tapped([_json_reply(answer)], tmp_path, forensics=False) as (_, tap):
        assert httpx.post(tap.url + "/v1/messages", json=body).status_code == 200
    (session,) = _sessions(tap)
    (usage,) = [r for r in session.records if isinstance(r, Usage)]
    assert (usage.prompt_tokens, usage.completion_tokens) == (30, 9)
    assert usage.reasoning_tokens is None  # thinking came whole, uncounted: unknown, not 0


def test_what_the_tap_cannot_read_is_forwarded_and_said_once_per_route(tmp_path: Path) -> None:
    with tapped([ANSWER], tmp_path, forensics=False) as (up, tap):
        for _ in range(2):
            assert httpx.post(tap.url + "/v1/completions", json={"prompt": "Hi"}).status_code == 200
            chained = {"input": "And then?", "previous_response_id": "resp_1"}
            assert httpx.post(tap.url + "/v1/responses", json=chained).status_code == 200
        assert tap.log is not None and tap.log.wait()
    assert len(up.requests) == 4  # all forwarded
    assert tap.log.notes == [
        "/v1/completions: forwarded, not logged: a prompt, not a conversation",
        "/v1/responses: forwarded, not logged: previous_response_id (the earlier turns are "
        "kept by the server, not sent)",
    ]
    assert (tap.log.sessions, tap.log.problems, tap.log.skipped) == ([], [], 2)


def test_a_note_on_what_the_tap_cannot_read_quotes_no_key(tmp_path: Path) -> None:
    """The note is printed: it named a Responses input item by its text, a key in it too
    (the request's own Bearer token); now by its type, and the request's credentials are
    hidden in any note."""
    key = "sk-note-0123456789"
    with tapped([ANSWER], tmp_path, forensics=False) as (_, tap):
        odd = {"input": [f"please use {key}"], "model": "m"}
        auth = {"Authorization": f"Bearer {key}"}
        assert httpx.post(tap.url + "/v1/responses", json=odd, headers=auth).status_code == 200
        assert tap.log is not None and tap.log.wait()
    assert tap.log.notes == [
        "/v1/responses: forwarded, not logged: an input item that is not an object (a str)"
    ]


def test_forensics_keeps_one_client_of_the_upstream_per_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each loss is looked into through a kept client (one per API key), not a client made
    and closed per loss (a new connection each: 6 % of the tap's CPU under 64 agents); the
    clients close with the tap."""
    made: list[Any] = []
    closed: list[Any] = []

    class Counted(TemplateServer):
        def __init__(self, url: str, **kw: Any) -> None:
            super().__init__(url, **kw)
            made.append(kw.get("api_key"))

        def close(self) -> None:
            closed.append(self)
            super().close()

    monkeypatch.setattr(_log, "TemplateServer", Counted)
    with tapped([CALL, ANSWER] * 3, tmp_path) as (_, tap):
        for n in range(3):
            ask = {"role": "user", "content": f"What is the weather in Oslo, {n}?"}
            _post(tap.url, [ask])
            _post(tap.url, [ask, *_echo()])
        assert tap.log is not None and tap.log.wait(10)
        assert closed == []
    losses = [r for s in _sessions(tap) for r in s.records if isinstance(r, CacheLoss)]
    assert len(losses) == 3 and all(str(r.detail).startswith("forensics failed") for r in losses)
    assert made == [None] and len(closed) == 1
