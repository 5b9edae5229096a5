import math

import numpy as np
import pytest
import torch

from model.episodes import EpisodeSampler, episode_accuracy
from model.evaluation.scoring import (
    OUTSIDE,
    EpisodeScores,
    aurc,
    best_threshold,
    expected_calibration_error,
    flat_queries,
    nota_correct,
    reliability_bins,
    score_episodes,
    scores_from_log_probs,
    selective_accuracy,
)
from model.methods.base import PrototypeHead
from model.methods.registry import build_head
from model.prior.graph import RelationGraph
from tests.conftest import model_config


def test_ece_matches_a_hand_computation():
    conf = np.array([0.95, 0.95, 0.55, 0.55, 0.30])
    hit = np.array([1, 0, 1, 1, 0], dtype=bool)
    # bins of width 1/15: 0.95 -> bin 14 (acc 0.5), 0.55 -> bin 8 (acc 1), 0.30 -> bin 4 (acc 0)
    hand = (2 / 5) * abs(0.5 - 0.95) + (2 / 5) * abs(1.0 - 0.55) + (1 / 5) * abs(0.0 - 0.30)
    assert expected_calibration_error(conf, hit, 15) == pytest.approx(hand * 100)
    bins = reliability_bins(conf, hit, 15)
    assert bins["count"].tolist() == [0] * 4 + [1] + [0] * 3 + [2] + [0] * 5 + [2]
    assert bins["correct"][14] == 1 and bins["confidence"][8] == pytest.approx(1.1)


def test_ece_edges_and_perfect_calibration():
    # Right edges belong to the lower bin (lower, upper]; 0 goes to the first bin.
    bins = reliability_bins(np.array([0.0, 1 / 15, 2 / 15, 1.0]), np.ones(4), 15)
    assert bins["count"][0] == 2 and bins["count"][1] == 1 and bins["count"][14] == 1
    conf = np.full(100, 0.8)
    hit = np.arange(100) < 80
    assert expected_calibration_error(conf, hit) == pytest.approx(0.0, abs=1e-9)
    assert expected_calibration_error(np.full(10, 0.9), np.zeros(10)) == pytest.approx(90.0)


def test_selective_curve_monotone_properties_and_aurc_by_brute_force():
    rng = np.random.default_rng(0)
    hit = rng.random(400) < 0.7
    noise = rng.random(400)
    coverages = np.arange(1, 101) / 100
    perfect = selective_accuracy(hit + 0.1 * noise, hit, coverages)  # errors ranked last
    reverse = selective_accuracy(-(hit + 0.1 * noise), hit, coverages)
    assert np.all(np.diff(perfect) <= 1e-12) and np.all(np.diff(reverse) >= -1e-12)
    assert perfect[0] == 100.0 and reverse[0] == 0.0
    assert perfect[-1] == pytest.approx(hit.mean() * 100) == reverse[-1]
    for conf in (noise, hit + 0.1 * noise):
        order = np.argsort(-conf, kind="stable")
        brute = np.mean([1 - hit[order[:k]].mean() for k in range(1, 401)]) * 100
        assert aurc(conf, hit) == pytest.approx(brute)
    e = 1 - hit.mean()
    assert aurc(hit + 0.1 * noise, hit) == pytest.approx(
        (e + (1 - e) * math.log(1 - e)) * 100, abs=1.0)
    assert aurc(hit + 0.1 * noise, hit) < aurc(noise, hit) < aurc(-(hit + 0.1 * noise), hit)


def _rows_sampler(per=8, rels=5):
    return EpisodeSampler([f"P{i}" for i in range(rels) for _ in range(per)])


@pytest.mark.parametrize("kind", ["proto", "regrab"])
def test_score_episodes_agrees_with_episode_accuracy(kind):
    sampler = _rows_sampler()
    enc = torch.eye(5).repeat_interleave(8, 0) + 0.8 * torch.randn(
        40, 5, generator=torch.Generator().manual_seed(1))
    ep = sampler.sample(np.random.default_rng(0), 3, 2, 3, 30)
    if kind == "proto":
        head = PrototypeHead("euclidean", 1.0).eval()
        rows = torch.full((5,), -1)
    else:
        cfg = model_config("regrab", langevin={"noise_eval": True})
        ei = torch.tensor([[0, 1], [1, 0]])
        graph = RelationGraph([f"P{i}" for i in range(5)], torch.randn(5, 4), ei, torch.ones(2))
        head = build_head(cfg, graph, dim=5).eval()
        rows = head.prior.index(sampler.relations)
    query, label = flat_queries(ep.query)
    log_p, scores = score_episodes(head, enc, ep.relation, ep.support, query, label, rows, 7,
                                   torch.Generator().manual_seed(3))
    acc = episode_accuracy(head, enc, ep, rows, 7, torch.Generator().manual_seed(3))
    assert log_p.shape == (30, 9, 3)
    assert np.allclose(np.exp(log_p).sum(-1), 1.0, atol=1e-5)
    assert np.allclose(scores.accuracy(), acc)
    assert np.allclose(scores.confidence, np.exp(log_p).max(-1), atol=1e-6)
    assert (label == np.repeat(np.arange(3), 3)).all()


def test_nota_correct_counts_abstention():
    scores = EpisodeScores(prediction=np.array([[0, 1, 1, 0]]),
                           confidence=np.array([[0.9, 0.4, 0.8, 0.3]]),
                           label=np.array([[0, 1, OUTSIDE, OUTSIDE]]))
    # threshold 0.5: q0 answered right, q1 abstained (wrong), q2 answered (wrong), q3 abstained
    assert nota_correct(scores, 0.5).tolist() == [[True, False, False, True]]
    assert nota_correct(scores, 0.0).tolist() == [[True, True, False, False]]


def test_best_threshold_is_the_best_cut_by_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(20):
        label = np.where(rng.random((6, 10)) < 0.3, OUTSIDE, rng.integers(0, 3, (6, 10)))
        log_p = np.log(rng.dirichlet(np.ones(3), size=(6, 10)))
        log_p = np.round(log_p, 1)  # ties between confidences
        scores = scores_from_log_probs(log_p, label)
        candidates = np.concatenate([[0.0, 1.01], np.unique(scores.confidence) + 1e-9])
        best = max(nota_correct(scores, t).mean() for t in candidates)
        t = best_threshold(scores)
        assert nota_correct(scores, t).mean() == pytest.approx(best)
        assert t not in scores.confidence


def test_best_threshold_extremes():
    all_outside = EpisodeScores(np.zeros((1, 3), int), np.array([[0.5, 0.7, 1.0]]),
                                np.full((1, 3), OUTSIDE))
    assert best_threshold(all_outside) > 1.0
    none_outside = EpisodeScores(np.zeros((1, 3), int), np.array([[0.5, 0.7, 1.0]]),
                                 np.zeros((1, 3), int))
    assert best_threshold(none_outside) == 0.0


def test_a_long_scoring_shows_its_progress_and_a_short_one_does_not(monkeypatch):
    from model.evaluation import scoring

    shown = []

    class Bar:
        def __init__(self, total, disable, **kwargs):
            self.total, self.on, self.n = total, disable is not True, 0
            shown.append(self)

        def update(self):
            self.n += 1

        def close(self):
            pass

    monkeypatch.setattr(scoring, "tqdm", Bar)
    sampler = _rows_sampler()
    enc = torch.randn(40, 5, generator=torch.Generator().manual_seed(1))
    ep = sampler.sample(np.random.default_rng(0), 3, 1, 1, 30)
    query, label = flat_queries(ep.query)
    head, rows = PrototypeHead("euclidean", 1.0).eval(), torch.full((5,), -1)
    for batch in (10, 1):  # 3 batches, then 30 (a bar from PROGRESS_BATCHES on)
        monkeypatch.setattr(scoring, "PROGRESS_BATCHES", 30)
        score_episodes(head, enc, ep.relation, ep.support, query, label, rows, batch,
                       torch.Generator().manual_seed(3))
    assert [(b.total, b.on, b.n) for b in shown] == [(3, False, 3), (30, True, 30)]
