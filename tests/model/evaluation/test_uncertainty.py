import math

import numpy as np
import pytest
import torch

from model.evaluation.calibration import tempered
from model.evaluation.uncertainty import (
    POINT_SCORES,
    POSTERIOR_SCORES,
    ROC_GRID,
    detection,
    entropy,
    mc_log_probs,
    roc_points,
    select_scores,
    uncertainty_scores,
)


def test_scores_of_sampled_logits():
    logits = torch.randn(2, 4, 3, 5)  # (B, S, Q, N)
    out = uncertainty_scores(logits)
    assert set(out) == {*POINT_SCORES, *POSTERIOR_SCORES}
    probs = torch.softmax(logits.double(), -1).mean(1)
    assert torch.allclose(mc_log_probs(logits.double()).exp(), probs)
    assert torch.allclose(out["entropy"], entropy(probs))
    assert torch.allclose(out["max_prob"], 1 - probs.max(-1).values)
    top2 = probs.topk(2, -1).values
    assert torch.allclose(out["margin"], 1 - (top2[..., 0] - top2[..., 1]))
    # Entropy splits into the samples' mean entropy and the mutual information.
    assert torch.allclose(out["entropy"], out["expected_entropy"] + out["mutual_information"])
    assert (out["mutual_information"] > 0).all()
    assert (out["top_logit_var"] > 0).all()


def test_agreeing_samples_carry_no_mutual_information():
    same = torch.randn(2, 1, 3, 5).expand(2, 4, 3, 5)
    out = uncertainty_scores(same)
    assert torch.allclose(out["mutual_information"], torch.zeros(2, 3, dtype=torch.float64),
                          atol=1e-9)
    assert torch.allclose(out["top_logit_var"], torch.zeros(2, 3, dtype=torch.float64))


def test_a_deterministic_head_gets_point_scores_and_the_tempered_ones():
    logits = torch.randn(2, 1, 3, 5)
    assert set(uncertainty_scores(logits)) == set(POINT_SCORES)
    out = uncertainty_scores(logits, tau=2.0)
    scaled = tempered(torch.log_softmax(logits[:, 0].double(), -1), 2.0).exp()
    assert torch.allclose(out["max_prob_ts"], 1 - scaled.max(-1).values)
    assert torch.allclose(out["entropy_ts"], entropy(scaled))
    uniform = torch.full((5,), 0.2, dtype=torch.float64)
    assert math.isclose(float(entropy(uniform)), math.log(5))


def _brute_force(score, outside):
    pos, neg = score[outside], score[~outside]
    auroc = ((pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean())
    flags = [score >= t for t in np.unique(score)[::-1]]
    tpr = np.array([f[outside].mean() for f in flags])
    fpr = np.array([f[~outside].mean() for f in flags])
    prec = np.array([outside[f].mean() for f in flags])
    ap = np.sum(np.diff(np.concatenate([[0.0], tpr])) * prec)
    return auroc * 100, ap * 100, fpr[np.argmax(tpr >= 0.95)] * 100, tpr, fpr


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detection_agrees_with_a_brute_force_count(seed):
    rng = np.random.default_rng(seed)
    outside = rng.random(120) < 0.3
    score = np.round(rng.normal(size=120) + outside, 1)  # ties on purpose
    got = detection(score, outside)
    auroc, ap, fpr95, tpr, fpr = _brute_force(score, outside)
    assert got["auroc"] == pytest.approx(auroc)
    assert got["aupr"] == pytest.approx(ap)
    assert got["fpr95"] == pytest.approx(fpr95)
    roc = roc_points(score, outside)
    for f, t in zip(ROC_GRID, roc, strict=True):
        reachable = tpr[fpr <= f + 1e-12]
        assert t == pytest.approx(reachable.max() * 100 if len(reachable) else 0.0)


def test_detection_extremes():
    outside = np.array([True, True, False, False, False])
    assert detection(np.array([5, 4, 1, 2, 3]), outside) == {
        "auroc": 100.0, "aupr": 100.0, "fpr95": 0.0}
    assert detection(np.array([0, 0, 1, 2, 3]), outside)["auroc"] == 0.0
    assert detection(np.ones(5), outside)["auroc"] == 50.0
    assert all(math.isnan(v) for v in detection(np.ones(3), np.zeros(3, bool)).values())


def test_select_scores_slices_and_adds_the_tempered_scores():
    logits = torch.randn(2, 3, 6, 4)
    log_p = mc_log_probs(logits).numpy()
    scores = {k: v.numpy() for k, v in uncertainty_scores(logits).items()}
    out = select_scores(scores, slice(2, 5), 1.5, log_p)
    assert set(out) == set(scores) | {"max_prob_ts", "entropy_ts"}
    assert all(v.shape == (2, 3) for v in out.values())
    np.testing.assert_array_equal(out["entropy"], scores["entropy"][:, 2:5])
    assert set(select_scores(scores, slice(0, 6))) == set(scores)
