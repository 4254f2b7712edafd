"""A ChatPanel in a real browser: Voila serves a small notebook on 127.0.0.1, Debian's headless
Chromium loads it (driven over the DevTools protocol, websocket-client), and the test reads the
page: the streamed answer and the tool call are there, Enter sends, Shift+Enter makes a new line.

The notebook drives the panel with a scripted client (no model: the words are known). Skipped
only when ``/usr/bin/chromium`` is absent (``apt-get install -y chromium``).
"""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser import CHROMIUM, DevTools, chromium, free_port, running
from nbformat.v4 import new_code_cell, new_notebook

ANSWER = "The weather in Oslo is sunny and mild."
SECOND = "Rome is warm today, with a light breeze from the sea and clear skies until the evening."
THIRD = " ".join(["A very long story that goes on."] * 200)
LONE = "Odd bytes \ud800 here, then the end."
"""An answer with a lone surrogate (``"\\ud800"`` in a server's JSON): it killed the panel's
worker thread (issue 23); the browser must show it replaced, and the panel stay usable."""

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]

NOTEBOOK = '''
import json, re, tempfile, threading, time
from boxmaker import (Baseline, Config, Content, Queued, Progress, Reasoning,
                      RequestCancelled, Runtime, Session, ToolCall, Waiting)
from boxmaker.demo import demo_registry
from boxmaker.client import Completion
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
client = SlowScript(ANSWERS, [0.005, 0.12, 0.05, 0.005])
runtime = Runtime(config=Config(), client=client, registry=registry)
session = Session.create(tempfile.mkdtemp(), Baseline(tools=registry.definitions()))
panel = ChatPanel(runtime, session)
'''


def _write_notebook(path: Path) -> None:
    setup = NOTEBOOK.replace("ANSWERS", json.dumps([ANSWER, SECOND, THIRD, LONE]))
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
    port = free_port()
    command = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}"]
    with running([*command, "--Voila.ip=127.0.0.1"], port, tmp_path / "voila.log", tmp_path):
        yield f"http://127.0.0.1:{port}/"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    with chromium(tmp_path) as tools:
        yield tools


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
        "(a => a.length ? a[a.length - 1].innerText : '')"
        "(document.querySelectorAll('.bxm-answer, .bxm-live-answer'))"
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

    # a lone surrogate in an answer: shown replaced (U+FFFD), and the panel takes the next turn
    browser.js(f"{area}.focus()")
    browser.call("Input.insertText", text="Say something odd")
    browser.key("Enter", 13, text="\r")
    shown = LONE.replace("\ud800", "\ufffd")
    browser.wait_for(f"({last_answer}).includes({json.dumps(shown)})", timeout=60)
    browser.wait_for("!document.querySelector('.bxm-send').disabled")
    assert browser.js("document.querySelector('.bxm-stop').disabled") is True


APPROVAL_NOTEBOOK = '''
import tempfile
from boxmaker import (ApprovalPolicy, ApprovalPort, Baseline, Config, Content, InProcessPort,
                      Registry, Runtime, Session, ToolCall, ToolOk)
from boxmaker.client import Completion
from boxmaker.widgets import ChatPanel


class Script:
    """First a call of forget_city, then an answer that quotes the tool's result."""

    def chat_with_retry(self, body, on_event, *, reasoning_budget=None, cancel=None):
        last = body["messages"][-1]
        if last["role"] == "user":
            call = ToolCall(id="f1", name="forget_city", arguments='{"city": "Oslo"}')
            return Completion(id="a1", content=None, reasoning=None, tool_calls=(call,),
                              finish_reason="tool_calls")
        text = "Done: " + last["content"]
        on_event(Content(text))
        return Completion(id="a2", content=text, reasoning=None, tool_calls=(),
                          finish_reason="stop")


registry = Registry()
registry.add_port_tool("forget_city", "Forget a city.",
                       {"type": "object", "properties": {"city": {"type": "string"}}})
inner = InProcessPort({"forget_city": lambda r: ToolOk(content=f"forgot {r.arguments['city']}")})
runtime = Runtime(config=Config(), client=Script(), registry=registry)
session = Session.create(tempfile.mkdtemp(), Baseline(tools=registry.definitions()))
panel = ChatPanel(runtime, session)
runtime.port = ApprovalPort(inner, ApprovalPolicy(tools=("forget_city",)), panel.ask_approval)
'''


@pytest.fixture
def voila_approval_url(tmp_path: Path) -> Iterator[str]:
    notebook = tmp_path / "approval.ipynb"
    nb = new_notebook(
        cells=[new_code_cell(APPROVAL_NOTEBOOK), new_code_cell("panel")],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(nb, notebook)
    port = free_port()
    command = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}"]
    with running([*command, "--Voila.ip=127.0.0.1"], port, tmp_path / "voila.log", tmp_path):
        yield f"http://127.0.0.1:{port}/"


def test_approve_a_call_in_the_panel_in_chromium(
    voila_approval_url: str, browser: DevTools, tmp_path: Path
) -> None:
    """A call the policy names waits in the panel; a person clicks Approve and it runs."""
    browser.call("Page.enable")
    browser.call("Page.navigate", url=voila_approval_url)
    area = "document.querySelector('.bxm-input textarea')"
    browser.wait_for(f"{area} !== null", timeout=90)
    browser.js(f"{area}.focus()")
    browser.call("Input.insertText", text="Forget Oslo")
    browser.key("Enter", 13, text="\r")
    row = "document.querySelector('.bxm-approval')"
    browser.wait_for(f"{row} && {row}.offsetParent !== null && {row}.innerText.includes('Oslo')")
    assert "forget_city" in browser.js(f"{row}.innerText")
    (tmp_path / "approval-pending.png").write_bytes(
        base64.b64decode(browser.call("Page.captureScreenshot")["data"])
    )
    browser.js("document.querySelector('.bxm-approve button, button.bxm-approve').click()")
    text = "Array.from(document.querySelectorAll('.bxm-panel')).map(e => e.innerText).join('')"
    browser.wait_for(f"({text}).includes('Done: forgot Oslo')")
    browser.wait_for(f"{row}.offsetParent === null")  # decided: the row is hidden again
