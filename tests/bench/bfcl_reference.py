"""BFCL's own evaluation, run in a process of its own: the reference of the agreement tests.

Reads JSON from stdin: ``{"cases": [{"category", "id", "result"}, ...], "tools": [ids]}``;
writes JSON to stdout: ``{"verdicts": [{"valid", "error_type"}...], "tools": {id: [...]},
"handler": name}``.

Each case goes through BFCL's own per-entry evaluation (``bfcl evaluate``'s
``_evaluate_single_ast_entry``, ``_evaluate_single_relevance_entry`` and
``_evaluate_single_multi_turn_entry``), with BFCL's own handler of an OpenAI chat-completions
function-calling model (its ``decode_ast`` and ``decode_execute``), the entries and possible
answers loaded by BFCL's own loader as ``evaluate_task`` loads them. ``tools`` asks for BFCL's
own tool compilation (``convert_to_tool``) of entries as its inference loads them.

BFCL's evaluation module imports every vendor's model handler, and boxmaker's environment has
none of their SDKs (``bfcl-eval`` is installed without its dependencies): each missing SDK is
a stand-in module whose names are inert classes. Nothing here calls a vendor; the stand-ins
only let BFCL's modules import. ``BFCL_PROJECT_ROOT`` points BFCL's result, score and lock
folders at a temporary folder (BFCL makes them when imported).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import tempfile
import types
from contextlib import redirect_stdout
from typing import Any

STAND_INS = {
    "anthropic",
    "cohere",
    "datamodel_code_generator",
    "google.genai",
    "mistralai",
    "qwen_agent",
    "tree_sitter",
    "tree_sitter_java",
    "tree_sitter_javascript",
    "writerai",
}
"""The vendor SDKs (and parsers of Java and JavaScript calls) BFCL's modules import at the top."""


class _Inert(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(name)

    def __getitem__(cls, item: Any) -> Any:
        return cls


def _inert(name: str) -> Any:
    return _Inert(
        name,
        (Exception,),
        {
            "__init__": lambda self, *a, **k: None,
            "__getattr__": lambda self, n: _inert(n)(),
            "__call__": lambda self, *a, **k: _inert("result")(),
        },
    )


class _StandIn(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _inert(name)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        parts = name.split(".")
        if not any(".".join(parts[:i]) in STAND_INS for i in range(1, len(parts) + 1)):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(name, path, target) is not None:
                    return None  # installed: the real one
            except (ImportError, AttributeError, ValueError):
                continue
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> Any:
        module = _StandIn(spec.name)
        module.__path__ = []  # a package: its submodules are stand-ins too
        return module

    def exec_module(self, module: Any) -> None:
        return None


def main() -> None:
    request = json.load(sys.stdin)
    os.environ["BFCL_PROJECT_ROOT"] = tempfile.mkdtemp(prefix="bfcl-root-")
    os.environ.setdefault("OPENAI_API_KEY", "not-used-by-the-checker")
    sys.meta_path.append(_Finder())
    with redirect_stdout(io.StringIO()):  # BFCL prints as it goes
        out = _evaluate(request)
    json.dump(out, sys.stdout)


def _evaluate(request: dict[str, Any]) -> dict[str, Any]:
    from bfcl_eval.constants.enums import Language, ModelStyle, ReturnFormat
    from bfcl_eval.constants.model_config import MODEL_CONFIG_MAPPING
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
    from bfcl_eval.eval_checker import eval_runner
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.model_handler.api_inference.openai_completion import OpenAICompletionsHandler
    from bfcl_eval.model_handler.utils import convert_to_tool
    from bfcl_eval.utils import load_dataset_entry, load_ground_truth_entry

    name = next(
        key
        for key, config in sorted(
            MODEL_CONFIG_MAPPING.items(), key=lambda i: not i[0].startswith("gpt")
        )
        if config.model_handler is OpenAICompletionsHandler
        and config.is_fc_model
        and config.underscore_to_dot
    )
    handler = eval_runner.get_handler(name)
    prompts: dict[str, dict[str, Any]] = {}
    answers: dict[str, Any] = {}
    verdicts = []
    for case in request["cases"]:
        category = case["category"]
        if category not in {p.rsplit("_", 1)[0] for p in prompts}:
            for entry in load_dataset_entry(
                category, include_prereq=False, include_language_specific_hint=False
            ):
                prompts[entry["id"]] = entry
            if category != "irrelevance":
                for answer in load_ground_truth_entry(category):
                    answers[answer["id"]] = answer["ground_truth"]
        prompt = json.loads(json.dumps(prompts[case["id"]]))
        if category == "irrelevance":
            got = eval_runner._evaluate_single_relevance_entry(
                handler, case["id"], case["result"], prompt, name, category
            )
        elif category.startswith("multi_turn"):
            for key in [k for k in vars(multi_turn_utils) if k.endswith("_instance")]:
                del vars(multi_turn_utils)[key]  # as in a process of its own per result
            got = eval_runner._evaluate_single_multi_turn_entry(
                handler, case["id"], case["result"], answers[case["id"]], prompt, name, category
            )
        else:
            got = eval_runner._evaluate_single_ast_entry(
                handler,
                case["id"],
                case["result"],
                answers[case["id"]],
                prompt,
                name,
                category,
                language=Language.PYTHON,
                return_format=ReturnFormat.PYTHON,
                has_tool_call_tag=False,
            )
        error_type = got.get("error_type") or (got.get("error") or {}).get("error_type", "")
        verdicts.append({"valid": bool(got["valid"]), "error_type": error_type})
    tools: dict[str, Any] = {}
    for entry_id in request.get("tools", []):
        category = entry_id.rsplit("_", 1)[0]
        entry = next(e for e in load_dataset_entry(category) if e["id"] == entry_id)
        tools[entry_id] = convert_to_tool(
            entry["function"], GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS
        )
    return {"verdicts": verdicts, "tools": tools, "handler": name}


if __name__ == "__main__":
    main()
