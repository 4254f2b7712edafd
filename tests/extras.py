"""Tests of an optional extra skip, naming the extra, when it is not installed.

The README's quick start installs ``.[dev]`` alone; CI also installs the extras (``.ci/run``)
and runs the quick suite once more on ``.[dev]`` alone, so a test that needs an extra must say
which one instead of failing. Use :func:`need` inside a test (or at a module's top) and
:data:`ENGINES` to parametrize over the frames' engines.
"""

from __future__ import annotations

import importlib.util
from types import ModuleType
from typing import Any

import pytest

EXTRA_OF: dict[str, str] = {
    "duckdb": "duckdb",
    "pyarrow": "parquet",
    "pyarrow.parquet": "parquet",
    "opentelemetry.sdk": "otel",
    "inspect_ai": "inspect",
    "atif": "atif",
    "datasets": "hub",
    "mlflow": "live-receivers",
    "ray": "ray",
    "pydantic_ai": "tap-agents",
    "agents": "tap-agents",
    "bfcl_eval": "bench",
    "mpmath": "bench",
    "sphinx": "docs",
    "myst_nb": "docs",
    "furo": "docs",
    "sphinxarg": "docs",
}
"""The optional extra (``pyproject.toml``) that installs each module the tests may need."""


AFTER: dict[str, str] = {
    "bench": " && pip install --no-deps bfcl-eval==2026.3.23 (boxmaker bench setup)",
}
"""What an extra needs installed beside it (BFCL's package goes in without its dependencies,
which no extra can say)."""


def reason(module: str) -> str:
    """The skip reason for a missing ``module``: the extra to install."""
    extra = EXTRA_OF[module]
    then = AFTER.get(extra, "")
    return (
        f"needs the '{extra}' extra ({module} is not installed): pip install -e '.[{extra}]'{then}"
    )


def need(module: str) -> ModuleType:
    """Import ``module`` (a key of :data:`EXTRA_OF`) or skip the test, naming its extra."""
    imported: ModuleType = pytest.importorskip(module, reason=reason(module))
    return imported


def has(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a dotted name whose parent is missing
        return False


def needs_mark(module: str) -> Any:
    """A ``skipif`` mark for a parameter or test that needs ``module``."""
    return pytest.mark.skipif(not has(module), reason=reason(module))


ENGINES = [
    pytest.param("pandas", id="pandas"),
    pytest.param("duckdb", id="duckdb", marks=needs_mark("duckdb")),
]
"""The frames' engines, for ``@pytest.mark.parametrize("engine", ENGINES)``: the DuckDB one
skips, naming its extra, where duckdb is not installed."""
