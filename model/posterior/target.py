"""The posterior over prototypes as pure functions: gradient, closed form, evidence (paper
Eq. 7-10).

For an episode with N ways and K shots the prototypes v = (v_1 .. v_N) have the posterior

    log p(v | x_S, y_S, G) = c * log p(y_S | x_S, v) + sum_r log N(v_r | h_r, lambda^-1 I) + const

with h_r the graph prior mean and the support term chosen by ``likelihood`` (the three are
described in :mod:`model.posterior.langevin`). :func:`log_posterior_grad` is the gradient each
SGLD step follows. With the ``gaussian`` likelihood the posterior is Gaussian in closed form
(:func:`gaussian_posterior`), and two functions give empirical Bayes: the marginal likelihood
of a way's sentences (:func:`log_evidence`, a training term) and a method-of-moments estimate
of lambda and sigma^2 from relations the model was not trained on (:func:`heldout_scales`);
:func:`way_precision` estimates an episode's prior precision from its own support. The
chain's start (:func:`init_prototypes`) and its preconditioned step (:func:`preconditioner`,
:func:`langevin_step`) are here too.

Nothing here keeps state or draws random numbers; the sampler that uses these,
:class:`~model.posterior.langevin.LangevinSampler`, does.

Shapes:
    B episodes, S samples, N ways, K shots, D encoding size, R relations.
"""

from __future__ import annotations

import math

import torch

from model.posterior.logits import similarity_logits


def gaussian_posterior(
    support: torch.Tensor, h: torch.Tensor, precision: torch.Tensor | float,
    variance: torch.Tensor | float, shots: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Closed-form posterior of the ``gaussian`` likelihood: mean and per-way variance.

    ``shots`` gives each way its own count k_r of the padded support (a way with k_r = 0
    keeps its prior); None: every way has K.

    Shapes:
        support: (B, N, K, D), h: (B, N, D), shots: (B, N) or None
        -> mean (B, N, D), variance (B, N, 1)
    """
    if shots is not None:
        mask = (torch.arange(support.shape[2], device=support.device)
                < shots[..., None].to(support.device)).to(support.dtype)[..., None]
        k = shots.to(device=h.device, dtype=h.dtype)[..., None]  # (B, N, 1)
        var = 1.0 / (precision + k / variance)  # (B, N, 1): each way its own
        mean = var * (precision * h + (support * mask).sum(2) / variance)
        return mean, var
    k = support.shape[2]
    var = 1.0 / (precision + k / variance)  # scalar: every way has K shots
    mean = var * (precision * h + support.sum(2) / variance)  # (B, N, D)
    return mean, torch.as_tensor(var, dtype=h.dtype, device=h.device).expand(*h.shape[:2], 1)


def log_evidence(
    x: torch.Tensor, h: torch.Tensor, precision: torch.Tensor | float,
    variance: torch.Tensor | float,
) -> torch.Tensor:
    """Log marginal likelihood of each way's sentences under the ``gaussian`` model.

    With ``x_i ~ N(v, sigma^2 I)`` and ``v ~ N(h, lambda^-1 I)``, the n sentences of a way have
    ``log p(x | h) = log N(m | h, (1/lambda + sigma^2/n) I) + log of the scatter term``, with m
    their mean and the scatter ``sum_i ||x_i - m||^2 / sigma^2`` (up to constants in h,
    lambda and sigma^2). Maximising it over h, lambda and sigma^2 is empirical Bayes: it
    trains the prior mean to predict a relation's encodings and the scales to match their
    spread, which the few-shot loss alone barely does once the support outweighs the prior.

    Shapes:
        x: (B, N, n, D) with n >= 1, h: (B, N, D) -> (B, N)
    """
    n, d = x.shape[2], x.shape[3]
    m = x.mean(2)  # (B, N, D)
    var_m = 1.0 / precision + variance / n
    fit = -0.5 * (((m - h) ** 2).sum(-1) / var_m + d * torch.log(torch.as_tensor(var_m)))
    scatter = ((x - m[:, :, None]) ** 2).sum((2, 3))  # (B, N)
    spread = -0.5 * (scatter / variance + (n - 1) * d * torch.log(torch.as_tensor(variance)))
    return fit + spread


def heldout_scales(
    x: list[torch.Tensor], h: torch.Tensor, floor: float = 1e-6
) -> tuple[float, float]:
    """Empirical-Bayes lambda and sigma^2 from relations a model was not trained on.

    Method of moments under the ``gaussian`` model: the within-relation scatter estimates
    sigma^2, and the distance between each relation's mean encoding m_r and its prior mean
    h_r, ``E ||m_r - h_r||^2 / D = 1/lambda + sigma^2 / n_r``, estimates 1/lambda.

    Args:
        x: per relation, its sentences' encodings, (n_r, D) with n_r >= 2.
        h: the prior means of the same relations, (R, D).
        floor: smallest 1/lambda and sigma^2 returned (a prior that predicts every mean
            exactly would otherwise get infinite precision).

    Returns:
        (lambda, sigma^2) as floats.
    """
    d = h.shape[1]
    scatter = sum(float(((xr - xr.mean(0)) ** 2).sum()) for xr in x)
    dof = sum((len(xr) - 1) * d for xr in x)
    variance = max(scatter / dof, floor)
    gaps = [float(((xr.mean(0) - hr) ** 2).sum()) / d - variance / len(xr)
            for xr, hr in zip(x, h, strict=True)]
    return 1.0 / max(sum(gaps) / len(gaps), floor), variance


def log_posterior_grad(
    v: torch.Tensor,
    support: torch.Tensor,
    h: torch.Tensor,
    *,
    temperature: float,
    similarity: str,
    likelihood: str,
    precision: torch.Tensor | float,
    variance: torch.Tensor | float,
) -> torch.Tensor:
    """Closed-form gradient of the log posterior in v (the support of way n is labelled n).

    ``softmax``: ``1/T sum_s (1[y_s = r] - p_sr) d sim(x_s, v_r)/d v_r`` with ``d sim/d v = x``
    (dot) or ``x - v`` (Euclidean), divided by K for ``softmax_mean``; ``gaussian``:
    ``K (m_r - v_r) / sigma^2``; plus the prior's ``-lambda (v_r - h_r)``.

    Shapes:
        v: (B, S, N, D), support: (B, N, K, D), h: (B, N, D) -> (B, S, N, D)
    """
    b, n, k, d = support.shape
    prior = -precision * (v - h[:, None])
    if k == 0:
        return prior
    if likelihood == "gaussian":
        return prior + (support.sum(2)[:, None] - k * v) / variance
    x = support.reshape(b, 1, n * k, d)  # (B, 1, N K, D)
    p = torch.softmax(similarity_logits(x, v, similarity, temperature), dim=-1)  # (B,S,NK,N)
    onehot = torch.eye(n, dtype=v.dtype, device=v.device).repeat_interleave(k, 0)  # (NK, N)
    resid = onehot - p  # (B, S, N K, N)
    grad = torch.einsum("bsmn,bzmd->bsnd", resid, x)  # (B, S, N, D)
    if similarity == "euclidean":
        grad = grad - resid.sum(2)[..., None] * v
    grad = grad / (k * temperature if likelihood == "softmax_mean" else temperature)
    return prior + grad


def way_precision(support: torch.Tensor, h: torch.Tensor, precision: torch.Tensor | float,
                  variance: torch.Tensor | float, shots: torch.Tensor | None = None
                  ) -> torch.Tensor:
    """The prior precision of an episode's ways from their support (``prior_trust: evidence``).

    Under the model a way's support mean satisfies ``E |m_r - h_r|^2 / D = 1/lambda +
    sigma^2/K``. Averaged over the episode's N ways (over N D numbers, so one episode gives a
    usable estimate), ``1/lambda_e = max(1/lambda, mean_r |m_r - h_r|^2 / D - sigma^2/K)`` is
    the method-of-moments prior variance of this episode, never below what ``lambda`` says:
    priors that point away from their support lose their pull, priors as good as in training
    keep it. Every way of the episode gets the same ``lambda_e``: with Euclidean logits a way
    whose posterior were wider than the others' would lose every query by ``D s^2 / 2T`` on
    average, whatever its prior said. With ``shots`` each way's term uses its own k_r, and
    ways without shots have no evidence to give (if no way has one, lambda stays).

    Shapes:
        support: (B, N, K, D) with K >= 1, h: (B, N, D), shots: (B, N) or None -> (B, 1, 1)
    """
    k, d = support.shape[2], support.shape[3]
    if shots is None:
        gap = (support.mean(2) - h).pow(2).sum(-1).mean(1).view(-1, 1, 1) / d - variance / k
        return 1.0 / torch.clamp(gap, min=1.0 / precision)
    kr = shots.to(device=h.device, dtype=h.dtype)  # (B, N)
    mask = (torch.arange(k, device=h.device) < shots[..., None].to(h.device)).to(h.dtype)
    m = (support * mask[..., None]).sum(2) / kr.clamp(min=1)[..., None]  # (B, N, D)
    has = (kr > 0).to(h.dtype)  # (B, N)
    term = ((m - h).pow(2).sum(-1) / d - variance / kr.clamp(min=1)) * has
    gap = (term.sum(1) / has.sum(1).clamp(min=1)).view(-1, 1, 1)
    gap = torch.where(has.sum(1).view(-1, 1, 1) > 0, gap, torch.zeros_like(gap))
    return 1.0 / torch.clamp(gap, min=1.0 / precision)


def init_prototypes(
    support: torch.Tensor, h: torch.Tensor, prior_weight: float, mean_weight: float,
    shots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Starting point ``m_r + a * h_r - b * m`` (appendix A); with ``shots`` (the padded
    support's per-way counts) the means read the real shots only, and a way without shots
    starts at ``h_r``.

    Shapes:
        support: (B, N, K, D), h: (B, N, D), shots: (B, N) or None -> (B, N, D)
    """
    if shots is None:
        m_r = support.mean(2)  # (B, N, D)
        m = support.mean((1, 2))[:, None, :]  # (B, 1, D)
        return m_r + prior_weight * h - mean_weight * m
    k = shots.to(device=h.device, dtype=h.dtype)[..., None]  # (B, N, 1)
    mask = (torch.arange(support.shape[2], device=h.device)
            < shots[..., None].to(h.device)).to(h.dtype)[..., None]
    total = (support * mask).sum(2)  # (B, N, D)
    m_r = torch.where(k > 0, total / k.clamp(min=1), h)
    m = (total.sum(1) / k.sum(1).clamp(min=1))[:, None, :]  # (B, 1, D)
    return m_r + prior_weight * h - mean_weight * m


def preconditioner(shots: int, likelihood: str, precision: torch.Tensor | float,
                   variance: torch.Tensor | float) -> torch.Tensor | float:
    """P of the update: the exact posterior variance for ``gaussian``, else 1."""
    if likelihood != "gaussian":
        return 1.0
    return 1.0 / (precision + shots / variance)


def langevin_step(
    v: torch.Tensor,
    grad: torch.Tensor,
    step_size: float,
    precond: torch.Tensor | float,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """One SGLD update ``v + eps/2 * P grad + sqrt(eps P) z`` (pure: no state, no sampling).

    Shapes:
        v, grad, noise: (B, S, N, D) -> (B, S, N, D)
    """
    v = v + 0.5 * step_size * precond * grad
    if noise is not None:
        scale = (math.sqrt(step_size * precond) if isinstance(precond, float)
                 else torch.sqrt(step_size * precond))
        v = v + scale * noise
    return v
