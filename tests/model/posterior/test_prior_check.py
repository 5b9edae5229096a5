"""The prior checked against the support's labels (``prior_trust: checked``)."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from model.posterior.langevin import LangevinSampler
from model.posterior.prior_check import prior_check
from model.posterior.target import way_precision
from tests.model.posterior.test_langevin import _cfg


def _episode(swap: bool, seed: int = 0, n: int = 4, k: int = 2, d: int = 32):
    """Ways' prior means far apart, supports around them; ``swap``: each way's sentences lie
    around the next way's prior mean (the priors name the wrong relations)."""
    g = torch.Generator().manual_seed(seed)
    h = 4.0 * torch.randn(1, n, d, generator=g)
    centres = h.roll(1, dims=1) if swap else h
    support = centres[:, :, None] + 0.3 * torch.randn(1, n, k, d, generator=g)
    return support, h


def test_priors_that_classify_the_support_are_kept_and_swapped_ones_dropped():
    right = prior_check(*_episode(False), 1.0, 0.5, 2.5)
    wrong = prior_check(*_episode(True), 1.0, 0.5, 2.5)
    assert right.shape == (1, 1, 1)
    assert float(right) > 0.999 and float(wrong) < 1e-3


def test_it_is_the_bayes_factor_of_the_zero_shot_predictive_against_chance():
    torch.manual_seed(3)
    b, n, k, d, lam, var, t = 2, 3, 2, 8, 2.0, 0.5, 2.5
    support, h = torch.randn(b, n, k, d), torch.randn(b, n, d)
    got = prior_check(support, h, lam, var, t)
    for e in range(b):
        log_bf = 0.0
        for r in range(n):
            for i in range(k):
                logits = torch.tensor([-(support[e, r, i] - h[e, s]).pow(2).sum().item()
                                       * var / (2 * t * (var + 1 / lam)) for s in range(n)])
                log_bf += float(torch.log_softmax(logits, 0)[r]) + math.log(n)
        assert float(got[e]) == pytest.approx(1 / (1 + math.exp(-log_bf)), rel=1e-4)


def test_padding_is_not_read_and_an_episode_without_shots_keeps_its_prior():
    support, h = _episode(False, k=3)
    shots = torch.tensor([[1, 3, 2, 1]])
    noisy = support.clone()
    for r, kr in enumerate(shots[0].tolist()):
        noisy[0, r, kr:] = 100.0  # padded slots: must not count
    assert torch.allclose(prior_check(support, h, 1.0, 0.5, 2.5, shots),
                          prior_check(noisy, h, 1.0, 0.5, 2.5, shots))
    for r, kr in enumerate(shots[0].tolist()):
        noisy[0, r, kr:] = math.nan  # whatever a padded slot holds
    assert torch.allclose(prior_check(support, h, 1.0, 0.5, 2.5, shots),
                          prior_check(noisy, h, 1.0, 0.5, 2.5, shots))
    none = torch.zeros(1, 4, dtype=torch.long)
    assert float(prior_check(support, h, 1.0, 0.5, 2.5, none)) == 1.0


def test_the_sampler_checks_only_at_evaluation_and_only_when_asked():
    support, h = _episode(True)
    base = _cfg(likelihood="gaussian", scales="fixed", prior_precision=2.0,
                likelihood_variance=0.5, noise_eval=False)
    evidence = LangevinSampler(dataclasses.replace(base, prior_trust="evidence")).eval()
    checked = LangevinSampler(dataclasses.replace(base, prior_trust="checked")).eval()
    lam_e = way_precision(support, h, 2.0, 0.5)
    w = prior_check(support, h, 2.0, 0.5, base.temperature)
    assert torch.allclose(evidence.support_precision(support, h), lam_e)
    assert torch.allclose(checked.support_precision(support, h), lam_e * w.clamp(min=1e-6))
    # Swapped priors: the checked prototypes sit on their support means.
    v = checked(support, h)[:, 0]
    assert torch.allclose(v, support.mean(2), atol=1e-3)
    # Training episodes read the evidence rule alone (training is unchanged).
    assert torch.allclose(checked.train().support_precision(support, h), lam_e)
