import pytest
import torch

from model.langevin import (
    LangevinConfig,
    LangevinSampler,
    init_prototypes,
    langevin_step,
    log_posterior_grad,
    similarity_logits,
)
from pipeline.errors import PipelineError


def _log_posterior(v, support, h, temperature, similarity, prior_weight):
    """Independent autograd target: (1/K) log p(y_S | x_S, v) + w log N(v | h, I)."""
    b, n, k, d = support.shape
    x = support.reshape(b, n * k, d)
    total = 0.0
    for s in range(v.shape[1]):
        if similarity == "dot":
            sim = x @ v[:, s].transpose(1, 2)
        else:
            sim = -0.5 * torch.cdist(x, v[:, s]) ** 2
        logp = torch.log_softmax(sim / temperature, -1)
        labels = torch.arange(n).repeat_interleave(k)
        total = total + logp[:, torch.arange(n * k), labels].sum() / k
        total = total - prior_weight * 0.5 * ((v[:, s] - h) ** 2).sum()
    return total


@pytest.mark.parametrize("similarity", ["dot", "euclidean"])
@pytest.mark.parametrize("shots", [1, 3])
def test_closed_form_gradient_matches_autograd(similarity, shots):
    torch.manual_seed(0)
    b, s, n, d = 2, 3, 4, 6
    support = torch.randn(b, n, shots, d, dtype=torch.float64)
    h = torch.randn(b, n, d, dtype=torch.float64)
    v = torch.randn(b, s, n, d, dtype=torch.float64, requires_grad=True)
    _log_posterior(v, support, h, 2.5, similarity, 0.7).backward()
    closed = log_posterior_grad(v.detach(), support, h, temperature=2.5,
                                similarity=similarity, prior_weight=0.7)
    assert closed.shape == (b, s, n, d)
    assert torch.allclose(closed, v.grad, atol=1e-10)


def test_init_formula():
    support = torch.tensor([[[[1.0, 0.0], [3.0, 0.0]], [[0.0, 2.0], [0.0, 4.0]]]])  # (1,2,2,2)
    h = torch.tensor([[[10.0, 10.0], [-10.0, 0.0]]])
    v = init_prototypes(support, h, prior_weight=0.5, mean_weight=2.0)
    m_r = torch.tensor([[[2.0, 0.0], [0.0, 3.0]]])
    m = torch.tensor([1.0, 1.5])
    assert torch.allclose(v, m_r + 0.5 * h - 2.0 * m)


def test_step_is_pure_and_follows_update_rule():
    torch.manual_seed(1)
    support, h = torch.randn(1, 3, 2, 5), torch.randn(1, 3, 5)
    v, z = torch.randn(1, 2, 3, 5), torch.randn(1, 2, 3, 5)
    grad = log_posterior_grad(v, support, h, temperature=10.0, similarity="dot")
    out = langevin_step(v, support, h, 0.1, z, temperature=10.0, similarity="dot")
    assert torch.allclose(out, v + 0.05 * grad + 0.1**0.5 * z)
    assert torch.equal(out, langevin_step(v, support, h, 0.1, z, temperature=10.0,
                                          similarity="dot"))


def test_sampler_shapes_noise_and_decay():
    torch.manual_seed(2)
    support, h = torch.randn(4, 5, 2, 8), torch.randn(4, 5, 8)
    sampler = LangevinSampler(LangevinConfig(samples=7, steps=3))
    sampler.train()
    v = sampler(support, h, torch.Generator().manual_seed(0))
    assert v.shape == (4, 7, 5, 8)
    assert not torch.allclose(v[:, 0], v[:, 1])  # noise makes chains differ
    sampler.eval()  # noise off at evaluation by default: one deterministic chain
    v_eval = sampler(support, h)
    assert v_eval.shape == (4, 1, 5, 8)
    # A decay of 0 stops the chain after one step (the authors' 100x decay is almost that).
    frozen = LangevinSampler(LangevinConfig(steps=4, step_decay=0.0, noise_train=False)).eval()
    one = LangevinSampler(LangevinConfig(steps=1, noise_train=False)).eval()
    assert torch.allclose(frozen(support, h), one(support, h))


def test_prior_alone_contracts_towards_h():
    # Zero support encodings carry no likelihood signal, so each step is v - h <- (1 - eps/2)
    # (v - h); starting at m_r - m = 0 (a = 0) gives v = (1 - (1 - eps/2)^M) h.
    support = torch.zeros(1, 3, 2, 4)
    h = torch.randn(1, 3, 4)
    cfg = LangevinConfig(steps=6, step_size=0.5, init_prior_weight=0.0, noise_eval=False)
    v = LangevinSampler(cfg).eval()(support, h)[:, 0]
    assert torch.allclose(v, (1 - 0.75**6) * h, atol=1e-6)


def test_logits_temperature_and_bad_config():
    x, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4)
    assert torch.allclose(similarity_logits(x, v, "dot", 10.0), x @ v.transpose(1, 2) / 10)
    assert torch.allclose(similarity_logits(x, v, "euclidean", 2.0),
                          -0.5 * torch.cdist(x, v) ** 2 / 2, atol=1e-5)
    with pytest.raises(PipelineError):
        LangevinConfig(similarity="cosine")
