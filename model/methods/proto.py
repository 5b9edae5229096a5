"""Baselines that share REGRAB's encoder, episodes and training loop.

* ``mtb``: prototypes are the support means, dot-product similarity (Baldini Soares et al.,
  2019, as the paper uses it: a prototypical network with dot product).
* ``proto``: prototypes are the support means, Euclidean similarity (Snell et al., 2017).
* ``regrab_no_prior``: REGRAB with h_r = 0, i.e. a standard normal prior and no graph.

All use the temperature of the ``model`` section, so they differ from REGRAB only in how
prototypes are formed.

The module also holds what the heads of methods without a graph prior share
(:class:`PriorFreeHead`, :func:`require_shots`, :func:`episode_chunks`).

Shapes:
    B episodes, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from model.methods.registry import Method
from model.methods.regrab import mc_log_predictive
from model.posterior.logits import similarity_logits
from pipeline.errors import PipelineError


def require_shots(support: torch.Tensor, method: str) -> None:
    """Refuse episodes without support sentences (K = 0): ``method`` has no prior to
    classify from.

    Shapes:
        support: (B, N, K, D)
    """
    if support.shape[2] == 0:
        raise PipelineError(f"{method} needs K >= 1 support sentences per way (it has no "
                            "prior to classify from); use regrab for zero-shot")


def episode_chunks(scores: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                   support: torch.Tensor, query: torch.Tensor, episodes: int) -> torch.Tensor:
    """``scores(support, query)`` over chunks of ``episodes`` episodes (at least one), as one
    "sample" (S = 1). Exact, since episodes are independent; it bounds evaluation memory.

    Shapes:
        support: (B, N, K, D), query: (B, Q, D); scores -> (b, Q, N) -> (B, 1, Q, N)
    """
    step = max(1, episodes)
    parts = [scores(support[i:i + step], query[i:i + step])
             for i in range(0, support.shape[0], step)]
    return torch.cat(parts)[:, None]  # (B, 1, Q, N)


class PredictiveHead(nn.Module):
    """A head with no evidence term and nothing to fit on held-out relations, whose
    predictive is the Monte Carlo average of its :meth:`sample_logits` samples.

    Subclasses define ``sample_logits(support, query, h, generator) -> (B, S, Q, N)``.
    """

    def evidence(self, x: torch.Tensor, h: torch.Tensor | None) -> None:
        return None

    def fit_heldout(self, groups: list[torch.Tensor], h: torch.Tensor) -> None:
        return None

    def log_predictive(self, support: torch.Tensor, query: torch.Tensor,
                       h: torch.Tensor | None = None, generator: torch.Generator | None = None
                       ) -> torch.Tensor:
        """``log (1/S) sum_s softmax(logits_s)`` over the samples of :meth:`sample_logits`;
        with one sample (S = 1) the log-softmax of its logits, exactly.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D), h: (B, N, D) or None -> (B, Q, N)
        """
        return mc_log_predictive(self.sample_logits(support, query, h, generator))


class PriorFreeHead(PredictiveHead):
    """A :class:`PredictiveHead` without a graph prior: no h_r (``prior_means`` is None).

    Subclasses whose ways share their support set ``couples_ways = True``.
    """

    prior = None
    couples_ways = False

    def prior_states(self) -> None:
        return None

    def prior_means(self, states: None, rows: torch.Tensor, text: None = None) -> None:
        return None


class PrototypeHead(PriorFreeHead):
    """Prototype = mean support encoding; softmax over ``sim / T``."""

    def __init__(self, similarity: str, temperature: float) -> None:
        super().__init__()
        self.similarity = similarity
        self.temperature = temperature

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """Logits of every query against the prototypes, as one "sample" (S = 1).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, 1, Q, N)
        """
        require_shots(support, "a prototype baseline")
        v = support.mean(2)  # (B, N, D)
        return similarity_logits(query, v, self.similarity, self.temperature)[:, None]


def _prototypes(config, graph, dim: int) -> PrototypeHead:
    return PrototypeHead(config.langevin.similarity, config.langevin.temperature)


METHODS = (
    Method("mtb", _prototypes, "support-mean prototypes, dot product (Baldini Soares et al.)",
           similarity="dot", seed=2),
    Method("proto", _prototypes, "support-mean prototypes, Euclidean (Snell et al.)",
           similarity="euclidean", seed=3),
)
