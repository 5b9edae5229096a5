"""BMAML: prototype particles moved by SVGD on the support likelihood (Yoon et al., 2018).

"Bayesian Model-Agnostic Meta-Learning" (NeurIPS 2018) keeps M particles of a task's
parameters, starts them from meta-learned initial particles, moves them by a few steps of
Stein variational gradient descent (Liu and Wang, 2016) on the task's training data, and
predicts with the average over particles. Here a particle is one set of prototypes
``V_m = (v_m1 .. v_mN)`` (N x D), and its log target is the support likelihood of the
project's softmax over ways plus a Gaussian prior (REGRAB's ``softmax`` likelihood of
:mod:`model.posterior.langevin` with h = 0):

    log p(V | S) = sum_(n,k) log softmax_n(sim(x_nk, V) / T) - lambda/2 ||V||^2 + const

SVGD moves every particle along the kernelised gradient

    V_i <- V_i + eps/M sum_j [k(V_j, V_i) grad log p(V_j) + grad_(V_j) k(V_j, V_i)]
    k(V, V') = exp(-||V - V'||^2 / h),   h = med_(i != j) ||V_i - V_j||^2 / log(M + 1)

(the RBF kernel with Liu and Wang's median heuristic, over the flattened N x D particle).
The first term follows the posterior's gradient, the second pushes particles apart, so the
particles approximate the posterior rather than collapsing on its mode. The query
predictive is ``log (1/M) sum_m softmax(sim(x_q, V_m) / T)``.

Particles start at ``m_n + sigma * z_mn`` (m_n the support mean, ``z ~ N(0, I)`` drawn with
the caller's generator, sigma a learned per-dimension scale), take
``model.langevin.steps`` SVGD steps of a learned size eps, and M is ``model.langevin.samples``;
lambda is ``model.langevin.prior_precision``. The gradient is in closed form and
differentiable, so training back-propagates through every SVGD step exactly (the
second-order meta-gradient, what ``create_graph=True`` would give, at no autograd cost), and
evaluation under ``torch.no_grad`` needs no gradients at all. The kernel bandwidth h is held
constant in that back-propagation, as SVGD's own derivation holds it.

Where ours differs from the paper, and why:

* Particles are prototypes (the last layer), not every weight of the network: the encoder is
  shared by all particles and trained by the outer loop only, which keeps a particle at
  N x D numbers instead of a transformer.
* The paper meta-learns M fixed initial particles; a prototype set cannot be fixed across
  episodes whose ways differ, so ours start at the support means plus sampled noise of a
  meta-learned scale, and the step size is meta-learned too (the paper fixes it).
* The meta-loss is the ensemble's query log-likelihood (the paper's Bayesian fast
  adaptation, its first objective) through the shared trainer, not its Chaser loss, which
  needs a second, longer SVGD run on support plus queries per step.
* ``model.langevin.noise_train``/``noise_eval`` apply as for REGRAB: with noise off one
  particle starts at the support means, and SVGD becomes gradient ascent on the posterior.
* Ways with unequal shots: the average of ``model.langevin.balanced_members`` SVGD runs, each
  on the support with every way cut to the smallest way's count
  (:mod:`model.posterior.subsample`); oversampled, the way with more sentences drew the
  queries.

Shapes:
    B episodes, M particles (S in the head's outputs), N ways, K shots, Q queries, D
    encoding size, P = N D the size of one particle.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from model.methods.base import SampledPrototypeHead, gaussian_samples, require_shots
from model.methods.registry import Method
from model.posterior.config import LangevinConfig
from model.posterior.logits import prototype_logits

if TYPE_CHECKING:
    from model.config import RegrabConfig
    from model.prior.graph import RelationGraph

#: Starting per-dimension scale sigma of the particles around the support means.
INIT_STD = 0.1
#: Starting SVGD step size eps.
INIT_STEP_SIZE = 0.05


def rbf_kernel(particles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """RBF kernel matrix with the median-heuristic bandwidth, and that bandwidth.

    ``h = med ||x_i - x_j||^2 / log(M + 1)`` over pairs i != j (detached: a constant of the
    update); one particle has the kernel 1 and h = 1.

    Shapes:
        particles: (..., M, P) -> kernel (..., M, M), h (..., 1, 1)
    """
    m = particles.shape[-2]
    gram = particles @ particles.transpose(-1, -2)  # (..., M, M)
    sq = gram.diagonal(dim1=-2, dim2=-1)  # (..., M), without another pass over the particles
    dist = (sq[..., :, None] + sq[..., None, :] - 2 * gram).clamp_min(0)  # (..., M, M)
    if m == 1:
        h = torch.ones_like(dist)
    else:
        off = ~torch.eye(m, dtype=torch.bool, device=particles.device)
        med = dist.detach()[..., off].median(-1).values  # (...)
        h = (med / math.log(m + 1)).clamp_min(torch.finfo(dist.dtype).tiny)[..., None, None]
    return torch.exp(-dist / h), h


def svgd_step(particles: torch.Tensor, grad_logp: torch.Tensor,
              step_size: torch.Tensor | float) -> torch.Tensor:
    """One SVGD update (pure: no state, no sampling).

    ``x_i + eps/M sum_j [k_ji grad_j + (2/h) (x_i - x_j) k_ji]``, the second term being
    ``grad_(x_j) k(x_j, x_i)`` of the RBF kernel. It is computed as
    ``x_i (1 + c/M sum_j k_ij) + eps/M sum_j k_ij (grad_j - (2/h) x_j)`` with
    ``c = 2 eps / h``: two passes over the particles instead of eight (an evaluation batch
    holds 250 x M x N x D numbers, and these passes were most of its time).

    Shapes:
        particles, grad_logp: (..., M, P) -> (..., M, P)
    """
    *lead, m, p = particles.shape
    x = particles.reshape(-1, m, p)  # (E, M, P), E = all leading dims
    k, h = rbf_kernel(x)  # (E, M, M), symmetric; h (E, 1, 1)
    pull = torch.addcmul(grad_logp.reshape(-1, m, p), -2.0 / h, x)  # (E, M, P)
    scale = 1.0 + (2.0 * step_size / (h * m)) * k.sum(-1, keepdim=True)  # (E, M, 1)
    # In place on the product's fresh output: its backward needs only k and pull.
    out = torch.bmm((step_size / m) * k, pull).addcmul_(x, scale)  # (E, M, P)
    return out.reshape(*lead, m, p)


class BmamlHead(SampledPrototypeHead):
    """M prototype particles per episode, moved by SVGD; predictive averaged over them,
    ``log (1/M) sum_m softmax(sim(x_q, V_m) / T)``."""

    couples_ways = True  # the softmax likelihood normalises over every way's prototype

    def __init__(self, config: LangevinConfig, dim: int) -> None:
        super().__init__(config)
        self.log_init_std = nn.Parameter(torch.full((dim,), math.log(INIT_STD)))
        self.log_step_size = nn.Parameter(torch.tensor(math.log(INIT_STEP_SIZE)))

    def log_target_grad(self, v: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        """Gradient of every particle's log target (softmax likelihood + N(0, I / lambda)).

        ``1/T sum_s (1[y_s = n] - p_sn) d sim(x_s, v_n)/d v_n - lambda v_n``, with
        ``d sim/d v = x`` (dot) or ``x - v`` (Euclidean): the ``softmax`` gradient of
        :func:`model.posterior.target.log_posterior_grad` at h = 0, in products that do not copy
        the support once per particle.

        Shapes:
            v: (B, M, N, D), support: (B, N, K, D) -> (B, M, N, D)
        """
        cfg = self.config
        b, m, n, d = v.shape
        k = support.shape[2]
        x = support.reshape(b, n * k, d)  # (B, N K, D); shot k of way n is labelled n
        p = torch.softmax(prototype_logits(x, v, cfg.similarity, cfg.temperature), -1)
        onehot = torch.eye(n, dtype=v.dtype, device=v.device).repeat_interleave(k, 0)
        resid = (onehot - p).transpose(-1, -2) / cfg.temperature  # (B, M, N, N K)
        grad = (resid.reshape(b, m * n, n * k) @ x).view(b, m, n, d)  # (B, M, N, D)
        if cfg.similarity == "dot":
            return grad.add(v, alpha=-cfg.prior_precision)  # the prior's -lambda v
        # Euclidean: d sim / d v = x - v adds -sum_s r_sn v_n to the prior's -lambda v.
        shrink = resid.sum(-1, keepdim=True) + cfg.prior_precision  # (B, M, N, 1)
        return torch.addcmul(grad, shrink, v, value=-1.0)

    def draws(self) -> int:
        """M, the particles: ``samples`` (1 without noise)."""
        return self.config.samples if self.noisy() else 1

    def particles(self, support: torch.Tensor, generator: torch.Generator | None = None,
                  draws: int | None = None) -> torch.Tensor:
        """Initial particles, then ``steps`` SVGD steps on the support.

        Shapes:
            support: (B, N, K, D) with K >= 1 -> (B, M, N, D), M = ``draws`` or
            :meth:`draws`
        """
        require_shots(support, "bmaml")
        mean = support.mean(2)  # (B, N, D)
        if self.noisy():
            v = gaussian_samples(mean, self.log_init_std.exp(), draws or self.draws(),
                                 generator)
        else:
            v = mean[:, None]  # (B, 1, N, D)
        eps = self.log_step_size.exp()
        for _ in range(self.config.steps):
            grad = self.log_target_grad(v, support)  # (B, M, N, D)
            v = svgd_step(v.flatten(2), grad.flatten(2), eps).view_as(v)  # (B, M, N, D)
        return v

    #: The prototype samples :meth:`sample_logits` scores are the particles.
    sample_prototypes = particles


def _bmaml(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> BmamlHead:
    return BmamlHead(config.langevin, dim)


METHODS = (
    Method("bmaml", _bmaml, "prototype particles moved by SVGD on the support, predictive "
           "averaged over particles (Yoon et al., 2018)", seed=7, stepwise=True,
           samples=True),
)
