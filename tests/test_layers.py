"""Nothing imports upward: each module of ``boxmaker/`` imports only modules of lower layers.

``LAYERS`` is the architecture, lowest first; a module may import any module of an earlier
layer (or of its own, where the pair is listed in ``SAME_LAYER``), never a later one, and
imports sit at the top of each module (none hidden in a function, where they would hide a
dependency), except the modules named in ``LAZY`` (they pull heavy libraries).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "boxmaker"

LAYERS: list[set[str]] = [
    {"records", "model", "fastjson"},
    {"errors"},
    {"events", "migrations", "config_checks", "sse", "infer_errors", "cancel", "completion"},
    {"config_ports"},
    {"config"},
    {"logfile", "cache", "tools"},
    {"think_tags"},
    {"fast_chunks"},
    {"chunks", "loopguard"},
    {"stream", "thinking_cap"},
    {"session", "client", "approval", "mcp_port"},
    {"forensics"},
    {"turn", "transcript", "columns", "batchplan"},
    {"frame_rows"},
    {"frames", "render", "batchrun"},
    {"plots", "widget_transcript", "demo", "server", "batchview"},
    {"widgets"},
    {"report", "cassettes", "batch", "doctor", "terminal"},
    {"pytest_plugin", "cli"},
    {"__init__", "__main__"},
]

LAZY = {
    "widgets",
    "server",
    "plots",
    "frames",
    "report",
    "cassettes",
    "mcp_port",
    "batch",
    "batchview",
}
"""Modules that pull a heavy library (ipywidgets, xllamacpp, matplotlib, pandas, vcrpy, mcp): a
higher layer may import them inside a function, so ``import boxmaker`` stays light."""


def _layer(module: str) -> int:
    top = module.split(".")[0]
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
                    [".".join([*base, node.module])]
                    if node.module
                    else [".".join([*base, a.name]) for a in node.names]
                )
            elif node.module and node.module.startswith("boxmaker"):
                names = [node.module]
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


def _in_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
            and any(child is target for child in ast.walk(node))
        ):
            return True
    return False


MODULES = sorted(
    p for p in PACKAGE.rglob("*.py") if "model" not in p.relative_to(PACKAGE).parts[:-1]
)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_upward_or_hides_an_import(path: Path) -> None:
    rel = path.relative_to(PACKAGE).with_suffix("")
    me = ".".join(rel.parts)
    mine = _layer(me if rel.parts[0] != "cassettes" else "cassettes")
    for imported, line, at_top in _own_imports(path):
        if imported.split(".")[0] == me.split(".")[0]:
            continue  # inside one package (boxmaker/cassettes/...)
        theirs = _layer(imported)
        assert theirs < mine or me == "__init__", (
            f"boxmaker/{rel}.py:{line} imports boxmaker.{imported} (layer {theirs}) "
            f"from layer {mine}: an upward import"
        )
        assert at_top or imported.split(".")[0] in LAZY, (
            f"boxmaker/{rel}.py:{line}: import of boxmaker.{imported} in a function"
        )
