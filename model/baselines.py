"""Baselines that share REGRAB's encoder, episodes and training loop.

* ``mtb``: prototypes are the support means, dot-product similarity (Baldini Soares et al.,
  2019, as the paper uses it: a prototypical network with dot product).
* ``proto``: prototypes are the support means, Euclidean similarity (Snell et al., 2017).
* ``regrab_no_prior``: REGRAB with h_r = 0, i.e. a standard normal prior and no graph.

All use the temperature of the ``model`` section, so they differ from REGRAB only in how
prototypes are formed.

Shapes:
    B episodes, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

import torch
from torch import nn

from model.langevin import similarity_logits
from model.registry import Method
from pipeline.errors import PipelineError


class PrototypeHead(nn.Module):
    """Prototype = mean support encoding; softmax over ``sim / T``."""

    prior = None
    couples_ways = False

    def __init__(self, similarity: str, temperature: float) -> None:
        super().__init__()
        self.similarity = similarity
        self.temperature = temperature

    def prior_states(self) -> None:
        return None

    def prior_means(self, states: None, rows: torch.Tensor, text: None = None) -> None:
        return None

    def evidence(self, x: torch.Tensor, h: None) -> None:
        return None

    def fit_heldout(self, groups: list[torch.Tensor], h: torch.Tensor) -> None:
        return None

    def sample_logits(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Logits of every query against the prototypes, as one "sample" (S = 1).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, 1, Q, N)
        """
        if support.shape[2] == 0:
            raise PipelineError("prototype baselines need K >= 1 support sentences per way")
        v = support.mean(2)  # (B, N, D)
        return similarity_logits(query, v, self.similarity, self.temperature)[:, None]

    def log_predictive(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Log-softmax over prototypes for every query.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, Q, N)
        """
        logits = self.sample_logits(support, query)[:, 0]  # (B, Q, N)
        return torch.log_softmax(logits, dim=-1)


def _prototypes(config, graph, dim: int) -> PrototypeHead:
    return PrototypeHead(config.langevin.similarity, config.langevin.temperature)


METHODS = (
    Method("mtb", _prototypes, "support-mean prototypes, dot product (Baldini Soares et al.)",
           similarity="dot"),
    Method("proto", _prototypes, "support-mean prototypes, Euclidean (Snell et al.)",
           similarity="euclidean"),
)
