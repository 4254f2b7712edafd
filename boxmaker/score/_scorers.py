"""Scorers: a name, a version and a function of a run's records that says how right it was.

A scorer is any callable taking a session's records (:class:`~boxmaker.records.Record`, in
log order) and returning a :class:`Score`, a ``bool`` or a number in ``[0, 1]``; wrap it in
:class:`Scorer` to give it a name and a version (the version goes into ``scores.ndjson``, so a
changed scorer can be told from the old one). :func:`target_scorer` makes the scorer of a
task's :class:`~boxmaker.score.Target`. :func:`apply` runs one scorer and never raises: an
exception becomes a score with ``value`` NaN and the error named.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..records import Record
from ._match import answer_of, calls_of, match_answer, match_trajectory
from ._targets import Target

__all__ = ["TARGET_SCORER", "Score", "Scorer", "apply", "target_scorer"]

TARGET_SCORER = "target"
"""The name of the scorer made from a task's target."""


@dataclass(frozen=True, kw_only=True)
class Score:
    """How right one run was.

    Attributes:
        value: in ``[0, 1]`` (1 right, 0 wrong; a fraction for partial credit); NaN when the
            scorer failed (``error`` says why).
        explanation: why, in a sentence or two.
        error: the scorer's exception (``"ValueError: ..."``), ``None`` when it ran.
        request: what a model-graded scorer sent (the chat-completions body), ``None`` for
            others; kept with the score in ``scores.ndjson`` so a grade can be checked.
        reply: the grader's answer text, ``None`` for others.
    """

    value: float
    explanation: str = ""
    error: str | None = None
    request: Mapping[str, Any] | None = None
    reply: str | None = None


ScoreFunction = Callable[[Sequence[Record]], "Score | bool | float"]
"""The function of a scorer: a run's records in, a score out."""


@dataclass(frozen=True, kw_only=True)
class Scorer:
    """A named, versioned scorer.

    Attributes:
        name: names the scorer in ``scores.ndjson`` and the frames (``"target"`` is taken by
            the targets' scorer).
        fn: the function (see :data:`ScoreFunction`).
        version: bump it when ``fn`` changes, so old and new scores are told apart.
        secrets: credentials the scorer uses (a model grader's api key): written as
            ``<API_KEY>`` wherever they appear in ``scores.ndjson`` (a grader that echoes its
            key), by the rule the session logs and cassettes are scrubbed by.
    """

    name: str
    fn: ScoreFunction
    version: str = "1"
    secrets: tuple[str, ...] = ()


def target_scorer(target: Target) -> Scorer:
    """The scorer of ``target``: 1 when every given part (answer, trajectory) matches, else 0,
    with each part's reason in the explanation."""

    def score(records: Sequence[Record]) -> Score:
        parts: list[tuple[bool, str]] = []
        if target.answer is not None:
            parts.append(match_answer(target.answer, answer_of(records)))
        if target.trajectory is not None:
            parts.append(match_trajectory(target.trajectory, calls_of(records)))
        ok = all(p[0] for p in parts)
        return Score(value=1.0 if ok else 0.0, explanation="; ".join(p[1] for p in parts))

    return Scorer(name=TARGET_SCORER, fn=score, version="1")


def apply(scorer: Scorer, records: Sequence[Record]) -> Score:
    """Run ``scorer`` on ``records``: its score, or a NaN score naming the error it raised or
    the value it returned that is not a score (a number outside ``[0, 1]``, a string...).
    Never raises (``KeyboardInterrupt`` and ``SystemExit`` excepted)."""
    try:
        out = scorer.fn(records)
    except Exception as exc:
        return Score(value=math.nan, error=f"{type(exc).__name__}: {exc}")
    asked: dict[str, Any] = {}
    if isinstance(out, Score):
        if out.error is not None:
            return out
        value, explanation = out.value, out.explanation
        asked = {"request": out.request, "reply": out.reply}
    elif isinstance(out, bool | int | float):
        value, explanation = float(out), ""
    else:
        return Score(value=math.nan, error=f"the scorer returned {type(out).__name__}")
    if not 0.0 <= value <= 1.0:
        why = f"the scorer returned {value!r}, not in [0, 1]"
        return Score(value=math.nan, error=why, **asked)
    return Score(value=value, explanation=explanation, **asked)
