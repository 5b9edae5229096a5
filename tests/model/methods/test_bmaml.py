"""BMAML (model/methods/bmaml.py): the SVGD update, the prototype particles, the method
end to end."""

import dataclasses
import math
import statistics

import pytest
import torch

from model.methods.base import Head, mc_log_predictive
from model.methods.bmaml import INIT_STD, METHODS, BmamlHead, rbf_kernel, svgd_step
from model.posterior.logits import similarity_logits
from pipeline.errors import PipelineError
from tests.conftest import model_config
from tests.model.tiny_regrab import registered, train_evaluate_reload

D = 8


def head(**langevin) -> BmamlHead:
    """A BMAML head on the project's ``model.langevin`` section, with ``langevin`` changed."""
    return BmamlHead(dataclasses.replace(model_config("regrab").langevin, **langevin), D)


def test_svgd_on_a_2d_gaussian_target_moves_particles_to_its_mean_and_spread():
    mu = torch.tensor([1.0, -2.0])
    sigma = torch.tensor([[1.0, 0.6], [0.6, 2.0]])
    precision = torch.linalg.inv(sigma)
    g = torch.Generator().manual_seed(0)
    x = 0.3 * torch.randn(50, 2, generator=g) + torch.tensor([-3.0, 3.0])  # far, and tight
    for _ in range(500):
        x = svgd_step(x, -(x - mu) @ precision, 0.5)
    assert torch.allclose(x.mean(0), mu, atol=0.1)
    # Fifty particles hold the spread to within 20% (SVGD's finite-particle estimate runs
    # ~10% narrow here); gradient ascent alone would collapse them onto the mean.
    assert torch.allclose(torch.cov(x.T), sigma, rtol=0.2, atol=0.05)


def test_svgd_step_matches_the_update_written_particle_by_particle():
    g = torch.Generator().manual_seed(1)
    x, grad = torch.randn(2, 5, 3, generator=g), torch.randn(2, 5, 3, generator=g)
    new = svgd_step(x, grad, 0.1)
    for b in range(2):
        pairs = [float(((x[b, i] - x[b, j]) ** 2).sum()) for i in range(5) for j in range(i)]
        h = statistics.median_low(pairs) / math.log(6)
        for i in range(5):
            phi = torch.zeros(3)
            for j in range(5):
                k = math.exp(-float(((x[b, j] - x[b, i]) ** 2).sum()) / h)
                phi += k * grad[b, j] + k * 2 * (x[b, i] - x[b, j]) / h  # drive + repulsion
            assert torch.allclose(new[b, i], x[b, i] + 0.1 * phi / 5, atol=1e-5)
    kernel, _ = rbf_kernel(x)
    assert torch.allclose(kernel.diagonal(dim1=-2, dim2=-1), torch.ones(2, 5))
    # One particle has nothing to repel: SVGD is gradient ascent.
    assert torch.allclose(svgd_step(x[:, :1], grad[:, :1], 0.1), x[:, :1] + 0.1 * grad[:, :1])
    # Identical particles do not divide by a zero bandwidth.
    same = svgd_step(x[:, :1].expand(-1, 4, -1), grad[:, :1].expand(-1, 4, -1), 0.1)
    assert torch.isfinite(same).all()


@pytest.mark.parametrize("similarity", ["euclidean", "dot"])
def test_the_target_gradient_is_the_gradient_of_support_likelihood_plus_prior(similarity):
    h = head(similarity=similarity, temperature=2.0, prior_precision=0.5)
    g = torch.Generator().manual_seed(2)
    support, v = torch.randn(2, 3, 2, D, generator=g), torch.randn(2, 4, 3, D, generator=g)
    v.requires_grad_(True)
    x = support.reshape(2, 1, 6, D)  # (B, 1, N K, D); shot k of way n is labelled n
    log_p = torch.log_softmax(similarity_logits(x, v, similarity, 2.0), -1)  # (B, M, NK, N)
    labels = torch.arange(3).repeat_interleave(2)
    target = log_p[..., torch.arange(6), labels].sum() - 0.25 * (v * v).sum()
    (auto,) = torch.autograd.grad(target, v)
    assert torch.allclose(h.log_target_grad(v.detach(), support), auto, atol=1e-5)


def test_particles_shapes_seed_spread_and_noise_switch():
    h = head(samples=6, steps=3).requires_grad_(False)
    assert isinstance(h, Head) and h.couples_ways
    support = torch.randn(2, 4, 3, D)
    v = h.particles(support, torch.Generator().manual_seed(0))
    assert v.shape == (2, 6, 4, D)
    assert torch.equal(v, h.particles(support, torch.Generator().manual_seed(0)))
    assert not torch.allclose(v[:, 0], v[:, 1])  # the particles differ
    start = head(samples=6, steps=0).requires_grad_(False).particles(
        support, torch.Generator().manual_seed(0))
    spread = float((start - support.mean(2)[:, None]).std())
    assert abs(spread - INIT_STD) < 0.02  # they start around the support means
    assert not torch.allclose(v, start)  # and SVGD moved them
    quiet = head(samples=6, steps=3, noise_eval=False).eval()
    assert quiet.particles(support).shape == (2, 1, 4, D)  # one deterministic particle


@pytest.mark.parametrize("ways,shots", [(2, 1), (5, 1), (5, 3)])
def test_logits_and_predictive_for_any_ways_and_shots(ways, shots):
    h = head(samples=5, steps=2).eval()
    support, query = torch.randn(3, ways, shots, D), torch.randn(3, 7, D)
    with torch.no_grad():  # as evaluation calls it: SVGD needs no autograd
        logits = h.sample_logits(support, query, None, torch.Generator().manual_seed(0))
        log_p = h.log_predictive(support, query, None, torch.Generator().manual_seed(0))
    assert logits.shape == (3, 5, 7, ways) and log_p.shape == (3, 7, ways)
    assert torch.allclose(log_p, mc_log_predictive(logits))
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(3, 7), atol=1e-5)
    assert not log_p.requires_grad
    with pytest.raises(PipelineError, match="K >= 1"):
        h.log_predictive(torch.randn(3, ways, 0, D), query)


def test_training_differentiates_through_the_svgd_steps():
    h = head(samples=4, steps=3).train()
    support = torch.randn(1, 3, 2, D, requires_grad=True)
    query = torch.randn(1, 6, D)
    log_p = h.log_predictive(support, query, None, torch.Generator().manual_seed(0))
    torch.nn.functional.nll_loss(log_p[0], torch.arange(3).repeat(2)).backward()
    for name, p in h.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, \
            name
    assert h.log_step_size.grad.abs() > 0  # only the steps use the step size
    assert torch.isfinite(support.grad).all() and support.grad.abs().sum() > 0


def test_bmaml_trains_evaluates_and_loads(tmp_path):
    with registered(*METHODS):
        model, metrics = train_evaluate_reload(tmp_path, ["bmaml"])
    assert isinstance(model.head, BmamlHead) and model.config.method == "bmaml"
    fresh = BmamlHead(model.config.langevin, model.encoder.out_dim)
    # Its parameters trained and came back from the checkpoint.
    assert not torch.equal(model.head.log_step_size, fresh.log_step_size)
    assert not torch.equal(model.head.log_init_std, fresh.log_init_std)
    for setting in ("2w1s", "3w2s"):
        assert 0 <= metrics["nyt25"]["bmaml"][setting] <= 100
