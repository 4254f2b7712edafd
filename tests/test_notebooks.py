"""Every notebook under notebooks/ runs headless (nbclient) without error, and is stored
without outputs.

The notebooks start their own embedded llama.cpp servers on 127.0.0.1 (marked ``live``); the
kernel is this interpreter (``python3`` installed into ``sys.prefix`` when missing), so the
notebooks see the same boxmaker.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 120
"""Longest any one cell may run."""
NOTEBOOK_BUDGET_S = 120
"""Longest a whole notebook may run."""


def _imports(nb: nbformat.NotebookNode) -> set[str]:
    """The top-level modules the notebook's code cells import."""
    names: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # a cell magic: no imports to read
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def _missing_modules(nb: nbformat.NotebookNode) -> list[str]:
    """The modules the notebook imports that are not installed (an optional extra, e.g.
    ``agents`` of ``boxmaker[tap-agents]``): the notebook is skipped then, naming them, so the
    README's test command holds on a ``.[dev]`` install."""
    return sorted(n for n in _imports(nb) if importlib.util.find_spec(n) is None)


def test_a_notebook_needing_a_module_not_installed_is_found() -> None:
    """The skip rule reads imports: the tap notebook's Agents SDK (``boxmaker[tap-agents]``)."""
    tap = nbformat.read(ROOT / "notebooks" / "09-tap.ipynb", as_version=4)
    assert {"agents", "boxmaker"} <= _imports(tap)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import no_such_mod_x")])
    assert _missing_modules(nb) == ["no_such_mod_x"]


def _kernel_name() -> str:
    """A kernel spec that runs this interpreter; installed into ``sys.prefix`` when missing."""
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    name = "python3"
    try:
        argv0 = KernelSpecManager().get_kernel_spec(name).argv[0]
    except NoSuchKernel:
        argv0 = ""
    # jupyter_client runs "python"/"python3" specs with the current interpreter
    if argv0 in ("python", "python3") or Path(argv0).resolve() == Path(sys.executable).resolve():
        return name
    subprocess.run(
        [sys.executable, "-m", "ipykernel", "install", "--sys-prefix", "--name", name],
        check=True,
        capture_output=True,
    )
    return name


def test_there_are_notebooks() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert {"01-turn-loop.ipynb", "02-limits.ipynb", "03-cassettes.ipynb"} <= set(names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    """Stored clean and valid: nbformat's validator (run by ``read``) warns of a cell without
    an id (``MissingIDFieldWarning``, an error in this run; notebook 02 had 13, issue 21)."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert all(cell.get("id") for cell in nb.cells)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.live
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_headless(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    if missing := _missing_modules(nb):
        pytest.skip(f"{path.name} needs {', '.join(missing)} (an optional extra: CONTRIBUTING.md)")
    monkeypatch.delenv("BOXMAKER_URL", raising=False)  # 01 starts its own embedded server
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name=_kernel_name(),
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.monotonic()
    client.execute()  # raises CellExecutionError on the first cell that fails
    elapsed = time.monotonic() - started
    assert elapsed < NOTEBOOK_BUDGET_S, f"{path.name} took {elapsed:.0f} s"
    errors = [
        out
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]
    assert not errors
