"""How unlikely each support sentence's label is, given the rest of the support (and the prior).

A support sentence ``x_j`` labelled with way r is suspicious when the other ways explain it
better than its own way does without it. Two scores, both a log-density margin in nats
(larger: more suspicious; 0: the best other way and its own way tie):

* :func:`gaussian_suspicion`, from the ``gaussian`` posterior over prototypes
  (:mod:`model.posterior.target`): under the model a sentence of way r is
  ``N(mu_r, (sigma^2 + s_r^2) I)``, with ``mu_r, s_r^2`` way r's posterior mean and variance.
  Its own way's posterior is built from the prior mean h_r and the other ``n_r - 1``
  sentences (leave one out; with ``n_r = 1`` it is the prior itself), every other way's from
  all its sentences (a way without sentences: its prior). The score is the best other way's
  log predictive density of ``x_j`` minus its own way's.
* :func:`prototype_suspicion`, the point estimate a prototype method has: half the squared
  distance of ``x_j`` to its own way's mean without it, minus that to the nearest other way's
  mean (NaN where its way has no other sentence, since nothing is left to compare with).

Both take ways of unequal size: ``counts`` says how many of a way's K slots hold sentences
(the rest is padding, scored NaN).

Shapes:
    B episodes (support sets), N ways, K shots (slots), D encoding size.
"""

from __future__ import annotations

import math

import torch


def _mask(support: torch.Tensor, counts: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    """The slots that hold a sentence (B, N, K), their counts per way (B, N, 1) as floats
    and the support with padding zeroed."""
    b, n, k, _ = support.shape
    if counts is None:  # no padding to zero
        filled = torch.ones((b, n, k), dtype=torch.bool, device=support.device)
        return filled, torch.full((b, n, 1), float(k), dtype=support.dtype,
                                  device=support.device), support
    filled = torch.arange(k, device=support.device) < counts[..., None]  # (B, N, K)
    x = support * filled[..., None]
    return filled, counts.to(support.dtype)[..., None], x


def _sq_dist(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``|x_(b,n,k) - v_(b,o)|^2`` for every slot and way without a (B, N, K, N, D) tensor.

    Shapes:
        x: (B, N, K, D), v: (B, N, D) -> (B, N, K, N)
    """
    b, n, k, d = x.shape
    flat = x.reshape(b, n * k, d)
    dot = flat @ v.transpose(1, 2)  # (B, N K, N)
    sq = (flat * flat).sum(-1, keepdim=True) - 2 * dot + (v * v).sum(-1)[:, None]
    return sq.clamp(min=0).view(b, n, k, -1)


def _margin(own: torch.Tensor, other: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """Best other way's score minus its own way's, NaN on padding.

    Shapes:
        own: (B, N, K), other: (B, N, K, N) scores (higher: the way explains the sentence
        better), filled: (B, N, K) -> (B, N, K)
    """
    n = other.shape[-1]
    self_way = torch.eye(n, dtype=torch.bool, device=other.device)[None, :, None, :]
    best = other.masked_fill(self_way, -math.inf).amax(-1)  # (B, N, K)
    return torch.where(filled, best - own, torch.full_like(own, math.nan))


def episode_precision(support: torch.Tensor, counts: torch.Tensor | None, h: torch.Tensor,
                      precision: torch.Tensor | float, variance: torch.Tensor | float
                      ) -> torch.Tensor:
    """``prior_trust: evidence``'s per-episode prior precision for ways of unequal size.

    :func:`~model.posterior.target.way_precision` with each way's own ``sigma^2 / n_r``, over
    the ways that have sentences: ``1/lambda_e = max(1/lambda, mean_r |m_r - h_r|^2 / D -
    sigma^2 / n_r)``. With equal K it is exactly that function's value.

    Shapes:
        support: (B, N, K, D), counts: (B, N) or None, h: (B, N, D) -> (B, 1, 1)
    """
    filled, n, x = _mask(support, counts)
    d = support.shape[-1]
    has = n[..., 0] > 0  # (B, N)
    mean = x.sum(2) / n.clamp(min=1)
    gap = (mean - h).pow(2).sum(-1) / d - variance / n[..., 0].clamp(min=1)  # (B, N)
    gap = (gap * has).sum(1) / has.sum(1).clamp(min=1)
    floor = 1.0 / torch.as_tensor(precision, dtype=gap.dtype, device=gap.device)
    return 1.0 / torch.maximum(gap, floor).view(-1, 1, 1)


def gaussian_suspicion(support: torch.Tensor, h: torch.Tensor, precision: torch.Tensor | float,
                       variance: torch.Tensor | float, counts: torch.Tensor | None = None
                       ) -> torch.Tensor:
    """Leave-one-out posterior-predictive margin of every support sentence (module doc).

    Args:
        support: the support encodings, way r's sentences in ``support[:, r, :counts]``.
        h: the prior means.
        precision: lambda, a number or one per episode (B, 1, 1).
        variance: sigma^2 of the likelihood.
        counts: sentences per way (None: K each).

    Shapes:
        support: (B, N, K, D), h: (B, N, D), counts: (B, N) -> (B, N, K)
    """
    filled, n, x = _mask(support, counts)
    d = support.shape[-1]
    lam = torch.as_tensor(precision, dtype=x.dtype, device=x.device)
    total = x.sum(2)  # (B, N, D)
    # Every way's posterior from all its sentences, scored on every sentence.
    s2 = 1.0 / (lam + n / variance)  # (B, N, 1)
    mu = s2 * (lam * h + total / variance)  # (B, N, D)
    spread = variance + s2[..., 0]  # (B, N)
    other = (-0.5 * _sq_dist(x, mu) / spread[:, None, None]
             - 0.5 * d * torch.log(spread)[:, None, None])  # (B, N, K, N)
    # Its own way's posterior without it: mean a - c x, so x minus it is (1 + c) x - a.
    s2_own = 1.0 / (lam + (n - 1).clamp(min=0) / variance)  # (B, N, 1)
    a = s2_own * (lam * h + total / variance)  # (B, N, D)
    c = 1.0 + s2_own / variance  # (B, N, 1)
    sq = (c * c * (x * x).sum(-1) - 2 * c * torch.einsum("bnkd,bnd->bnk", x, a)
          + (a * a).sum(-1, keepdim=True))  # (B, N, K)
    spread_own = variance + s2_own  # (B, N, 1)
    own = -0.5 * sq.clamp(min=0) / spread_own - 0.5 * d * torch.log(spread_own)  # (B, N, K)
    return _margin(own, other, filled)


def prototype_suspicion(support: torch.Tensor, counts: torch.Tensor | None = None
                        ) -> torch.Tensor:
    """Leave-one-out prototype margin of every support sentence (module doc): half its squared
    distance to its own way's mean without it, minus half that to the nearest other way's
    mean; NaN for a way's only sentence and on padding.

    Shapes:
        support: (B, N, K, D), counts: (B, N) -> (B, N, K)
    """
    filled, n, x = _mask(support, counts)
    total = x.sum(2)
    mean = total / n.clamp(min=1)  # (B, N, D)
    other = -0.5 * _sq_dist(x, mean)  # (B, N, K, N)
    empty = (n[..., 0] == 0)[:, None, None, :]  # a way without sentences has no prototype
    other = other.masked_fill(empty, -math.inf)
    # x minus the mean of the rest is (n x - total) / (n - 1).
    scale = n / (n - 1).clamp(min=1)  # (B, N, 1)
    sq = scale * scale * ((x * x).sum(-1) - 2 * torch.einsum("bnkd,bnd->bnk", x, total) / n
                          + (total * total).sum(-1, keepdim=True) / (n * n))
    own = -0.5 * sq.clamp(min=0)
    out = _margin(own, other, filled)
    return out.masked_fill((n <= 1).expand_as(out), math.nan)
