"""``inspect view`` in a real browser (Debian's headless Chromium) shows what the Inspect
export of a 2x2 grid batch keeps: four logs in the log list (one per setting, their task args
the settings; the viewer loads the rows' headers lazily, so the list is only checked for its
four rows and a setting), and in each setting's log its settings, a result per scorer, and
the samples' targets, answers and scores; a screenshot of each page is taken (into the
test's folder)."""

from __future__ import annotations

import base64
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, DevTools, chromium, free_port, running
from extras import need
from test_inspect import TASKS, grid_batch

from boxmaker.export import export_inspect

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (apt-get install -y chromium)"
    ),
]


def _shot(page: DevTools, path: Path) -> None:
    data = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
    path.write_bytes(data)
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


def _shown(value: Any) -> str:
    """A setting's value as the viewer writes it (JavaScript's numbers: 0.0 is ``0``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value)


def test_inspect_view_shows_each_setting_with_its_scores(tmp_path: Path) -> None:
    need("inspect_ai")
    from inspect_ai.log import read_eval_log

    evals = tmp_path / "evals"
    export_inspect(grid_batch(tmp_path), evals)
    files = sorted(evals.glob("*.eval"))
    assert len(files) == 4
    port = free_port()
    view = [sys.executable, "-m", "inspect_ai", "view", "--log-dir", str(evals)]
    view += ["--port", str(port), "--host", "127.0.0.1"]
    url = f"http://127.0.0.1:{port}/"
    with running(view, port, tmp_path / "view.log", tmp_path), chromium(tmp_path) as page:
        page.call("Page.enable")
        page.call("Page.navigate", url=url)
        page.wait_for("document.body.innerText.includes('4 rows')")
        page.wait_for("document.body.innerText.includes('loop.thinking_tokens=')")
        _shot(page, tmp_path / "logs.png")
        for file in files:
            log = read_eval_log(str(file), header_only=True)
            settings = log.eval.task_args
            page.call("Page.navigate", url="about:blank")
            page.call("Page.navigate", url=f"{url}#/logs/{file.name}")
            config = ", ".join(f"{k}: {_shown(v)}" for k, v in settings.items())
            page.wait_for(f"document.body.innerText.includes({json.dumps(config)})")
            page.wait_for("document.body.innerText.includes('2 Samples')")
            text = page.js("document.body.innerText")
            right = r"0\.5" if settings["loop.thinking_tokens"] == 64 else r"0(\.0)?"
            assert re.search(rf"\btarget\t{right}\n", text), text  # the result, by scorer
            assert re.search(r"\bpolite\t0\.5\n", text), text
            for task, expected in TASKS.items():  # each sample's target and answer
                assert json.dumps({"answer": {"contains": expected}}) in text.replace("\n", " ")
                assert task in text
            assert "In Tokyo it is 21:01." in text
            _shot(page, tmp_path / f"{file.stem}.png")
