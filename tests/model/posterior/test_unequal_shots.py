"""Ways with unequal shots: padded support plus per-way counts, scored in one call."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from model.episodes import EpisodeSampler, cycled
from model.evaluation.shots import UnequalSetting, sample_unequal, step_share, summarise
from model.methods.base import PrototypeHead
from model.methods.regrab import RegrabHead
from model.posterior.langevin import LangevinSampler, predictive_shift
from model.posterior.shots import head_logits, oversample, support_mean
from model.posterior.target import gaussian_posterior, way_precision
from pipeline.errors import PipelineError
from tests.conftest import model_config


def _padded(seed: int = 0, b: int = 3, n: int = 4, k: int = 5, d: int = 16):
    g = torch.Generator().manual_seed(seed)
    support = torch.randn(b, n, k, d, generator=g)
    shots = torch.randint(1, k + 1, (b, n), generator=g)
    shots[0, 0] = k  # one way is full
    return support, shots


def _langevin(**kw):
    return dataclasses.replace(model_config().langevin, **kw)


def test_support_mean_reads_each_ways_own_shots_and_oversampling_cycles_them():
    support, shots = _padded()
    mean = support_mean(support, shots)
    over = oversample(support, shots)
    for b in range(support.shape[0]):
        for n in range(support.shape[1]):
            k = int(shots[b, n])
            assert torch.allclose(mean[b, n], support[b, n, :k].mean(0), atol=1e-6)
            for j in range(support.shape[2]):
                assert torch.equal(over[b, n, j], support[b, n, j % k])
    with pytest.raises(PipelineError, match="K >= 1"):
        oversample(support, torch.zeros_like(shots))
    # The row-level twin of the episodes cycles the same way.
    rows = np.arange(3 * 4 * 5).reshape(3, 4, 5)
    got = cycled(rows, shots.numpy())
    assert got[1, 2, 4] == rows[1, 2, 4 % int(shots[1, 2])]


def test_balanced_shots_change_no_logit():
    support, _ = _padded()
    full = torch.full(support.shape[:2], support.shape[2])
    query = torch.randn(3, 6, 16)
    head = PrototypeHead("euclidean", 2.5).eval()
    assert torch.equal(head_logits(head, support, query, None, None, full),
                       head.sample_logits(support, query))
    regrab = RegrabHead(_langevin(scales="fixed"), None, 16).eval()
    h = torch.zeros(3, 4, 16)
    a = head_logits(regrab, support, query, h, torch.Generator().manual_seed(1), full)
    b = regrab.sample_logits(support, query, h, torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_prototype_logits_of_unequal_shots_are_those_of_each_ways_own_mean():
    support, shots = _padded()
    query = torch.randn(3, 6, 16)
    head = PrototypeHead("euclidean", 2.5).eval()
    got = head_logits(head, support, query, None, None, shots)
    for b in range(3):
        for n in range(4):
            v = support[b, n, :int(shots[b, n])].mean(0)
            want = -0.5 * ((query[b] - v) ** 2).sum(-1) / 2.5
            assert torch.allclose(got[b, 0, :, n], want, atol=1e-4)


@pytest.mark.parametrize("trust", ["fixed", "evidence"])
def test_gaussian_posterior_gives_each_way_the_posterior_of_its_own_shots(trust):
    support, shots = _padded(1)
    h = torch.randn(3, 4, 16)
    lam, var = 2.0, 0.5
    if trust == "evidence":
        lam_e = way_precision(support, h, lam, var, shots)
        # The estimate averages each way's own gap.
        gaps = [[float(((support[b, n, :int(shots[b, n])].mean(0) - h[b, n]) ** 2).sum()) / 16
                 - var / int(shots[b, n]) for n in range(4)] for b in range(3)]
        want = [1.0 / max(np.mean(g), 1.0 / lam) for g in gaps]
        assert np.allclose(lam_e.view(-1).numpy(), want, rtol=1e-5)
        lam = lam_e
    mean, s2 = gaussian_posterior(support, h, lam, var, shots)
    for b in range(3):
        for n in range(4):
            k = int(shots[b, n])
            p = lam if isinstance(lam, float) else lam[b]
            m1, v1 = gaussian_posterior(support[b:b + 1, n:n + 1, :k], h[b:b + 1, n:n + 1], p, var)
            assert torch.allclose(mean[b, n], m1[0, 0], atol=1e-5)
            assert torch.allclose(s2[b, n], v1[0, 0], atol=1e-6)


def test_regrab_scores_unequal_shots_in_one_call_as_each_way_alone():
    # The gaussian posterior factorises over the ways: with fixed prior trust and noise off,
    # one call on the padded support gives every way the logits of its own shots.
    cfg = _langevin(scales="fixed", prior_trust="fixed", noise_eval=False, prior_precision=1.0,
                    likelihood_variance=0.3)
    head = RegrabHead(cfg, None, 16).eval()
    support, shots = _padded(2)
    query, h = torch.randn(3, 6, 16), torch.zeros(3, 4, 16)
    got = head.log_predictive(support, query, h, None, shots)  # (B, Q, N)
    logits = head.sample_logits(support, query, h, None, shots)[:, 0]
    for b in range(3):
        for n in range(4):
            k = int(shots[b, n])
            alone = head.sample_logits(support[b:b + 1, n:n + 1, :k], query[b:b + 1],
                                       h[b:b + 1, n:n + 1])
            assert torch.allclose(logits[b, :, n], alone[0, 0, :, 0], atol=1e-4)
    assert torch.allclose(got, torch.log_softmax(logits, -1), atol=1e-5)


def test_predictive_shift_centres_the_samples_on_the_posterior_predictive():
    torch.manual_seed(0)
    d, var, t = 32, 0.2, 2.5
    query, mean = torch.randn(1, 5, d), torch.randn(1, 3, d)
    std = torch.tensor([0.2, 0.5, 1.0]).view(1, 3, 1)
    v = mean[:, None] + std[:, None] * torch.randn(1, 20000, 3, d)
    samples = -0.5 * ((query[:, None, :, None] - v[:, :, None]) ** 2).sum(-1) / t
    shifted = samples + predictive_shift(query, mean, std, var, t)
    wide = var + std.view(1, 1, 3) ** 2
    dist = ((query[:, :, None] - mean[:, None]) ** 2).sum(-1)
    g = -(var / t) * (dist / (2 * wide) + 0.5 * d * torch.log(wide))
    assert torch.allclose(shifted.mean(1), g, atol=0.05 * g.abs().max())
    assert torch.allclose(shifted.std(1), samples.std(1))


def test_the_posterior_predictive_gives_a_way_with_more_shots_its_share_only():
    # Gaussian relations drawn as the model says (prior precision 4, sigma^2 = 1): the
    # samples' average gives the way with 5 shots over 30% of the queries, the posterior
    # predictive about 1/N of them.
    torch.manual_seed(0)
    b, n, d, var = 400, 5, 64, 1.0
    centres = torch.randn(b, n, d) * 0.5
    support = centres[:, :, None] + var ** 0.5 * torch.randn(b, n, 5, d)
    query = (centres[:, :, None] + var ** 0.5 * torch.randn(b, n, 4, d)).reshape(b, n * 4, d)
    shots = torch.ones(b, n, dtype=torch.long)
    shots[:, 0] = 5
    shares = {}
    for predictive in ("samples", "gaussian"):
        cfg = _langevin(scales="fixed", prior_trust="fixed", prior_precision=4.0,
                        likelihood_variance=var, temperature=var, predictive=predictive,
                        eval_samples=50)
        sampler = LangevinSampler(cfg).eval()
        logits = sampler.sample_logits(support, query, torch.zeros(b, n, d),
                                       torch.Generator().manual_seed(0), shots)
        pred = torch.softmax(logits, -1).mean(1).argmax(-1)
        shares[predictive] = float(step_share(pred.numpy(), shots.numpy()).mean())
    assert shares["samples"] > 0.3
    assert 0.12 < shares["gaussian"] < 0.28


def test_unequal_episodes_twin_and_step_share_their_draws():
    relations = [f"P{i}" for i in range(6) for _ in range(12)]
    sampler = EpisodeSampler(relations, "toy")
    setting = UnequalSetting.parse("5w1-5s")
    eps = sample_unequal(sampler, setting, [0, 0, 4000], 3, 40)
    whole, cut, step = (eps[n] for n in setting.names())
    assert whole.shots.min() >= 1 and whole.shots.max() <= 5 and whole.support.shape[2] == 5
    assert np.array_equal(cut.relation, whole.relation)
    assert np.array_equal(cut.query, whole.query)
    assert np.array_equal(cut.support[:, :, 0], whole.support[:, :, 0]) and cut.shots is None
    assert sorted(step.shots[0].tolist()) == [1, 1, 1, 1, 5]
    again = sample_unequal(sampler, setting, [0, 0, 4000], 3, 40)
    assert np.array_equal(again[setting.name].support, whole.support)
    for bad in ("5w1s", "1w1-5s", "5w3-2s"):
        with pytest.raises(PipelineError, match="unequal setting"):
            UnequalSetting.parse(bad)


def test_summaries_pair_each_split_with_its_twin():
    cells = {"split_0": {"proto": {
        "5w1-5s": {"episodes": np.array([0.8, 0.6])},
        "5w1-5s_cut1": {"episodes": np.array([0.7, 0.5])},
        "5w1-5s_step": {"episodes": np.array([0.5]), "share": np.array([0.2, 0.4])}}},
        "split_1": {"proto": {
            "5w1-5s": {"episodes": np.array([0.9])},
            "5w1-5s_cut1": {"episodes": np.array([0.7])},
            "5w1-5s_step": {"episodes": np.array([0.5]), "share": np.array([0.2])}}}}
    out = summarise(cells, ("5w1-5s",))
    assert out["gain"]["5w1-5s"]["proto"]["per_split"] == pytest.approx(
        {"split_0": 10.0, "split_1": 20.0})
    assert out["step_share"]["5w1-5s"]["proto"]["mean"] == pytest.approx(25.0)


def test_unbiased_prototypes_score_balanced_episodes_as_plain_means():
    support, _ = _padded(3)
    query = torch.randn(3, 6, 16)
    plain = PrototypeHead("euclidean", 2.5).eval()
    fair = PrototypeHead("euclidean", 2.5, "unbiased").eval()
    torch.testing.assert_close(torch.log_softmax(fair.sample_logits(support, query), -1),
                               torch.log_softmax(plain.sample_logits(support, query), -1))


def step_protocol(b: int = 400, n: int = 5, d: int = 64):
    """One way with 5 shots, the others with 1, every relation's encodings (unit spread)
    around its own centre; 4 queries per way. Support (B, N, 5, D), query (B, 4 N, D),
    shots (B, N)."""
    torch.manual_seed(0)
    centres = torch.randn(b, n, d) * 0.5
    support = centres[:, :, None] + torch.randn(b, n, 5, d)
    query = (centres[:, :, None] + torch.randn(b, n, 4, d)).reshape(b, n * 4, d)
    shots = torch.ones(b, n, dtype=torch.long)
    shots[:, 0] = 5
    return support, query, shots


def test_unbiased_prototypes_take_the_shots_advantage_away():
    # Plain means give the 5-shot way most queries, the unbiased distance about 1/N.
    support, query, shots = step_protocol()
    share = {}
    for scoring in ("mean", "unbiased"):
        head = PrototypeHead("euclidean", 1.0, scoring).eval()
        pred = head_logits(head, support, query, None, None, shots)[:, 0].argmax(-1)
        share[scoring] = float(step_share(pred.numpy(), shots.numpy()).mean())
    assert share["mean"] > 0.5
    assert 0.12 < share["unbiased"] < 0.28


def test_fewer_predictive_dims_charge_an_uncertain_way_less():
    query, mean = torch.randn(1, 4, 32), torch.randn(1, 2, 32)
    std = torch.tensor([0.1, 1.0]).view(1, 2, 1)
    full = predictive_shift(query, mean, std, 0.2, 2.5, 1.0)
    half = predictive_shift(query, mean, std, 0.2, 2.5, 0.5)
    # the wide way (1) gains against the narrow one (0)
    gain = (half - full)[..., 1] - (half - full)[..., 0]
    assert bool((gain > 0).all())
