"""When a prediction abstains ("none of these"): a cutoff read from the model's validation
relations, never from test relations.

A checkpoint keeps, per setting, the quantiles of every uncertainty score on in-set queries of
its validation relations (:class:`~model.files.score_quantiles.ScoreQuantiles`, measured at the
end of training). With an abstain rate R, a query abstains when its abstain score is past the
quantile that leaves R of in-set queries beyond it, read for the support's own ways and shots
(:func:`cutoff_for`): the stored settings of the nearest ways, interpolated between their shots
at the support's mean 1/K (a way's expected squared distance to its prototype grows as 1 + 1/K,
so 1/K is the axis the scores move along), so about R of queries like the validation ones
abstain whatever the support's shots, equal or not. More ways than the setting's make every
score larger, and more queries abstain. The score is the setting's default (the one that best
told queries of other relations from in-set ones on validation episodes) unless another is
named. An explicit threshold P on the top probability overrides the rate and the score: a
query abstains when its top probability is below P.

Scores are computed "larger is less sure" (:mod:`model.evaluation.uncertainty`); the ones
that are one minus (or minus) a quantity are written as that quantity, under a name that says
so (:data:`WRITTEN`: ``top_prob`` is the top probability, not one minus it), and the rule reads
"below" for them.

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

#: Scores computed as ``offset - quantity``, written as the quantity: ``{score: (written
#: name, offset)}``. Larger written values are surer, so a query abstains below a cutoff.
WRITTEN = {"max_prob": ("top_prob", 1.0), "margin": ("top_gap", 1.0),
           "max_logit": ("top_logit", 0.0), "max_prob_ts": ("top_prob_ts", 1.0)}
#: What each score is written as in a prediction row, in :data:`SCORES` order.
SCORE_NAMES = tuple(WRITTEN.get(k, (k,))[0] for k in SCORES)


def written_name(score: str) -> str:
    """The name ``score`` is written under (``max_prob`` -> ``top_prob``)."""
    return WRITTEN.get(score, (score,))[0]


def written_value(score: str, value: float) -> float:
    """``value`` of ``score`` as written: the quantity itself (``1 - max_prob`` is the top
    probability), or ``value`` for a score that already is what its name says."""
    return WRITTEN[score][1] - value if score in WRITTEN else value


def score_key(name: str) -> str:
    """The score a written name (or a score's own name) stands for: ``top_prob`` ->
    ``max_prob``; an unknown name comes back as given."""
    return {w: k for k, (w, _) in WRITTEN.items()}.get(name, name)


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
    if score is not None and score_key(score) not in SCORES:
        raise PipelineError(f"abstain score {score!r} is unknown; give one of "
                            f"{', '.join(SCORE_NAMES)}")
    if threshold is None and not stored and (rate or score is not None):
        raise PipelineError(
            "this checkpoint stores no uncertainty on validation relations to set an abstain "
            f"{'rate' if rate else 'score'} by (an older version trained it); retrain it, or "
            "abstain by a threshold on the top probability (--threshold P) instead")


def inverse_shots(shots: Sequence[int]) -> float:
    """The support's mean 1/K over its ways, a zero-shot way counted as one shot."""
    return float(np.mean([1.0 / max(int(k), 1) for k in shots]))


def nearest(stored: Sequence[ScoreQuantiles], ways: int, shots: Sequence[int]
            ) -> ScoreQuantiles:
    """The stored setting nearest an N-way support with these per-way shots: the nearest N
    (the fewer of equals), then the nearest 1/K to the support's mean 1/K, then fewer shots."""
    x = inverse_shots(shots)
    return min(stored, key=lambda s: (abs(s.ways - ways), s.ways, abs(1.0 / s.shots - x),
                                      s.shots))


def cutoff_for(stored: Sequence[ScoreQuantiles], ways: int, shots: Sequence[int], score: str,
               level: float) -> tuple[float, list[ScoreQuantiles]]:
    """The ``level`` quantile of ``score`` on in-set validation queries, read for an N-way
    support with these per-way shots: among the stored settings of the nearest N that hold
    ``score``, linear in 1/K between the two whose shots bracket the support's mean 1/K
    (:func:`inverse_shots`), the nearest one's outside their range.

    Returns:
        The cutoff and the settings it was read from (one, or the two it lies between).
    """
    have = [s for s in stored if score in s.quantiles]
    ways_used = nearest(have, ways, shots).ways
    row = sorted((s for s in have if s.ways == ways_used), key=lambda s: 1.0 / s.shots)
    x = inverse_shots(shots)
    at = [float(np.interp(level, LEVELS, s.quantiles[score])) for s in row]
    xs = [1.0 / s.shots for s in row]
    same = [i for i, v in enumerate(xs) if abs(v - x) < 1e-9]  # a mean 1/K of 0.2 may be 0.2+eps
    if same or x < xs[0] or x > xs[-1]:
        i = same[0] if same else (0 if x < xs[0] else len(row) - 1)
        return at[i], [row[i]]
    i = int(np.searchsorted(xs, x))  # xs[i - 1] < x < xs[i]
    return float(np.interp(x, xs[i - 1 : i + 1], at[i - 1 : i + 1])), [row[i], row[i - 1]]


def describe_support(ways: int, shots: Sequence[int]) -> str:
    """``3-way 2-shot`` or ``5-way 1-5-shot (mean 1/K 0.44)``, for the rule's text."""
    low, high = min(shots), max(shots)
    if low == high:
        return f"{ways}-way {low}-shot"
    return f"{ways}-way {low}-{high}-shot (mean 1/K {inverse_shots(shots):.2g})"


@dataclass(frozen=True)
class AbstainRule:
    """Which queries abstain.

    Attributes:
        score: the uncertainty score compared (:data:`SCORES`' name, larger less sure;
            written as :attr:`written`; None: none).
        cutoff: a query abstains when its ``score`` is above this (None: by ``threshold``,
            or never).
        threshold: an explicit threshold on the top probability (replaces the cutoff).
        setting: the stored validation setting nearest the support, whose temperature the
            ``_ts`` scores use (None: none used).
        text: what the rule is, for the summary line.
    """

    score: str | None
    cutoff: float | None
    threshold: float | None
    setting: ScoreQuantiles | None
    text: str

    @property
    def written(self) -> str | None:
        """The name the abstain score is written under in a prediction row."""
        return None if self.score is None else written_name(self.score)

    @property
    def written_cutoff(self) -> float | None:
        """The cutoff on the written score (a query abstains below it for :data:`WRITTEN`
        scores, above it for the others)."""
        if self.cutoff is None or self.score is None:
            return None
        return written_value(self.score, self.cutoff)

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


def make_rule(stored: Sequence[ScoreQuantiles], ways: int, shots: Sequence[int],
              rate: float | None, score: str | None, threshold: float | None,
              method: str) -> AbstainRule:
    """The rule for an N-way support with these per-way shots.

    Args:
        stored: the checkpoint's validation settings (empty for an older checkpoint).
        ways, shots: the support's N and each way's K (0 for a zero-shot way).
        rate: share of validation-like queries to abstain on (None: :data:`DEFAULT_RATE`
            when there are stored settings, else never).
        score: the score to abstain by, its written name or its own (None: the nearest
            setting's default).
        threshold: an explicit top-probability threshold; overrides ``rate`` and ``score``.
        method: the checkpoint's method, named in errors.
    """
    check_request(rate, score, threshold, stored)
    setting = nearest(stored, ways, shots) if stored else None
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
    name = score_key(score) if score else (
        setting.default if setting.default in have else "max_prob")
    if name not in have:
        why = ("it has no posterior samples" if name in POSTERIOR_SCORES
               else "it stores no such score for its validation relations")
        raise PipelineError(f"abstain score {written_name(name)} does not apply to this "
                            f"{method} checkpoint ({why}); give one of "
                            f"{', '.join(written_name(k) for k in have)}")
    shown = written_name(name)
    rate = DEFAULT_RATE if rate is None else rate
    if rate == 0:
        return AbstainRule(name, None, None, setting,
                           f"never (abstain rate 0; abstain_score holds {shown})")
    cutoff, used = cutoff_for(stored, ways, shots, name, 1.0 - rate)
    support = describe_support(ways, shots)
    where = (f"validation setting {used[0].name}, nearest this {support} support"
             if len(used) == 1 else
             f"validation settings {used[0].name} and {used[1].name}, interpolated in 1/K "
             f"for this {support} support")
    if name in WRITTEN:
        return AbstainRule(name, cutoff, None, setting,
                           f"{shown} below {written_value(name, cutoff):.4g}, its {rate:.4g} "
                           f"quantile on in-set queries of the checkpoint's {where}")
    return AbstainRule(name, cutoff, None, setting,
                       f"{shown} above {cutoff:.4g}, its {1.0 - rate:.4g} quantile on in-set "
                       f"queries of the checkpoint's {where}")


#: Uncertainty scores written beside ``entropy`` and ``mutual_information`` (null where they
#: do not apply), and their columns in a prediction row.
OTHER_SCORES = tuple(k for k in SCORES if k not in ("entropy", "mutual_information"))
OTHER_COLUMNS = tuple(written_name(k) for k in OTHER_SCORES)


def written_scores(scores: dict[str, np.ndarray], rule: AbstainRule, count: int
                   ) -> list[dict[str, float | None]]:
    """Per query, ``abstain_score``, ``entropy``, ``mutual_information`` (0 without posterior
    samples) and the :data:`OTHER_COLUMNS` (None where a score does not apply), each written
    as what its name says (:func:`written_value`).

    Shapes:
        scores: each (Q,) with Q = ``count``
    """
    def column(key: str) -> list[float | None]:
        values = scores.get(key)
        return [None] * count if values is None else [written_value(key, float(v))
                                                      for v in values]

    cols = {"abstain_score": [None] * count if rule.score is None else column(rule.score),
            "entropy": column("entropy"),
            "mutual_information": column("mutual_information") if "mutual_information"
            in scores else [0.0] * count,
            **{written_name(k): column(k) for k in OTHER_SCORES}}
    return [{k: v[i] for k, v in cols.items()} for i in range(count)]
