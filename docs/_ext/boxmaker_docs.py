"""Pages of the docs site made from the code at build time, so they cannot drift from it.

Directives (used from the MyST pages as ```` ```{boxmaker-layers} ```` and so on):

- ``boxmaker-layers``: the layers of the package as ``tests/test_layers.py`` states them
  (``LAYERS``, read with :mod:`ast`: the test is the one statement of the architecture).
- ``boxmaker-names``: every name of ``boxmaker.__all__``, linked to the face that documents it.
- ``boxmaker-measurements``: the table of ``docs/measurements.toml``, each row a benchmark's
  last line as it printed it, with its date and command.
- ``boxmaker-benchmarks``: every script of ``benchmarks/`` with its docstring's first paragraph.

The command line reference needs no directive of its own: sphinx-argparse's ``argparse``
directive reads the parser that ``boxmaker`` itself runs.
"""

from __future__ import annotations

import ast
import importlib
import tomllib
from pathlib import Path
from typing import Any, ClassVar

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

ROOT = Path(__file__).resolve().parents[2]


def layers() -> list[list[str]]:
    """``LAYERS`` of ``tests/test_layers.py``, lowest first, each layer's names sorted."""
    tree = ast.parse((ROOT / "tests" / "test_layers.py").read_text())
    for node in tree.body:
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "LAYERS"
            and node.value is not None
        ):
            return [sorted(layer) for layer in ast.literal_eval(node.value)]
    raise RuntimeError("tests/test_layers.py has no LAYERS")


def where_documented(name: str) -> str:
    """The dotted path a name of ``boxmaker.__all__`` is documented at: its object's
    ``__module__`` (each part's face sets it to itself) plus the name."""
    import boxmaker

    obj = getattr(boxmaker, name)
    module = getattr(obj, "__module__", None)
    if not isinstance(module, str) or not module.startswith("boxmaker."):
        raise RuntimeError(f"boxmaker.{name} has no public module to link to")
    return f"{module}.{name}"


class _RstDirective(SphinxDirective):
    """A directive that writes reStructuredText and parses it in place."""

    has_content = False

    def rst(self) -> list[str]:
        raise NotImplementedError

    def run(self) -> list[nodes.Node]:
        container = nodes.container()
        lines = StringList(self.rst(), source=self.get_source_info()[0])
        self.state.nested_parse(lines, self.content_offset, container)
        return list(container.children)


class Layers(_RstDirective):
    def rst(self) -> list[str]:
        self.env.note_dependency(str(ROOT / "tests" / "test_layers.py"))
        out = []
        for number, names in enumerate(layers(), start=1):
            shown = ", ".join(f"``{n}``" for n in names)
            out.append(f"{number}. {shown}")
        return out


class Names(_RstDirective):
    def rst(self) -> list[str]:
        import boxmaker

        out = [".. list-table::", "   :header-rows: 1", "", "   * - name", "     - documented at"]
        for name in sorted(n for n in boxmaker.__all__ if n != "__version__"):
            target = where_documented(name)
            face = target.rsplit(".", 1)[0]
            out += [f"   * - ``{name}``", f"     - :py:obj:`{face}.{name} <{target}>`"]
        return out


class Measurements(_RstDirective):
    required_arguments = 0
    option_spec: ClassVar[dict[str, Any]] = {}

    def rst(self) -> list[str]:
        path = Path(self.env.srcdir) / "measurements.toml"
        self.env.note_dependency(str(path))
        rows = tomllib.loads(path.read_text())["measurement"]
        out = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 20 12 40 28",
            "",
            "   * - benchmark",
            "     - date",
            "     - last line printed",
            "     - on",
        ]
        for row in rows:
            out += [
                f"   * - ``{row['command']}``",
                f"     - {row['date']}",
                f"     - ``{row['line']}``",
                f"     - {row['machine']}",
            ]
        return out


class Benchmarks(_RstDirective):
    def rst(self) -> list[str]:
        out = [".. list-table::", "   :header-rows: 1", "", "   * - script", "     - measures"]
        for path in sorted((ROOT / "benchmarks").glob("*.py")):
            self.env.note_dependency(str(path))
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            first = " ".join(doc.split("\n\n")[0].split()).removeprefix("Benchmark: ")
            out += [f"   * - ``benchmarks/{path.name}``", f"     - {first}"]
        return out


class Settings(_RstDirective):
    """Every ``section.key`` of :class:`boxmaker.config.Config` (what a TOML config, a batch
    grid and ``fork --set`` name), with its default and the field's own docstring."""

    def rst(self) -> list[str]:
        import dataclasses

        from boxmaker.config import Config

        docs: dict[tuple[str, str], str] = {}
        for path in sorted((ROOT / "boxmaker" / "config").glob("*.py")):
            self.env.note_dependency(str(path))
            for cls in ast.parse(path.read_text()).body:
                if not isinstance(cls, ast.ClassDef):
                    continue
                body = cls.body
                for field, after in zip(body, body[1:], strict=False):
                    if (
                        isinstance(field, ast.AnnAssign)
                        and isinstance(field.target, ast.Name)
                        and isinstance(after, ast.Expr)
                        and isinstance(after.value, ast.Constant)
                        and isinstance(after.value.value, str)
                    ):
                        text = " ".join(after.value.value.split())
                        docs[(cls.name, field.target.id)] = text
        out = [
            ".. list-table::",
            "   :header-rows: 1",
            "   :widths: 25 15 60",
            "",
            "   * - setting",
            "     - default",
            "     - what it is",
        ]
        config = Config()
        for section in dataclasses.fields(config):
            value = getattr(config, section.name)
            if not dataclasses.is_dataclass(value):
                continue
            for knob in dataclasses.fields(value):
                doc = docs.get((type(value).__name__, knob.name), "")
                default = repr(getattr(value, knob.name))
                out += [
                    f"   * - ``{section.name}.{knob.name}``",
                    f"     - ``{default}``",
                    f"     - {doc}",
                ]
        return out


def _check_faces(app: Sphinx) -> None:
    """Fail the build when a public face has no API page (``docs/api/*.md``)."""
    pages = "\n".join(p.read_text() for p in (Path(app.srcdir) / "api").glob("*.md"))
    for face in public_faces():
        importlib.import_module(face)
        if f"automodule:: {face}\n" not in pages and face != "boxmaker":
            raise RuntimeError(f"{face} has no API page: add an automodule to docs/api/")


def public_faces() -> list[str]:
    """Every part's face and public submodule: each package's ``__init__``, each top-level
    module and each module of a part without a leading underscore."""
    package = ROOT / "boxmaker"
    faces = {"boxmaker"}
    for path in package.iterdir():
        if path.name.startswith("_"):
            continue
        if (path / "__init__.py").exists():
            faces.add(f"boxmaker.{path.name}")
            faces |= {
                f"boxmaker.{path.name}.{sub.stem}"
                for sub in path.glob("*.py")
                if not sub.stem.startswith("_")
            }
        elif path.suffix == ".py":
            faces.add(f"boxmaker.{path.stem}")
    return sorted(faces - PRIVATE_SUBMODULES)


PRIVATE_SUBMODULES = {
    "boxmaker.model.data",
    "boxmaker.model.data_limits",
    "boxmaker.model.dialogue",
    "boxmaker.model.format",
    "boxmaker.model.make",
    "boxmaker.model.train",
    "boxmaker.model.words",
}
"""Modules without a leading underscore that are not the library's: the shipped model's
training code (a tool of the repository, outside the library's import graph)."""


def _skip_field_aliases(
    app: Sphinx, what: str, name: str, obj: Any, skip: bool, options: Any
) -> bool | None:
    """A NamedTuple's fields are documented by its ``Attributes`` section, not again as
    ``Alias for field number N``."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("autodoc-skip-member", _skip_field_aliases)
    app.add_directive("boxmaker-layers", Layers)
    app.add_directive("boxmaker-names", Names)
    app.add_directive("boxmaker-measurements", Measurements)
    app.add_directive("boxmaker-benchmarks", Benchmarks)
    app.add_directive("boxmaker-settings", Settings)
    app.connect("builder-inited", _check_faces)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
