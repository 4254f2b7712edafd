"""The Berkeley Function Calling Leaderboard's own package, opened without its dependencies.

``bfcl-eval`` (PyPI) ships BFCL v4's data (questions, possible answers, the function docs of
the multi-turn APIs) and its checkers (the AST checker of single-turn calls, the multi-turn
checker with its executable, stateful APIs). Its dependency pins (an old numpy, a dozen vendor
SDKs) must not enter boxmaker's environment, so the wheel is installed without them
(:data:`SETUP_COMMAND`) and only its light modules are imported:

- the data files, read from the package folder (``bfcl_eval/data``), as BFCL's own loader
  reads them (one JSON object a line; the multi-turn entries' functions are the docs of their
  ``involved_classes``); the loader itself is not imported, since importing
  ``bfcl_eval.constants.eval_config`` makes folders next to the installed package;
- ``bfcl_eval.eval_checker.ast_eval.ast_checker``: its one heavy import is
  ``bfcl_eval.constants.model_config`` (every vendor's model handler), read only by
  ``convert_func_name`` for a model's ``underscore_to_dot``. A stand-in module with one entry,
  :data:`MODEL_NAME` (an OpenAI-style function-calling model: ``.`` in a function name is sent
  as ``_``, as BFCL does for such models), is put in ``sys.modules`` while the checker is
  imported, and taken out again;
- ``bfcl_eval.eval_checker.multi_turn_eval`` (the multi-turn checker and the executor of the
  APIs) and the API classes under it, which need ``mpmath`` (the ``bench`` extra).

Nothing of BFCL's code is copied here. What boxmaker writes itself, because BFCL keeps it in
modules that import vendor SDKs: the tools as an OpenAI function-calling model is offered them
(:func:`compile_tools`, BFCL's ``convert_to_tool`` for ``ModelStyle.OPENAI_COMPLETIONS``) and
the decoding of a function-calling model's output (:mod:`boxmaker.bench._verdict`). The tests
hold both to BFCL's own code, run with stand-ins for the vendor SDKs in a process of its own.
"""

from __future__ import annotations

import copy
import functools
import importlib
import importlib.metadata
import json
import sys
import threading
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import BenchError

__all__ = [
    "BFCL_VERSION",
    "CATEGORIES",
    "MODEL_NAME",
    "MULTI_TURN",
    "SETUP_COMMAND",
    "SINGLE_TURN",
    "Entry",
    "bfcl_version",
    "compile_tools",
    "load_entries",
]

BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release boxmaker's BFCL runs are made and checked with."""

SETUP_COMMAND = f"pip install 'boxmaker[bench]' && pip install --no-deps bfcl-eval=={BFCL_VERSION}"
"""How to install BFCL's package without its dependencies (``boxmaker bench setup`` runs the
second half); the ``bench`` extra holds the light modules its checkers need."""

SINGLE_TURN = ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance")
"""BFCL's single-turn categories boxmaker runs: one question, one answer, its calls checked by
BFCL's AST checker (``irrelevance``: right when the answer makes no call)."""

MULTI_TURN = ("multi_turn_base",)
"""BFCL's multi-turn categories boxmaker runs: several user turns, the calls executed on BFCL's
stateful APIs and checked by its multi-turn checker (state and results after every turn)."""

CATEGORIES = SINGLE_TURN + MULTI_TURN
"""Every category boxmaker runs, in BFCL's order."""

MODEL_NAME = "boxmaker-FC"
"""The model name BFCL's checkers are given: a function-calling model whose function names
have ``.`` sent as ``_`` (``underscore_to_dot``)."""

_PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
"""What BFCL's inference adds to each function's description of a Python category."""

_OPENAPI_TYPES_MODULE = "bfcl_eval.constants.type_mappings"
_MODEL_CONFIG = "bfcl_eval.constants.model_config"
_AST_CHECKER = "bfcl_eval.eval_checker.ast_eval.ast_checker"
_MULTI_TURN_CHECKER = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker"
_MULTI_TURN_UTILS = "bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils"
_BACKEND_CONFIG = "bfcl_eval.constants.executable_backend_config"
_IMPORT_LOCK = threading.Lock()


def bfcl_version() -> str:
    """The installed ``bfcl-eval`` version.

    Raises:
        BenchError: it is not installed (the message gives :data:`SETUP_COMMAND`).
    """
    try:
        return importlib.metadata.version("bfcl-eval")
    except importlib.metadata.PackageNotFoundError:
        raise BenchError(
            f"BFCL's package is not installed: {SETUP_COMMAND} (or: boxmaker bench setup)"
        ) from None


def _module(name: str) -> types.ModuleType:
    """Import one of BFCL's light modules, or say how to install what it needs.

    Raises:
        BenchError: ``bfcl-eval`` or a module its checkers need (``mpmath``) is missing.
    """
    bfcl_version()
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise BenchError(
            f"BFCL's {name} cannot be imported ({exc}); the 'bench' extra holds what its "
            f"checkers need: {SETUP_COMMAND}"
        ) from exc


@functools.cache
def ast_checker() -> types.ModuleType:
    """BFCL's AST checker module, imported with the stand-in ``model_config`` (see the module
    docstring), whose one entry is :data:`MODEL_NAME`.

    Raises:
        BenchError: ``bfcl-eval`` is not installed.
    """
    bfcl_version()
    with _IMPORT_LOCK:
        if _AST_CHECKER in sys.modules:
            module = sys.modules[_AST_CHECKER]
        else:
            stand_in = types.ModuleType(_MODEL_CONFIG)
            stand_in.__doc__ = "boxmaker's stand-in: one function-calling model, no handlers"
            stand_in.MODEL_CONFIG_MAPPING = {}  # type: ignore[attr-defined]
            before = sys.modules.get(_MODEL_CONFIG)
            sys.modules[_MODEL_CONFIG] = stand_in
            try:
                module = _module(_AST_CHECKER)
            finally:
                if before is None:
                    sys.modules.pop(_MODEL_CONFIG, None)
                else:
                    sys.modules[_MODEL_CONFIG] = before
        mapping = module.MODEL_CONFIG_MAPPING
        if MODEL_NAME not in mapping:  # the real mapping, where BFCL is installed in full
            mapping[MODEL_NAME] = types.SimpleNamespace(underscore_to_dot=True, is_fc_model=True)
    return module


def multi_turn_checker() -> types.ModuleType:
    """BFCL's multi-turn checker module (``multi_turn_checker``).

    Raises:
        BenchError: ``bfcl-eval`` is not installed.
    """
    return _module(_MULTI_TURN_CHECKER)


def multi_turn_utils() -> types.ModuleType:
    """BFCL's executor of the multi-turn APIs (``execute_multi_turn_func_call``).

    Raises:
        BenchError: ``bfcl-eval`` is not installed.
    """
    return _module(_MULTI_TURN_UTILS)


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One BFCL test entry, as its files hold it.

    Attributes:
        id: BFCL's id (``simple_python_12``, ``multi_turn_base_3``).
        category: its category (one of :data:`CATEGORIES`).
        turns: the user message of each turn (BFCL v4's entries of these categories have one
            message a turn, none a system prompt).
        functions: the function docs as BFCL's checkers read them (no language hint).
        ground_truth: the possible answers (single-turn: a list of ``{name: {param:
            [allowed values]}}``; multi-turn: per turn, the calls as Python text); ``None``
            for ``irrelevance``, which has none.
        initial_config: a multi-turn entry's API state at the start (class name -> state).
        involved_classes: a multi-turn entry's API classes.
    """

    id: str
    category: str
    turns: tuple[str, ...]
    functions: tuple[Mapping[str, Any], ...]
    ground_truth: Any = None
    initial_config: Mapping[str, Any] = field(default_factory=dict)
    involved_classes: tuple[str, ...] = ()

    @property
    def multi_turn(self) -> bool:
        """Whether this is a multi-turn entry (its calls run on BFCL's APIs)."""
        return self.category in MULTI_TURN

    def tools(self) -> list[dict[str, Any]]:
        """The tools an OpenAI function-calling model is offered for this entry, as BFCL's
        inference offers them (:func:`compile_tools` of the docs with BFCL's Python hint)."""
        hinted = [dict(f, description=f["description"] + _PYTHON_HINT) for f in self.functions]
        return compile_tools(hinted)

    def prompt_entry(self) -> dict[str, Any]:
        """The entry as BFCL's evaluation reads it (``id``, ``question``, ``function``, and a
        multi-turn entry's ``initial_config`` and ``involved_classes``)."""
        out: dict[str, Any] = {
            "id": self.id,
            "question": [[{"role": "user", "content": t}] for t in self.turns],
            "function": copy.deepcopy([dict(f) for f in self.functions]),
        }
        if self.multi_turn:
            out["initial_config"] = copy.deepcopy(dict(self.initial_config))
            out["involved_classes"] = list(self.involved_classes)
        return out


def _read_lines(*parts: str) -> list[dict[str, Any]]:
    from importlib.resources import files

    path = files("bfcl_eval").joinpath("data", *parts)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchError(f"BFCL's data file {'/'.join(parts)} cannot be read: {exc}") from exc
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@functools.cache
def _func_docs(class_name: str) -> tuple[Mapping[str, Any], ...]:
    files = _module(_BACKEND_CONFIG).MULTI_TURN_FUNC_DOC_FILE_MAPPING
    return tuple(_read_lines("multi_turn_func_doc", files[class_name]))


@functools.cache
def load_entries(category: str) -> tuple[Entry, ...]:
    """Every entry of one BFCL v4 category, in the file's order, with its possible answers.

    Raises:
        BenchError: ``bfcl-eval`` is not installed, or ``category`` is none of
            :data:`CATEGORIES`.
    """
    if category not in CATEGORIES:
        raise BenchError(f"BFCL category {category!r} is none of {', '.join(CATEGORIES)}")
    bfcl_version()
    prefix = _module("bfcl_eval.constants.category_mapping").VERSION_PREFIX
    rows = _read_lines(f"{prefix}_{category}.json")
    answers: dict[str, Any] = {}
    if category != "irrelevance":
        answers = {
            a["id"]: a["ground_truth"]
            for a in _read_lines("possible_answer", f"{prefix}_{category}.json")
        }
    out = []
    for row in rows:
        classes = tuple(row.get("involved_classes", ()))
        functions = tuple(row.get("function", ()))
        if category in MULTI_TURN:
            functions = tuple(doc for name in classes for doc in _func_docs(name))
        turns = tuple(_user_message(row["id"], turn) for turn in row["question"])
        out.append(
            Entry(
                id=row["id"],
                category=category,
                turns=turns,
                functions=functions,
                ground_truth=answers.get(row["id"]),
                initial_config=row.get("initial_config", {}),
                involved_classes=classes,
            )
        )
    return tuple(out)


def _user_message(entry_id: str, turn: Sequence[Mapping[str, Any]]) -> str:
    if len(turn) != 1 or turn[0].get("role") != "user":
        raise BenchError(f"BFCL entry {entry_id}: a turn that is not one user message")
    return str(turn[0]["content"])


def compile_tools(functions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """BFCL function docs as OpenAI chat-completions tools, as BFCL offers them to an
    OpenAI-style function-calling model: ``.`` in a name becomes ``_`` (such models cannot
    take it), the parameters an ``object``, each type mapped by BFCL's ``GORILLA_TO_OPENAPI``
    (an unknown one, or none, ``string``; a ``float`` also gets ``format: float`` and says so
    in its description), nested properties and items mapped the same way.

    Args:
        functions: BFCL function docs (``name``, ``description``, ``parameters``).

    Returns:
        ``[{"type": "function", "function": {...}}, ...]``, new objects (the docs are not
        changed).
    """
    mapping = _module(_OPENAPI_TYPES_MODULE).GORILLA_TO_OPENAPI
    out = []
    for doc in functions:
        item = copy.deepcopy(dict(doc))
        item["name"] = item["name"].replace(".", "_")
        item["parameters"]["type"] = "object"
        item["parameters"]["properties"] = _typed(item["parameters"]["properties"], mapping)
        out.append({"type": "function", "function": item})
    return out


def _typed(properties: dict[str, Any], mapping: Mapping[str, str]) -> dict[str, Any]:
    """Each property's BFCL type as its OpenAPI type (see :func:`compile_tools`)."""
    for value in properties.values():
        given = value.get("type")
        if given == "float":
            value["format"] = "float"
            value["description"] += " This is a float type value."
        value["type"] = mapping.get(given, "string") if given is not None else "string"
        if value["type"] not in ("array", "object"):
            continue
        if "properties" in value:
            value["properties"] = _typed(value["properties"], mapping)
        elif "items" in value:
            items = value["items"]
            items["type"] = mapping[items["type"]]
            if items["type"] == "array" and "items" in items:
                items["items"]["type"] = mapping[items["items"]["type"]]
            elif items["type"] == "object" and "properties" in items:
                items["properties"] = _typed(items["properties"], mapping)
    return properties
