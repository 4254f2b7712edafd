"""The one scrubbing rule (``boxmaker._secrets``): every form of a credential found and hidden,
in time linear in what is scrubbed (issue 36: a 50 MB ``api_key`` was re-quoted for every
string written; a turn took 39 s)."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxmaker import _secrets
from boxmaker._secrets import (
    API_KEY_PLACEHOLDER,
    SECRET_PLACEHOLDER,
    compiled,
    credentials_in,
    hide_bytes,
    hide_fields,
    hide_in_json,
    hide_text,
    searchable,
)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The secrets whose forms were made (``_secrets._text_forms``), from a cold cache."""
    calls: list[str] = []
    real = _secrets._text_forms

    def forms(secret: str) -> list[str]:
        calls.append(secret)
        return real(secret)

    monkeypatch.setattr(_secrets, "_text_forms", forms)
    _secrets._compiled.cache_clear()
    yield calls
    _secrets._compiled.cache_clear()


def test_the_forms_of_a_key_are_made_once_not_once_per_string(counted: list[str]) -> None:
    key = "k/" + "x" * 200_000  # not URL-safe: quoted, the costly form
    value: dict[str, Any] = {"records": [{"content": f"text {i}", "n": i} for i in range(2000)]}
    value["records"][7]["content"] = f"echo {key}"
    secrets = searchable([key, "another-key-0123"])
    hidden = hide_in_json(value, secrets)
    assert hidden["records"][7]["content"] == f"echo {API_KEY_PLACEHOLDER}"
    assert hidden["records"][8] is value["records"][8]  # untouched parts are the same objects
    assert sorted(counted) == sorted(secrets)  # once each, for 4,000 strings
    hide_in_json(value, searchable([key, "another-key-0123"]))  # the next record: same keys
    hide_text(f"{key}!", secrets)
    hide_bytes(key.encode(), secrets)
    assert len(counted) == 2


def test_a_url_safe_key_is_not_url_quoted(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: object, **kwargs: object) -> str:
        raise AssertionError("quote called")

    monkeypatch.setattr(urllib.parse, "quote", boom)
    monkeypatch.setattr(urllib.parse, "quote_plus", boom)
    assert _secrets.forms("sk-live_0123.abc~") == [b"sk-live_0123.abc~"]


@given(key=st.text(alphabet=st.characters(exclude_categories=["Cs"])))
def test_the_url_forms_are_urllibs(key: str) -> None:
    expected = {
        key,
        urllib.parse.quote(key, safe=""),
        urllib.parse.quote_plus(key),
        json.dumps(key)[1:-1],
    }
    assert set(_secrets.forms(key)) == {f.encode() for f in expected}


def test_a_lone_surrogate_in_a_key_is_no_error() -> None:
    assert b"%ED%A0%80" in b"".join(_secrets.forms("sk-\ud800-0123456789"))


_KEY = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="<>"),
    min_size=8,
    max_size=40,
)


@given(key=_KEY, before=st.text(max_size=20), after=st.text(max_size=20))
def test_every_form_of_a_key_is_hidden_in_text_bytes_and_json(
    key: str, before: str, after: str
) -> None:
    shown = [key, urllib.parse.quote(key, safe=""), urllib.parse.quote_plus(key)]
    shown.append(json.dumps(key)[1:-1])
    secrets = searchable([key])
    for form in shown:
        text = before + form + after
        assert form not in hide_text(text, secrets).replace(before, "").replace(after, "")
        assert API_KEY_PLACEHOLDER in hide_text(text, secrets)
        assert API_KEY_PLACEHOLDER.encode() in hide_bytes(text.encode(), secrets)
        assert API_KEY_PLACEHOLDER in hide_in_json({"a": [text]}, secrets)["a"][0]


@given(key=_KEY)
def test_a_key_sent_in_a_body_field_is_found_and_its_field_hidden(key: str) -> None:
    body = json.dumps({"model": "m", "auth": {"API-Key": key}}).encode()
    assert credentials_in(body=body) == [key]
    assert json.loads(hide_fields(body))["auth"]["API-Key"] == SECRET_PLACEHOLDER
    assert json.loads(hide_fields(body))["model"] == "m"


def test_compiled_forms_are_longest_secret_first() -> None:
    forms = compiled(searchable(["abcdefgh", "abcdefgh-longer"])).text
    assert forms[0] == "abcdefgh-longer"
    assert hide_text("abcdefgh-longer abcdefgh", searchable(["abcdefgh", "abcdefgh-longer"])) == (
        f"{API_KEY_PLACEHOLDER} {API_KEY_PLACEHOLDER}"
    )
