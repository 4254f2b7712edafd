"""``boxmaker doctor`` without a model: an unreachable server, a key that is needed."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from boxmaker.cli import main
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
