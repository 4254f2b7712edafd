"""BFCL's verdict on a run: boxmaker's records as BFCL's model result, checked by BFCL's code.

Two steps, each as BFCL's evaluation (``bfcl evaluate``) takes them for an OpenAI-style
function-calling model:

1. :func:`model_result`: what BFCL's inference would have recorded for the run. A step (one
   completion) is ``[{name: arguments text}, ...]`` when it made calls, else its content text.
   A single-turn entry's result is its first step (BFCL asks once); a multi-turn entry's is a
   list of turns, each a list of steps. A turn a limit ended with calls still to run is where
   BFCL's step limit would have stopped the whole entry (its later turns are not there); a run
   whose completion failed (the context full, the server gone) is an inference error text, as
   BFCL writes one.
2. :func:`verdict`: BFCL's per-entry evaluation of that result: decoding (arguments parsed as
   JSON; a multi-turn step as Python call text, as BFCL executes it), the format checks, then
   BFCL's own ``ast_checker`` (single-turn), the "no call" rule (``irrelevance``) or
   ``multi_turn_checker`` (the calls executed on BFCL's APIs from the entry's initial state,
   compared with the ground truth's state and results after every turn).

The decoding is boxmaker's own few lines (BFCL keeps it in its model handlers, which import
every vendor's SDK); ``tests/bench`` holds it, and the whole verdict, to BFCL's own evaluation
on hand-made right and wrong outputs for every category.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..records import Assistant, Record, TurnEnd, User
from ._bfcl import MODEL_NAME, Entry, ast_checker, multi_turn_checker, multi_turn_utils

__all__ = ["Verdict", "call_text", "model_result", "verdict"]

_NORMAL_ENDS = frozenset({"answered", "length", "answered_after_limit", "tool_call_in_content"})
"""Turn outcomes after which BFCL's inference would go on with the next turn: the model
answered (or was cut at ``max_tokens``, or wrote a call as text, which BFCL's decoder skips)."""

_STOPPED = frozenset(
    {"tool_iterations", "repeated_call", "loop", "completions", "tool_calls", "tool_arguments"}
)
"""Turn outcomes of a loop limit that stopped the model while it was still calling tools: BFCL's
step limit (``MAXIMUM_STEP_LIMIT``) stops the whole entry there."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFUSED = "_boxmaker_refused_call()"
"""What a call whose name or argument names are not plain identifiers becomes before BFCL
executes it (BFCL ``eval``s the call text): a call of nothing, which BFCL's executor answers
"Error during execution: ...", as it answers a call it cannot run."""

_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """BFCL's verdict on one run.

    Attributes:
        valid: BFCL counts the entry right.
        error_type: BFCL's error type when not (``simple_function_checker:wrong_count``,
            ``multi_turn:instance_state_mismatch``...), ``""`` when valid.
        error: BFCL's error message(s), joined.
    """

    valid: bool
    error_type: str = ""
    error: str = ""


def model_result(entry: Entry, records: Sequence[Record]) -> Any:
    """What BFCL's inference would have recorded for a run of ``entry`` with these records
    (see the module docstring): a step list or text (single-turn), a list of turns of steps
    (multi-turn), or ``"Error during inference: ..."`` for a run without an answer."""
    turns = _turns(records)
    if not entry.multi_turn:
        if not turns or not turns[0][0]:
            outcome = turns[0][1] if turns else "no_turn"
            return f"Error during inference: the run has no completion ({outcome})"
        return turns[0][0][0]
    out: list[list[Any]] = []
    for steps, outcome in turns:
        if outcome not in _NORMAL_ENDS and outcome not in _STOPPED:
            return f"Error during inference: a turn ended {outcome}"
        out.append(steps)
        if outcome in _STOPPED:
            break  # BFCL's step limit: the entry stops here
    return out


def _turns(records: Sequence[Record]) -> list[tuple[list[Any], str]]:
    """Per turn of ``records``: its steps (each completion as BFCL records it) and outcome."""
    out: list[tuple[list[Any], str]] = []
    for record in records:
        if isinstance(record, User):
            out.append(([], "open"))
        elif isinstance(record, Assistant) and out:
            calls = [{c.name: c.arguments} for c in record.tool_calls]
            out[-1][0].append(calls if calls else record.content)
        elif isinstance(record, TurnEnd) and out:
            out[-1] = (out[-1][0], record.outcome)
    return out


def verdict(entry: Entry, result: Any) -> Verdict:
    """BFCL's per-entry evaluation of ``result`` (a :func:`model_result`) for ``entry``.

    Raises:
        BenchError: ``bfcl-eval`` is not installed.
    """
    if entry.multi_turn:
        return _multi_turn(entry, result)
    if entry.category == "irrelevance":
        return _irrelevance(result)
    return _ast(entry, result)


def _decode_ast(result: Any) -> list[dict[str, Any]]:
    """A function-calling model's step as BFCL's AST input: ``[{name: {param: value}}]``
    (raises, as BFCL's decoder does, for a text or arguments that are not JSON)."""
    decoded = []
    for item in result:
        name = next(iter(item.keys()))
        decoded.append({name: json.loads(item[name])})
    return decoded


def _calls_format(decoded: Any) -> bool:
    """BFCL's check that a decoded step is a list of ``{name: {params}}`` (``[]`` included)."""
    return isinstance(decoded, list) and all(
        isinstance(item, dict) and len(item) == 1 and isinstance(next(iter(item.values())), dict)
        for item in decoded
    )


def _no_call(decoded: Any) -> bool:
    """BFCL's "no function call" for a decoded step: not in the calls format, ``[]`` or
    ``[{}]``."""
    return not _calls_format(decoded) or not decoded or (len(decoded) == 1 and not decoded[0])


def _ast(entry: Entry, result: Any) -> Verdict:
    try:
        decoded = _decode_ast(result)
    except Exception as exc:
        why = f"Invalid syntax. Failed to decode AST. {exc}"
        return Verdict(valid=False, error_type="ast_decoder:decoder_failed", error=why)
    if not _calls_format(decoded):
        why = "Did not output in the specified format."
        return Verdict(valid=False, error_type="ast_decoder:decoder_wrong_output_format", error=why)
    language = ast_checker().Language.PYTHON
    checked = ast_checker().ast_checker(
        [dict(f) for f in entry.functions],
        decoded,
        entry.ground_truth,
        language,
        entry.category,
        MODEL_NAME,
    )
    return _of(checked)


def _irrelevance(result: Any) -> Verdict:
    try:
        called = not _no_call(_decode_ast(result))
    except Exception:
        called = False  # not a call BFCL can decode: no call
    if called:
        why = "Valid syntax. Successfully decode AST when it should not."
        return Verdict(valid=False, error_type="irrelevance_error:decoder_success", error=why)
    return Verdict(valid=True)


def call_text(name: str, arguments: Any) -> str:
    """One call as the Python text BFCL's executor runs: ``name(k=repr(v),...)`` (how BFCL
    turns a function-calling model's call into an executable one); a name or argument name
    that is no plain identifier gives a call of nothing (BFCL ``eval``s the text, and answers
    what it cannot run with an execution error).

    Raises:
        ValueError, TypeError: ``arguments`` is text that is not JSON, or not an object.
    """
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    pairs = args.items()  # AttributeError for a JSON value that is no object, as in BFCL
    if not _IDENTIFIER.fullmatch(name) or not all(
        isinstance(k, str) and _IDENTIFIER.fullmatch(k) for k, _ in pairs
    ):
        return _REFUSED
    return f"{name}({','.join(f'{k}={v!r}' for k, v in pairs)})"


def _decode_execute(step: Any) -> list[str]:
    """A function-calling model's step as BFCL's executable call texts (raises, as BFCL's
    decoder does, for a text)."""
    items = [step] if isinstance(step, dict) else step
    return [call_text(name, value) for item in items for name, value in item.items()]


def _multi_turn(entry: Entry, result: Any) -> Verdict:
    truth = entry.ground_truth
    if not isinstance(result, list):
        why = "Error during inference phase. Model did not output a list of model responses."
        return Verdict(valid=False, error_type="multi_turn:inference_error", error=why)
    if len(result) != len(truth):
        why = (
            "Model was force-terminated during inference phase: "
            f"{len(result)} turns of {len(truth)}."
        )
        return Verdict(valid=False, error_type="multi_turn:force_terminated", error=why)
    utils = multi_turn_utils()
    decoded: list[list[list[str]]] = []
    for steps in result:
        turn: list[list[str]] = []
        for step in steps:
            try:
                calls = _decode_execute(step)
            except Exception:
                continue  # BFCL skips a step it cannot decode (the model chatting)
            if not utils.is_empty_execute_response(calls):
                turn.append(calls)
        decoded.append(turn)
    checker = multi_turn_checker()
    # BFCL keeps each entry's API instances in its executor's module globals, named by model
    # and entry: a name of this scoring's own, dropped afterwards, starts every check afresh
    model = f"{MODEL_NAME.replace('-', '_')}_{uuid.uuid4().hex}"
    try:
        checked = checker.multi_turn_checker(
            decoded, truth, entry.prompt_entry(), entry.category, model
        )
    finally:
        forget_instances(model)
    return _of(checked)


def forget_instances(model: str) -> None:
    """Drop the API instances BFCL's executor keeps for ``model`` (its module globals)."""
    utils = multi_turn_utils()
    prefix = re.sub(r"[-./:]", "_", model)
    with _LOCK:
        for name in [n for n in vars(utils) if n.startswith(prefix)]:
            vars(utils).pop(name, None)


def _of(checked: dict[str, Any]) -> Verdict:
    if checked.get("valid"):
        return Verdict(valid=True)
    error = checked.get("error", checked.get("error_message", ""))
    text = "; ".join(map(str, error)) if isinstance(error, list) else str(error)
    return Verdict(valid=False, error_type=str(checked.get("error_type", "")), error=text)
