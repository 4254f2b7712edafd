"""Did the agent get it right: targets, scorers and success rates with confidence intervals.

Pure: a run's records in, a score out (no network, no files). A batch task's ``target``
(:func:`parse_target`: the answer and the tool trajectory a right run has) gives the
``"target"`` scorer; any function of a run's records is a scorer too (:class:`Scorer`).
:func:`paired_bootstrap` gives each setting's success rate and its difference to a baseline
with percentile intervals, resampling tasks (paired). Scoring a batch folder and comparing its
settings is :func:`boxmaker.batch.score_batch` and :func:`boxmaker.batch.compare`.
"""

from .._public import publish
from ._match import answer_of, calls_of, match_answer, match_trajectory
from ._scorers import TARGET_SCORER, Score, Scorer, apply, target_scorer
from ._stats import Bootstrap, paired_bootstrap
from ._targets import (
    ANSWER_MATCHERS,
    TRAJECTORY_MODES,
    AnswerTarget,
    CallTarget,
    Target,
    TrajectoryTarget,
    parse_target,
)

__all__ = [
    "ANSWER_MATCHERS",
    "TARGET_SCORER",
    "TRAJECTORY_MODES",
    "AnswerTarget",
    "Bootstrap",
    "CallTarget",
    "Score",
    "Scorer",
    "Target",
    "TrajectoryTarget",
    "answer_of",
    "apply",
    "calls_of",
    "match_answer",
    "match_trajectory",
    "paired_bootstrap",
    "parse_target",
    "target_scorer",
]

publish(globals(), __all__)
