"""Do an episode's prior means belong to its ways? The support's labels answer it.

REGRAB's prior alone is a zero-shot classifier: a sentence goes to the way whose prior mean
h_r lies nearest (its posterior predictive with no shots, ``-(sigma^2 / T) |x - h_r|^2 /
(2 (sigma^2 + 1/lambda))`` up to a constant shared by the ways). A labelled support sentence
is a test of that classifier. Two hypotheses explain an episode's support labels:

- M1, the priors name the episode's relations: sentence i of way y_i has the prior's
  predictive probability ``p(y_i | x_i, h)``;
- M0, they do not (names read the wrong relations, a description written for another one):
  the priors say nothing about which way a sentence belongs to, ``1/N`` each.

The log Bayes factor is ``sum_i log p(y_i | x_i, h) + log N`` over the support, and with even
prior odds ``P(M1 | S) = sigmoid(log BF)``. :func:`prior_check` returns it per episode; with
``prior_trust: checked`` the sampler multiplies the episode's prior precision by it, so an
episode whose supports the priors misclassify keeps a prior of almost no weight (the flat
prior of M0: the prototypes are the support means), and one they classify keeps it whole.
Scaling the precision stands in for the mixture of the two posteriors it approximates.

Shapes:
    B episodes, N ways, K shots (padded), D encoding size.
"""

from __future__ import annotations

import math

import torch

from model.posterior.logits import similarity_logits


def prior_check(support: torch.Tensor, h: torch.Tensor, precision: torch.Tensor | float,
                variance: torch.Tensor | float, temperature: float,
                shots: torch.Tensor | None = None) -> torch.Tensor:
    """``P(M1 | S)``, the probability that the prior means name the episode's ways.

    Args:
        support: the support encodings, way r's sentences in ``support[:, r, :shots[r]]``.
        h: the ways' prior means.
        precision, variance: lambda and sigma^2 of the model (the prior's predictive).
        temperature: T of the query softmax.
        shots: each way's count of the padded support (None: every way has K).

    Returns 1 (the prior kept) for an episode without support sentences.

    Shapes:
        support: (B, N, K, D), h: (B, N, D), shots: (B, N) or None -> (B, 1, 1)
    """
    b, n, k, d = support.shape
    var = torch.as_tensor(variance, dtype=h.dtype, device=h.device)
    scale = var / (2.0 * temperature * (var + 1.0 / torch.as_tensor(precision, dtype=h.dtype,
                                                                     device=h.device)))
    x = support.reshape(b, n * k, d)
    dist = -2.0 * similarity_logits(x, h, "euclidean", 1.0)  # |x - h_r|^2: (B, N K, N)
    logp = torch.log_softmax(-scale * dist, dim=-1)
    own = logp.gather(-1, torch.arange(n, device=h.device).repeat_interleave(k)
                      .expand(b, -1)[..., None])[..., 0]  # (B, N K)
    if shots is None:
        filled = torch.ones_like(own, dtype=torch.bool)
    else:
        filled = (torch.arange(k, device=h.device)
                  < shots[..., None].to(h.device)).reshape(b, n * k)
    # Padded slots are left out, whatever they hold (a product with the mask lets NaN through).
    log_bf = torch.where(filled, own + math.log(n), torch.zeros_like(own)).sum(-1)  # (B,)
    kept = torch.where(filled.any(-1), torch.sigmoid(log_bf), torch.ones_like(log_bf))
    return kept.view(-1, 1, 1)
