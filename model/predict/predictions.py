"""What :meth:`~model.predict.predictor.Predictor.predict` returns: probabilities, uncertainty
scores and abstention of Q queries, and one plain record per query (the rows ``regrab-predict``
writes and ``regrab-serve`` answers).

Shapes:
    Q queries, N ways (candidate relations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from model.predict.abstain import AbstainRule, written_scores


@dataclass
class Predictions:
    """Results of :meth:`Predictor.predict` for Q queries over the N ``relations``.

    Attributes:
        relations: the candidate relations, in column order of ``probs``.
        probs: (Q, N) predictive probabilities (rows sum to 1).
        scores: (Q,) per uncertainty score that applies (:data:`SCORES` order; larger is
            less sure).
        rule: which queries abstain (:class:`~model.predict.abstain.AbstainRule`).
    """

    relations: list[str]
    probs: np.ndarray
    scores: dict[str, np.ndarray]
    rule: AbstainRule

    def __len__(self) -> int:
        return len(self.probs)

    @property
    def best(self) -> list[str]:
        """The most probable relation of every query (abstaining or not)."""
        return [self.relations[i] for i in self.probs.argmax(1)]

    @property
    def confidence(self) -> np.ndarray:
        return self.probs.max(1)

    @property
    def entropy(self) -> np.ndarray:
        """(Q,) predictive entropy in nats."""
        return self.scores["entropy"]

    @property
    def mutual_information(self) -> np.ndarray:
        """(Q,) mutual information between prediction and prototypes in nats (0 for a head
        without posterior samples)."""
        return self.scores.get("mutual_information", np.zeros(len(self)))

    @property
    def abstain_score(self) -> np.ndarray | None:
        """(Q,) the score the rule compares (None when it never abstains for lack of one)."""
        return None if self.rule.score is None else self.scores[self.rule.score]

    @property
    def abstain(self) -> np.ndarray:
        return self.rule.abstain(self.scores, self.confidence)

    @property
    def labels(self) -> list[str | None]:
        """The prediction of every query, None where it abstains ("none of these")."""
        return [None if a else b for a, b in zip(self.abstain, self.best, strict=True)]

    def records(self) -> list[dict[str, Any]]:
        """One plain dict per query (JSON-ready; a score that does not apply is None), each
        score written as what its name says (``top_prob``: the top probability,
        :func:`~model.predict.abstain.written_scores`)."""
        scores = written_scores(self.scores, self.rule, len(self))
        return [
            {"prediction": label, "best": best, "confidence": float(conf), "abstain": bool(a),
             **scores[i],
             "probabilities": {r: float(p) for r, p in zip(self.relations, row, strict=True)}}
            for i, (label, best, conf, a, row) in enumerate(zip(
                self.labels, self.best, self.confidence, self.abstain, self.probs, strict=True))
        ]
