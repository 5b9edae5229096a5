"""Baselines that share REGRAB's encoder, episodes and training loop.

* ``mtb``: prototypes are the support means, dot-product similarity (Baldini Soares et al.,
  2019, as the paper uses it: a prototypical network with dot product).
* ``proto``: prototypes are the support means, Euclidean similarity (Snell et al., 2017).
* ``regrab_no_prior``: REGRAB with h_r = 0, i.e. a standard normal prior and no graph.

All use the temperature of the ``model`` section, so they differ from REGRAB only in how
prototypes are formed.

Shapes:
    B episodes, N ways, K shots, M queries, D encoding size, R relations in the graph.
"""

from __future__ import annotations

import torch
from torch import nn

from model.graph_prior import GraphPrior, RelationGraph
from model.langevin import LangevinConfig, similarity_logits
from model.regrab import RegrabConfig, RegrabHead
from pipeline.errors import PipelineError


class PrototypeHead(nn.Module):
    """Prototype = mean support encoding; softmax over ``sim / T``."""

    prior = None

    def __init__(self, config: LangevinConfig) -> None:
        super().__init__()
        self.config = config

    def prior_states(self) -> None:
        return None

    def prior_means(self, states: None, rows: torch.Tensor) -> None:
        return None

    def log_predictive(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Log-softmax over prototypes for every query.

        Shapes:
            support: (B, N, K, D), query: (B, M, D) -> (B, M, N)
        """
        if support.shape[2] == 0:
            raise PipelineError("prototype baselines need K >= 1 support sentences per way")
        v = support.mean(2)  # (B, N, D)
        logits = similarity_logits(query, v, self.config.similarity, self.config.temperature)
        return torch.log_softmax(logits, dim=-1)  # (B, M, N)


def build_head(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> nn.Module:
    """The head for ``config.method`` (graph needed only by ``regrab``)."""
    if config.method in ("mtb", "proto"):
        return PrototypeHead(config.langevin)
    if config.method == "regrab_no_prior":
        return RegrabHead(config.langevin, None, dim)
    if graph is None:
        raise PipelineError("method regrab needs the relation graph; pass --graph and --features")
    return RegrabHead(config.langevin, GraphPrior(config.graph, graph, dim), dim)
