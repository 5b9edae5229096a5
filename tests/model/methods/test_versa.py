"""Versa (model/methods/versa.py): the amortised posterior, its samples, and the method
end to end."""

import dataclasses

import pytest
import torch
from torch import nn

from model.methods.base import Head, mc_log_predictive
from model.methods.versa import (
    INIT_LOG_VARIANCE,
    METHODS,
    VersaHead,
    gaussian_kl_to_standard_normal,
)
from model.posterior.logits import prototype_logits, similarity_logits
from pipeline.errors import PipelineError
from tests.conftest import model_config
from tests.model.tiny_regrab import registered, train_evaluate_reload

D = 16


def head(**langevin) -> VersaHead:
    """A Versa head on the project's ``model.langevin`` section, with ``langevin`` changed."""
    torch.manual_seed(0)
    return VersaHead(dataclasses.replace(model_config("regrab").langevin, **langevin), D)


def trained_looking(h: VersaHead) -> VersaHead:
    """Give the zero-initialised output layers random weights, so outputs read the support."""
    torch.manual_seed(1)
    for net in (h.mean_net, h.log_var_net):
        nn.init.normal_(net[-1].weight, std=0.3)
    return h


def test_versas_amortised_posterior_has_the_right_shapes_and_a_finite_kl():
    h = trained_looking(head())
    assert isinstance(h, Head) and not h.couples_ways
    support = torch.randn(2, 3, 4, D)
    mean, log_var = h.posterior(support)
    assert mean.shape == log_var.shape == (2, 3, D)
    kl = h.kl(support)
    assert kl.shape == (2, 3) and torch.isfinite(kl).all() and (kl >= 0).all()
    exact = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean, (0.5 * log_var).exp()),
        torch.distributions.Normal(torch.zeros_like(mean), torch.ones_like(mean))).sum(-1)
    assert torch.allclose(kl, exact, atol=1e-4)
    assert float(gaussian_kl_to_standard_normal(torch.zeros(D), torch.zeros(D))) == 0.0
    # Each way's posterior reads its own support only (couples_ways is False).
    other = support.clone()
    other[:, 1] += 1.0
    mean2, log_var2 = h.posterior(other)
    assert torch.equal(mean2[:, 0], mean[:, 0]) and torch.equal(log_var2[:, 2], log_var[:, 2])
    assert not torch.allclose(mean2[:, 1], mean[:, 1] + 1.0)  # the correction reads it
    assert not torch.equal(log_var2[:, 1], log_var[:, 1])


def test_an_untrained_head_is_centred_on_the_support_means():
    h = head()
    support = torch.randn(2, 3, 4, D)
    mean, log_var = h.posterior(support)
    assert torch.allclose(mean, support.mean(2), atol=1e-6)
    assert torch.allclose(log_var, torch.full_like(log_var, INIT_LOG_VARIANCE))


def test_sampling_repeats_with_a_seed_and_uses_the_variance():
    h = trained_looking(head(samples=4000)).requires_grad_(False)
    support = torch.randn(1, 2, 3, D)
    v = h.sample_prototypes(support, torch.Generator().manual_seed(3))
    assert v.shape == (1, 4000, 2, D)
    assert torch.equal(v, h.sample_prototypes(support, torch.Generator().manual_seed(3)))
    assert not torch.equal(v, h.sample_prototypes(support, torch.Generator().manual_seed(4)))
    assert not torch.allclose(v[:, 0], v[:, 1])  # two samples differ
    mean, log_var = h.posterior(support)
    z = (v - mean[:, None]) / (0.5 * log_var).exp()[:, None]  # standardised draws
    assert abs(float(z.mean())) < 0.02 and abs(float(z.std()) - 1.0) < 0.02
    assert float(log_var.std()) > 0.1  # the spread per dimension is the network's, not one
    # Without noise the posterior mean is the one prototype (S = 1).
    quiet = head(noise_eval=False).eval()
    assert torch.equal(quiet.sample_prototypes(support), quiet.posterior(support)[0][:, None])


@pytest.mark.parametrize("ways,shots", [(2, 1), (5, 1), (5, 3)])
def test_logits_and_predictive_for_any_ways_and_shots(ways, shots):
    h = trained_looking(head(samples=3, eval_samples=6)).eval()
    support, query = torch.randn(2, ways, shots, D), torch.randn(2, 7, D)
    with torch.no_grad():
        logits = h.sample_logits(support, query, None, torch.Generator().manual_seed(0))
        log_p = h.log_predictive(support, query, None, torch.Generator().manual_seed(0))
    assert logits.shape == (2, 6, 7, ways) and log_p.shape == (2, 7, ways)
    assert torch.allclose(log_p, mc_log_predictive(logits))
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(2, 7), atol=1e-5)
    assert not log_p.requires_grad  # no graph leaks out of evaluation
    # The logits are the Euclidean similarity to each sample over T.
    v = h.sample_prototypes(support, torch.Generator().manual_seed(0))
    sim = -0.5 * ((query[:, None, :, None] - v[:, :, None]) ** 2).sum(-1)
    assert torch.allclose(logits, sim.detach() / h.config.temperature, atol=1e-4)
    with pytest.raises(PipelineError, match="K >= 1"):
        h.log_predictive(torch.randn(2, ways, 0, D), query)


@pytest.mark.parametrize("similarity", ["euclidean", "dot"])
def test_prototype_logits_are_the_similarity_logits_of_every_sample(similarity):
    x, v = torch.randn(2, 7, D), torch.randn(2, 3, 4, D)
    assert torch.allclose(prototype_logits(x, v, similarity, 2.0),
                          similarity_logits(x[:, None], v, similarity, 2.0), atol=1e-4)


def test_training_reaches_every_parameter():
    h = trained_looking(head(samples=3)).train()
    support, query = torch.randn(1, 3, 2, D), torch.randn(1, 6, D)
    log_p = h.log_predictive(support, query, None, torch.Generator().manual_seed(0))
    torch.nn.functional.nll_loss(log_p[0], torch.arange(3).repeat(2)).backward()
    for name, p in h.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name


def test_versa_trains_evaluates_and_loads(tmp_path):
    with registered(*METHODS):
        model, metrics = train_evaluate_reload(tmp_path, ["versa"])
    assert isinstance(model.head, VersaHead) and model.config.method == "versa"
    # Its parameters trained and came back: the zero-started output layers have moved.
    assert model.head.mean_net[-1].weight.abs().sum() > 0
    assert not torch.allclose(model.head.log_var_net[-1].bias,
                              torch.full((model.encoder.out_dim,), INIT_LOG_VARIANCE))
    for setting in ("2w1s", "3w2s"):
        assert 0 <= metrics["nyt25"]["versa"][setting] <= 100
