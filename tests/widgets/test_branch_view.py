"""``BranchView``: the tree of a session and its forks, the first differing record, the
usage compared; read in a real browser (Voila, headless Chromium) as the panel's test does."""

from __future__ import annotations

import base64
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from browser import CHROMIUM, DevTools, chromium, free_port, running
from nbformat.v4 import new_code_cell, new_notebook

from boxmaker.widgets import BranchView

MAKE_LOGS = """
import tempfile
from boxmaker.config import Config
from boxmaker.demo import demo_registry
from boxmaker.records import Baseline
from boxmaker.session import Session
from boxmaker.testing import ScriptedClient, answer, call, calls
from boxmaker.turn import Runtime, continue_fork, run_turn

def runtime(steps):
    return Runtime(config=Config(), client=ScriptedClient(steps), registry=demo_registry())

folder = FOLDER or tempfile.mkdtemp()
parent = Session.create(folder, Baseline(tools=demo_registry().definitions()), session_id="p")
oslo = calls(call("get_weather", {"city": "Oslo"}))
run_turn(parent, runtime([oslo, answer("Mild in Oslo.")]), "Weather in Oslo?")
one = parent.fork(at=1, rerun=True, session_id="cold-one", settings={"loop.tool_iterations": 1})
continue_fork(one, runtime([answer("I cannot say.")]))
two = one.fork(at=1, rerun=True, session_id="grandchild")
continue_fork(two, runtime([answer("Still no idea.")]))
for s in (parent, one, two):
    s.close()
"""


def make_logs(folder: Path) -> None:
    exec(MAKE_LOGS.replace("FOLDER", repr(str(folder))), {})  # the notebook's own code


def test_branch_view_draws_the_tree_and_the_first_difference(tmp_path: Path) -> None:
    make_logs(tmp_path)
    view = BranchView(tmp_path)
    by_id = {b.session: b for b in view.branches}
    assert by_id["p"].forked is None
    one = by_id["cold-one"]
    assert one.forked is not None and one.forked.parent_session == "p"
    assert one.first_difference == 3  # Forked, then the user message, then the answer differs
    assert '"content": "I cannot say."' in one.own and "get_weather" in one.theirs
    assert one.usage == ((1, 0, 0, "I cannot say."), (2, 0, 0, "Mild in Oslo."))
    page = view.html()
    # the grandchild is drawn under its parent, which is drawn under the root
    assert page.index("p<") < page.index("cold-one") < page.index("grandchild")
    assert page.count("<ul class='bxm-tree'>") == 3
    assert "forked from cold-one at turn 1 (before_answer)" in page


@pytest.fixture
def voila_url(tmp_path: Path) -> Iterator[str]:
    notebook = tmp_path / "branches.ipynb"
    setup = MAKE_LOGS.replace("FOLDER", "None")
    show = "from boxmaker.widgets import BranchView\nBranchView(folder)"
    nb = new_notebook(
        cells=[new_code_cell(setup), new_code_cell(show)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    nbformat.write(nb, notebook)
    port = free_port()
    command = [sys.executable, "-m", "voila", str(notebook), "--no-browser", f"--port={port}"]
    with running([*command, "--Voila.ip=127.0.0.1"], port, tmp_path / "voila.log", tmp_path):
        yield f"http://127.0.0.1:{port}/"


@pytest.mark.live
@pytest.mark.skipif(not CHROMIUM.exists(), reason="/usr/bin/chromium is absent")
def test_branch_view_in_voila_in_chromium(voila_url: str, tmp_path: Path) -> None:
    with chromium(tmp_path) as browser:
        read(browser, voila_url, tmp_path)


def read(browser: DevTools, url: str, tmp_path: Path) -> None:
    browser.call("Page.enable")
    browser.call("Page.navigate", url=url)
    text = (
        "Array.from(document.querySelectorAll('.bxm-branch-view')).map(e => e.innerText).join('')"
    )
    browser.wait_for(f"({text}).includes('grandchild')", timeout=90)
    page = browser.js(text)
    assert "forked from p at turn 1 (before_answer)" in page
    assert "first differs at record 3" in page
    assert "I cannot say." in page and "Mild in Oslo." in page
    assert json.dumps({"loop.tool_iterations": 1}) in page
    nested = "document.querySelectorAll('.bxm-tree .bxm-tree .bxm-tree').length"
    assert browser.js(nested) == 1  # the grandchild's list, inside its parent's, inside the root's
    shot = tmp_path / "branch-view.png"
    shot.write_bytes(base64.b64decode(browser.call("Page.captureScreenshot")["data"]))
    assert shot.stat().st_size > 5_000
