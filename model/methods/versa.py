"""Versa: an amortised Gaussian posterior over each way's prototype (Gordon et al., 2019).

"Meta-Learning Probabilistic Inference for Prediction" (ICLR 2019) replaces per-task
optimisation by an amortisation network that maps a way's support to the parameters of a
Gaussian over that way's classifier weights, and trains it with ML-PIP, the predictive
log-likelihood of the queries under the Monte Carlo average over weight samples:

    phi_n   = (1/K) sum_k e(x_nk)                       instance pooling of an embedding
    mu_n    = m_n + f_mu(phi_n),  log s2_n = f_s(phi_n)  (D each; m_n the support mean)
    v_ns    = mu_n + s_n * z_ns,  z_ns ~ N(0, I)          s = 1..S, reparameterised
    log p(y_q = n | x_q, S) ~= log (1/S) sum_s softmax_n(sim(x_q, v_ns) / T)

``e`` is one dense layer with ELU before pooling and ``f_mu``, ``f_s`` are two-layer MLPs
after it, as in the paper's amortisation network. ML-PIP has no KL term (the objective is
the predictive likelihood alone, which the shared trainer already maximises);
:meth:`VersaHead.kl` still gives the KL of each way's posterior to ``N(0, I)`` for
inspection and tests.

Where ours differs from the paper, and why:

* The Gaussian is over a prototype compared to the queries with the project's similarity
  (``model.langevin.similarity``, Euclidean by default) and temperature, not over the weights
  and bias of a linear softmax layer: Versa then differs from ``proto`` only by the learned
  posterior, which is the comparison the project wants. No bias is sampled (a Euclidean
  logit has none).
* The mean is the support mean plus a learned correction, whose last layer starts at zero,
  so an untrained head is ``proto`` with Gaussian noise; the paper's network outputs the
  weight mean directly, from an arbitrary classifier at the start. The correction can still
  learn the training relations themselves: on frozen MiniLM encodings of NYT-25 split 0
  (10 training relations), 300 head-only steps took 5-11 points off proto's test accuracy.
* Hidden width :data:`HIDDEN` instead of the feature size D (1536 here): the paper's width
  would put ~20M parameters in the head and in every checkpoint.
* Prototypes are sampled, not logits (Versa's local reparameterisation trick): samples
  then depend on the support alone, so one draw serves every query of an episode and adding
  queries (NOTA) does not change the others' scores, as for REGRAB.
* ``model.langevin.noise_train``/``noise_eval`` apply as for REGRAB: with noise off the
  posterior mean is used (S = 1), a point estimate.
* Ways with unequal shots: the average of ``model.langevin.balanced_members`` posteriors, each
  amortised from the support with every way cut to the smallest way's count
  (:mod:`model.posterior.subsample`); instance pooling reads no count, and the mean of more
  sentences drew the queries.

Shapes:
    B episodes, S samples, N ways, K shots, Q queries, D encoding size, H hidden width.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from model.methods.base import SampledPrototypeHead, gaussian_samples, require_shots
from model.methods.registry import Method
from model.posterior.config import LangevinConfig

if TYPE_CHECKING:
    from model.config import RegrabConfig
    from model.prior.graph import RelationGraph

#: Width of the amortisation network's hidden layers.
HIDDEN = 128
#: Starting log-variance per dimension of every prototype (std 0.1; encodings of norm 10 in
#: D = 1536 have per-dimension spreads of about 0.25 within a relation).
INIT_LOG_VARIANCE = math.log(0.01)


def gaussian_kl_to_standard_normal(mean: torch.Tensor, log_var: torch.Tensor) -> torch.Tensor:
    """``KL(N(mean, diag exp(log_var)) || N(0, I))``, summed over the last dimension.

    Shapes:
        mean, log_var: (..., D) -> (...)
    """
    return 0.5 * (log_var.exp() + mean * mean - 1.0 - log_var).sum(-1)


def _mlp(inputs: int, hidden: int, outputs: int, last_bias: float) -> nn.Sequential:
    """Two dense layers with ELU; the last starts at zero weight and ``last_bias``."""
    net = nn.Sequential(nn.Linear(inputs, hidden), nn.ELU(), nn.Linear(hidden, outputs))
    nn.init.zeros_(net[-1].weight)
    nn.init.constant_(net[-1].bias, last_bias)
    return net


class VersaHead(SampledPrototypeHead):
    """Amortised Gaussian over each way's prototype; MC predictive over S samples, ML-PIP's
    ``log (1/S) sum_s softmax(sim(x_q, v_s) / T)``."""

    couples_ways = False  # each way's posterior reads only its own support

    def __init__(self, config: LangevinConfig, dim: int, hidden: int = HIDDEN) -> None:
        super().__init__(config)
        self.embed = nn.Sequential(nn.Linear(dim, hidden), nn.ELU())  # e, before pooling
        self.mean_net = _mlp(hidden, hidden, dim, 0.0)  # f_mu
        self.log_var_net = _mlp(hidden, hidden, dim, INIT_LOG_VARIANCE)  # f_s

    def posterior(self, support: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and log-variance of every way's prototype, from that way's support alone.

        Shapes:
            support: (B, N, K, D) with K >= 1 -> mean (B, N, D), log_var (B, N, D)
        """
        require_shots(support, "versa")
        pooled = self.embed(support).mean(2)  # (B, N, H)
        mean = support.mean(2) + self.mean_net(pooled)  # (B, N, D)
        return mean, self.log_var_net(pooled)

    def kl(self, support: torch.Tensor) -> torch.Tensor:
        """KL of each way's posterior to ``N(0, I)`` (not part of ML-PIP's objective).

        Shapes:
            support: (B, N, K, D) -> (B, N)
        """
        return gaussian_kl_to_standard_normal(*self.posterior(support))

    def draws(self) -> int:
        """``samples`` in training, ``eval_samples`` (when set) at evaluation, 1 without noise."""
        return self.config.draws(self.training) if self.noisy() else 1

    def sample_prototypes(self, support: torch.Tensor,
                          generator: torch.Generator | None = None,
                          draws: int | None = None) -> torch.Tensor:
        """S reparameterised prototype samples per way (the mean alone without noise).

        Shapes:
            support: (B, N, K, D) -> (B, S, N, D), S = ``draws`` or :meth:`draws`
        """
        mean, log_var = self.posterior(support)
        if not self.noisy():
            return mean[:, None]  # (B, 1, N, D)
        return gaussian_samples(mean, (0.5 * log_var).exp()[:, None], draws or self.draws(),
                                generator)


def _versa(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> VersaHead:
    return VersaHead(config.langevin, dim)


METHODS = (
    Method("versa", _versa, "amortised Gaussian over each prototype, predictive averaged "
           "over samples (Gordon et al., 2019)", seed=6, samples=True),
)
