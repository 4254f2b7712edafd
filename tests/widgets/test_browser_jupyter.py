"""A ChatPanel in JupyterLab and in Notebook 7, in headless Chromium, against the embedded
llama.cpp server with the shipped model.

One Jupyter server (it serves both front ends: ``/lab`` and ``/notebooks``) opens a notebook
whose first cell makes a panel on the embedded server this test started; Chromium runs the
cells through the front end's own commands (the app is exposed for tests) and then uses the
panel as a person would: Shift+Enter makes a new line (the notebook's cells and prompt numbers
stay as they were), Enter sends, the answer streams, Stop ends a long answer within a second,
the Stop button stays in one place, the progress row is hidden after every turn, a message of
two lines shows as two lines, and the notebook saved by the front end holds the conversation
as static HTML that nbconvert turns into a page with its text.

The model's words are not known in advance (a tiny model); the tests read what the panel
shows. Skipped where ``/usr/bin/chromium`` is absent.
"""

from __future__ import annotations

import base64
import json
import secrets
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser import CHROMIUM, DevTools, chromium, free_port, running
from nbconvert import HTMLExporter
from nbformat.v4 import new_code_cell, new_notebook

from boxmaker.server import EmbeddedServer

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]

SETUP = """
import tempfile
from boxmaker import Baseline, Client, ClientConfig, Config, Runtime, SamplingConfig, Session
from boxmaker.demo import demo_registry
from boxmaker.widgets import ChatPanel


class Rambling:
    '''The real client; a turn that asks for a long story streams until stopped
    (no tools offered, llama.cpp's ``ignore_eos``, up to 12,000 tokens).'''

    def __init__(self, client):
        self.client = client

    def chat_with_retry(self, body, on_event, **kwargs):
        user = [m for m in body["messages"] if m["role"] == "user"][-1]
        if "long story" in user["content"]:
            body = {k: v for k, v in body.items() if k != "tools"}
            body.update(ignore_eos=True, max_tokens=12000)
        return self.client.chat_with_retry(body, on_event, **kwargs)


# the turn's client-side bound follows max_tokens: room for the long story the client asks for
config = Config(client=ClientConfig(url=URL, retry_attempts=0),
                sampling=SamplingConfig(max_tokens=12000))
registry = demo_registry()
runtime = Runtime(config=config, client=Rambling(Client(config.client)), registry=registry)
session = Session.create(tempfile.mkdtemp(), Baseline(tools=registry.definitions()))
panel = ChatPanel(runtime, session)
"""


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with EmbeddedServer(n_ctx=16384, n_threads=1) as server:
        yield server.url


@pytest.fixture
def jupyter(tmp_path: Path, model_url: str) -> Iterator[tuple[str, str, Path]]:
    """A Jupyter server on 127.0.0.1 over ``tmp_path`` holding ``panel.ipynb``: yields its
    base URL, its token and the notebook's path."""
    notebook = tmp_path / "panel.ipynb"
    cells = [new_code_cell(SETUP.replace("URL", json.dumps(model_url))), new_code_cell("panel")]
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(new_notebook(cells=cells, metadata={"kernelspec": kernel}), notebook)
    port, token = free_port(), secrets.token_hex(16)
    command = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.root_dir={tmp_path}",
        f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
        "--JupyterNotebookApp.expose_app_in_browser=True",
        "--LabApp.news_url=",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        f"--LabApp.workspaces_dir={tmp_path / 'workspaces'}",
        f"--LabApp.user_settings_dir={tmp_path / 'settings'}",
        "--ServerApp.open_browser=False",
        "--ServerApp.allow_root=True",
        "--LabApp.extension_manager=readonly",
    ]
    with running(command, port, tmp_path / "jupyter.log", tmp_path):
        yield f"http://127.0.0.1:{port}", token, notebook


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    with chromium(tmp_path) as tools:
        yield tools


NOTEBOOK = "Array.from(window.jupyterapp.shell.widgets('main')).find(w => w.sessionContext)"
PANEL = "document.querySelector('.bxm-panel')"
AREA = f"{PANEL}.querySelector('.bxm-input textarea')"
PROMPTS = (
    "Array.from(document.querySelectorAll('.jp-Cell .jp-InputPrompt'))"
    ".map(e => e.innerText.trim()).join('|')"
)
USERS = (
    "Array.from(document.querySelectorAll('.bxm-panel .bxm-user')).map(e => e.innerText).join('|')"
)


def _rect(browser: DevTools, selector: str) -> list[float]:
    rect = browser.js(
        f"(r => [r.x, r.y, r.width, r.height])("
        f"{PANEL}.querySelector('{selector}').getBoundingClientRect())"
    )
    assert isinstance(rect, list)
    return [round(v, 1) for v in rect]


def _turn_ended(browser: DevTools) -> None:
    browser.wait_for(f"{PANEL}.querySelector('.bxm-stop').disabled", timeout=60)
    browser.wait_for(f"!{PANEL}.querySelector('.bxm-send').disabled", timeout=60)


def _use_the_panel(browser: DevTools, url: str, notebook: Path, tmp_path: Path) -> None:
    """What both front ends must do, on a page that shows ``panel.ipynb``."""
    browser.call("Page.enable")
    browser.call("Page.navigate", url=url)
    browser.wait_for("window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')")
    browser.wait_for(
        f"{NOTEBOOK} && {NOTEBOOK}.sessionContext.session?.kernel?.connectionStatus"
        " === 'connected'",
        timeout=60,
    )
    browser.js(f"window.jupyterapp.shell.activateById({NOTEBOOK}.id)")
    browser.js("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    browser.wait_for(f"{PANEL} && {AREA}", timeout=60)
    browser.wait_for(f"{AREA}.dataset.bxm === '1'")  # the keyboard script is in place
    assert browser.js(f"{AREA}.getAttribute('data-lm-suppress-shortcuts')") == "true"
    browser.wait_for(f"{PROMPTS} === '[1]:|[2]:'")
    cells = browser.js("document.querySelectorAll('.jp-Notebook .jp-Cell').length")
    stop_before = _rect(browser, ".bxm-stop")
    send_before = _rect(browser, ".bxm-send")

    # Shift+Enter: a new line in the box; the notebook runs nothing
    browser.js(f"{AREA}.focus()")
    browser.call("Input.insertText", text="Hello")
    browser.key("Enter", 13, modifiers=8, text="\r")  # 8 = Shift
    browser.call("Input.insertText", text="there!")
    assert browser.js(f"{AREA}.value") == "Hello\nthere!"
    assert browser.js("document.activeElement") is not None
    assert browser.js(f"document.activeElement === {AREA}")
    # Enter sends; the turn streams and ends
    browser.key("Enter", 13, text="\r")
    browser.wait_for(f"({USERS}).includes('Hello')")
    _turn_ended(browser)
    assert browser.js(USERS) == "You: Hello\nthere!"  # two lines, no empty line between
    font, line, height = browser.js(
        f"(e => [parseFloat(getComputedStyle(e).fontSize), parseFloat(getComputedStyle(e)"
        f".lineHeight), e.getBoundingClientRect().height])({PANEL}.querySelector('.bxm-user'))"
    )
    # lines spaced as text (ipywidgets spaces an HTML widget's lines 28 px apart, which
    # read as an empty line between two lines of 13 px text)
    assert line <= 1.6 * font and 2 * line <= height <= 2 * line + 10, (font, line, height)
    answer = browser.js(f"{PANEL}.querySelector('.bxm-answer, .bxm-tool').innerText")
    assert answer.strip()
    assert browser.js(f"getComputedStyle({PANEL}.querySelector('.bxm-progress')).display") == (
        "none"
    )
    assert browser.js(f"{AREA}.value") == ""
    assert browser.js(PROMPTS) == "[1]:|[2]:"  # Shift+Enter and Enter ran no cell
    assert browser.js("document.querySelectorAll('.jp-Notebook .jp-Cell').length") == cells

    # a long answer streams: Stop in the same place, the box follows the text; Stop ends it
    browser.js(f"{AREA}.focus()")
    browser.call("Input.insertText", text="Tell me a long story")
    browser.key("Enter", 13, text="\r")
    browser.wait_for(f"!{PANEL}.querySelector('.bxm-stop').disabled")
    box = f"{PANEL}.querySelector('.bxm-transcript')"
    browser.wait_for(f"{box}.scrollHeight > {box}.clientHeight + 200", timeout=60)
    assert not browser.js(f"{PANEL}.querySelector('.bxm-stop').disabled")  # still streaming
    assert _rect(browser, ".bxm-stop") == stop_before
    assert _rect(browser, ".bxm-send") == send_before
    at_bottom = f"{box}.scrollTop + {box}.clientHeight >= {box}.scrollHeight - 30"
    browser.wait_for(at_bottom)  # follows the new text
    browser.js(f"{box}.scrollTop = 0; {box}.dispatchEvent(new Event('scroll'))")
    grown = browser.js(f"{box}.scrollHeight") + 100
    browser.wait_for(f"{box}.scrollHeight > {grown}")
    assert browser.js(f"{box}.scrollTop") == 0  # the reader scrolled up: the box stays
    shot = browser.call("Page.captureScreenshot")["data"]
    (tmp_path / "streaming.png").write_bytes(base64.b64decode(shot))
    browser.js(
        "window.bxmEnded = null;"
        f"new MutationObserver(() => {{ if (!window.bxmEnded && {PANEL}.innerText"
        ".includes('Turn ended: TurnCancelled')) window.bxmEnded = performance.now(); })"
        f".observe({PANEL}, {{subtree: true, childList: true, characterData: true}});"
        f"window.bxmStopped = performance.now(); {PANEL}.querySelector('.bxm-stop').click();"
    )
    browser.wait_for("window.bxmEnded !== null", timeout=10)
    took = browser.js("window.bxmEnded - window.bxmStopped")
    assert took < 1000, f"Stop took {took:.0f} ms"
    (tmp_path / "stop-ms.txt").write_text(f"{took:.0f}\n")
    _turn_ended(browser)
    assert browser.js(f"getComputedStyle({PANEL}.querySelector('.bxm-progress')).display") == (
        "none"
    )
    assert browser.js(PROMPTS) == "[1]:|[2]:"

    # the front end saves the notebook: its static copy holds the conversation
    browser.js("window.jupyterapp.commands.execute('docmanager:save')")
    deadline = time.monotonic() + 30
    while "Turn ended: TurnCancelled" not in notebook.read_text():
        assert time.monotonic() < deadline, notebook.read_text()[:3000]
        time.sleep(0.2)
    page, _ = HTMLExporter().from_notebook_node(nbformat.read(notebook, as_version=4))
    assert "Hello\nthere!" in page and "Tell me a long story" in page
    assert "Turn ended: TurnCancelled" in page and answer.strip()[:20] in page
    (tmp_path / "converted.html").write_text(page)


def test_chat_panel_in_jupyterlab(
    jupyter: tuple[str, str, Path], browser: DevTools, tmp_path: Path
) -> None:
    base, token, notebook = jupyter
    _use_the_panel(browser, f"{base}/lab/tree/panel.ipynb?token={token}", notebook, tmp_path)


def test_chat_panel_in_notebook_7(
    jupyter: tuple[str, str, Path], browser: DevTools, tmp_path: Path
) -> None:
    base, token, notebook = jupyter
    _use_the_panel(browser, f"{base}/notebooks/panel.ipynb?token={token}", notebook, tmp_path)
