"""Stochastic gradient Langevin dynamics over prototype vectors (paper Eq. 9-10, appendix A).

The target is the posterior
``log p(v | x_S, y_S, G) = (1/K) log p(y_S | x_S, v) + w * log N(v | h, I) + const``
with the likelihood a softmax over similarities at temperature T (``logits = sim / T``). Its
gradient has a closed form, so the sampler needs no autograd pass of its own and stays
differentiable with respect to the support encodings and h (needed for end-to-end training):

``grad_v_r = 1/(K T) sum_s (1[y_s = r] - p_sr) d sim(x_s, v_r)/d v_r - w (v_r - h_r)``

with ``d sim/d v = x`` for the dot product and ``x - v`` for ``sim = -||x - v||^2 / 2``.

One step: ``v <- v + eps/2 * grad + sqrt(eps) * z``. Samples start at
``m_r + a * h_r - b * m`` (appendix A; a = b = 1 there).

Shapes:
    B episodes, S samples, N ways, K shots, D encoding size, M sentences (N * K or queries).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from pipeline.errors import PipelineError

SIMILARITIES = ("dot", "euclidean")


@dataclass(frozen=True)
class LangevinConfig:
    """Sampler settings (``params.yaml`` section ``model``).

    Attributes:
        samples: S posterior samples (paper: 10).
        steps: M Langevin steps (paper: 5).
        step_size: eps (paper: 0.1).
        step_decay: eps is multiplied by this after every step (1.0 = constant; the authors'
            code used 0.01, which freezes the chain after the first step).
        init_prior_weight: a in ``m_r + a * h_r - b * m``.
        init_mean_weight: b in the same formula.
        temperature: T; logits are ``sim / T`` in the support and query likelihoods.
        similarity: ``dot`` (paper) or ``euclidean`` (appendix C).
        prior_weight: w, weight of log N(v | h, I) in the posterior (paper: 1).
        noise_train: add sqrt(eps) z during training.
        noise_eval: add it at evaluation too (off: deterministic, S collapses to one chain).
    """

    samples: int = 10
    steps: int = 5
    step_size: float = 0.1
    step_decay: float = 1.0
    init_prior_weight: float = 1.0
    init_mean_weight: float = 1.0
    temperature: float = 10.0
    similarity: str = "dot"
    prior_weight: float = 1.0
    noise_train: bool = True
    noise_eval: bool = False

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise PipelineError(
                f"model.similarity={self.similarity!r} unknown; use one of {SIMILARITIES}"
            )
        if self.samples < 1 or self.steps < 0 or self.step_size < 0 or self.temperature <= 0:
            raise PipelineError(
                "model.samples >= 1, model.langevin_steps >= 0, model.step_size >= 0 and "
                "model.temperature > 0 are required"
            )


def similarity_logits(
    x: torch.Tensor, v: torch.Tensor, similarity: str, temperature: float
) -> torch.Tensor:
    """Softmax logits ``sim(x, v) / T`` of every sentence against every prototype.

    Shapes:
        x: (..., M, D), v: (..., N, D) -> (..., M, N)
    """
    if similarity == "dot":
        sim = x @ v.transpose(-1, -2)
    else:
        sim = -0.5 * (
            (x * x).sum(-1, keepdim=True)
            - 2 * x @ v.transpose(-1, -2)
            + (v * v).sum(-1).unsqueeze(-2)
        )
    return sim / temperature


def init_prototypes(
    support: torch.Tensor, h: torch.Tensor, prior_weight: float, mean_weight: float
) -> torch.Tensor:
    """Starting point ``m_r + a * h_r - b * m`` (appendix A).

    Shapes:
        support: (B, N, K, D), h: (B, N, D) -> (B, N, D)
    """
    m_r = support.mean(2)  # (B, N, D)
    m = support.mean((1, 2))[:, None, :]  # (B, 1, D)
    return m_r + prior_weight * h - mean_weight * m


def log_posterior_grad(
    v: torch.Tensor,
    support: torch.Tensor,
    h: torch.Tensor,
    *,
    temperature: float,
    similarity: str,
    prior_weight: float = 1.0,
) -> torch.Tensor:
    """Closed-form gradient of ``(1/K) log p(y_S | x_S, v) + w log N(v | h, I)`` in v.

    The support of way n is labelled n.

    Shapes:
        v: (B, S, N, D), support: (B, N, K, D), h: (B, N, D) -> (B, S, N, D)
    """
    b, n, k, d = support.shape
    x = support.reshape(b, 1, n * k, d)  # (B, 1, M, D)
    p = torch.softmax(similarity_logits(x, v, similarity, temperature), dim=-1)  # (B, S, M, N)
    onehot = torch.eye(n, dtype=v.dtype, device=v.device).repeat_interleave(k, 0)  # (M, N)
    resid = onehot - p  # (B, S, M, N)
    grad = torch.einsum("bsmn,bzmd->bsnd", resid, x)  # (B, S, N, D)
    if similarity == "euclidean":
        grad = grad - resid.sum(2)[..., None] * v
    grad = grad / (k * temperature)
    return grad - prior_weight * (v - h[:, None])


def langevin_step(
    v: torch.Tensor,
    support: torch.Tensor,
    h: torch.Tensor,
    step_size: float,
    noise: torch.Tensor | None,
    *,
    temperature: float,
    similarity: str,
    prior_weight: float = 1.0,
) -> torch.Tensor:
    """One SGLD update ``v + eps/2 * grad + sqrt(eps) * z`` (pure: no state, no sampling).

    Shapes:
        v: (B, S, N, D), support: (B, N, K, D), h: (B, N, D), noise: (B, S, N, D) or None
        -> (B, S, N, D)
    """
    grad = log_posterior_grad(
        v, support, h, temperature=temperature, similarity=similarity, prior_weight=prior_weight
    )
    v = v + 0.5 * step_size * grad
    if noise is not None:
        v = v + math.sqrt(step_size) * noise
    return v


class LangevinSampler(nn.Module):
    """Draws S prototype samples per episode from the posterior with SGLD."""

    def __init__(self, config: LangevinConfig) -> None:
        super().__init__()
        self.config = config

    def forward(
        self,
        support: torch.Tensor,
        h: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Run the chains; noise follows ``noise_train``/``noise_eval`` and ``self.training``.

        Without noise every chain is identical, so one chain is run and S collapses to 1.

        Shapes:
            support: (B, N, K, D), h: (B, N, D) -> (B, S, N, D)
        """
        cfg = self.config
        noisy = cfg.noise_train if self.training else cfg.noise_eval
        samples = cfg.samples if noisy else 1
        v0 = init_prototypes(support, h, cfg.init_prior_weight, cfg.init_mean_weight)
        v = v0[:, None].expand(-1, samples, -1, -1)  # (B, S, N, D)
        eps = cfg.step_size
        for _ in range(cfg.steps):
            z = None
            if noisy:
                z = torch.randn(v.shape, generator=generator, device=v.device, dtype=v.dtype)
            v = langevin_step(
                v, support, h, eps, z,
                temperature=cfg.temperature,
                similarity=cfg.similarity,
                prior_weight=cfg.prior_weight,
            )
            eps *= cfg.step_decay
        return v
