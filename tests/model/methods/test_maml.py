"""MAML head: the inner steps against the closed-form gradient, second order, end to end."""

import math

import pytest
import torch

from model.methods.base import Head, PrototypeHead
from model.methods.maml import METHODS, MamlHead
from pipeline.errors import PipelineError
from tests.model.tiny_regrab import registered, train_evaluate_reload

T = 2.0


def episode(b=2, n=3, k=2, q=4, d=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    support = torch.randn(b, n, k, d, generator=g, dtype=dtype)
    query = torch.randn(b, q, d, generator=g, dtype=dtype)
    return support, query


def head_with(d, lrs, first_order=False, seed=1):
    """A head in float64 with a random metric gamma and the given per-step rates."""
    head = MamlHead(T, d, steps=len(lrs), first_order=first_order).double()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.log_metric.copy_(0.3 * torch.randn(d, generator=g, dtype=torch.float64))
        head.log_lr.copy_(torch.tensor([math.log(a) for a in lrs], dtype=torch.float64))
    return head


def by_hand(support, gamma, lrs, detach_grad=False):
    """Proto-MAML start and the inner steps with the explicit softmax-CE gradient of a linear
    head, ``dL/dW = (P - Y)^T X / (M T)``, ``dL/db = 1^T (P - Y) / (M T)``; autograd through
    this formula is the second-order MAML gradient, detaching it the first-order one."""
    b, n, k, d = support.shape
    x = support.reshape(b, n * k, d)
    y = torch.nn.functional.one_hot(torch.arange(n).repeat_interleave(k), n).to(x.dtype)
    c = support.mean(2)
    w = gamma * c
    bias = -0.5 * (gamma * c * c).sum(-1)
    for lr in lrs:
        p = torch.softmax((x @ w.transpose(1, 2) + bias[:, None]) / T, -1)  # (B, M, N)
        gw = (p - y).transpose(1, 2) @ x / (n * k * T)  # (B, N, D)
        gb = (p - y).sum(1) / (n * k * T)  # (B, N)
        if detach_grad:
            gw, gb = gw.detach(), gb.detach()
        w, bias = w - lr * gw, bias - lr * gb
    return w, bias


def test_adapted_weights_match_a_hand_computed_gradient_step():
    support, _ = episode()
    head = head_with(5, [0.7])
    w, b = head.adapted(support)
    w_ref, b_ref = by_hand(support, head.log_metric.exp(), [0.7])
    assert torch.allclose(w, w_ref, atol=1e-12) and torch.allclose(b, b_ref, atol=1e-12)
    w0, _ = by_hand(support, head.log_metric.exp(), [])
    assert (w - w0).abs().max() > 1e-3  # the step moved the weights


def test_each_step_uses_its_own_learning_rate():
    support, _ = episode(seed=3)
    head = head_with(5, [0.5, 2.0, 1.0])
    w, b = head.adapted(support)
    w_ref, b_ref = by_hand(support, head.log_metric.exp(), [0.5, 2.0, 1.0])
    assert torch.allclose(w, w_ref, atol=1e-12) and torch.allclose(b, b_ref, atol=1e-12)
    w_swapped, _ = by_hand(support, head.log_metric.exp(), [2.0, 0.5, 1.0])
    assert not torch.allclose(w, w_swapped, atol=1e-6)


def test_outer_gradient_is_second_order():
    """The gradient of the query loss with respect to the start (gamma) and the support
    matches autograd through the hand-written steps, and differs from the first-order one."""
    support, query = episode(b=1, n=3, k=2, q=6, seed=5)
    labels = torch.arange(3).repeat_interleave(2)[None]
    lrs = [1.5, 1.0]

    def grads(head=None, detach_grad=False):
        s = support.clone().requires_grad_(True)
        if head is None:
            log_gamma = head_with(5, lrs).log_metric.detach().clone().requires_grad_(True)
            w, b = by_hand(s, log_gamma.exp(), lrs, detach_grad)
            log_p = torch.log_softmax((query @ w.transpose(1, 2) + b[:, None]) / T, -1)
        else:
            log_gamma = head.log_metric
            log_p = head.log_predictive(s, query)
        loss = torch.nn.functional.nll_loss(log_p.reshape(-1, 3), labels.reshape(-1))
        return torch.autograd.grad(loss, (log_gamma, s))

    second = grads(head_with(5, lrs))
    first = grads(head_with(5, lrs, first_order=True))
    for got, want in zip(second, grads(), strict=True):
        assert torch.allclose(got, want, atol=1e-10)
    for got, want in zip(first, grads(detach_grad=True), strict=True):
        assert torch.allclose(got, want, atol=1e-10)
    assert (second[0] - first[0]).abs().max() > 1e-4  # the second-order terms are there


def test_gradients_agree_with_finite_differences():
    """gradcheck over the support, the queries, gamma and the step sizes: exact only if the
    steps are differentiated second order (the first-order head fails the same check)."""
    support, query = episode(b=2, n=2, k=2, q=3, d=3, seed=7)
    names = ("log_metric", "log_lr")

    def run(head):
        def f(s, q, log_metric, log_lr):
            params = dict(zip(names, (log_metric, log_lr), strict=True))
            return torch.func.functional_call(head, params, (s, q))
        return f

    head = head_with(3, [1.0, 0.5])
    inputs = (support.requires_grad_(True), query.requires_grad_(True),
              head.log_metric.detach().clone().requires_grad_(True),
              head.log_lr.detach().clone().requires_grad_(True))
    head.forward = head.log_predictive  # functional_call calls forward
    assert torch.autograd.gradcheck(run(head), inputs)
    fo = head_with(3, [1.0, 0.5], first_order=True)
    fo.forward = fo.log_predictive
    assert not torch.autograd.gradcheck(run(fo), inputs, raise_exception=False)


def test_without_steps_it_is_proto():
    """gamma = 1 and no steps: the linear head is the Euclidean prototype classifier."""
    support, query = episode(b=3, n=4, k=3, q=5, d=6, seed=11)
    maml = MamlHead(T, 6, steps=0).double()
    proto = PrototypeHead("euclidean", T)
    assert torch.allclose(maml.log_predictive(support, query),
                          proto.log_predictive(support, query), atol=1e-10)


def test_episodes_of_a_batch_adapt_independently():
    support, query = episode(b=3, seed=13)
    head = head_with(5, [1.0, 1.0, 1.0])
    batched = head.log_predictive(support, query)
    alone = torch.cat([head.log_predictive(support[i:i + 1], query[i:i + 1]) for i in range(3)])
    assert torch.allclose(batched, alone, atol=1e-12)


def test_evaluation_under_no_grad_adapts_and_leaves_no_graph():
    support, query = episode(seed=17)
    head = head_with(5, [1.0, 1.0])
    support.requires_grad_(True)
    trained = head.log_predictive(support, query)
    head.eval()
    with torch.no_grad():
        evaluated = head.log_predictive(support, query)
    assert evaluated.grad_fn is None and not evaluated.requires_grad
    assert torch.allclose(evaluated, trained.detach(), atol=1e-12)  # the steps still ran
    without = MamlHead(T, 5, steps=0).double()
    without.log_metric.data.copy_(head.log_metric)
    assert not torch.allclose(evaluated, without.log_predictive(support, query), atol=1e-4)
    out = head.log_predictive(support, query)  # eval mode with grad on: still detached
    assert out.grad_fn is None and not out.requires_grad


def test_shapes_for_any_ways_and_shots_and_zero_shot_refused():
    head = MamlHead(5.0, 8)
    assert isinstance(head, Head) and head.couples_ways and head.prior is None
    for n, k in ((5, 1), (10, 5), (2, 3)):
        support, query = episode(b=2, n=n, k=k, q=7, d=8, dtype=torch.float32)
        assert head.sample_logits(support, query).shape == (2, 1, 7, n)
        log_p = head.log_predictive(support, query)
        assert log_p.shape == (2, 7, n)
        assert torch.allclose(log_p.exp().sum(-1), torch.ones(2, 7))
    with pytest.raises(PipelineError, match="K >= 1"):
        head.log_predictive(torch.zeros(1, 3, 0, 8), torch.zeros(1, 2, 8))


def test_maml_trains_evaluates_and_loads(tmp_path):
    with registered(*METHODS):
        model, metrics = train_evaluate_reload(tmp_path, ["maml", "proto"])
    assert isinstance(model.head, MamlHead) and model.config.method == "maml"
    assert model.config.langevin.similarity == "euclidean"
    assert model.head.log_metric.abs().max() > 0  # the start's metric trained (from 0)
    assert set(metrics["nyt25"]) >= {"maml", "proto"}
    for setting in ("2w1s", "3w2s"):
        assert 0 <= metrics["nyt25"]["maml"][setting] <= 100
