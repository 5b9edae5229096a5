import dataclasses

import pytest
import torch

from model.posterior.langevin import (
    LangevinConfig,
    LangevinSampler,
    chain_coefficients,
    init_prototypes,
    langevin_step,
    preconditioner,
)
from model.posterior.logits import prototype_logits, similarity_logits
from model.posterior.target import gaussian_posterior, log_posterior_grad
from pipeline.errors import PipelineError
from tests.conftest import model_config


def _cfg(**kw) -> LangevinConfig:
    """The default sampler with the paper's fixed prior trust and the samples' average as
    the predictive (the formulas tested here), changed by ``kw``."""
    return dataclasses.replace(model_config().langevin,
                               **{"prior_trust": "fixed", "predictive": "samples", **kw})


def _log_posterior(v, support, h, temperature, similarity, likelihood, lam, var):
    """Independent autograd target, written from the module doc's equations."""
    b, n, k, d = support.shape
    x = support.reshape(b, n * k, d)
    labels = torch.arange(n).repeat_interleave(k)
    total = 0.0
    for s in range(v.shape[1]):
        if likelihood == "gaussian":
            total = total - 0.5 / var * ((x - v[:, s][:, labels]) ** 2).sum()
        else:
            if similarity == "dot":
                sim = x @ v[:, s].transpose(1, 2)
            else:
                sim = -0.5 * torch.cdist(x, v[:, s]) ** 2
            logp = torch.log_softmax(sim / temperature, -1)[:, torch.arange(n * k), labels]
            total = total + logp.sum() / (k if likelihood == "softmax_mean" else 1)
        total = total - lam * 0.5 * ((v[:, s] - h) ** 2).sum()
    return total


@pytest.mark.parametrize("likelihood", ["gaussian", "softmax", "softmax_mean"])
@pytest.mark.parametrize("similarity", ["dot", "euclidean"])
@pytest.mark.parametrize("shots", [1, 3])
def test_closed_form_gradient_matches_autograd(likelihood, similarity, shots):
    torch.manual_seed(0)
    b, s, n, d = 2, 3, 4, 6
    support = torch.randn(b, n, shots, d, dtype=torch.float64)
    h = torch.randn(b, n, d, dtype=torch.float64)
    v = torch.randn(b, s, n, d, dtype=torch.float64, requires_grad=True)
    _log_posterior(v, support, h, 2.5, similarity, likelihood, 0.7, 0.3).backward()
    closed = log_posterior_grad(v.detach(), support, h, temperature=2.5, similarity=similarity,
                                likelihood=likelihood, precision=0.7, variance=0.3)
    assert closed.shape == (b, s, n, d)
    assert torch.allclose(closed, v.grad, atol=1e-10)


def test_gaussian_posterior_shrinks_prior_with_more_shots():
    torch.manual_seed(3)
    h = torch.randn(1, 2, 4, dtype=torch.float64)
    for k in (1, 5, 50):
        support = torch.randn(1, 2, k, 4, dtype=torch.float64)
        mean, var = gaussian_posterior(support, h, precision=2.0, variance=0.5)
        w_data = (k / 0.5) / (2.0 + k / 0.5)
        assert torch.allclose(mean, (1 - w_data) * h + w_data * support.mean(2))
        assert torch.allclose(var, torch.full((1, 2, 1), 1 / (2.0 + k / 0.5), dtype=h.dtype))
    # The exact posterior mode is a zero of the gradient.
    mean, _ = gaussian_posterior(support, h, 2.0, 0.5)
    grad = log_posterior_grad(mean[:, None], support, h, temperature=1.0, similarity="dot",
                              likelihood="gaussian", precision=2.0, variance=0.5)
    assert grad.abs().max() < 1e-9


def test_preconditioned_chain_samples_the_gaussian_posterior():
    # With P = posterior variance the chain is an AR(1) towards mu with stationary variance
    # s^2 / (1 - eps/4); check the sample mean and variance over many chains.
    torch.manual_seed(4)
    support = torch.randn(1, 3, 2, 5, dtype=torch.float64)
    h = torch.randn(1, 3, 5, dtype=torch.float64)
    cfg = _cfg(samples=4000, steps=60, step_size=0.2, likelihood="gaussian",
               prior_precision=3.0, likelihood_variance=0.4, scales="fixed",
               init_prior_weight=0.0, init_mean_weight=0.0, noise_eval=True, eval_samples=0)
    v = LangevinSampler(cfg).eval()(support, h, torch.Generator().manual_seed(0))
    mean, var = gaussian_posterior(support, h, 3.0, 0.4)
    assert torch.allclose(v.mean(1), mean, atol=0.02)
    expected = var[0, 0, 0] / (1 - 0.2 / 4)
    assert abs(v.var(1).mean() / expected - 1) < 0.05


def test_init_formula():
    support = torch.tensor([[[[1.0, 0.0], [3.0, 0.0]], [[0.0, 2.0], [0.0, 4.0]]]])  # (1,2,2,2)
    h = torch.tensor([[[10.0, 10.0], [-10.0, 0.0]]])
    v = init_prototypes(support, h, prior_weight=0.5, mean_weight=2.0)
    m_r = torch.tensor([[[2.0, 0.0], [0.0, 3.0]]])
    m = torch.tensor([1.0, 1.5])
    assert torch.allclose(v, m_r + 0.5 * h - 2.0 * m)


def test_step_is_pure_and_follows_update_rule():
    torch.manual_seed(1)
    v, g, z = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 5)
    out = langevin_step(v, g, 0.1, 1.0, z)
    assert torch.allclose(out, v + 0.05 * g + 0.1**0.5 * z)
    assert torch.equal(out, langevin_step(v, g, 0.1, 1.0, z))
    p = preconditioner(2, "gaussian", torch.tensor(1.0), torch.tensor(0.5))
    assert torch.allclose(langevin_step(v, g, 0.1, p, z), v + 0.05 * p * g + (0.1 * p) ** 0.5 * z)
    assert preconditioner(2, "softmax", 1.0, 0.5) == 1.0


def test_sampler_shapes_noise_seed_and_decay():
    torch.manual_seed(2)
    support, h = torch.randn(4, 5, 2, 8), torch.randn(4, 5, 8)
    sampler = LangevinSampler(_cfg(samples=7, steps=3, noise_train=True, noise_eval=True,
                                   eval_samples=0))
    sampler.train()
    v = sampler(support, h, torch.Generator().manual_seed(0))
    assert v.shape == (4, 7, 5, 8)
    assert not torch.allclose(v[:, 0], v[:, 1])  # noise makes chains differ
    sampler.eval()  # sampling at evaluation repeats with the same seed
    a = sampler(support, h, torch.Generator().manual_seed(5))
    b = sampler(support, h, torch.Generator().manual_seed(5))
    assert a.shape == (4, 7, 5, 8) and torch.equal(a, b)
    quiet = LangevinSampler(_cfg(noise_eval=False)).eval()
    assert quiet(support, h).shape == (4, 1, 5, 8)  # no noise: one deterministic chain
    # A decay of 0 stops the chain after one step (the authors' 100x decay is almost that).
    frozen = LangevinSampler(_cfg(steps=4, step_decay=0.0, noise_eval=False)).eval()
    one = LangevinSampler(_cfg(steps=1, noise_eval=False)).eval()
    assert torch.allclose(frozen(support, h), one(support, h))


def test_eval_samples_draw_more_chains_at_evaluation_only():
    torch.manual_seed(3)
    support, h = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 4)
    sampler = LangevinSampler(_cfg(samples=4, steps=2, noise_train=True, noise_eval=True,
                                   eval_samples=9))
    assert sampler.train()(support, h, torch.Generator().manual_seed(0)).shape == (2, 4, 3, 4)
    v = sampler.eval()(support, h, torch.Generator().manual_seed(0))
    assert v.shape == (2, 9, 3, 4)
    zero = sampler(torch.zeros(2, 3, 0, 4), h, torch.Generator().manual_seed(0))
    assert zero.shape == (2, 9, 3, 4)  # zero-shot samples the prior as often
    # Without noise every chain is the same: one, whatever eval_samples says.
    quiet = LangevinSampler(_cfg(noise_eval=False, eval_samples=9)).eval()
    assert quiet(support, h).shape == (2, 1, 3, 4)
    # More draws estimate the same posterior: their mean comes closer to its mean.
    cfg = _cfg(samples=2, steps=0, likelihood="gaussian", noise_eval=True, eval_samples=4000)
    mean = LangevinSampler(dataclasses.replace(cfg, noise_eval=False)).eval()(support, h)
    many = LangevinSampler(cfg).eval()(support, h, torch.Generator().manual_seed(1))
    assert torch.allclose(many.mean(1), mean[:, 0], atol=0.1)


def test_zero_shot_samples_the_prior():
    h = torch.randn(2, 3, 4)
    empty = torch.zeros(2, 3, 0, 4)
    cfg = _cfg(samples=3000, likelihood="gaussian", prior_precision=4.0, noise_eval=True,
               eval_samples=0)
    v = LangevinSampler(cfg).eval()(empty, h, torch.Generator().manual_seed(0))
    assert v.shape == (2, 3000, 3, 4)
    assert torch.allclose(v.mean(1), h, atol=0.05)
    assert abs(v.var(1).mean().item() - 0.25) < 0.01
    paper = LangevinSampler(_cfg(likelihood="softmax")).eval()(empty, h)
    assert torch.equal(paper, h[:, None])  # the paper's rule: v = h


def test_learned_scales_get_gradients():
    cfg = _cfg(likelihood="gaussian", scales="learned", noise_train=True, steps=2)
    sampler = LangevinSampler(cfg).train()
    support, h = torch.randn(2, 3, 1, 4), torch.randn(2, 3, 4)
    sampler(support, h, torch.Generator().manual_seed(0)).square().sum().backward()
    assert sampler.log_precision.grad.abs() > 0 and sampler.log_variance.grad.abs() > 0


def test_logits_temperature_and_bad_config():
    x, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    assert torch.allclose(similarity_logits(x, v, "dot", 10.0), x @ v.transpose(1, 2) / 10)
    assert torch.allclose(similarity_logits(x, v, "euclidean", 2.0),
                          -0.5 * torch.cdist(x, v) ** 2 / 2, atol=1e-5)
    with pytest.raises(PipelineError, match="similarity"):
        model_config(langevin={"similarity": "cosine"})
    with pytest.raises(PipelineError, match="likelihood"):
        model_config(langevin={"likelihood": "poisson"})


def test_log_evidence_matches_the_exact_marginal_up_to_a_constant():
    from model.posterior.target import log_evidence

    torch.manual_seed(5)
    n, d = 3, 4
    x = torch.randn(1, 2, n, d, dtype=torch.float64)
    h = torch.randn(1, 2, d, dtype=torch.float64)

    def exact(lam, var):
        # Per dimension the n draws are jointly normal: mean h, cov var I + (1/lam) 1 1^T.
        cov = var * torch.eye(n, dtype=x.dtype) + torch.ones(n, n, dtype=x.dtype) / lam
        dist = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=x.dtype), cov)
        return dist.log_prob((x - h[:, :, None]).transpose(2, 3)).sum(-1)  # (1, 2)

    for (l1, v1), (l2, v2) in [((2.0, 0.5), (0.3, 1.7)), ((5.0, 0.1), (5.0, 0.9))]:
        got = log_evidence(x, h, l1, v1) - log_evidence(x, h, l2, v2)
        assert torch.allclose(got, exact(l1, v1) - exact(l2, v2), atol=1e-9)


def test_gaussian_chain_in_closed_form_equals_the_step_by_step_chain():
    torch.manual_seed(6)
    support = torch.randn(2, 3, 2, 5, dtype=torch.float64)
    h = torch.randn(2, 3, 5, dtype=torch.float64)
    cfg = _cfg(samples=20000, steps=4, step_size=0.7, step_decay=0.8, likelihood="gaussian",
               prior_precision=2.0, likelihood_variance=0.3, scales="fixed",
               init_prior_weight=0.5, init_mean_weight=0.0, noise_eval=True, eval_samples=0)
    sampler = LangevinSampler(cfg).eval()
    # Step by step with the pure functions, the way the softmax likelihoods run.
    v = init_prototypes(support, h, 0.5, 0.0)[:, None].expand(-1, 20000, -1, -1)
    p = preconditioner(2, "gaussian", 2.0, 0.3)
    gen, eps = torch.Generator().manual_seed(1), 0.7
    for _ in range(4):
        grad = log_posterior_grad(v, support, h, temperature=1.0, similarity="euclidean",
                                  likelihood="gaussian", precision=2.0, variance=0.3)
        v = langevin_step(v, grad, eps, p, torch.randn(v.shape, generator=gen,
                                                       dtype=v.dtype))
        eps *= 0.8
    closed = sampler(support, h, torch.Generator().manual_seed(2))
    assert torch.allclose(closed.mean(1), v.mean(1), atol=0.01)
    assert torch.allclose(closed.var(1), v.var(1), rtol=0.05)
    # Without noise the two are the same deterministic chain.
    quiet = LangevinSampler(dataclasses.replace(cfg, noise_eval=False)).eval()
    v = init_prototypes(support, h, 0.5, 0.0)[:, None]
    eps = 0.7
    for _ in range(4):
        grad = log_posterior_grad(v, support, h, temperature=1.0, similarity="euclidean",
                                  likelihood="gaussian", precision=2.0, variance=0.3)
        v = langevin_step(v, grad, eps, p, None)
        eps *= 0.8
    assert torch.allclose(quiet(support, h), v, atol=1e-12)


def test_heldout_scales_recover_lambda_and_sigma_from_the_generative_model():
    from model.posterior.target import heldout_scales

    g = torch.Generator().manual_seed(7)
    r, n, d, lam, var = 400, 6, 32, 4.0, 0.25
    h = torch.randn(r, d, generator=g, dtype=torch.float64)
    v = h + torch.randn(r, d, generator=g, dtype=torch.float64) / lam**0.5
    x = [v[i] + torch.randn(n, d, generator=g, dtype=torch.float64) * var**0.5
         for i in range(r)]
    got_lam, got_var = heldout_scales(x, h)
    assert abs(got_var / var - 1) < 0.03 and abs(got_lam / lam - 1) < 0.05
    # A prior that predicts nothing: lambda tracks the spread of the relation means.
    lam0, _ = heldout_scales(x, torch.zeros_like(h))
    assert lam0 < 1.0


def test_heldout_mode_keeps_scales_as_saved_buffers():
    sampler = LangevinSampler(_cfg(likelihood="gaussian", scales="heldout",
                                   prior_precision=1.0, likelihood_variance=0.05))
    assert sampler.precision == pytest.approx(1.0) and not list(sampler.parameters())
    sampler.set_scales(12.5, 0.02)
    assert sampler.precision == pytest.approx(12.5) and sampler.variance == pytest.approx(0.02)
    state = sampler.state_dict()
    fresh = LangevinSampler(_cfg(likelihood="gaussian", scales="heldout",
                                 prior_precision=1.0, likelihood_variance=0.05))
    fresh.load_state_dict(state)
    assert fresh.precision == pytest.approx(12.5)
    with pytest.raises(ValueError, match="heldout"):
        LangevinSampler(_cfg(scales="fixed")).set_scales(1.0, 1.0)


@pytest.mark.parametrize("scales", ["learned", "heldout"])
def test_flat_prior_needs_fixed_scales_and_says_so(scales):
    # prior_precision 0 used to switch the sampler to fixed scales without a word.
    with pytest.raises(PipelineError, match=f"prior_precision 0 .* needs scales: fixed, not "
                       f"{scales}.*; fix params.yaml"):
        model_config(langevin={"prior_precision": 0, "scales": scales})
    flat = model_config(langevin={"prior_precision": 0, "scales": "fixed"}).langevin
    sampler = LangevinSampler(flat)
    assert sampler.mode == "fixed" and sampler.precision == 0
    h = torch.randn(2, 3, 4)
    assert torch.equal(sampler(torch.randn(2, 3, 0, 4), h, torch.Generator())[:, 0], h)


@pytest.mark.parametrize("shots", [0, 2])
def test_sampler_logits_project_at_evaluation_and_score_samples_in_training(shots):
    torch.manual_seed(9)
    support, h = torch.randn(2, 3, shots, 32), torch.randn(2, 3, 32)
    query = torch.randn(2, 4, 32)
    cfg = _cfg(samples=5, eval_samples=30000, likelihood="gaussian", noise_eval=True,
               noise_train=True, prior_precision=2.0, scales="fixed")
    sampler = LangevinSampler(cfg)
    # Training scores the drawn samples: the same numbers as scoring forward's samples.
    sampler.train()
    got = sampler.sample_logits(support, query, h, torch.Generator().manual_seed(3))
    v = sampler(support, h, torch.Generator().manual_seed(3))
    assert got.shape == (2, 5, 4, 3)
    assert torch.equal(got, prototype_logits(query, v, cfg.similarity, cfg.temperature))
    # Evaluation draws the projected logits: a different draw of the same law.
    sampler.eval()
    fast = sampler.sample_logits(support, query, h, torch.Generator().manual_seed(3))
    slow = prototype_logits(query, sampler(support, h, torch.Generator().manual_seed(4)),
                            cfg.similarity, cfg.temperature)
    assert fast.shape == slow.shape == (2, 30000, 4, 3)
    assert not torch.equal(fast, slow)
    assert torch.allclose(torch.softmax(fast, -1).mean(1), torch.softmax(slow, -1).mean(1),
                          atol=0.01)
    assert torch.allclose(fast.std(1), slow.std(1), rtol=0.03)


def test_a_chain_of_a_billion_steps_stops_at_its_fixed_point_with_the_same_numbers():
    cfg = model_config().langevin
    for eps, decay in ((1.0, 1.0), (0.5, 0.5), (0.01, 1.0)):
        short = dataclasses.replace(cfg, steps=200_000, step_size=eps, step_decay=decay)
        c, spread, ran = chain_coefficients(dataclasses.replace(short, steps=10**9))
        assert ran < short.steps and (c, spread) == chain_coefficients(short)[:2]
    five = dataclasses.replace(cfg, steps=5, step_size=1.0, step_decay=1.0)
    assert chain_coefficients(five) == (0.5 ** 5, sum(0.25 ** t for t in range(5)), 5)


def test_what_a_chain_costs_is_measured_and_a_year_of_steps_is_refused():
    from model.posterior.cost import chain_seconds
    from pipeline.budget import check_time

    cfg = dataclasses.replace(model_config().langevin, likelihood="softmax", steps=2)
    two = chain_seconds(cfg, 3, 1, dim=8)
    assert two > 0 and chain_seconds(dataclasses.replace(cfg, steps=0), 3, 1) == 0.0
    with pytest.raises(PipelineError, match=r"would take about .* more than 7.0 days; lower"):
        check_time("the chains", 10**12, two, "chain", "lower model.langevin.steps")
    check_time("the chains", 10, two, "chain", "lower model.langevin.steps")
