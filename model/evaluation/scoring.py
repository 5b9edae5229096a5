"""Per-query predictions and what to say about them: probabilities, uncertainty, calibration.

Pure functions on arrays, shared by :mod:`model.evaluation.splits` and the predict command:

* :func:`score_episodes` runs a head over cached encodings and returns the predictive
  log-probabilities of every query (REGRAB: the average over its S posterior samples, Eq. 11;
  proto and mtb: their softmax) and :class:`EpisodeScores` (prediction, confidence, label).
* the uncertainty scores of every query come from :mod:`model.evaluation.uncertainty`.
* :func:`reliability_bins`, :func:`expected_calibration_error`: calibration of the
  max-probability confidence in equal-width bins (Guo et al., 2017; 15 bins by default).
* :func:`selective_accuracy`, :func:`aurc`: accuracy when abstaining on the least confident
  queries, and the area under the risk-coverage curve (Geifman and El-Yaniv, 2017).
* :func:`nota_correct`, :func:`best_threshold`: none-of-the-above scoring by abstention.

Confidence is the predictive probability of the predicted way, in [0, 1].

Shapes:
    B episodes, S posterior samples, N ways, K shots, Q queries of an episode (all ways
    together), D encoding size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from model.episodes import log_predictive_batches
from model.evaluation.uncertainty import mc_log_probs, uncertainty_scores

#: Batches of episodes from which scoring shows a progress bar (on a terminal).
PROGRESS_BATCHES = 100
#: Label of a query whose relation is none of the episode's N ways (NOTA episodes).
OUTSIDE = -1


@dataclass(frozen=True)
class EpisodeScores:
    """What a method answered for every query of B episodes.

    Attributes:
        prediction: (B, Q) index of the predicted way.
        confidence: (B, Q) predictive probability of that way.
        label: (B, Q) index of the true way, :data:`OUTSIDE` for a NOTA query.
        uncertainty: score name -> (B, Q) (:func:`model.evaluation.uncertainty.uncertainty_scores`;
            empty when not computed).
    """

    prediction: np.ndarray
    confidence: np.ndarray
    label: np.ndarray
    uncertainty: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def correct(self) -> np.ndarray:
        """(B, Q) the predicted way is the true one (never for an outside query)."""
        return self.prediction == self.label

    def accuracy(self) -> np.ndarray:
        """(B,) fraction of correct queries per episode, without abstention."""
        return self.correct.mean(1)


def flat_queries(query: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Query rows of N-way episodes laid out way by way, and their labels.

    Shapes:
        query: (B, N, Q_way) -> rows (B, N * Q_way), labels (B, N * Q_way)
    """
    b, n, q = query.shape
    labels = np.broadcast_to(np.repeat(np.arange(n), q), (b, n * q))
    return query.reshape(b, n * q), np.ascontiguousarray(labels)


@torch.no_grad()
def score_episodes(
    head: torch.nn.Module,
    encodings: torch.Tensor,
    relation: np.ndarray,
    support: np.ndarray,
    query: np.ndarray,
    label: np.ndarray,
    relation_rows: torch.Tensor,
    batch_size: int = 250,
    generator: torch.Generator | None = None,
    shots: np.ndarray | None = None,
) -> tuple[np.ndarray, EpisodeScores]:
    """Predictive log-probabilities of every query, computed from cached encodings, and
    every uncertainty score of every query.

    The batches come from :func:`model.episodes.log_predictive_batches`, the loop
    :func:`model.episodes.episode_accuracy` runs too.

    Args:
        head: a REGRAB or baseline head in eval mode.
        encodings: sentence encodings; the row arrays index into them.
        relation: sampler relation index of every way.
        support: sentence rows of the support.
        query: sentence rows of the queries.
        label: true way of every query (:data:`OUTSIDE` for NOTA queries).
        relation_rows: graph row of each sampler relation (-1 unknown; ignored without prior).
        batch_size: episodes per forward pass.
        generator: seeds the posterior samples of a head that samples at evaluation.
        shots: each way's count when they differ (see
            :func:`model.episodes.log_predictive_batches`).

    Shapes:
        encodings: (n, D), relation: (B, N), support: (B, N, K), query: (B, Q),
        label: (B, Q), shots: (B, N) or None
        -> log-probabilities (B, Q, N) and scores of (B, Q)
    """
    parts: list[np.ndarray] = []
    scores: dict[str, list[np.ndarray]] = {}
    batches = math.ceil(relation.shape[0] / max(batch_size, 1))
    # A long scoring (regrab-score --episodes 1000000) shows where it is, in a log too (not
    # only on a terminal: it ran minutes with no line); the default runs' few batches do not.
    bar = tqdm(total=batches, desc="episodes", unit="batch", leave=False,
               disable=batches < PROGRESS_BATCHES)
    for logits in log_predictive_batches(head, encodings, relation, support, query,
                                         relation_rows, batch_size, generator, samples=True,
                                         shots=shots):
        bar.update()
        log_p = mc_log_probs(logits)
        parts.append(log_p.float().cpu().numpy())
        for name, value in uncertainty_scores(logits, log_p=log_p).items():
            scores.setdefault(name, []).append(value.cpu().numpy())
    bar.close()
    log_p = np.concatenate(parts) if parts else np.zeros((0, query.shape[1], relation.shape[1]))
    out = scores_from_log_probs(log_p, label)
    return log_p, dataclasses.replace(out, uncertainty={k: np.concatenate(v)
                                                        for k, v in scores.items()})


def scores_from_log_probs(log_p: np.ndarray, label: np.ndarray) -> EpisodeScores:
    """Prediction and confidence (the max predictive probability) of every query.

    Shapes:
        log_p: (B, Q, N), label: (B, Q) -> scores of (B, Q)
    """
    prediction = log_p.argmax(-1)
    confidence = np.exp(np.take_along_axis(log_p, prediction[..., None], -1)[..., 0])
    return EpisodeScores(prediction, np.clip(confidence, 0.0, 1.0), np.asarray(label))


def reliability_bins(
    confidence: np.ndarray, correct: np.ndarray, bins: int = 15
) -> dict[str, np.ndarray]:
    """Counts, summed confidence and summed correctness in equal-width confidence bins.

    Bin b holds confidences in ``(b/bins, (b+1)/bins]`` (0 goes to the first bin). Sums, not
    means, so bins of several splits add up.

    Shapes:
        confidence, correct: any shape, flattened -> each (bins,)
    """
    conf = np.asarray(confidence, dtype=np.float64).ravel()
    hit = np.asarray(correct, dtype=np.float64).ravel()
    # Edges from linspace, as the usual implementation has them, so a confidence on an edge
    # lands in the bin below it whatever the rounding of conf * bins.
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, bins - 1)
    return {"count": np.bincount(index, minlength=bins).astype(np.int64),
            "confidence": np.bincount(index, weights=conf, minlength=bins),
            "correct": np.bincount(index, weights=hit, minlength=bins)}


def ece_from_bins(bins: dict[str, np.ndarray]) -> float:
    """ECE in percent from :func:`reliability_bins` (possibly summed over splits)."""
    total = bins["count"].sum()
    if total == 0:
        return float("nan")
    return float(np.abs(bins["correct"] - bins["confidence"]).sum() / total * 100)


def expected_calibration_error(
    confidence: np.ndarray, correct: np.ndarray, bins: int = 15
) -> float:
    """Expected calibration error in percent: ``sum_b (n_b / n) |acc_b - conf_b|``."""
    return ece_from_bins(reliability_bins(confidence, correct, bins))


def _ranked_hits(confidence: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Correctness ordered from the most to the least confident query (stable on ties)."""
    conf = np.asarray(confidence, dtype=np.float64).ravel()
    order = np.argsort(-conf, kind="stable")
    return np.asarray(correct, dtype=np.float64).ravel()[order]


def selective_accuracy(
    confidence: np.ndarray, correct: np.ndarray, coverages: np.ndarray
) -> np.ndarray:
    """Accuracy (percent) on the ``ceil(c n)`` most confident queries, for every coverage c.

    Shapes:
        confidence, correct: any shape, flattened (n queries); coverages: (C,) in (0, 1]
        -> (C,)
    """
    hits = np.cumsum(_ranked_hits(confidence, correct))
    n = len(hits)
    keep = np.clip(np.ceil(np.asarray(coverages) * n - 1e-9).astype(np.int64), 1, n)
    return hits[keep - 1] / keep * 100


def aurc(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Area under the risk-coverage curve, in percent (lower is better).

    The mean, over k = 1..n, of the error rate on the k most confident queries. With error
    rate e, a confidence that ranks every error last scores about ``e + (1 - e) ln(1 - e)``
    (about e^2 / 2), a confidence that is noise scores e.
    """
    hits = _ranked_hits(confidence, correct)
    if len(hits) == 0:
        return float("nan")
    risk = 1 - np.cumsum(hits) / np.arange(1, len(hits) + 1)
    return float(risk.mean() * 100)


def nota_correct(scores: EpisodeScores, threshold: float) -> np.ndarray:
    """Correctness when abstaining ("none of the above") below ``threshold`` confidence.

    A query inside the N ways is correct when answered with its way; an outside query
    (label :data:`OUTSIDE`) is correct when the method abstains.

    Shapes:
        scores of (B, Q) -> (B, Q) bool
    """
    abstain = scores.confidence < threshold
    outside = scores.label == OUTSIDE
    return np.where(outside, abstain, ~abstain & scores.correct)


def best_threshold(scores: EpisodeScores) -> float:
    """The abstention threshold that maximises NOTA accuracy on ``scores``.

    Every distinct confidence is a candidate cut; the threshold returned is the midpoint
    between the confidences on either side of the best cut (0 = never abstain, a value
    above 1 = always abstain), so it does not sit on a value seen in these episodes. Ties
    go to the lowest threshold (abstain as little as possible).
    """
    conf = scores.confidence.ravel().astype(np.float64)
    outside = (scores.label == OUTSIDE).ravel()
    answered_right = (scores.correct.ravel() & ~outside).astype(np.float64)
    order = np.argsort(conf, kind="stable")
    conf, outside, answered_right = conf[order], outside[order], answered_right[order]
    # A cut after the first i queries (ascending confidence) abstains on them: they score
    # when outside, the rest score when answered right. Only cuts between distinct values.
    abstained_ok = np.concatenate([[0.0], np.cumsum(outside)])  # (n + 1,)
    answered_ok = answered_right.sum() - np.concatenate([[0.0], np.cumsum(answered_right)])
    score = abstained_ok + answered_ok
    valid = np.ones(len(conf) + 1, dtype=bool)
    valid[1:-1] = conf[1:] > conf[:-1]
    best = int(np.flatnonzero(valid)[np.argmax(score[valid])])
    if best == 0:
        return 0.0
    if best == len(conf):
        return float(math.nextafter(max(conf[-1], 1.0), math.inf))
    return float((conf[best - 1] + conf[best]) / 2)
