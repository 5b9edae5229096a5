"""Per-query uncertainty scores and how well they flag queries a model should not answer.

The one place that turns a head's per-sample logits into uncertainty: evaluation, transfer,
``regrab-predict`` and ``regrab-suggest`` all call :func:`uncertainty_scores`. Every score is
larger when the model is less sure, so one rule reads them all: abstain above a threshold,
label first the sentence with the largest score.

Scores (nats unless said otherwise):

* ``max_prob``: one minus the top predictive probability.
* ``margin``: one minus the gap between the two top predictive probabilities.
* ``entropy``: entropy of the predictive distribution (total uncertainty).
* ``max_logit``: minus the largest logit, averaged over samples as ``log mean_s exp``: for
  REGRAB's Euclidean logits, how far the query lies from every relation's (sampled)
  prototypes, which a softmax normalises away (Hendrycks et al., 2022).
* ``max_prob_ts``, ``entropy_ts``: the same after temperature scaling with a validation
  temperature (:mod:`model.evaluation.calibration`); only when a temperature is given.
* ``mutual_information``: entropy of the mean minus the mean entropy of the posterior samples
  (BALD, Houlsby et al. 2011): the part of the uncertainty that comes from not knowing the
  prototypes. Zero for a head without samples.
* ``expected_entropy``: the mean entropy of the samples (what stays uncertain even if the
  prototypes were known).
* ``top_logit_var``: the variance over samples of the logit of the predicted relation.

:data:`POSTERIOR_SCORES` need S > 1 posterior samples; a deterministic head gets only the rest.

Detection (:func:`detection`) treats "outside" queries (from relations not in the support) as
positives: AUROC, AUPR (average precision) and the false-positive rate at 95% true-positive
rate (FPR@95), all in percent.

Shapes:
    S posterior samples, Q queries, N ways; ``...`` any leading batch axes.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from model.methods.base import mc_log_predictive

#: Scores every head has.
POINT_SCORES = ("max_prob", "margin", "entropy", "max_logit")
#: Scores after temperature scaling (when a temperature is given).
TEMPERED_SCORES = ("max_prob_ts", "entropy_ts")
#: Scores that need posterior samples (S > 1).
POSTERIOR_SCORES = ("mutual_information", "expected_entropy", "top_logit_var")
#: Every score, in report order.
SCORES = (*POINT_SCORES, *TEMPERED_SCORES, *POSTERIOR_SCORES)


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats over the last axis (0 log 0 = 0)."""
    return -torch.special.xlogy(p, p).sum(-1)


#: ``log (1/S) sum_s softmax(logits_s)``, the Monte Carlo log-predictive of every head
#: (Eq. 11): (..., S, Q, N) -> (..., Q, N).
mc_log_probs = mc_log_predictive


def _top_two(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if probs.shape[-1] == 1:
        return probs[..., 0], torch.zeros_like(probs[..., 0])
    top = probs.topk(2, dim=-1).values
    return top[..., 0], top[..., 1]


def uncertainty_scores(sample_logits: torch.Tensor, tau: float | None = None,
                       log_p: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Every score that applies, from per-sample logits (see the module docstring).

    Args:
        sample_logits: a head's ``sample_logits`` output.
        tau: a validation temperature; adds the ``_ts`` scores.
        log_p: the log-predictive if the caller has it already (:func:`mc_log_probs`).

    Shapes:
        sample_logits: (..., S, Q, N) -> each score (..., Q)
    """
    logits = sample_logits.double()
    log_p = mc_log_probs(logits) if log_p is None else log_p.double()
    probs = log_p.exp()
    first, second = _top_two(probs)
    out = {"max_prob": 1.0 - first, "margin": 1.0 - (first - second), "entropy": entropy(probs)}
    mean_logit = torch.logsumexp(logits, dim=-3) - math.log(logits.shape[-3])  # (..., Q, N)
    out["max_logit"] = -mean_logit.max(-1).values
    if tau is not None:
        out |= tempered_scores(log_p, tau)
    if logits.shape[-3] > 1:
        per_sample = entropy(torch.softmax(logits, dim=-1)).mean(-2)  # (..., Q)
        out["expected_entropy"] = per_sample
        # Clamped: the two terms agree to rounding when every sample says the same.
        out["mutual_information"] = (out["entropy"] - per_sample).clamp_min(0.0)
        top = probs.argmax(-1)  # (..., Q)
        index = top.unsqueeze(-2).unsqueeze(-1).expand(*logits.shape[:-1], 1)
        out["top_logit_var"] = logits.gather(-1, index)[..., 0].var(-2)
    return {k: out[k] for k in SCORES if k in out}


def tempered_scores(log_p: torch.Tensor, tau: float) -> dict[str, torch.Tensor]:
    """``max_prob_ts`` and ``entropy_ts``: the scores of the predictive tempered by ``tau``
    (:func:`model.evaluation.calibration.tempered`).

    Shapes:
        log_p: (..., Q, N) -> each (..., Q)
    """
    scaled = torch.softmax(log_p.double() / tau, dim=-1)
    return {"max_prob_ts": 1.0 - scaled.max(-1).values, "entropy_ts": entropy(scaled)}


def _ranks(values: np.ndarray) -> np.ndarray:
    """1-based ranks, ties given their average rank."""
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values), dtype=np.float64)
    sorted_v = values[order]
    bounds = np.flatnonzero(np.diff(sorted_v)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(values)]])
    for s, e in zip(starts, ends, strict=True):
        ranks[order[s:e]] = (s + e + 1) / 2
    return ranks


def detection(score: np.ndarray, outside: np.ndarray) -> dict[str, float]:
    """How well ``score`` separates outside queries (positives) from inside ones, in percent.

    * ``auroc``: probability that a random outside query scores above a random inside one
      (ties count half).
    * ``aupr``: average precision with outside as the positive class (chance: the outside
      share).
    * ``fpr95``: share of inside queries flagged at the highest threshold that still flags
      95% of outside queries (lower is better).

    NaN for all three when either class is empty.

    Shapes:
        score, outside: any shape, flattened (n queries)
    """
    s = np.asarray(score, dtype=np.float64).ravel()
    pos = np.asarray(outside, dtype=bool).ravel()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return {"auroc": float("nan"), "aupr": float("nan"), "fpr95": float("nan")}
    ranks = _ranks(s)
    auroc = (ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    # Thresholds at distinct values, from the highest score down: flag every score >= t.
    order = np.argsort(-s, kind="stable")
    s_sorted, p_sorted = s[order], pos[order]
    last = np.concatenate([np.flatnonzero(np.diff(s_sorted)), [len(s) - 1]])
    tp = np.cumsum(p_sorted)[last].astype(np.float64)
    fp = (last + 1) - tp
    recall = tp / n_pos
    precision = tp / (last + 1)
    aupr = float(np.sum(np.diff(np.concatenate([[0.0], recall])) * precision))
    at = int(np.searchsorted(recall, 0.95 - 1e-12, side="left"))
    fpr95 = fp[min(at, len(fp) - 1)] / n_neg
    return {"auroc": float(auroc * 100), "aupr": aupr * 100, "fpr95": float(fpr95 * 100)}


#: False-positive rates at which :func:`roc_points` reads the ROC curve.
ROC_GRID = np.round(np.linspace(0.0, 1.0, 51), 2)


def roc_points(score: np.ndarray, outside: np.ndarray) -> np.ndarray:
    """True-positive rate (percent) of flagging outside queries at every false-positive rate of
    :data:`ROC_GRID`: the best threshold whose FPR does not exceed it (0 where none does).

    Shapes:
        score, outside: any shape, flattened -> (len(ROC_GRID),)
    """
    s = np.asarray(score, dtype=np.float64).ravel()
    pos = np.asarray(outside, dtype=bool).ravel()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return np.full(len(ROC_GRID), np.nan)
    order = np.argsort(-s, kind="stable")
    s_sorted, p_sorted = s[order], pos[order]
    last = np.concatenate([np.flatnonzero(np.diff(s_sorted)), [len(s) - 1]])
    tp = np.concatenate([[0.0], np.cumsum(p_sorted)[last]])
    fpr = np.concatenate([[0.0], (last + 1 - tp[1:]) / n_neg])
    # The curve is monotone in both rates, so the last point at or below each grid FPR is best.
    at = np.searchsorted(fpr, ROC_GRID + 1e-12, side="right") - 1
    return tp[at] / n_pos * 100


def select_scores(scores: dict[str, np.ndarray], cols: slice,
                  tau: float | None = None, log_p: np.ndarray | None = None
                  ) -> dict[str, np.ndarray]:
    """The queries ``cols`` of every score, with the tempered ones when ``tau`` is known.

    Shapes:
        scores: each (B, Q), log_p: (B, Q, N) -> each (B, Q_cols)
    """
    out = {k: v[:, cols] for k, v in scores.items()}
    if tau is not None and log_p is not None:
        ts = tempered_scores(torch.from_numpy(np.asarray(log_p[:, cols])), tau)
        out |= {k: v.numpy() for k, v in ts.items()}
    return {k: out[k] for k in SCORES if k in out}
