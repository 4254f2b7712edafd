"""The tap's session logs are scrubbed by the one rule (``boxmaker._secrets``) its cassettes
are (issue 36: only a Bearer token was hidden in the log): a key sent in any header, query or
JSON form, and echoed back by the upstream (in an answer, a 401 quoting it, URL-escaped or
JSON-escaped), reaches neither the log nor the cassette."""

from __future__ import annotations

import base64
import json
import urllib.parse
from pathlib import Path

import httpx
import pytest
from fake_llama import Reply, running

from boxmaker._secrets import API_KEY_PLACEHOLDER, credentials_in
from boxmaker.records import Assistant, TurnEnd
from boxmaker.session import Session
from boxmaker.tap import Tap

CHAT = "/v1/chat/completions"
BEARER = "sk-bearer-0123456789"
X_API = "sk-xapi-abcdefghij"
API = "sk-apikey-klmnopqrst"
QUERY = "sk-query/+=uvwxyz01"  # URL-escaped in the query: %2F%2B%3D
FIELD = 'sk-field-"quoted"-234'  # JSON-escaped in the body
PASSWORD = "basic-pass-56789abc"
TABBED = "sk-tabbed-0123456789"
BASIC = base64.b64encode(f"alice:{PASSWORD}".encode()).decode()

FORMS = {
    "authorization (Bearer)": ({"Authorization": f"Bearer {BEARER}"}, "", {}, BEARER),
    "x-api-key": ({"x-api-key": X_API}, "", {}, X_API),
    "api-key": ({"api-key": API}, "", {}, API),
    "?api_key=": ({}, "?api_key=" + urllib.parse.quote(QUERY, safe=""), {}, QUERY),
    "body api_key": ({}, "", {"api_key": FIELD}, FIELD),
    "authorization (Basic)": ({"Authorization": f"Basic {BASIC}"}, "", {}, PASSWORD),
    # h11 takes a tab after the scheme; the key was looked for as "Bearer<TAB>KEY"
    "authorization (Bearer, a tab)": ({"Authorization": f"Bearer\t{TABBED}"}, "", {}, TABBED),
}


def _echo(secret: str) -> str:
    """The key as a server may quote it: plain, URL-escaped and JSON-escaped."""
    quoted = urllib.parse.quote(secret, safe="")
    return f"key {secret} / {quoted} / {json.dumps(secret)}"


@pytest.mark.parametrize("form", list(FORMS))
def test_a_key_in_any_form_echoed_by_the_upstream_is_hidden_in_the_log_and_cassette(
    tmp_path: Path, form: str
) -> None:
    headers, query, extra, secret = FORMS[form]
    echoed = Reply(content=_echo(secret))
    refused = Reply(
        status=401, error={"code": 401, "message": f"invalid key {_echo(secret)}", "type": "auth"}
    )
    cassette = tmp_path / "c.yaml"
    system = {"role": "system", "content": f"You hold {secret}."}  # even in the baseline
    ask = {"role": "user", "content": "Which key?"}
    with (
        running([echoed, refused]) as up,
        Tap(up.url, directory=tmp_path / "logs", forensics=False, cassette=cassette) as tap,
    ):
        statuses = []
        for messages in ([system, ask], [system, ask, {"role": "user", "content": "Again?"}]):
            body = {"messages": messages, "stream": True, **extra}
            answer = httpx.post(tap.url + CHAT + query, json=body, headers=headers, timeout=10)
            statuses.append(answer.status_code)
        assert tap.log is not None and tap.log.wait() and tap.cassette is not None
        assert tap.cassette.wait()
    assert statuses == [200, 401]  # the agent got both, the keys in them as they came
    (log,) = tap.log.sessions
    raw = log.read_text()
    quoted = urllib.parse.quote(secret, safe="")
    for shown in (secret, quoted, json.dumps(secret)[1:-1]):
        assert shown not in raw, form
        assert shown not in cassette.read_text(), form
    with Session.open(log, read_only=True) as session:
        assert API_KEY_PLACEHOLDER in session.baseline.system
        replies = [r.content for r in session.records if isinstance(r, Assistant)]
        ends = [r for r in session.records if isinstance(r, TurnEnd)]
    assert replies == [f"key {API_KEY_PLACEHOLDER} / {API_KEY_PLACEHOLDER} / "
                       f'"{API_KEY_PLACEHOLDER}"']  # fmt: skip
    assert ends[-1].outcome == "infer_error" and ends[-1].status == 401
    assert API_KEY_PLACEHOLDER in (ends[-1].detail or "")


def test_the_rule_finds_each_form_a_request_shows() -> None:
    basic = f"Basic {BASIC}"
    found = credentials_in(
        [("Authorization", basic), ("X-Api-Key", X_API), ("API-KEY", API), ("x-other", "no")],
        "/v1/chat?api_key=" + urllib.parse.quote(QUERY, safe="") + "&model=tiny-model-name",
        json.dumps({"nested": {"Api-Key": FIELD}, "token": "short"}).encode(),
    )
    assert found == [BASIC, f"alice:{PASSWORD}", PASSWORD, X_API, API, QUERY, FIELD]
    assert credentials_in([("Authorization", "Bearer EMPTY")]) == []  # a placeholder
    assert credentials_in([("Authorization", "Basic !!notbase64!!")]) == ["!!notbase64!!"]
    assert credentials_in(uri="http://[broken/?api_key=0123456789") == []


def test_a_key_the_body_escapes_or_a_header_repeats_is_hidden_in_the_cassette(
    tmp_path: Path,
) -> None:
    """The cassette stores a request's body as decoded JSON: a key written escaped in it
    (``\\u0073k-...``, or ``\\/`` for a ``/`` as PHP's encoder writes it), which the bytes do
    not show, came out plain; and a credential header sent twice kept only its last value
    for the search, so an echo of the first was recorded."""
    first, second = "sk-first-dup-11111111", "sk-second-dup-2222222"
    slashed = "sk-AKIAb/cdEF+gh/ijkl"
    escaped = "\\u0073" + BEARER[1:]  # the s of sk- written as \u0073
    body = (
        '{"stream":true,"messages":[{"role":"user","content":"use '
        + escaped
        + " and "
        + slashed.replace("/", "\\/")
        + '"}],"api_key":"'
        + slashed.replace("/", "\\/")
        + '"}'
    ).encode()
    assert json.loads(body)["messages"][0]["content"] == f"use {BEARER} and {slashed}"
    cassette = tmp_path / "c.yaml"
    with (
        running([Reply(status=401, error={"code": 401, "message": f"{first} {second}?"})]) as up,
        Tap(up.url, directory=tmp_path / "logs", forensics=False, cassette=cassette) as tap,
    ):
        headers = [
            ("Authorization", f"Bearer {BEARER}"),
            ("x-api-key", first),
            ("x-api-key", second),
            ("Content-Type", "application/json"),
        ]
        answer = httpx.post(tap.url + CHAT, content=body, headers=headers, timeout=10)
        assert answer.status_code == 401 and first in answer.text  # the agent got it as it came
        assert tap.log is not None and tap.log.wait() and tap.cassette is not None
        assert tap.cassette.wait()
    (log,) = tap.log.sessions
    for secret in (BEARER, first, second, slashed):
        assert secret not in cassette.read_text(), secret
        assert secret not in log.read_text(), secret
    assert API_KEY_PLACEHOLDER in cassette.read_text()
