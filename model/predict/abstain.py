"""When a prediction abstains ("none of these"): a cutoff read from the model's validation
relations, never from test relations.

A checkpoint keeps, per setting, the quantiles of every uncertainty score on in-set queries of
its validation relations (:class:`~model.files.score_quantiles.ScoreQuantiles`, measured at the
end of training). With an abstain rate R, a query abstains when its abstain score is above the
(1 - R) quantile of that score in the stored setting closest to the support (shots first: the
smallest K of the support; then ways), so about R of queries like the validation ones abstain.
More ways than the setting's make every score larger, and more queries abstain. The score is
the setting's default (the one that best told queries of other relations from in-set ones on
validation episodes) unless another is named. An explicit threshold P on the top probability
overrides the rate and the score: a query abstains when its top probability is below P.

A checkpoint without stored scores (written by an older version) abstains only with a
threshold; asking it for a rate above 0 is an error that says what to do instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from model.evaluation.uncertainty import POSTERIOR_SCORES, SCORES
from model.files.score_quantiles import LEVELS, ScoreQuantiles
from pipeline.errors import PipelineError

#: The share of validation-like queries abstained on unless the user gives another.
DEFAULT_RATE = 0.05


def check_request(rate: float | None, score: str | None, threshold: float | None,
                  stored: Sequence[ScoreQuantiles]) -> None:
    """Refuse an abstain rate, score or threshold that cannot be used, before any work.

    Raises:
        PipelineError: one line naming the value and what to give instead.
    """
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise PipelineError(f"threshold {threshold} is not a probability in [0, 1]")
    if rate is not None and not 0.0 <= rate < 1.0:
        raise PipelineError(f"abstain rate {rate} is not a share in [0, 1): give the share of "
                            "validation-like queries to abstain on, e.g. 0.05, or 0 to never "
                            "abstain")
    if score is not None and score not in SCORES:
        raise PipelineError(f"abstain score {score!r} is unknown; give one of "
                            f"{', '.join(SCORES)}")
    if threshold is None and not stored and (rate or score is not None):
        raise PipelineError(
            "this checkpoint stores no uncertainty on validation relations to set an abstain "
            f"{'rate' if rate else 'score'} by (an older version trained it); retrain it, or "
            "abstain by a threshold on the top probability (--threshold P) instead")


def closest(stored: Sequence[ScoreQuantiles], ways: int, shots: int) -> ScoreQuantiles:
    """The stored setting closest to an N-way support whose smallest K is ``shots``: the
    nearest K, then the nearest N, then the fewer shots."""
    return min(stored, key=lambda s: (abs(s.shots - shots), abs(s.ways - ways), s.shots))


@dataclass(frozen=True)
class AbstainRule:
    """Which queries abstain.

    Attributes:
        score: the uncertainty score written as each query's ``abstain_score`` (None: none).
        cutoff: a query abstains when its score is above this (None: by ``threshold``, or
            never).
        threshold: an explicit threshold on the top probability (replaces the cutoff).
        setting: the stored validation setting the cutoff comes from (None: none used).
        text: what the rule is, for the summary line.
    """

    score: str | None
    cutoff: float | None
    threshold: float | None
    setting: ScoreQuantiles | None
    text: str

    @property
    def temperature(self) -> float | None:
        """The validation temperature of the setting, for the ``_ts`` scores."""
        return None if self.setting is None else self.setting.temperature

    def abstain(self, scores: dict[str, np.ndarray], confidence: np.ndarray) -> np.ndarray:
        """(Q,) whether each query abstains, from its scores and top probability."""
        if self.threshold is not None:
            return confidence < self.threshold
        if self.cutoff is None or self.score is None:
            return np.zeros(len(confidence), dtype=bool)
        return scores[self.score] > self.cutoff


def make_rule(stored: Sequence[ScoreQuantiles], ways: int, shots: int, rate: float | None,
              score: str | None, threshold: float | None, method: str) -> AbstainRule:
    """The rule for an N-way support whose smallest K is ``shots``.

    Args:
        stored: the checkpoint's validation settings (empty for an older checkpoint).
        ways, shots: the support's N and smallest K.
        rate: share of validation-like queries to abstain on (None: :data:`DEFAULT_RATE`
            when there are stored settings, else never).
        score: the score to abstain by (None: the setting's default).
        threshold: an explicit top-probability threshold; overrides ``rate`` and ``score``.
        method: the checkpoint's method, named in errors.
    """
    check_request(rate, score, threshold, stored)
    setting = closest(stored, ways, shots) if stored else None
    if threshold is not None:
        given = " (overrides the abstain rate and score)" if rate or score else ""
        return AbstainRule("max_prob", None, threshold, setting,
                           f"top probability below the threshold {threshold:g}{given}")
    if setting is None:
        return AbstainRule(None, None, None, None,
                           "never: this checkpoint stores no uncertainty on validation "
                           "relations (an older version trained it); retrain it, or give a "
                           "threshold on the top probability")
    have = [k for k in SCORES if k in setting.quantiles]
    name = score or (setting.default if setting.default in have else "max_prob")
    if name not in have:
        why = ("it has no posterior samples" if name in POSTERIOR_SCORES
               else "it stores no such score for its validation relations")
        raise PipelineError(f"abstain score {name} does not apply to this {method} checkpoint "
                            f"({why}); give one of {', '.join(have)}")
    where = (f"validation setting {setting.name}, closest to this {ways}-way {shots}-shot "
             "support")
    rate = DEFAULT_RATE if rate is None else rate
    if rate == 0:
        return AbstainRule(name, None, None, setting,
                           f"never (abstain rate 0; abstain_score holds {name})")
    cutoff = float(np.interp(1.0 - rate, LEVELS, setting.quantiles[name]))
    return AbstainRule(name, cutoff, None, setting,
                       f"{name} above {cutoff:.4g}, its {1.0 - rate:.4g} quantile on in-set "
                       f"queries of the checkpoint's {where}")
