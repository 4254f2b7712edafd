"""The docs site: it builds with warnings as errors, loads nothing from another host, and every
code block of its pages runs (or, for a shell line, parses as the command it names).

A page's code blocks are fenced blocks of ``docs/**/*.md``. What a block needs is said by a
MyST comment line just above it (``% docs-test: ...``, not rendered):

- nothing: a python block runs offline, in the quick suite;
- ``live``: it starts an embedded llama.cpp server (the ``live`` marker);
- ``needs MODULE ...``: it skips, naming the optional extra (``tests/extras.py``), where a
  module is missing;
- ``needs-models``: it skips unless the real test models were fetched
  (``python scripts/fetch_models.py``).

The python blocks of a page run in order in one namespace, in a fresh folder holding a copy of
``cassettes/`` (a reader runs them from a clone's root). ``bash`` blocks: every ``boxmaker``
line parses with the command's own parser, every script, test path, module and extra it names
exists. ``toml`` blocks load as a config; ``json`` blocks are JSON Lines.
"""

from __future__ import annotations

import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import CHROMIUM, chromium, free_port, running
from extras import EXTRA_OF, has, reason

from boxmaker.model.real import MODELS_DIR_ENV, REAL_MODELS, models_dir, real_model_path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [
    *sorted(p for p in DOCS.rglob("*.md") if not {"_build", "notebooks"} & set(p.parts)),
    ROOT / "CONTRIBUTING.md",
    ROOT / "CHANGELOG.md",
]
"""The pages of the site: ``docs/`` and the two files its contributing and changelog pages
include."""
LANGUAGES = {"python", "bash", "toml", "json", "text"}
"""Every fenced block says its language; ``text`` is output, shown and not run."""
MARK = re.compile(r"^% docs-test: (.+)$")
MODELS_DIR = models_dir()
"""The real models' folder, read before a fixture points ``HOME`` elsewhere."""
LIVE_MARKS = ("live", "needs-models")
"""Marks of a block that starts an embedded server (the real models are served so too)."""
FENCE = re.compile(r"^```(\S*)(?:\s.*)?$")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    page: Path
    line: int
    language: str
    code: str
    needs: tuple[str, ...]
    """The words of its ``% docs-test:`` line (empty: none)."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` (MyST directives, ```` ```{name} ````, are not code)."""
    out: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        fence = FENCE.match(lines[i].strip())
        if fence and not fence.group(1).startswith("{"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            start = i
            i += 1
            body = []
            while i < len(lines) and lines[i].strip() != "```":
                body.append(lines[i][indent:])
                i += 1
            assert i < len(lines), f"{page}:{start + 1}: a block that never ends"
            above = lines[start - 1] if start else ""
            mark = MARK.match(above)
            needs = tuple(mark.group(1).split()) if mark else ()
            code = "\n".join(body) + "\n"
            out.append(Block(page, start + 1, fence.group(1), code, needs))
        elif fence:  # a directive: skip to its end
            i += 1
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
            assert i < len(lines), f"{page}:{i}: a directive that never ends"
        i += 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]


def _id(page: Path) -> str:
    return str(page.relative_to(DOCS if page.is_relative_to(DOCS) else ROOT))


def test_every_block_says_its_language_and_every_mark_is_known() -> None:
    assert ALL, "no code block found under docs/"
    for block in ALL:
        assert block.language in LANGUAGES, f"{block.where}: ```{block.language}"
        if block.needs:
            assert block.language == "python", f"{block.where}: a mark on a {block.language} block"
            kind = block.needs[0]
            assert kind in ("live", "needs", "needs-models"), f"{block.where}: {block.needs}"
            for module in block.needs[1:] if kind == "needs" else ():
                assert module in EXTRA_OF, f"{block.where}: {module} is in no extra"


# --- python blocks ---------------------------------------------------------------------------


def _python(page: Path, live: bool) -> list[Block]:
    """The page's python blocks the offline (``live`` False) or the live run executes: the
    live run executes every block, in order, since a live block may build on earlier ones."""
    found = [b for b in blocks(page) if b.language == "python"]
    if live:
        return found if any(b.needs[:1] in [(m,) for m in LIVE_MARKS] for b in found) else []
    return [b for b in found if not b.needs or b.needs[0] not in LIVE_MARKS]


def _run(page: Path, chosen: list[Block], folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shutil.copytree(ROOT / "cassettes", folder / "cassettes")
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))  # a block may write a module and import it
    namespace: dict[str, Any] = {"__name__": f"docs_{page.stem}"}
    for block in chosen:
        if block.needs[:1] == ("needs",):
            for module in block.needs[1:]:
                if not has(module):
                    pytest.skip(f"{block.where}: {reason(module)}")
        if block.needs[:1] == ("needs-models",):
            if any(real_model_path(name, MODELS_DIR) is None for name in REAL_MODELS):
                pytest.skip(f"{block.where}: needs the real models (scripts/fetch_models.py)")
            monkeypatch.setenv(MODELS_DIR_ENV, str(MODELS_DIR))
        exec(compile(block.code, block.where, "exec"), namespace)


OFFLINE = [p for p in PAGES if _python(p, live=False)]
LIVE = [p for p in PAGES if _python(p, live=True)]


@pytest.mark.parametrize("page", OFFLINE, ids=_id)
def test_the_python_blocks_of_a_page_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(page, _python(page, live=False), tmp_path, monkeypatch)


@pytest.mark.live
@pytest.mark.parametrize("page", LIVE, ids=_id)
def test_the_python_blocks_of_a_page_run_on_the_embedded_server(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _run(page, _python(page, live=True), tmp_path, monkeypatch)


# --- shell, toml and json blocks -------------------------------------------------------------

EXTERNAL = {"llama-server", "ray", "inspect", "jupyter"}
"""Commands of other projects a page may show; not checked here."""


def _commands(code: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, ``$ `` prompts, comments and
    leading ``VAR=value`` assignments dropped, ``&&`` chains split."""
    joined = code.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        words = shlex.split(line.removeprefix("$ "), comments=True)
        command: list[str] = []
        for word in [*words, "&&"]:
            if word == "&&":
                while command and re.match(r"^[A-Z_]+=", command[0]):
                    command.pop(0)
                if command:
                    out.append(command)
                command = []
            else:
                command.append(word)
    return out


def _extra_packages() -> set[str]:
    """The distributions the optional extras of ``pyproject.toml`` name (``sphinx`` of the
    ``docs`` extra: its module is there on a ``.[docs]`` install, not on ``.[dev]`` alone)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = set()
    for requirements in project["optional-dependencies"].values():
        for requirement in requirements:
            names.add(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower())
    return names


def _check_command(words: list[str], where: str) -> None:
    from boxmaker.cli._main import _parser

    program = Path(words[0]).name
    if program == "boxmaker":
        try:
            _parser().parse_args(words[1:])
        except SystemExit as exit:
            raise AssertionError(f"{where}: {shlex.join(words)} does not parse") from exit
    elif program in ("python", "python3"):
        if words[1:3] == ["-m", "venv"]:
            return
        if words[1] == "-m":
            module = words[2]
            if module == "pytest":
                for arg in words[3:]:
                    if not arg.startswith("-") and "/" in arg:
                        path = arg.split("::")[0]
                        assert (ROOT / path).exists(), f"{where}: {path}"
            else:
                import importlib.util

                if importlib.util.find_spec(module) is None:  # an extra not installed here
                    assert module in _extra_packages(), f"{where}: no module {module}"
        else:
            assert (ROOT / words[1]).is_file(), f"{where}: no script {words[1]}"
    elif program == "pip":
        project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
        extras = set(project["optional-dependencies"])
        for word in words:
            if word.startswith(".["):
                named = set(word[2:].rstrip("]").split(","))
                assert named <= extras, f"{where}: no extra {named - extras}"
    elif program in ("ruff", "mypy", "bash"):
        paths = [w for w in words[1:] if not w.startswith("-") and w not in ("check", "format")]
        for path in paths:
            assert (ROOT / path).exists(), f"{where}: {program} {path}: no such path"
    else:
        assert program in EXTERNAL, f"{where}: {program}: a command this test does not know"


def test_every_shell_line_names_a_command_as_it_is() -> None:
    checked = 0
    for block in ALL:
        if block.language == "bash":
            for words in _commands(block.code):
                _check_command(words, block.where)
                checked += 1
    assert checked > 20


def test_every_toml_block_loads_as_a_config(tmp_path: Path) -> None:
    from boxmaker import Config

    for n, block in enumerate(b for b in ALL if b.language == "toml"):
        path = tmp_path / f"{n}.toml"
        path.write_text(block.code)
        assert isinstance(Config.from_toml(path), Config), block.where


def test_every_json_block_is_json_lines_and_every_task_loads(tmp_path: Path) -> None:
    from boxmaker.batch import load_tasks

    for n, block in enumerate(b for b in ALL if b.language == "json"):
        lines = [json.loads(line) for line in block.code.splitlines() if line.strip()]
        if all("id" in line for line in lines):
            path = tmp_path / f"{n}.jsonl"
            path.write_text(block.code)
            assert len(load_tasks(path)) == len(lines), block.where


# --- the site --------------------------------------------------------------------------------


def build_site(out: Path) -> Path:
    """Build the site into ``out`` as CI does (warnings are errors); returns the HTML folder.
    Skips, naming the extra, where Sphinx is not installed."""
    for module in ("sphinx", "myst_nb", "furo", "sphinxarg"):
        if not has(module):
            pytest.skip(reason(module))
    built = out / "html"
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-d", str(out / "doctrees"), str(DOCS), str(built)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr  # -q: only warnings would print
    return built


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("site"))


def test_the_site_builds_and_loads_nothing_from_another_host(site: Path) -> None:
    remote = re.compile(r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=["'](?:https?:)?//""")
    pages = list(site.rglob("*.html"))
    assert len(pages) > 40
    for page in pages:
        text = page.read_text()
        assert not remote.search(text), f"{page.relative_to(site)} loads from another host"
        assert "fonts.googleapis" not in text and "@import url(" not in text
    for css in site.rglob("*.css"):
        assert not re.search(r"url\((['\"]?)(?:https?:)?//", css.read_text()), css.name
    # the pages made from the code
    cli = html.unescape(re.sub(r"<[^>]+>", "", (site / "cli.html").read_text()))
    cli = " ".join(cli.split())
    assert "boxmaker demo [-h]" in cli and "--slot-save-path" in cli
    assert 'id="boxmaker.session.split_turns"' in (site / "api" / "session.html").read_text()
    assert "01-turn-loop.html" in (site / "notebooks.html").read_text()


@pytest.mark.live  # a browser: not in the quick suite, as tests/widgets/test_browser.py
@pytest.mark.skipif(
    not CHROMIUM.exists(), reason="/usr/bin/chromium is absent (bash .ci/setup-browser)"
)
def test_searching_the_site_for_a_function_lands_on_its_api_page(
    site: Path, tmp_path: Path
) -> None:
    """A reader types ``split_turns`` into the site's search box, presses Enter, opens the
    first result, and reads the function's signature and docstring on its API page."""
    port = free_port()
    serve = [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", str(port)]
    with running(serve, port, tmp_path / "http.log", cwd=site), chromium(tmp_path) as browser:
        browser.call("Page.enable")
        browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/index.html")
        box = "document.querySelector('input[name=q]')"
        browser.wait_for(f"{box} !== null && document.readyState === 'complete'")
        browser.js(f"{box}.focus()")
        browser.call("Input.insertText", text="split_turns")
        browser.key("Enter", 13, text="\r")
        first = "document.querySelector('#search-results ul.search li a')"
        browser.wait_for(f"location.pathname.endsWith('/search.html') && {first} !== null")
        href = browser.js(f"{first}.href")
        assert href.startswith(f"http://127.0.0.1:{port}/api/session.html"), href
        assert href.endswith("#boxmaker.session.split_turns"), href
        browser.js(f"{first}.click()")
        target = "document.getElementById('boxmaker.session.split_turns')"
        browser.wait_for(f"location.pathname.endsWith('/api/session.html') && {target} !== null")
        signature = " ".join(browser.js(f"{target}.innerText").split())
        assert signature.startswith("boxmaker.session.split_turns(log"), signature
        described = browser.js(f"{target}.parentElement.innerText")
        assert "Cut a log" in described and "records into turns" in described
        assert browser.js("document.title").startswith("boxmaker.session")


def test_every_measured_figure_names_a_benchmark_and_what_it_prints() -> None:
    """``docs/measurements.toml`` (the benchmarks page's figures) holds what a script printed:
    the script exists, and it prints each figure's name."""
    rows = tomllib.loads((DOCS / "measurements.toml").read_text())["measurement"]
    assert rows
    for row in rows:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", row["date"]), row
        script = ROOT / shlex.split(row["command"])[1]
        assert script.is_file() and script.parent.name == "benchmarks", row["command"]
        source = script.read_text()
        names = re.findall(r"([a-z][a-z_0-9]*) -?\d", row["line"])
        assert names, row["line"]
        for name in names:  # rss_50m_mb is printed as f"rss_{n}m_mb"
            for piece in filter(None, re.split(r"\d+", name)):
                assert piece in source, f"{script.name} prints no {name}"
