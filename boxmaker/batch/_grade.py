"""A model-graded scorer: a llama-server (or any chat-completions server) grades each run.

The grader is asked, in one request per run, whether the run's answer meets a criterion, and
answers ``GRADE: C`` (correct), ``GRADE: P`` (partly) or ``GRADE: I`` (incorrect): the
convention of Inspect AI's ``model_graded_qa`` scorer. The request (a chat-completions body,
temperature 0 and a fixed seed) and the grader's reply are kept with the score in
``scores.ndjson`` (:class:`~boxmaker.score.Score` ``request``/``reply``), so every grade can be
read back and checked; a reply without a grade is a failed score (value NaN) naming the reply.
Scores are computed once per (run, scorer, version): re-scoring offline keeps them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from ..client import ChatClient, Client
from ..records import Record, User
from ..score import Score, Scorer, answer_of

__all__ = ["GRADES", "GRADE_TEMPLATE", "model_graded"]

GRADES = {"C": 1.0, "P": 0.5, "I": 0.0}
"""The value of each grade letter (Inspect AI's ``model_graded_qa``: C, P, I)."""

GRADE_TEMPLATE = """You are grading the answer of an AI assistant to a task.

[Task]
{question}

[Answer]
{answer}

[Criterion]
{criterion}

Does the answer meet the criterion? Explain in one sentence, then end with exactly one line:
GRADE: C (it meets the criterion), GRADE: P (partly) or GRADE: I (it does not)."""
"""The grader's prompt; ``{question}`` (the run's user messages), ``{answer}`` (its last
answer) and ``{criterion}`` are filled in."""

_GRADE = re.compile(r"GRADE:\s*([CPI])\b")


def model_graded(
    client: ChatClient,
    criterion: str,
    *,
    name: str = "model_graded",
    version: str = "1",
    template: str = GRADE_TEMPLATE,
    max_tokens: int = 256,
    seed: int = 0,
    model: str | None = None,
) -> Scorer:
    """A scorer that asks a model whether each run's answer meets ``criterion``.

    Args:
        client: a chat client (:class:`boxmaker.client.Client` on the grader's server, or any
            :class:`~boxmaker.client.ChatClient`); one streamed request per run, with retries.
        criterion: what a right answer does, in words ("names the temperature in Lisbon").
        name, version: the scorer's, as in ``scores.ndjson``; bump ``version`` when the
            criterion, template or grader changes.
        template: the prompt (see :data:`GRADE_TEMPLATE` for its fields).
        max_tokens: the grader's reply at most (tokens).
        seed: the request's sampling seed (with temperature 0: the same grade again).
        model: the request's ``model`` (a server with several), ``None``: the server's own.

    Returns:
        A :class:`~boxmaker.score.Scorer`: value 1 (C), 0.5 (P) or 0 (I), the last grade
        letter of the reply counting; the explanation is the reply's text before it. A reply
        with no grade scores NaN with that error; the request and reply are kept either way.
        A grader that cannot be reached is a failed score (the error), never a crash.
        The client's api key is the scorer's ``secrets`` (hidden in ``scores.ndjson``).
    """

    def grade(records: Sequence[Record]) -> Score:
        question = "\n".join(r.content for r in records if isinstance(r, User))
        text = template.format(
            question=question, answer=answer_of(records) or "", criterion=criterion
        )
        body: dict[str, Any] = {
            "messages": [{"role": "user", "content": text}],
            "temperature": 0.0,
            "seed": seed,
            "max_tokens": max_tokens,
        }
        if model is not None:
            body["model"] = model
        reply = client.chat_with_retry(dict(body), lambda event: None).content or ""
        found = _GRADE.findall(reply)
        if not found:
            error = f"the grader's reply has no GRADE: C, P or I: {reply[-200:]!r}"
            return Score(value=float("nan"), error=error, request=body, reply=reply)
        why = reply[: reply.rfind("GRADE:")].strip() or f"GRADE: {found[-1]}"
        return Score(value=GRADES[found[-1]], explanation=why, request=body, reply=reply)

    key = client.config.api_key if isinstance(client, Client) else None
    return Scorer(name=name, fn=grade, version=version, secrets=(key,) if key else ())
