"""TransE (Bordes et al., 2013): relation features from a knowledge graph.

A triple (h, r, t) is plausible when the tail sits near the head moved by the
relation, ``h + r ~ t``; the distance ``d(h, r, t) = ||h + r - t||_p`` is small for
true triples and, after training, larger for corrupted ones. REGRAB takes the
relation vectors ``r`` as the initial node features of its relation graph.

The loss is built for throughput on CPUs. Negatives are shared by a chunk of
positives, as in DGL-KE / GraphVite: every positive in a chunk of ``chunk_size``
triples is contrasted with the same ``negatives`` uniformly drawn entities, so for
``p = 2`` all negative distances of a chunk come from one matrix product instead of a
(chunk, negatives, D) difference tensor. The tables are initialised from a CPU
``torch.Generator``, the one training then draws from.

This module is the model and its loss; :mod:`model.transe.optim` trains it row by row
and :mod:`model.transe.ranking` ranks held-out triples with it.

Shapes:
    P: positive triples in a batch, E: entities, R: relations, D: embedding size,
    G: chunks in a batch, C: positives per chunk, M: negatives per chunk.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from model.transe.config import TransEConfig


class TransE(nn.Module):
    """Entity and relation tables with the TransE distance.

    The tables are plain tensors updated row by row by
    :class:`~model.transe.optim.RowAdam` rather
    than by autograd on the whole table: a step gathers the rows its batch uses
    into small leaf tensors, so backward and the update cost O(rows in batch).

    Args:
        num_entities: E.
        num_relations: R.
        config: Hyper-parameters (``dim``, ``p_norm``, ``normalize_entities``).
        generator: CPU generator used for the initialisation.
    """

    def __init__(
        self,
        num_entities: int,
        num_relations: int,
        config: TransEConfig,
        generator: torch.Generator,
    ) -> None:
        super().__init__()
        self.config = config
        if config.normalize_entities:
            # Bordes et al.: uniform in +-6/sqrt(D), then rows L2-normalised.
            bound = 6.0 / math.sqrt(config.dim)
        else:
            # Sun et al. (RotatE code, also for TransE): +-(margin + 2)/D puts initial
            # distances near the margin, where the self-adversarial loss has gradient;
            # Bordes' range would start every distance far beyond it.
            bound = (config.margin + 2.0) / config.dim
        ent = torch.empty(num_entities, config.dim).uniform_(-bound, bound, generator=generator)
        rel = torch.empty(num_relations, config.dim).uniform_(-bound, bound, generator=generator)
        if config.normalize_entities:
            ent = F.normalize(ent, dim=-1)
            rel = F.normalize(rel, dim=-1)
        self.entities = nn.Parameter(ent, requires_grad=False)  # (E, D)
        self.relations = nn.Parameter(rel, requires_grad=False)  # (R, D)

    @property
    def num_entities(self) -> int:
        """E."""
        return self.entities.shape[0]

    @property
    def num_relations(self) -> int:
        """R."""
        return self.relations.shape[0]

    @torch.no_grad()
    def write_rows(
        self,
        ent_ids: torch.Tensor,
        ent_rows: torch.Tensor,
        rel_ids: torch.Tensor,
        rel_rows: torch.Tensor,
    ) -> None:
        """Store updated rows, entities put back on the unit sphere (Bordes et al.)."""
        if self.config.normalize_entities:
            ent_rows = F.normalize(ent_rows, dim=-1)
        self.entities.index_copy_(0, ent_ids, ent_rows)
        self.relations.index_copy_(0, rel_ids, rel_rows)


def pair_distance(diff: torch.Tensor, p: int) -> torch.Tensor:
    """Row-wise ``||diff||_p`` over the last axis."""
    return torch.linalg.vector_norm(diff, ord=p, dim=-1)


def cross_distance(x: torch.Tensor, y: torch.Tensor, p: int) -> torch.Tensor:
    """All-pairs ``||x_i - y_j||_p`` in batches.

    For ``p = 2`` the expansion ``|x|^2 + |y|^2 - 2 x.y`` turns the work into one
    matrix product, which is what makes shared negatives cheap.

    Shapes:
        x: (..., C, D), y: (..., M, D) -> (..., C, M)
    """
    if p == 2:
        sq = (
            x.pow(2).sum(-1, keepdim=True)
            + y.pow(2).sum(-1).unsqueeze(-2)
            - 2.0 * torch.matmul(x, y.transpose(-1, -2))
        )
        # Clamp: rounding can push tiny squares below zero, and sqrt'(0) is infinite.
        return sq.clamp_min(1e-12).sqrt()
    return torch.cdist(x, y, p=1.0)


def transe_loss(pos: torch.Tensor, neg: torch.Tensor, config: TransEConfig) -> torch.Tensor:
    """Loss of positive distances against their negatives' distances.

    Shapes:
        pos: (P,), neg: (P, M) -> scalar
    """
    if config.loss == "margin":
        return F.relu(config.margin + pos.unsqueeze(1) - neg).mean()
    # Self-adversarial: hard negatives (small distance) weigh more; weights are constants.
    weights = torch.softmax(config.adversarial_temperature * (config.margin - neg), dim=1)
    pos_loss = -F.logsigmoid(config.margin - pos).mean()
    neg_loss = -(weights.detach() * F.logsigmoid(neg - config.margin)).sum(1).mean()
    return (pos_loss + neg_loss) / 2


def chunk_loss(
    h: torch.Tensor,
    r: torch.Tensor,
    t: torch.Tensor,
    cand: torch.Tensor,
    tail_chunks: int,
    config: TransEConfig,
) -> torch.Tensor:
    """Loss of positives whose chunks share negative entities.

    The first ``tail_chunks`` chunks corrupt tails, the rest heads; the batch is a
    random sample, so this is as fair as a per-row coin without a per-row select.
    Corrupting the head of (h, r, t) to h' gives ``||h' - (t - r)||``, so both
    sides reduce to distances between an anchor and candidate entities.

    Shapes:
        h, r, t: (P, D) with P = G * C, cand: (G, M, D) -> scalar
    """
    g = cand.shape[0]
    split = tail_chunks * config.chunk_size
    hr = h + r  # (P, D)
    pos = pair_distance(hr - t, config.p_norm)  # (P,)
    anchor = torch.cat([hr[:split], t[split:] - r[split:]])  # (P, D)
    anchor = anchor.view(g, config.chunk_size, config.dim)  # (G, C, D)
    neg = cross_distance(anchor, cand, config.p_norm).reshape(h.shape[0], -1)  # (P, M)
    return transe_loss(pos, neg, config)
