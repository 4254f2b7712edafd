"""The tap's cassette (``Tap(cassette=...)``, ``boxmaker tap --cassette``): every exchange the
upstream answered, recorded off the request path into a cassette that boxmaker's own replay
reads (``use_cassette``, ``boxmaker cassette show``), scrubbed as ``use_cassette`` scrubs: the
agent's ``Authorization`` token and an ``api_key`` in its body never reach the file; streams
replay event by event; a cassette that cannot be written forwards anyway and says so once."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from fake_llama import SSE_HEAD, Raw, Reply, chunk, running

from boxmaker.cassettes import load_interactions, transcript, use_cassette
from boxmaker.cli import main
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config
from boxmaker.demo import demo_registry
from boxmaker.records import Assistant, Baseline
from boxmaker.session import Session
from boxmaker.tap import Tap
from boxmaker.turn import Runtime, run_turn

CHAT = "/v1/chat/completions"
SECRET = "sk-tap-cassette-0123456789"
BODY_KEY = "body-key-abcdefghijklmnop"
CALL = Reply(
    content="", reasoning="I should look.", tool_calls=[("c1", "get_weather", '{"city": "Oslo"}')]
)
ANSWER = Reply(content="Sunny.", reasoning="It is sunny.")
ASK = "What is the weather in Oslo?"


def _turn(url: str, tmp_path: Path, name: str) -> Session:
    """One turn of boxmaker's own loop against ``url`` (a tool call, then the answer), with
    the secret as the client's api key (its ``Authorization`` header)."""
    registry = demo_registry()
    config = Config(client=ClientConfig(url=url, api_key=SECRET, retry_attempts=0))
    session = Session.create(tmp_path / name, Baseline(tools=registry.definitions()))
    with Client(config.client) as client:
        run_turn(session, Runtime(config=config, client=client, registry=registry), ASK)
    return session


def _assistants(session: Session) -> list[tuple[str | None, str | None, list[str]]]:
    return [
        (r.content, r.reasoning, [c.arguments for c in r.tool_calls])
        for r in session.records
        if isinstance(r, Assistant)
    ]


def test_a_tapped_loop_is_recorded_without_its_secrets_and_replays_with_the_same_answers(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "tapped.yaml"
    keyed = {"messages": [{"role": "user", "content": "hi"}], "api_key": BODY_KEY}
    with (
        running([CALL, ANSWER, ANSWER]) as up,
        Tap(up.url, directory=tmp_path / "logs", forensics=False, cassette=cassette) as tap,
    ):
        live = _turn(tap.url, tmp_path, "live")
        # the agent's own request with a key in its body and its URL, not only its header
        keyed_live = httpx.post(tap.url + CHAT + f"?api_key={BODY_KEY}", json=keyed, timeout=10)
    assert tap.cassette is not None and tap.cassette.problems == []
    text = cassette.read_text()
    for secret in (SECRET, BODY_KEY):
        assert secret not in text
    assert "Authorization" not in text and "authorization" not in text
    interactions = load_interactions(cassette)
    # every request the upstream answered, in order: the loop's GET /props, its two
    # completions, the agent's own request
    assert tap.cassette.recorded == len(interactions) == len(up.requests)
    chats = [i for i in interactions if i["request"]["uri"].endswith(CHAT)]
    assert len(chats) == len(up.bodies) == 3
    assert json.loads(chats[2]["request"]["body"])["api_key"] == "<SECRET>"
    assert interactions[-1]["request"]["uri"] == up.url + CHAT  # the key's query parameter gone
    # replayed offline through boxmaker's own loop: the same answers. Its side requests (the
    # loop's GET /props, forensics' /apply-template) passed the tap as any request does and
    # are in the cassette, but use_cassette refuses side requests: they stay unplayed
    with use_cassette(cassette, "none", strict=False) as played:
        replayed = _turn("http://127.0.0.1:9", tmp_path, "replayed")
        keyed_again = httpx.post("http://127.0.0.1:9" + CHAT, json=keyed, timeout=10)
    unplayed = [
        (i["request"]["method"], i["request"]["uri"].removeprefix(up.url))
        for n, i in enumerate(interactions)
        if not played.play_counts[n]
    ]
    assert unplayed == [("GET", "/props"), ("POST", "/apply-template")]
    assert _assistants(replayed) == _assistants(live) != []
    assert _assistants(live)[-1][0] == "Sunny."
    assert keyed_again.content == keyed_live.content and b"data: [DONE]" in keyed_live.content
    # and `boxmaker cassette show` reads it
    shown = transcript(cassette)
    assert ASK in shown and "Sunny." in shown and SECRET not in shown


def test_a_streamed_answer_is_stored_as_forwarded_and_replays_event_by_event(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "stream.yaml"
    with running([ANSWER]) as up, Tap(up.url, cassette=cassette) as tap:
        body = {"messages": [{"role": "user", "content": ASK}], "stream": True}
        forwarded = httpx.post(tap.url + CHAT, json=body, timeout=10).content
    events = [e + b"\n\n" for e in forwarded.split(b"\n\n") if e]
    assert len(events) > 10 and events[-1] == b"data: [DONE]\n\n"
    (interaction,) = load_interactions(cassette)
    assert interaction["response"]["body"]["string"] == forwarded
    assert interaction["response"]["headers"] == {"Content-Type": ["text/event-stream"]}
    assert "sse: |" in cassette.read_text()  # boxmaker's readable form: one event a line
    with (
        use_cassette(cassette, "none"),
        httpx.stream("POST", "http://127.0.0.1:9" + CHAT, json=body) as replayed,
    ):
        assert list(replayed.iter_raw()) == events


def _read_until_broken(r: httpx.Response) -> list[bytes]:
    got = []
    with pytest.raises(httpx.RemoteProtocolError):  # the tap breaks off as the upstream did
        for raw in r.iter_raw():
            got.append(raw)
    return got


def test_every_route_is_recorded_and_a_broken_stream_replays_its_error(tmp_path: Path) -> None:
    cassette = tmp_path / "routes.yaml"
    first = b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
    broken = Raw([SSE_HEAD, chunk(first), b"20\r\ndata"], hold=False)  # cut mid-chunk
    body = {"messages": [{"role": "user", "content": ASK}], "stream": True}
    with running([broken]) as up, Tap(up.url, cassette=cassette) as tap:
        health = httpx.get(tap.url + "/health").json()
        with httpx.stream("POST", tap.url + CHAT, json=body) as r:
            got = b"".join(_read_until_broken(r))
        assert tap.cassette is not None and tap.cassette.wait()
    assert got == first + b"data"
    health_i, chat_i = load_interactions(cassette)
    assert (health_i["request"]["method"], health_i["request"]["uri"]) == (
        "GET",
        up.url + "/health",
    )
    assert chat_i["response"]["body"]["string"] == got
    assert chat_i["response"]["error"].startswith("RemoteProtocolError: ")
    with use_cassette(cassette, "none"):
        assert httpx.get("http://127.0.0.1:9/health").json() == health
        with httpx.stream("POST", "http://127.0.0.1:9" + CHAT, json=body) as replayed:
            assert _read_until_broken(replayed) == [first, b"data"]  # the same bytes, the error


def test_an_unreachable_upstream_is_not_recorded(tmp_path: Path) -> None:
    cassette = tmp_path / "down.yaml"
    with running([ANSWER]) as up:
        url = up.url
    with Tap(url, cassette=cassette) as tap:
        assert httpx.post(tap.url + CHAT, json={"messages": []}).status_code == 502
    assert tap.cassette is not None and tap.cassette.recorded == 0
    assert not cassette.exists() and tap.cassette.problems == []


def test_a_cassette_that_cannot_be_written_forwards_anyway_and_says_so_once(
    tmp_path: Path,
) -> None:
    (tmp_path / "file").write_text("not a directory")
    cassette = tmp_path / "file" / "tapped.yaml"
    body = {"messages": [{"role": "user", "content": ASK}], "stream": True}
    with (
        running([ANSWER]) as up,
        Tap(up.url, directory=tmp_path / "logs", cassette=cassette) as tap,
    ):
        answers = [httpx.post(tap.url + CHAT, json=body, timeout=10) for _ in range(3)]
        assert tap.cassette is not None and tap.cassette.wait()
    assert [r.status_code for r in answers] == [200] * 3
    assert all(r.content.endswith(b"data: [DONE]\n\n") for r in answers)
    (problem,) = tap.cassette.problems
    assert problem.startswith("the cassette stopped recording (forwarding goes on): ")
    assert str(cassette) in problem
    assert tap.log is not None and len(tap.log.sessions) == 3  # the logs go on


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs (root only)")
def test_a_full_disk_under_the_cassette_forwards_anyway_and_says_so_once(tmp_path: Path) -> None:
    disk = tmp_path / "small"
    disk.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(disk)], check=False
    ).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        big: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * 40_000}]}
        with running([ANSWER]) as up, Tap(up.url, cassette=disk / "c.yaml") as tap:
            answers = [httpx.post(tap.url + CHAT, json=big, timeout=10) for _ in range(3)]
            assert tap.cassette is not None and tap.cassette.wait()
            problems = list(tap.cassette.problems)
        assert [r.status_code for r in answers] == [200] * 3
        assert len(problems) == 1 and "No space left on device" in problems[0]
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_cassette_show_reads_what_the_command_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cassette = tmp_path / "cli.yaml"
    with running([ANSWER]) as up, Tap(up.url, cassette=cassette) as tap:
        body = {"messages": [{"role": "user", "content": ASK}], "stream": True}
        httpx.post(tap.url + CHAT, json=body, headers={"Authorization": f"Bearer {SECRET}"})
    assert main(["cassette", "show", str(cassette)]) == 0
    out = capsys.readouterr().out
    assert ASK in out and "Sunny." in out and SECRET not in out


def test_replay_of_an_agents_cassette_says_nothing_could_be_played(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An agent's requests are not the ones boxmaker's loop sends: the what-if replay of its
    cassette plays nothing, and the command says so and fails (it exited 0 on 'played 0')."""
    cassette = tmp_path / "agent.yaml"
    with running([ANSWER]) as up, Tap(up.url, cassette=cassette) as tap:
        body = {"messages": [{"role": "user", "content": ASK}], "stream": True, "n_probs": 2}
        httpx.post(tap.url + CHAT, json=body, timeout=10).raise_for_status()
    assert main(["replay", str(cassette)]) == 1
    captured = capsys.readouterr()
    assert "played 0 of 1 recorded interactions" in captured.out
    assert f"nothing of {cassette} could be replayed" in captured.err
    assert "boxmaker replay LOG.jsonl" in captured.err
