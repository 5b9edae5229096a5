"""Tests for model/posterior/suspicion.py and model/evaluation/support_noise.py: a planted
mislabelled support sentence, and the suspicion scores that must find it."""

import math

import numpy as np
import pytest
import torch

from model.episodes import EpisodeSampler
from model.evaluation.support_noise import (
    detection_of_wrong,
    gaussian_sampler,
    plant_wrong,
    support_suspicion,
    suspicion_batches,
)
from model.methods.base import PrototypeHead
from model.methods.regrab import RegrabHead
from model.posterior.suspicion import (
    episode_precision,
    gaussian_suspicion,
    prototype_suspicion,
)
from model.posterior.target import gaussian_posterior, way_precision
from pipeline.errors import PipelineError
from tests.conftest import model_config


def clusters(b=20, n=5, k=5, d=16, spread=0.3, seed=0):
    """Support sets of N well-separated Gaussian clusters (means at distance ~4 sqrt(2)),
    with one sentence per episode taken from another way's cluster; its mask and the means."""
    g = torch.Generator().manual_seed(seed)
    means = 4 * torch.randn(b, n, d, generator=g, dtype=torch.double) / math.sqrt(d) * 2
    x = means[:, :, None] + spread * torch.randn(b, n, k, d, generator=g, dtype=torch.double)
    wrong = torch.zeros(b, n, k, dtype=torch.bool)
    for e in range(b):
        way, slot, other = e % n, (e // n) % k, (e + 1) % n
        x[e, way, slot] = means[e, other] + spread * torch.randn(d, generator=g,
                                                                 dtype=torch.double)
        wrong[e, way, slot] = True
    return x, wrong, means


def top_is_wrong(score: torch.Tensor, wrong: torch.Tensor) -> bool:
    """Whether, in every episode, the most suspicious sentence is the planted one."""
    flat = score.flatten(1).nan_to_num(-math.inf)
    return bool((wrong.flatten(1).gather(1, flat.argmax(1, keepdim=True))).all())


def test_gaussian_suspicion_finds_a_planted_sentence():
    x, wrong, means = clusters()
    s = gaussian_suspicion(x, means, 1.0, 0.3 ** 2)
    assert s.shape == wrong.shape and torch.isfinite(s).all()
    assert top_is_wrong(s, wrong)
    assert (s[wrong] > 0).all() and (s[~wrong] < 0).all()
    assert detection_of_wrong(s.numpy(), wrong.numpy())["auroc"] == 100.0


def test_gaussian_suspicion_is_the_leave_one_out_predictive():
    """Against the closed-form posterior of the other K-1 sentences, computed directly."""
    x, _, means = clusters(b=2, n=3, k=3, d=4)
    lam, var = 2.0, 0.5
    s = gaussian_suspicion(x, means, lam, var)
    e, r, j = 1, 2, 0
    rest = torch.cat([x[e:e + 1, r:r + 1, :j], x[e:e + 1, r:r + 1, j + 1:]], 2)
    mu, s2 = gaussian_posterior(rest, means[e:e + 1, r:r + 1], lam, var)

    def log_pred(point, mean, post_var):
        v = var + post_var
        return float(-0.5 * ((point - mean) ** 2).sum() / v - 0.5 * 4 * math.log(v))

    own = log_pred(x[e, r, j], mu[0, 0], float(s2))
    others = []
    for o in (0, 1):
        mo, so = gaussian_posterior(x[e:e + 1, o:o + 1], means[e:e + 1, o:o + 1], lam, var)
        others.append(log_pred(x[e, r, j], mo[0, 0], float(so)))
    assert float(s[e, r, j]) == pytest.approx(max(others) - own, rel=1e-9)


def test_one_shot_ways_are_scored_against_the_prior_and_padding_is_nan():
    """With counts, a way's only sentence is scored against its prior mean (the posterior
    from no other sentence); the point estimate has nothing left and gives NaN."""
    x, wrong, means = clusters(b=4, n=3, k=3)
    counts = torch.tensor([[3, 1, 2]] * 4)
    g = gaussian_suspicion(x, means, 1.0, 0.09, counts)
    p = prototype_suspicion(x, counts)
    assert torch.isnan(g[:, 1, 1:]).all() and torch.isfinite(g[:, 1, 0]).all()
    assert torch.isnan(p[:, 1]).all() and torch.isnan(p[:, 2, 2]).all()
    assert torch.isfinite(p[:, 0]).all()
    # A 1-shot sentence far from its prior mean and close to another way is suspicious.
    x[:, 1, 0] = means[:, 0]
    assert (gaussian_suspicion(x, means, 1.0, 0.09, counts)[:, 1, 0] > 0).all()


def test_episode_precision_with_equal_shots_is_way_precision():
    x, _, means = clusters(b=3, n=4, k=2)
    for lam in (0.5, 50.0):
        np.testing.assert_allclose(episode_precision(x, None, means, lam, 0.2),
                                   way_precision(x, means, lam, 0.2), rtol=1e-12)


def test_prototype_suspicion_finds_a_planted_sentence():
    x, wrong, _ = clusters(seed=3)
    s = prototype_suspicion(x)
    assert top_is_wrong(s, wrong) and (s[wrong] > 0).all() and (s[~wrong] < 0).all()


def test_heads_choose_their_score():
    """REGRAB's gaussian posterior gives the posterior score with its own prior means; a
    prototype head the leave-one-out prototype, whatever h it is given."""
    cfg = model_config("regrab")
    head = RegrabHead(cfg.langevin, None, 16)
    assert gaussian_sampler(head) is head.sampler
    assert gaussian_sampler(PrototypeHead("euclidean", 1.0)) is None
    x, wrong, means = clusters(seed=5)
    for h in (head, PrototypeHead("euclidean", 1.0)):
        assert top_is_wrong(support_suspicion(h, x, means), wrong)
    np.testing.assert_array_equal(support_suspicion(PrototypeHead("euclidean", 1.0), x, means),
                                  prototype_suspicion(x))
    # The prior means matter to REGRAB's score: a prior at another way's cluster moves it.
    moved = support_suspicion(head, x, means.roll(1, dims=1))
    assert not torch.allclose(moved, support_suspicion(head, x, means))


def sampler_of(per_relation=10, relations=4):
    return EpisodeSampler([f"P{r}" for r in range(relations) for _ in range(per_relation)])


def test_plant_wrong_replaces_one_sentence_by_one_of_another_way():
    sampler = sampler_of()
    clean = sampler.sample(np.random.default_rng(0), 3, 3, 2, 50)
    noisy = plant_wrong(sampler, clean, np.random.default_rng(1))
    assert noisy.wrong.sum((1, 2)).tolist() == [1] * 50
    assert (noisy.support != clean.support).sum() == 50
    np.testing.assert_array_equal(noisy.query, clean.query)
    labels = np.array([sampler.relations.index(f"P{r}") for r in range(4)
                       for _ in range(10)])
    for e in range(50):
        planted = noisy.support[e][noisy.wrong[e]][0]
        way = np.argwhere(noisy.wrong[e])[0, 0]
        assert noisy.source[e] != way
        assert labels[planted] == clean.relation[e, noisy.source[e]]
        held = np.concatenate([clean.support[e].ravel(), clean.query[e].ravel()])
        assert planted not in held
    again = plant_wrong(sampler, clean, np.random.default_rng(1))
    np.testing.assert_array_equal(again.support, noisy.support)
    # Every way and slot gets planted somewhere.
    assert noisy.wrong.sum(0).all()


def test_plant_wrong_needs_a_sentence_left_outside_the_episode():
    sampler = sampler_of(per_relation=4, relations=2)
    clean = sampler.sample(np.random.default_rng(0), 2, 2, 2, 3)
    with pytest.raises(PipelineError, match="no sentence left outside its episode"):
        plant_wrong(sampler, clean, np.random.default_rng(1))


def test_suspicion_batches_find_planted_sentences_of_encodings():
    """Over sentence rows as evaluate runs it: a relation's encodings cluster, and the
    planted sentence is found in every episode, in any batching."""
    sampler = sampler_of(per_relation=12, relations=5)
    g = torch.Generator().manual_seed(0)
    centre = 3 * torch.randn(5, 16, generator=g)
    enc = torch.stack([centre[r] + 0.3 * torch.randn(16, generator=g)
                       for r in range(5) for _ in range(12)])
    clean = sampler.sample(np.random.default_rng(2), 4, 4, 2, 30)
    noisy = plant_wrong(sampler, clean, np.random.default_rng(3))
    head = RegrabHead(model_config("regrab").langevin, None, 16).eval()
    rows = torch.full((5,), -1)
    whole = suspicion_batches(head, enc, noisy.relation, noisy.support, rows, 30)
    assert detection_of_wrong(whole, noisy.wrong)["auroc"] == 100.0
    np.testing.assert_allclose(
        suspicion_batches(head, enc, noisy.relation, noisy.support, rows, 7), whole, rtol=1e-5)
    point = suspicion_batches(PrototypeHead("euclidean", 1.0), enc, noisy.relation,
                              noisy.support, rows, 30)
    assert detection_of_wrong(point, noisy.wrong)["auroc"] == 100.0
