"""What a checkpoint keeps of a trained model's uncertainty on its validation relations.

:class:`ScoreQuantiles` is one setting's record, checked down to every number when a file is
read (a file may come from anybody): counts are counts, quantiles are finite and
non-decreasing, the default score is one of the stored ones. The checkpoint record
(:mod:`model.files.checkpoint`) stores a tuple of them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Stored quantiles of each uncertainty score: at 0, 0.01, ..., 1 (:data:`LEVELS`).
QUANTILE_LEVELS = 101
LEVELS = np.linspace(0.0, 1.0, QUANTILE_LEVELS)
#: The most settings, and scores per setting, a checkpoint may store (training writes 2 and 8).
MAX_VAL_SETTINGS, MAX_VAL_SCORES = 16, 32
_SCORE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")


@dataclass(frozen=True)
class ScoreQuantiles:
    """A trained model's uncertainty on in-set queries of its validation relations (never
    test) in one setting: what ``regrab-predict`` abstains by (measured at the end of
    training, :mod:`model.training.val_scores`).

    Attributes:
        ways: N of the validation episodes (the setting's, capped by the validation relations).
        shots: their K.
        queries: in-set queries scored.
        temperature: fitted on those queries (None: not fitted).
        quantiles: per uncertainty score (:mod:`model.evaluation.uncertainty`), its
            :data:`QUANTILE_LEVELS` quantiles at 0, 0.01, ..., 1 (non-decreasing).
        default: the score abstained on unless the user picks another.
        auroc: per score, its AUROC (%) for outside queries against in-set ones (empty when
            no validation relation was left to draw outside queries from).
        reason: how ``default`` was chosen, in words.
    """

    ways: int
    shots: int
    queries: int
    temperature: float | None
    quantiles: dict[str, tuple[float, ...]]
    default: str
    auroc: dict[str, float]
    reason: str

    @property
    def name(self) -> str:
        return f"{self.ways}w{self.shots}s"

    @classmethod
    def parse(cls, tree: Any) -> ScoreQuantiles:
        """A stored setting; raises ValueError naming what is malformed."""
        names = [f.name for f in dataclasses.fields(cls)]
        if not isinstance(tree, dict) or set(tree) != set(names):
            raise ValueError(f"a setting is not a record of {', '.join(names)}")
        ways, shots, queries = (_count(tree[k], k) for k in ("ways", "shots", "queries"))
        if ways < 2 or queries < 1:
            raise ValueError(f"{ways} ways or {queries} queries")
        tau = tree["temperature"]
        if tau is not None and not _number(tau) > 0:
            raise ValueError(f"temperature {str(tau)[:20]} is not a positive number")
        quantiles, auroc = tree["quantiles"], tree["auroc"]
        if not isinstance(quantiles, dict) or not 1 <= len(quantiles) <= MAX_VAL_SCORES:
            raise ValueError(f"quantiles are not 1 to {MAX_VAL_SCORES} scores")
        for score, values in quantiles.items():
            if not isinstance(score, str) or not _SCORE_NAME.match(score):
                raise ValueError(f"score name {str(score)[:40]!r} is not a score")
            if not isinstance(values, list) or len(values) != QUANTILE_LEVELS:
                raise ValueError(f"{score} quantiles are not a list of {QUANTILE_LEVELS}")
            v = [_number(x) for x in values]
            if any(b < a for a, b in zip(v, v[1:], strict=False)):
                raise ValueError(f"{score} quantiles decrease")
        if not isinstance(auroc, dict) or not set(auroc) <= set(quantiles) or not all(
                0 <= _number(x) <= 100 for x in auroc.values()):
            raise ValueError("auroc is not a percentage per stored score")
        if not isinstance(tree["default"], str) or tree["default"] not in quantiles:
            raise ValueError(f"default {str(tree['default'])[:40]!r} is not a stored score")
        if not isinstance(tree["reason"], str) or len(tree["reason"]) > 1000:
            raise ValueError("reason is not a short text")
        return cls(ways, shots, queries, None if tau is None else float(tau),
                   {k: tuple(float(x) for x in v) for k, v in quantiles.items()},
                   tree["default"], {k: float(x) for k, x in auroc.items()}, tree["reason"])


def _number(value: Any) -> float:
    """``value`` as a finite float; ValueError for anything else (NaN, text, True)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(
            value):
        raise ValueError(f"{str(value)[:20]} is not a finite number")
    return float(value)


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 10**9:
        raise ValueError(f"{what} {str(value)[:20]} is not a count")
    return value
