"""A ChatPanel in a real browser: Voila serves a small notebook on 127.0.0.1, Debian's headless
Chromium loads it (driven over the DevTools protocol, websocket-client), and the test reads the
page: the streamed answer and the tool call are there, Enter sends, Shift+Enter makes a new line.

The notebook drives the panel with a scripted client (no model: the words are known). Skipped
only when ``/usr/bin/chromium`` is absent (``apt-get install -y chromium``).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

CHROMIUM = Path("/usr/bin/chromium")
ANSWER = "The weather in Oslo is sunny and mild."
SECOND = "Rome is warm today, with a light breeze from the sea and clear skies until the evening."
THIRD = " ".join(["A very long story that goes on."] * 200)

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]

NOTEBOOK = '''
import json, re, tempfile, threading, time
from boxmaker import (Baseline, Completion, Config, Content, Queued, Progress, Reasoning,
                      RequestCancelled, Runtime, Session, ToolCall, Waiting)
from boxmaker.demo import demo_registry
from boxmaker.widgets import ChatPanel


class SlowScript:
    """Streams scripted turns: reasoning and a tool call, then answers, one word at a time
    (``pause`` seconds apart, so a browser can watch them arrive); honours ``cancel``."""

    def __init__(self, answers, pauses):
        self.answers = list(answers)
        self.pauses = list(pauses)
        self.n = 0

    def chat_with_retry(self, body, on_event, *, reasoning_budget=None, cancel=None):
        self.n += 1
        on_event(Queued())
        for done in range(0, 601, 200):
            on_event(Progress(total=600, cache=400, processed=done, time_ms=done / 10))
            time.sleep(0.02)
        on_event(Waiting())
        calling = body["messages"][-1]["role"] == "user" and self.n == 1
        text = "I should look up the weather." if calling else ""
        for word in re.findall(r"\\S+\\s*", text):
            on_event(Reasoning(word))
            time.sleep(0.005)
        calls = (ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}'),)
        content = None if calling else self.answers.pop(0)
        pause = 0.005 if calling else self.pauses.pop(0)
        for word in re.findall(r"\\S+\\s*", content or ""):
            if cancel is not None and cancel.is_set():
                raise RequestCancelled("the stream was closed")
            on_event(Content(word))
            time.sleep(pause)
        return Completion(
            id=f"s{self.n}", content=content, reasoning=text or None,
            tool_calls=calls if calling else (), finish_reason="tool_calls" if calling else "stop",
            timings={"cache_n": 200 + 200 * self.n, "prompt_n": 200, "predicted_n": 12,
                     "prompt_ms": 60.0, "predicted_ms": 60.0},
            usage={}, reasoning_tokens=len(text.split()), thinking_capped=False,
        )


registry = demo_registry()
client = SlowScript(ANSWERS, [0.005, 0.12, 0.05])
runtime = Runtime(config=Config(), client=client, registry=registry)
session = Session.create(tempfile.mkdtemp(), Baseline(tools=registry.definitions()))
panel = ChatPanel(runtime, session)
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _write_notebook(path: Path) -> None:
    setup = NOTEBOOK.replace("ANSWERS", json.dumps([ANSWER, SECOND, THIRD]))
    nb = new_notebook(
        cells=[
            new_code_cell(setup),
            new_code_cell("panel"),
            new_code_cell("outcome = panel.ask('What is the weather in Oslo?', timeout=60)"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(nb, path)


@pytest.fixture
def voila_url(tmp_path: Path) -> Iterator[str]:
    notebook = tmp_path / "panel.ipynb"
    _write_notebook(notebook)
    port = _free_port()
    log = (tmp_path / "voila.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voila",
            str(notebook),
            "--no-browser",
            f"--port={port}",
            "--Voila.ip=127.0.0.1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env={**os.environ, "JUPYTER_PLATFORM_DIRS": "1"},
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:  # listening? (a GET of the page would start a kernel)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "voila did not start:\n" + (tmp_path / "voila.log").read_text()
                )
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class DevTools:
    """A minimal Chrome DevTools protocol client over one page's websocket."""

    def __init__(self, ws_url: str) -> None:
        import websocket  # websocket-client, installed with jupyter_server

        self.ws = websocket.create_connection(ws_url, timeout=30, suppress_origin=True)
        self.next_id = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                result: dict[str, Any] = message["result"]
                return result

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                text = self.js("document.body ? document.body.innerText : ''")
                raise AssertionError(f"timed out waiting for {expression}; page text:\n{text}")
            time.sleep(0.25)

    def key(self, key: str, code: int, modifiers: int = 0, text: str = "") -> None:
        for kind in ("keyDown", "keyUp"):
            params: dict[str, Any] = {
                "type": kind,
                "key": key,
                "code": key,
                "windowsVirtualKeyCode": code,
                "nativeVirtualKeyCode": code,
                "modifiers": modifiers,
            }
            if kind == "keyDown" and text:
                params["text"] = text
            self.call("Input.dispatchKeyEvent", **params)

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    proc = subprocess.Popen(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--window-size=1200,1600",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "chromium.log").open("wb"),
    )
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    "chromium did not start:\n" + (tmp_path / "chromium.log").read_text()
                )
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
        page = next(t for t in targets if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        try:
            yield tools
        finally:
            tools.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


def test_chat_panel_in_voila_in_chromium(voila_url: str, browser: DevTools, tmp_path: Path) -> None:
    browser.call("Page.enable")
    browser.call("Page.navigate", url=voila_url)
    text = "Array.from(document.querySelectorAll('.bxm-panel')).map(e => e.innerText).join('')"
    # the turn ran while Voila executed the notebook: the page shows its transcript
    browser.wait_for(f"({text}).includes({json.dumps(ANSWER)})", timeout=90)
    page = browser.js(text)
    assert "What is the weather in Oslo?" in page
    assert "Tool call #1: get_weather" in page
    assert '"city": "Oslo"' in page
    assert "data class: public" in page
    assert "Reasoning (6 tokens)" in page
    assert "cache loss" not in page  # the scripted timings line up
    assert "prompt 400 · cached 1000" in page  # the turn's counters (two completions)
    shot = tmp_path / "chat-panel.png"
    shot.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot")["data"]))
    assert shot.stat().st_size > 10_000

    # the keyboard: Shift+Enter makes a new line, Enter sends
    area = "document.querySelector('.bxm-input textarea')"
    browser.wait_for(f"{area} !== null")
    browser.js(f"{area}.focus()")
    browser.call("Input.insertText", text="Weather in")
    browser.key("Enter", 13, modifiers=8, text="\r")  # 8 = Shift
    browser.call("Input.insertText", text="Rome?")
    assert browser.js(f"{area}.value") == "Weather in\nRome?"
    browser.key("Enter", 13, text="\r")
    # the answer streams: the page shows a part of it before the whole
    last_answer = (
        "(a => a.length ? a[a.length - 1].innerText : '')(document.querySelectorAll('.bxm-answer'))"
    )
    seen = set()
    deadline = time.monotonic() + 60
    while (now := browser.js(last_answer).strip()) != SECOND:
        assert time.monotonic() < deadline, now
        seen.add(now)
        time.sleep(0.05)
    partial = [p for p in seen if p and SECOND.startswith(p) and p != SECOND]
    assert partial, seen
    assert browser.js(f"{area}.value") == ""  # the panel cleared the input after sending
    assert "Weather in\nRome?" in browser.js(
        "Array.from(document.querySelectorAll('.bxm-user')).map(e => e.innerText).join('|')"
    )
    (tmp_path / "chat-panel-after-enter.png").write_bytes(
        base64.b64decode(browser.call("Page.captureScreenshot")["data"])
    )

    # Stop: a long answer is cut, the turn says so, the panel is ready again
    browser.wait_for("!document.querySelector('.bxm-send').disabled")  # the turn has ended
    browser.js(f"{area}.focus()")
    browser.call("Input.insertText", text="Tell me a long story")
    browser.js("document.querySelector('.bxm-send').click()")  # the Send button sends too
    browser.wait_for(f"({text}).includes('A very long story')")
    assert "Tell me a long story" in browser.js(
        "Array.from(document.querySelectorAll('.bxm-user')).map(e => e.innerText).join('|')"
    )
    assert browser.js(f"{area}.value") == ""  # sent once, through the value, and cleared
    browser.wait_for("!document.querySelector('.bxm-stop').disabled")
    browser.js("document.querySelector('.bxm-stop').click()")
    browser.wait_for(f"({text}).includes('Turn ended: TurnCancelled')")
    assert THIRD not in browser.js(text)
    browser.wait_for("!document.querySelector('.bxm-send').disabled")
    (tmp_path / "chat-panel-after-stop.png").write_bytes(
        base64.b64decode(browser.call("Page.captureScreenshot")["data"])
    )
