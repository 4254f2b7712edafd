"""Keys never land in plain in a session log: the cassettes' rule, applied to the log.

A server that echoes the api key (in an answer, an error body) must not get it written into
the log while the same exchange's cassette is scrubbed; the rule (boxmaker's ``_secrets``) is
the one the cassettes use, tested against the cassettes' own byte-level scrubber.
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import httpx
from fakes import ScriptedClient, answer
from hypothesis import given
from hypothesis import strategies as st

from boxmaker._secrets import (
    API_KEY_PLACEHOLDER,
    SECRET_PLACEHOLDER,
    hide_in_json,
    is_secret_field,
    searchable,
)
from boxmaker.cassettes._scrub import _hide
from boxmaker.client import Client
from boxmaker.config import ClientConfig, Config
from boxmaker.records import Baseline, User
from boxmaker.session import Session
from boxmaker.tools import Registry
from boxmaker.turn import Runtime, run_turn

KEY = "sk-live-4f9a1c2e7b"


def test_a_key_the_server_echoes_is_written_as_a_placeholder(tmp_path: Path) -> None:
    client = ScriptedClient([answer(f"Your key is {KEY}.")])
    runtime = Runtime(
        config=Config(client=ClientConfig(api_key=KEY)), client=client, registry=Registry()
    )
    with Session.create(tmp_path, Baseline(), session_id="k") as session:
        outcome = run_turn(session, runtime, f"my key: {KEY}")
        assert KEY in outcome.content  # what the caller sees is the answer as it came
        assert KEY in session.messages()[-1]["content"]  # and the running session keeps it
    raw = (tmp_path / "k.jsonl").read_text()
    assert KEY not in raw and raw.count(API_KEY_PLACEHOLDER) == 2
    reopened = Session.open(tmp_path / "k.jsonl", read_only=True)
    assert [getattr(r, "content", None) for r in reopened.records][:2] == [
        f"my key: {API_KEY_PLACEHOLDER}",
        f"Your key is {API_KEY_PLACEHOLDER}.",
    ]


def test_the_key_of_a_real_client_is_hidden_when_the_config_has_none(tmp_path: Path) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == f"Bearer {KEY}"
        delta = {"choices": [{"index": 0, "delta": {"content": f"echo {KEY}"}}]}
        stop = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        last = {"choices": [], "timings": {"cache_n": 0, "prompt_n": 3, "predicted_n": 2}}
        body = "".join(f"data: {json.dumps(e)}\n\n" for e in (delta, stop, last))
        return httpx.Response(
            200, text=body + "data: [DONE]\n\n", headers={"Content-Type": "text/event-stream"}
        )

    client = Client(ClientConfig(api_key=KEY), transport=httpx.MockTransport(handler))
    runtime = Runtime(config=Config(), client=client, registry=Registry())
    with Session.create(tmp_path, session_id="c") as session:
        assert run_turn(session, runtime, "hi").content == f"echo {KEY}"
    assert KEY not in (tmp_path / "c.jsonl").read_text()


def test_credential_fields_and_short_keys_follow_the_cassettes_rule(tmp_path: Path) -> None:
    with Session.create(tmp_path, session_id="f") as session:
        session.hide("EMPTY", None, "")  # a local server's placeholder key: not searched for
        session.append(User(content="EMPTY stays, as in a cassette"))
    (line,) = (tmp_path / "f.jsonl").read_text().splitlines()[1:]
    assert json.loads(line)["content"] == "EMPTY stays, as in a cassette"
    assert hide_in_json({"client.api_key": "x", "Api-Key": "y", "token": {"type": "string"}}) == {
        "client.api_key": SECRET_PLACEHOLDER,
        "Api-Key": SECRET_PLACEHOLDER,
        "token": {"type": "string"},  # a JSON Schema property, not a value
    }
    assert is_secret_field("loop.password") and not is_secret_field("prompt_tokens")


_PLAIN = string.ascii_letters + string.digits + " .,:;!?()[]{}<>@#$^&*'"
_KEYLIKE = string.ascii_letters + string.digits + "-_.+/=~%"


@given(
    parts=st.lists(st.text(_PLAIN, max_size=20), min_size=1, max_size=4),
    secret=st.text(_KEYLIKE, min_size=8, max_size=16),
)
def test_the_log_and_the_cassettes_hide_a_key_in_the_same_places(
    parts: list[str], secret: str
) -> None:
    """The same JSON value scrubbed as a cassette body (bytes) and as a log record (JSON)."""
    value: dict[str, Any] = {"content": secret.join(parts), "list": [secret, parts[0]]}
    as_cassette = json.loads(_hide(json.dumps(value).encode(), [secret]))
    as_log = hide_in_json(value, searchable([secret]))
    assert as_log == as_cassette
    assert secret not in json.dumps(as_log, ensure_ascii=False)
