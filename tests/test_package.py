"""The public face: exported names, environment.yml in step with pyproject, CI runs the README,
the docs name every part."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

import boxmaker

ROOT = Path(__file__).resolve().parent.parent


def test_exported_names_are_exactly_all() -> None:
    public = {n for n in dir(boxmaker) if not n.startswith("_")}
    modules = {n for n in public if inspect.ismodule(getattr(boxmaker, n))}
    assert public - modules == set(boxmaker.__all__) - {"__version__"}
    for name in boxmaker.__all__:
        obj = getattr(boxmaker, name)
        if name != "__version__":
            assert obj.__doc__, f"{name} has no docstring"


LOWER_LEVEL = {
    "cache_outcome": "boxmaker.cache",
    "cap_result": "boxmaker.tools",
    "dispatch": "boxmaker.tools",
    "messages": "boxmaker.session",
    "is_context_full": "boxmaker.client",
    "Completion": "boxmaker.client",
    "ToolCallDelta": "boxmaker.events",
    "read_log": "boxmaker.session",
}


def test_building_blocks_stay_in_their_modules() -> None:
    """The rule of boxmaker/__init__.py's docstring: what a notebook user needs is at the top,
    the building blocks under it are imported from their modules."""
    for name, module in LOWER_LEVEL.items():
        assert name not in boxmaker.__all__ and not hasattr(boxmaker, name), name
        assert hasattr(importlib.import_module(module), name), (name, module)
        assert f"``{module}" in boxmaker.__doc__ or name in boxmaker.__doc__, name


def test_exports_come_from_their_modules() -> None:
    assert boxmaker.run_turn.__module__ == "boxmaker.turn"
    assert boxmaker.Session.__module__ == "boxmaker.session"
    assert boxmaker.InferError.__module__ == "boxmaker.errors"


HEAVY = ("torch", "xllamacpp", "vcr", "pandas", "matplotlib", "ipywidgets", "mcp", "numpy")
STARTUP_HEAVY = ("jsonschema", "httpx", "markdown", "nh3", "yaml")
"""Imported only where used (issue 21): jsonschema (its format checker takes ~1.2 s) when a
tool registers, httpx when a client or a server check is made, markdown/nh3 when HTML is
rendered, yaml with cassettes."""


def _imported(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` a fresh ``python -c code`` has in ``sys.modules`` at its end."""
    probe = f"{code}\nimport sys; print(sorted(m for m in {names!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(ast.literal_eval(out.stdout.strip().splitlines()[-1]))


def test_import_is_light() -> None:
    assert _imported("import boxmaker", HEAVY + STARTUP_HEAVY) == []


def test_help_is_light() -> None:
    """``boxmaker --help`` (and a command's) imports none of the heavy libraries."""
    code = "from boxmaker.cli import main\ntry: main(['chat', '--help'])\nexcept SystemExit: pass"
    assert _imported(code, HEAVY + STARTUP_HEAVY) == []


def test_the_heavy_libraries_come_when_used() -> None:
    """The lazy names still load (and the probe can see a heavy import)."""
    assert _imported("from boxmaker import Client, run_turn", ("httpx",)) == ["httpx"]
    code = "import boxmaker; boxmaker.Registry().add(lambda: 1, name='f', description='d')"
    assert _imported(code, ("jsonschema",)) == ["jsonschema"]
    code = "from boxmaker.view._render import render_markdown; render_markdown('*a*')"
    assert _imported(code, ("markdown", "nh3")) == ["markdown", "nh3"]
    assert _imported("import boxmaker.score", ("numpy",)) == ["numpy"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_environment_yml_names_the_same_dependencies_as_pyproject() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = _names(project["dependencies"]) | _names(project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    assert any(d.startswith("python") for d in conda)
    assert "-e .[dev]" in pip or "-e .[dev]" in [p.replace('"', "") for p in pip]
    listed = _names([d for d in conda if not d.startswith(("python", "pip"))])
    listed |= _names([p for p in pip if not p.startswith("-e")])
    assert listed == wanted


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    match = re.search(r"^TEST_COMMAND='(.+)'$", ci, re.M)
    assert match, ".ci/run must define TEST_COMMAND"
    assert f"\n{match.group(1)}\n" in readme


_FACES = sorted(
    {"boxmaker"}
    | {f"boxmaker.{p.parent.name}" for p in (ROOT / "boxmaker").glob("*/__init__.py")}
    | {"boxmaker.frames.plots", "boxmaker.frames.report", "boxmaker.tools.mcp"}
    | {"boxmaker.tools.approval", "boxmaker.cassettes.whatif", "boxmaker.cli.doctor"}
    | {"boxmaker.testing", "boxmaker.demo", "boxmaker.server", "boxmaker.events", "boxmaker.errors"}
    - {"boxmaker.model"}
)
"""Every public face and public submodule of the package."""


def _public_names() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for face in _FACES:
        module = importlib.import_module(face)
        for name in getattr(module, "__all__", ()):
            out.setdefault(name, {})[face] = getattr(module, name)
    return out


def test_no_two_public_names_mean_different_things() -> None:
    """Issue 34: ``first_difference``, ``RULES``, ``Tokens``, ``Reply``, ``describe`` and
    ``answer_of`` each named two different things on two faces."""
    clashes = {
        name: sorted(where)
        for name, where in _public_names().items()
        if len({id(obj) for obj in where.values()}) > 1
    }
    assert clashes == {}


def test_every_public_exception_is_a_boxmaker_error_in_the_one_tree() -> None:
    """Issue 34: ``RecordError`` was a bare ValueError, and five more lived in their parts."""
    import boxmaker.errors as errors

    for name, where in _public_names().items():
        for face, obj in where.items():
            if isinstance(obj, type) and issubclass(obj, BaseException):
                assert issubclass(obj, (errors.BoxmakerError, Warning)), f"{face}.{name}"
                assert getattr(errors, name, None) is obj, f"{face}.{name} is not in errors"


def test_tests_of_an_optional_extra_skip_naming_it_and_ci_proves_it_on_dev_alone() -> None:
    """The README installs ``.[dev]`` alone: a test of an optional extra skips through
    ``tests/extras.py`` (its reason names the extra), never through a bare importorskip or an
    engine list that fails without duckdb; ``.ci/run`` runs the quick suite on ``.[dev]`` alone."""
    from extras import EXTRA_OF

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(project["optional-dependencies"])
    assert set(EXTRA_OF.values()) <= extras
    bare = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        for match in re.finditer(r"pytest\.importorskip\(([^)]*)\)", text):
            if "reason=" not in match.group(1):
                bare.append(f"{path.relative_to(ROOT)}: {match.group(0)}")
        if re.search(r"parametrize\(\s*\"engine\",\s*\[", text):
            bare.append(f"{path.relative_to(ROOT)}: an engine list (use extras.ENGINES)")
    assert bare == []
    ci = (ROOT / ".ci" / "run").read_text()
    quick = re.search(r"^QUICK_COMMAND='(.+)'$", ci, re.M)
    assert quick and quick.group(1).startswith('.venv-dev/bin/python -m pytest -m "not live"')
    assert re.search(r'^\.venv-dev/bin/pip install .*-e "\.\[dev\]"', ci, re.M)
    assert 'eval "$QUICK_COMMAND"' in ci


@pytest.mark.live
def test_readme_api_snippets_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first two python blocks of the README, one after the other, as a reader pastes
    them: a turn, then a turn a limit ends, then the frames of both logs."""
    readme = (ROOT / "README.md").read_text()
    snippets = re.findall(r"```python\n(.*?)```", readme, re.S)[:2]
    assert len(snippets) == 2, "the README's API section has two python blocks"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "readme"}
    for snippet in snippets:
        exec(compile(snippet, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "cached tokens:" in out
    assert "tool_iterations 1 0" in out  # the limit the comment promises
    assert len(list((tmp_path / "sessions").glob("*.jsonl"))) == 2
    assert namespace["loaded"].limit_hits.kind.tolist() == ["tool_iterations"]


def test_the_docs_parts_table_names_every_module() -> None:
    """The parts table of the docs' architecture page (the README's before the docs site)."""
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("## The parts", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("| `"))
    named = set(re.findall(r"`(\w+)`", " ".join(row.split("|")[1] for row in table.splitlines())))
    modules = {p.stem for p in (ROOT / "boxmaker").glob("*.py") if not p.stem.startswith("_")}
    modules |= {p.name for p in (ROOT / "boxmaker").iterdir() if (p / "__init__.py").exists()}
    assert modules - named == set(), "the architecture page's parts table misses these modules"
    assert named - modules == set(), "the parts table names modules that do not exist"


def test_no_old_module_path_is_kept() -> None:
    """Nothing was released under the old module paths (``boxmaker.logfile``, ...): their
    shims are gone (issue 34), and an old path is an ImportError like any other."""
    code = "import boxmaker.logfile"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 1 and "ModuleNotFoundError" in out.stderr
    assert not (ROOT / "boxmaker" / "_relocated.py").exists()


def test_the_docs_task_with_a_target_is_a_line_the_batch_reads(tmp_path: Path) -> None:
    """The retrial: the example was wrapped over three lines, which no JSON Lines file holds.
    (The examples were the README's; they are the docs' batch and score pages' now.)"""
    from boxmaker.batch import ForkTask, load_tasks

    pages = [ROOT / "docs" / "guides" / name for name in ("batch.md", "score.md")]
    blocks = [
        block.strip() + "\n"
        for page in pages
        for block in re.findall(r"```json\n(.*?)```", page.read_text(), re.S)
    ]
    assert len(blocks) == 2  # a fork task (batch) and a task with a target (score and compare)
    (tmp_path / "tasks.jsonl").write_text("".join(blocks))
    fork, task = load_tasks(tmp_path / "tasks.jsonl")
    assert task.id == "lisbon" and task.target is not None
    assert isinstance(fork, ForkTask) and fork.at == 1 and fork.target is not None
    # its target is about its own message: the demo's later ones would end in Oslo
    assert fork.messages == ("What time is it in Tokyo?",)
