"""The architecture, stated: one package per part of the spec, in layers, with no upward import.

``LAYERS`` is the layout, lowest first. A part (a package, or a top-level module such as
``records``) may import any part of an earlier layer, never one of its own layer or a later
one; inside a part its modules import each other freely. Across parts only the part's public
face is imported (``from ..client import Client``), never a private module
(``from ..client._client import ...``): a part's private modules are its own. Imports sit at
the top of each module (none hidden in a function, where they would hide a dependency), except
imports of the parts named in ``LAZY`` (they pull heavy libraries, so ``import boxmaker``
stays light). ``server`` and ``model`` stand apart: ``model`` needs only ``errors`` (its
``real`` module raises ``ModelFetchError``), ``server`` only ``model`` and ``errors``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "boxmaker"

LAYERS: list[set[str]] = [
    {"records", "errors", "_json", "_public", "_secrets"},
    {"events"},
    {"config", "model"},
    {"session", "tools", "view", "score", "server"},
    {"client"},
    {"cache"},
    {"turn"},
    {"frames", "widgets", "cassettes", "batch", "demo", "testing"},
    {"export", "tap"},  # the tap records its cassettes with cassettes' writer
    {"bench"},  # BFCL's tasks run as a batch and through the tap
    {"cli"},
    {"__init__", "_pytest_entry"},
]
"""The parts, lowest first (LAYOUT.md's eight layers, with the leaf modules of layer 1,
``model`` and ``server`` placed where their imports put them)."""

SAME_LAYER = {
    ("records", "_public"),  # the face sets its names' __module__
    ("errors", "records"),  # the tree's TurnLimit names a LimitKind (under TYPE_CHECKING)
    ("records", "errors"),  # the rule raises RecordError, in the one tree of errors
    ("events", "records"),  # events carry records
    ("batch", "frames"),  # batch.frames joins settings to a frame (lazily)
}

SHARED_INTERNALS = {
    "session._sources": "vet_logs: the source iterator's vetting in worker processes (DuckDB)",
    "session._turns": "backwards, unknown_types: the split's warnings, said alike by DuckDB",
}
"""Private modules of a lower part that the library's higher parts may import (never users):
LAYOUT.md's internal helpers, each named with what is taken from it."""

LAZY = {
    *("widgets", "server", "frames", "cassettes", "batch", "tools.mcp", "frames.plots"),
    *("cache", "client", "tap", "score", "export", "bench"),
}
"""Parts (or public submodules) that pull a heavy library (ipywidgets, xllamacpp, pandas,
matplotlib, vcrpy, mcp; pyarrow, OpenTelemetry and inspect_ai for ``export``; httpx for the
client and the cache forensics, numpy for the scores' bootstrap, so that ``boxmaker --help``
need not load it, issue 21): a higher layer may import them inside a function."""


def _part(module: str) -> str:
    return module.split(".")[0]


def _layer(module: str) -> int:
    top = _part(module)
    for number, names in enumerate(LAYERS):
        if top in names:
            return number
    raise AssertionError(f"boxmaker.{module} is in no layer of tests/test_layers.py")


def _own_imports(path: Path) -> list[tuple[str, int, bool]]:
    """(module imported, line, at top level) for each import of a boxmaker module."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    package_parts = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package_parts[: len(package_parts) - node.level + 1])
                names = (
                    _modules_of(".".join([*base, node.module]), node)
                    if node.module
                    else [".".join([*base, a.name]) for a in node.names]
                )
            elif node.module and node.module.startswith("boxmaker"):
                names = _modules_of(node.module, node)
            else:
                continue
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("boxmaker")]
        else:
            continue
        for name in names:
            inner = name.split(".", 1)[1] if "." in name else "__init__"
            out.append((inner, node.lineno, id(node) in top or _in_type_checking(tree, node)))
    return out


def _modules_of(module: str, node: ast.ImportFrom) -> list[str]:
    """``from boxmaker.tools import mcp`` imports the module ``boxmaker.tools.mcp``."""
    folder = PACKAGE.parent.joinpath(*module.split("."))
    out = []
    for alias in node.names:
        sub = folder / alias.name
        is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
        out.append(f"{module}.{alias.name}" if is_module else module)
    return out


def _in_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
            and any(child is target for child in ast.walk(node))
        ):
            return True
    return False


def _me(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
    return ".".join(parts)


TRAINING = {"data", "data_limits", "dialogue", "format", "make", "train", "words"}
"""The modules of ``boxmaker/model`` that make and train the shipped model: a tool of the
repository (they import the loop, PyTorch, gguf), outside the library's import graph."""

MODULES = sorted(
    p for p in PACKAGE.rglob("*.py") if not (p.parent.name == "model" and p.stem in TRAINING)
)
"""The library's modules (the model part's ``__init__`` and ``real`` included)."""


def test_the_training_code_sits_outside_the_librarys_import_graph() -> None:
    """No library module imports a training module of ``boxmaker/model`` (at any depth of a
    function), so ``import boxmaker`` and every command stay free of PyTorch and gguf."""
    training = {f"model.{name}" for name in TRAINING}
    for path in MODULES:
        for imported, line, _ in _own_imports(path):
            where = f"boxmaker/{path.relative_to(PACKAGE)}:{line}"
            assert imported not in training, f"{where} imports boxmaker.{imported}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_upward_hides_an_import_or_reaches_inside_a_part(path: Path) -> None:
    me = _me(path)
    mine = _layer(me)
    for imported, line, at_top in _own_imports(path):
        if _part(imported) == _part(me):
            continue  # inside one part
        where = f"boxmaker/{path.relative_to(PACKAGE)}:{line}"
        theirs = _layer(imported)
        assert theirs < mine or me == "__init__" or (_part(me), _part(imported)) in SAME_LAYER, (
            f"{where} imports boxmaker.{imported} (layer {theirs}) from layer {mine}: upward"
        )
        assert imported in SHARED_INTERNALS or not any(
            p.startswith("_") for p in imported.split(".")[1:]
        ), f"{where} imports boxmaker.{imported}: a private module of another part"
        assert at_top or imported in LAZY or _part(imported) in LAZY, (
            f"{where}: import of boxmaker.{imported} in a function"
        )


def test_every_part_has_a_public_face_with_a_docstring_and_an_exact_all() -> None:
    import importlib

    for init in sorted(PACKAGE.glob("*/__init__.py")):
        name = f"boxmaker.{init.parent.name}"
        if init.parent.name == "model":
            continue
        module = importlib.import_module(name)
        assert module.__doc__, f"{name} has no docstring"
        exported = set(getattr(module, "__all__", ()))
        assert exported, f"{name} has no __all__"
        for item in exported:
            obj = getattr(module, item)
            owner = getattr(obj, "__module__", None)
            if isinstance(owner, str) and owner.startswith(name + "."):
                assert not owner.split(".")[-1].startswith("_"), (
                    f"{name}.{item}.__module__ is {owner}, not the public path"
                )
