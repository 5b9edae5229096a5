"""The posterior over prototypes and its Langevin sampler (paper Eq. 7-10, appendix A).

For an episode with N ways and K shots, the prototypes v = (v_1 .. v_N) have the posterior

    log p(v | x_S, y_S, G) = c * log p(y_S | x_S, v) + sum_r log N(v_r | h_r, lambda^-1 I) + const

where h_r is the graph prior mean (:mod:`model.prior.gcn`) and ``likelihood`` chooses the
support term:

* ``gaussian`` (default): each support encoding is a draw around its prototype,
  ``x ~ N(v_y, sigma^2 I)``, summed over the shots (c = 1). This posterior is Gaussian,
  ``N(mu_r, s_r^2 I)`` with precision ``1/s_r^2 = lambda + K / sigma^2`` and mean
  ``mu_r = s_r^2 (lambda h_r + K m_r / sigma^2)`` (m_r the support mean): the prior's pull
  falls as K grows, and with ``lambda -> 0`` the mean is the support mean, i.e. proto's
  prototype. lambda and sigma^2 are on the scale of the encodings; ``scales`` says where
  they come from (see :class:`LangevinConfig`).
* ``softmax``: the paper's Eq. 7, ``log softmax_r(sim(x, v_r) / T)`` summed over the shots.
* ``softmax_mean``: the same averaged over the shots (c = 1/K). This is what the authors'
  code and our first version did; it keeps the prior's weight fixed as K grows.

SGLD (Welling and Teh, 2011) with a per-way preconditioner P_r:

    v <- v + eps/2 * P grad + sqrt(eps * P) * z,        z ~ N(0, I)

For ``gaussian``, ``P_r = s_r^2`` (the exact posterior variance), so the chain moves on the
posterior's own scale: a step of eps = 1 halves the distance to the mean and the noise has
the posterior's spread, whatever the encoding norm. For the softmax likelihoods P = 1 (the
paper's update). Chains start at ``m_r + a * h_r - b * m`` (appendix A: a = b = 1). On the
``gaussian`` target the chain is linear, so :meth:`LangevinSampler.gaussian_chain` draws its
state after the M steps from its exact law in one draw (the same distribution as M steps of
:func:`langevin_step`, which the tests check; the stationary variance of a step of eps is
``s^2 / (1 - eps/4)``, slightly wider than the posterior's, as for any unadjusted Langevin
chain). With K = 0 there is no support: the ``gaussian`` posterior is the prior,
``N(h_r, lambda^-1 I)``, and is sampled; the softmax likelihoods keep the paper's ``v = h``.
At evaluation those Gaussian samples are not drawn in all D dimensions: a query's logits see
a sample only in the span of the means, along the query's own direction and through its
norm, so :meth:`LangevinSampler.sample_logits` draws just that (each query's logits have the
law of scoring full samples, tested).

Everything is differentiable with respect to the support encodings, h, lambda and sigma^2,
so training reaches the encoder, the GCN and (``scales: learned``) the scales through the
samples. The target's pure functions (gradient, closed-form posterior, evidence, scales, the
chain's start and step) are in :mod:`model.posterior.target`.

Shapes:
    B episodes, S samples, N ways, K shots, Q queries, D encoding size.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from model.posterior.config import LangevinConfig
from model.posterior.logits import gaussian_sample_logits, predictive_shift, prototype_logits
from model.posterior.prior_check import prior_check
from model.posterior.target import (
    gaussian_posterior,
    init_prototypes,
    langevin_step,
    log_posterior_grad,
    preconditioner,
    way_precision,
)


def chain_coefficients(cfg: LangevinConfig) -> tuple[float, float, int]:
    """``(c, spread, steps run)`` of the ``gaussian`` chain, stopped at a fixed point (exact)."""
    c, spread, eps = 1.0, 0.0, cfg.step_size
    for done in range(cfg.steps):
        state = (c * (a := 1.0 - 0.5 * eps), spread * a * a + eps, eps * cfg.step_decay)
        if state == (c, spread, eps):
            return c, spread, done
        c, spread, eps = state
    return c, spread, cfg.steps


class LangevinSampler(nn.Module):
    """Draws S prototype samples per episode from the posterior with SGLD.

    ``scales: learned`` keeps lambda and sigma^2 as log-parameters (so they stay positive);
    ``heldout`` keeps them as buffers that :meth:`set_scales` overwrites (they are saved with
    the model); ``fixed`` uses the config's numbers. A flat prior (lambda = 0) is fixed:
    :class:`LangevinConfig` refuses it with other ``scales``.
    """

    def __init__(self, config: LangevinConfig) -> None:
        super().__init__()
        self.config = config
        self.mode = config.scales
        lam, var = math.log(config.prior_precision or 1.0), math.log(config.likelihood_variance)
        if self.mode == "learned":
            self.log_precision = nn.Parameter(torch.tensor(lam))
            self.log_variance = nn.Parameter(torch.tensor(var))
        elif self.mode == "heldout":
            self.register_buffer("log_precision", torch.tensor(lam, dtype=torch.float64))
            self.register_buffer("log_variance", torch.tensor(var, dtype=torch.float64))

    @property
    def precision(self) -> torch.Tensor | float:
        if self.mode == "learned":
            return self.log_precision.exp()
        if self.mode == "heldout":
            return float(self.log_precision.exp())
        return self.config.prior_precision

    @property
    def variance(self) -> torch.Tensor | float:
        if self.mode == "learned":
            return self.log_variance.exp()
        if self.mode == "heldout":
            return float(self.log_variance.exp())
        return self.config.likelihood_variance

    def set_scales(self, precision: float, variance: float) -> None:
        """Overwrite lambda and sigma^2 (``scales: heldout``; see
        :func:`~model.posterior.target.heldout_scales`)."""
        if self.mode != "heldout":
            raise ValueError(f"set_scales needs scales: heldout, not {self.mode}")
        self.log_precision.fill_(math.log(precision))
        self.log_variance.fill_(math.log(variance))

    def support_precision(self, support: torch.Tensor, h: torch.Tensor,
                          shots: torch.Tensor | None = None) -> torch.Tensor | float:
        """lambda, or with ``prior_trust: evidence`` each episode's (:func:`way_precision`);
        ``checked`` also multiplies it, at evaluation, by the probability that the priors
        name the episode's ways (:func:`~model.posterior.prior_check.prior_check`).

        Shapes:
            support: (B, N, K, D) with K >= 1, h: (B, N, D), shots: (B, N) or None
            -> scalar or (B, 1, 1)
        """
        cfg = self.config
        if cfg.prior_trust == "fixed" or cfg.likelihood != "gaussian":
            return self.precision
        lam = way_precision(support, h, self.precision, self.variance, shots)
        if cfg.prior_trust == "checked" and not self.training:
            lam = lam * prior_check(support, h, self.precision, self.variance,
                                    cfg.temperature, shots).clamp(min=1e-6)
        return lam

    def chain_law(self, v0: torch.Tensor, support: torch.Tensor, h: torch.Tensor,
                  shots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and spread of the chain's end state on the ``gaussian`` target.

        There the update is ``v <- v - eps/2 (v - mu) + sqrt(eps s^2) z`` (the gradient is
        ``-(v - mu) / s^2`` and P = s^2), a linear chain: after the steps v is Gaussian with
        mean ``mu + c (v0 - mu)``, ``c = prod_t (1 - eps_t / 2)``, and variance
        ``s^2 sum_t eps_t prod_(u > t) (1 - eps_u / 2)^2``.

        Shapes:
            v0, h: (B, N, D), support: (B, N, K, D), shots: (B, N) or None
            -> mean (B, N, D), std (B, N, 1)
        """
        cfg = self.config
        mu, s2 = gaussian_posterior(support, h, self.support_precision(support, h, shots),
                                    self.variance, shots)
        c, spread, _ = chain_coefficients(cfg)
        return mu + c * (v0 - mu), (s2 * spread).sqrt()

    def gaussian_chain(self, v0: torch.Tensor, support: torch.Tensor, h: torch.Tensor,
                       samples: int, draw: Any, shots: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """The state after ``steps`` preconditioned SGLD steps on the ``gaussian`` target.

        Drawing it once from :meth:`chain_law` gives the chain's end state exactly in law, at
        the cost of one step instead of ``steps`` (evaluation spent most of its time in the
        steps' noise). ``langevin_step`` runs the same chain step by step; the tests check the
        two agree.

        Shapes:
            v0, h: (B, N, D), support: (B, N, K, D) -> (B, S, N, D)
        """
        mean, std = self.chain_law(v0, support, h, shots)
        v = mean[:, None].expand(-1, samples, -1, -1)  # (B, S, N, D)
        if draw is None or not bool((std > 0).any()):
            return v
        return torch.addcmul(v, std[:, None], draw(v.shape))

    def law(self, support: torch.Tensor, h: torch.Tensor, shots: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Mean and spread of every sample when the samples are Gaussian and noisy; else None.

        That is the ``gaussian`` likelihood with noise on: with shots the chain's end state
        (:meth:`chain_law`), without them the prior ``N(h, lambda^-1 I)``.

        Shapes:
            support: (B, N, K, D), h: (B, N, D) -> mean (B, N, D), std (B, N, 1)
        """
        cfg = self.config
        if cfg.likelihood != "gaussian" or not self.noisy():
            return None
        if support.shape[2] == 0:
            if cfg.prior_precision == 0:
                return None
            std = torch.as_tensor((1.0 / self.precision) ** 0.5, dtype=h.dtype, device=h.device)
            return h, std.expand(*h.shape[:2], 1)
        v0 = init_prototypes(support, h, cfg.init_prior_weight, cfg.init_mean_weight, shots)
        return self.chain_law(v0, support, h, shots)

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor, h: torch.Tensor,
                      generator: torch.Generator | None = None,
                      shots: torch.Tensor | None = None) -> torch.Tensor:
        """Query logits under every sample; each query's have the law of scoring
        :meth:`forward`'s samples.

        At evaluation with Gaussian samples (:meth:`law`), only what the logits see of each
        sample is drawn (:func:`gaussian_sample_logits`), at a fraction of the cost of the
        D-dimensional samples. In training (the gradient would run through a QR
        decomposition) and for the other likelihoods, the samples are drawn and scored.
        With ``predictive: gaussian`` (Euclidean similarity) each way's samples are centred on
        its posterior predictive (:func:`predictive_shift`).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D), h: (B, N, D), shots: (B, N) or None
            -> (B, S, Q, N)
        """
        cfg = self.config
        law = None if self.training else self.law(support, h, shots)
        if law is not None:
            mean, std = law
            logits = gaussian_sample_logits(query, mean, std, cfg.draws(False),
                                            cfg.similarity, cfg.temperature, generator)
            if logits is None:
                v = self(support, h, generator, shots)  # (B, S, N, D)
                logits = prototype_logits(query, v, cfg.similarity, cfg.temperature)
            if cfg.predictive == "gaussian" and cfg.similarity == "euclidean":
                logits = logits + predictive_shift(query, mean, std, float(self.variance),
                                                   cfg.temperature, cfg.predictive_dims)
            return logits
        v = self(support, h, generator, shots)  # (B, S, N, D)
        return prototype_logits(query, v, cfg.similarity, cfg.temperature)

    def noisy(self) -> bool:
        return self.config.noise_train if self.training else self.config.noise_eval

    def forward(
        self,
        support: torch.Tensor,
        h: torch.Tensor,
        generator: torch.Generator | None = None,
        shots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run the chains; noise follows ``noise_train``/``noise_eval`` and ``self.training``.

        Without noise every chain is identical, so one chain is run and S collapses to 1.
        ``shots`` (per-way counts of a padded support) needs the ``gaussian`` likelihood.

        Shapes:
            support: (B, N, K, D), h: (B, N, D), shots: (B, N) or None -> (B, S, N, D)
        """
        cfg = self.config
        noisy = self.noisy()
        samples = cfg.draws(self.training) if noisy else 1
        k = support.shape[2]
        lam, var = self.precision, self.variance

        def draw(shape: torch.Size) -> torch.Tensor:
            return torch.randn(shape, generator=generator, device=h.device, dtype=h.dtype)

        if k == 0:
            if cfg.likelihood != "gaussian" or not noisy or cfg.prior_precision == 0:
                return h[:, None]  # (B, 1, N, D): the paper's zero-shot rule, v = h
            # The posterior is the prior N(h, lambda^-1 I): sample it.
            v = h[:, None].expand(-1, samples, -1, -1)  # (B, S, N, D)
            return v + draw(v.shape) * (1.0 / lam) ** 0.5
        v0 = init_prototypes(support, h, cfg.init_prior_weight, cfg.init_mean_weight, shots)
        if cfg.likelihood == "gaussian":
            return self.gaussian_chain(v0, support, h, samples, draw if noisy else None, shots)
        if shots is not None:
            raise ValueError(f"per-way shot counts need the gaussian likelihood, not "
                             f"{cfg.likelihood}; oversample the support to equal shots")
        v = v0[:, None].expand(-1, samples, -1, -1)  # (B, S, N, D)
        precond = preconditioner(k, cfg.likelihood, lam, var)
        eps = cfg.step_size
        for _ in range(cfg.steps):
            grad = log_posterior_grad(
                v, support, h, temperature=cfg.temperature, similarity=cfg.similarity,
                likelihood=cfg.likelihood, precision=lam, variance=var,
            )
            v = langevin_step(v, grad, eps, precond, draw(v.shape) if noisy else None)
            eps *= cfg.step_decay
        return v
