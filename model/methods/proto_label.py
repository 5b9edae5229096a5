"""``proto_label``: prototypes that read the relation's label, with no graph and no posterior.

The baseline that tells what REGRAB's graph and posterior add over reading the label. Each
way's label mean is REGRAB's label term without the graph term,

    h_r = b + g (e_r - mean e),

with ``e_r`` the encoding of the relation's label sentence (the same template sentence, the
same encoder, read the same way as REGRAB's prior: :class:`~model.prior.gcn.GraphPrior`
with ``text: true``), ``b`` a learned vector that starts at the mean training encoding and
``g`` a learned gain. The prototype combines it with the support mean ``m`` like a prior
worth ``w`` extra shots,

    v = (K m + w h_r) / (K + w),

with ``w >= 0`` learned end to end (it starts at 1), then a softmax over ``-|x - v|^2 / T``
as ``proto``. With ``w = 0`` it is ``proto``; with ``K = 0`` the label alone classifies.
The graph only supplies the relation list and labels: no TransE features, no GCN, no
sampling. Close in spirit to SimpleFSRE (Liu et al., Findings of ACL 2022), which adds the
encoded relation name and description to the prototype; ours reads the name, and the
description with ``model.prior.descriptions``, and learns the mixing weight.

Shapes:
    B episodes, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
from torch import nn

from model.methods.base import PredictiveHead
from model.methods.registry import Method
from model.posterior.logits import similarity_logits
from model.posterior.shots import (
    pooled_scatter,
    scored_prototypes,
    shot_counts,
    support_sum,
)
from model.prior.config import GraphPriorConfig
from model.prior.gcn import GraphPrior
from model.prior.graph import RelationGraph
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.config import RegrabConfig


class LabelPrior(GraphPrior):
    """:class:`GraphPrior` with the GCN term replaced by one learned vector ``b``."""

    def __init__(self, config: GraphPriorConfig, graph: RelationGraph, out_dim: int) -> None:
        if not config.text:
            raise PipelineError("method proto_label reads relation labels; set "
                                "model.prior.text: true and pass --relations")
        # The learned label weight w is this method's trust in the label: no held-out mix.
        super().__init__(dataclasses.replace(config, mix="fixed"), graph, out_dim)
        self.convs = nn.ModuleList()  # no graph network
        self.base = nn.Parameter(torch.zeros(out_dim))

    def _graph_states(self, rows: torch.Tensor | None) -> torch.Tensor:
        """``b`` for every row asked for (no graph).

        Shapes:
            rows: (...,) or None -> (..., D) or (R, D)
        """
        shape = (len(self.relations),) if rows is None else tuple(rows.shape)
        return self.base.expand(*shape, -1)

    def _named_states(self) -> torch.Tensor:
        """Label means of the relations named by :meth:`add_names`: (M, D)."""
        return self.base + self._label_gain() * self.named_text

    def prior_kind(self, relation: str) -> str:
        """``label`` for a relation with a label (in the graph's list or named), else
        ``fallback``: this prior never reads the graph."""
        row = self._index.get(relation, -1)
        if row < 0:
            return "fallback"
        if row < len(self.relations) and not bool(self.text[row].any()):
            # Listed without a label: h_r = b. (The saved label encodings say so; the label
            # strings are not saved, so a loaded model has none.)
            return "fallback"
        return "label"

    @torch.no_grad()
    def start_at(self, mean: torch.Tensor) -> None:
        """Start ``b`` at the mean training encoding (the label term's gain starts at 1).

        Shapes:
            mean: (D,)
        """
        self.base.copy_(mean)


def support_mean_or(support: torch.Tensor, shots: torch.Tensor | None, h: torch.Tensor
                    ) -> torch.Tensor:
    """Each way's support mean, ``h`` for a way without shots.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None, h: (B, N, D) -> (B, N, D)
    """
    k = shot_counts(support, shots)
    total = support_sum(support, shots)
    if isinstance(k, int):
        return total / k
    return torch.where(k > 0, total / k.clamp(min=1), h)


class ProtoLabelHead(PredictiveHead):
    """Support mean and label mean combined with a learned weight; softmax over ``sim / T``
    (:meth:`log_predictive`, with one "sample")."""

    couples_ways = False
    unequal_shots = True

    def __init__(self, prior: LabelPrior, similarity: str, temperature: float,
                 scoring: str = "mean") -> None:
        super().__init__()
        self.prior = prior
        self.similarity = similarity
        self.temperature = temperature
        self.scoring = scoring
        #: w, the label's weight in shots (clamped at 0 when used).
        self.label_weight = nn.Parameter(torch.tensor(1.0))

    def prior_states(self) -> torch.Tensor:
        """Label means of every relation of the graph: (R, D)."""
        return self.prior.node_states()

    def prior_means(self, states: torch.Tensor | None, rows: torch.Tensor,
                    text: torch.Tensor | None = None) -> torch.Tensor:
        """h_r for the ways of each episode, as :meth:`model.methods.regrab.RegrabHead.prior_means`.

        Shapes:
            states: (R, D) or None, rows: (B, N), text: (B, N, D) or None -> (B, N, D)
        """
        if states is None or text is not None:
            return self.prior(rows, text)
        h = states[rows.clamp(min=0)]  # (B, N, D)
        return torch.where((rows < 0)[..., None], self.prior.fallback.expand_as(h), h)

    def prototypes(self, support: torch.Tensor, h: torch.Tensor,
                   shots: torch.Tensor | None = None) -> torch.Tensor:
        """``v = (k m + w h) / (k + w)`` with each way's own k; the label mean alone when
        k = 0 (and ``w = 0``).

        Shapes:
            support: (B, N, K, D), h: (B, N, D), shots: (B, N) or None -> (B, N, D)
        """
        k = shot_counts(support, shots)
        w = self.label_weight.clamp(min=0)
        if isinstance(k, int) and k == 0:
            return h
        v = (support_sum(support, shots) + w * h) / (k + w).clamp(min=1e-12)
        if not isinstance(k, int):
            v = torch.where(k > 0, v, h)  # a way with no shots has its label mean alone
        return v

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None, generator: torch.Generator | None = None,
                      shots: torch.Tensor | None = None) -> torch.Tensor:
        """Logits of every query against the prototypes, as one "sample" (S = 1), scored as
        ``scoring`` says (:func:`~model.methods.base.scored_prototypes`; the sampling noise of
        ``v`` is ``k / (k + w)^2`` of an encoding's, and a way without shots keeps its label
        mean as it is).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D), h: (B, N, D), shots: (B, N) or None
            -> (B, 1, Q, N)
        """
        if h is None:
            raise PipelineError("proto_label needs the ways' label means (h)")
        v = self.prototypes(support, h, shots)  # (B, N, D)
        if support.shape[2] == 0 or self.scoring == "mean":
            return similarity_logits(query, v, self.similarity, self.temperature)[:, None]
        k = shot_counts(support, shots)
        w = self.label_weight.clamp(min=0)
        spread = k / (k + w).square().clamp(min=1e-12)
        if self.scoring == "normalised" and not isinstance(k, int):
            # a way without shots has no encodings to take a length from: its mean as it is
            v = torch.where(k > 0, v, h)
        extra = None
        if self.scoring == "unbiased":
            # The label mean misses its relation's mean by E |h - mu|^2, estimated over the
            # episode's ways from |m_r - h_r|^2 less the support mean's own noise; a way's
            # prototype carries (w / (k + w))^2 of it.
            scatter = pooled_scatter(support, shots)  # (B, 1, 1)
            has = (k > 0) if not isinstance(k, int) else None
            gap = (support_mean_or(support, shots, h) - h).pow(2).sum(-1, keepdim=True) \
                - scatter / (k if isinstance(k, int) else k.clamp(min=1))  # (B, N, 1)
            if has is not None:
                gap = torch.where(has, gap, torch.zeros_like(gap))
                ways = has.to(gap.dtype).sum(1, keepdim=True).clamp(min=1)
            else:
                ways = gap.shape[1]
            miss = (gap.sum(1, keepdim=True) / ways).clamp(min=0)  # (B, 1, 1)
            extra = (w / (k + w).clamp(min=1e-12)).square() * miss
        return scored_prototypes(query, v, support, shots, spread, self.scoring,
                                 self.similarity, self.temperature, extra)[:, None]


def _proto_label(config: RegrabConfig, graph: RelationGraph | None, dim: int
                 ) -> ProtoLabelHead:
    if graph is None:
        raise PipelineError("method proto_label reads the relation labels listed with the "
                            "graph; pass --graph, --features and --relations")
    return ProtoLabelHead(LabelPrior(config.prior, graph, dim), config.langevin.similarity,
                          config.langevin.temperature, config.langevin.prototype_scoring)


METHODS = (
    Method("proto_label", _proto_label, "support mean plus the relation label's encoding, "
           "learned weight; no graph, no posterior (SimpleFSRE-like)", uses_graph=True,
           zero_shot=True, similarity="euclidean", seed=4),
)
