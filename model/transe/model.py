"""TransE (Bordes et al., 2013): relation features from a knowledge graph.

A triple (h, r, t) is plausible when the tail sits near the head moved by the
relation, ``h + r ~ t``; the distance ``d(h, r, t) = ||h + r - t||_p`` is small for
true triples and, after training, larger for corrupted ones. REGRAB takes the
relation vectors ``r`` as the initial node features of its relation graph.

Training is built for throughput on CPUs:

* Negatives are shared by a chunk of positives (as in DGL-KE / GraphVite): every
  positive in a chunk of ``chunk_size`` triples is contrasted with the same
  ``negatives`` uniformly drawn entities, so for ``p = 2`` all negative distances
  of a chunk come from one matrix product instead of a (chunk, negatives, D)
  difference tensor.
* The embedding tables are dense tensors outside autograd. A step gathers the
  rows its batch uses into small leaf tensors, back-propagates into those, and
  :class:`RowAdam` updates just those rows, so a step costs O(rows in the batch)
  rather than O(E * D), with no sparse tensors involved.
* All randomness (initialisation, shuffling, negatives) comes from one CPU
  ``torch.Generator`` whose state goes into checkpoints, so a resumed run repeats
  an uninterrupted one exactly on CPU.

Shapes:
    T: triples in the training set, P: positive triples in a batch, E: entities,
    R: relations, D: embedding size,
    G: chunks in a batch, C: positives per chunk, M: negatives per chunk,
    U: distinct entity rows a batch touches, Q: evaluation queries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.config import field


@dataclass(frozen=True)
class TransEConfig:
    """Hyper-parameters of TransE and of its training schedule.

    Attributes:
        dim: Embedding size D of entities and relations.
        epochs: Passes over the training triples.
        batch_size: Positive triples per optimiser step.
        negatives: Corrupted entities contrasted with every positive.
        chunk_size: Positives that share one draw of ``negatives`` entities.
        lr: Learning rate of the row-wise Adam (:class:`RowAdam`).
        loss: ``margin`` (pairwise hinge, Bordes et al.) or ``adversarial``
            (self-adversarial negative sampling, Sun et al. 2019, as GraphVite).
        margin: Hinge margin, or gamma of the adversarial loss.
        adversarial_temperature: Inverse softmax temperature weighting negatives.
        p_norm: 1 or 2, the norm in ``||h + r - t||_p``.
        normalize_entities: Project entity vectors onto the unit sphere (Bordes et al.);
            GraphVite leaves them free and relies on a large margin instead.
        seed: Seed of initialisation, shuffling and negative sampling.
    """

    dim: int = field(ge=1)
    epochs: int = field(ge=1)
    batch_size: int = field(ge=1)
    negatives: int = field(ge=1)
    chunk_size: int = field(ge=1)
    lr: float = field(gt=0)
    loss: Literal["margin", "adversarial"]
    margin: float = field(ge=0)
    adversarial_temperature: float = field(gt=0)
    p_norm: Literal[1, 2]
    normalize_entities: bool
    seed: int

    def __post_init__(self) -> None:
        if self.chunk_size > self.batch_size:
            raise ValueError(
                f"chunk_size ({self.chunk_size}) must not exceed batch_size ({self.batch_size})"
            )


class TransE(nn.Module):
    """Entity and relation tables with the TransE distance.

    The tables are plain tensors updated row by row by :class:`RowAdam` rather
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


class RowAdam:
    """Adam that updates only the rows a step touched ("lazy" Adam, as SparseAdam).

    Moments of untouched rows stay as they are; the bias correction uses the
    global step count. Works on dense tables, so it avoids sparse tensors.

    Args:
        tables: The tensors to update, by name.
        lr: Learning rate.
        betas: Adam's moment decay rates.
        eps: Adam's denominator term.
    """

    def __init__(
        self,
        tables: dict[str, torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.tables = tables
        self.lr, self.betas, self.eps = lr, betas, eps
        self.step_count = 0
        self.exp_avg = {k: torch.zeros_like(v) for k, v in tables.items()}
        self.exp_avg_sq = {k: torch.zeros_like(v) for k, v in tables.items()}

    @torch.no_grad()
    def step(
        self, updates: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    ) -> dict[str, torch.Tensor]:
        """Advance the moments of the touched rows and return their new values.

        Args:
            updates: Table name -> (unique row ids, current rows, gradients), all
                with one row per id.

        Returns:
            Table name -> updated rows, for the caller to post-process and write back
            (writing once saves a gather and a scatter per table).
        """
        self.step_count += 1
        b1, b2 = self.betas
        corr1 = 1 - b1**self.step_count
        corr2 = 1 - b2**self.step_count
        new_rows = {}
        for name, (ids, rows, grad) in updates.items():
            m = self.exp_avg[name].index_select(0, ids).mul_(b1).add_(grad, alpha=1 - b1)
            v = self.exp_avg_sq[name].index_select(0, ids).mul_(b2)
            v.addcmul_(grad, grad, value=1 - b2)  # (U, D)
            self.exp_avg[name].index_copy_(0, ids, m)
            self.exp_avg_sq[name].index_copy_(0, ids, v)
            denom = v.div_(corr2).sqrt_().add_(self.eps)
            new_rows[name] = rows.addcdiv(m, denom, value=-self.lr / corr1)
        return new_rows

    def state_dict(self) -> dict:
        """Moments and step count, for checkpoints."""
        return {
            "step_count": self.step_count,
            "exp_avg": dict(self.exp_avg),
            "exp_avg_sq": dict(self.exp_avg_sq),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output in place."""
        self.step_count = int(state["step_count"])
        for name in self.tables:
            self.exp_avg[name].copy_(state["exp_avg"][name])
            self.exp_avg_sq[name].copy_(state["exp_avg_sq"][name])


def make_optimizer(model: TransE) -> RowAdam:
    """Row-wise Adam over both tables: only the rows a batch touches are updated."""
    return RowAdam({"entities": model.entities, "relations": model.relations}, lr=model.config.lr)


def train_step(
    model: TransE, optimizer: RowAdam, batch: torch.Tensor, generator: torch.Generator
) -> float:
    """One optimiser step on a batch of positives with chunk-shared uniform negatives.

    Shapes:
        batch: (P, 3) head, relation, tail ids on the model's device -> loss value
    """
    cfg = model.config
    device = batch.device
    b = batch.shape[0]
    g = -(-b // cfg.chunk_size)  # chunks; a short last batch is padded by repeating rows
    if g * cfg.chunk_size != b:
        # Cycle through the batch again so every chunk is full.
        batch = batch[torch.arange(g * cfg.chunk_size, device=device) % b]
        b = batch.shape[0]
    # Draw on the CPU generator so the stream is the same on every device.
    neg_ids = torch.randint(0, model.num_entities, (g, cfg.negatives), generator=generator)
    neg_ids = neg_ids.to(device)  # (G, M)
    # Half the chunks corrupt tails; an odd one out (or a lone chunk) takes a coin flip.
    coin = int(torch.randint(0, 2, (1,), generator=generator))
    tail_chunks = g // 2 + (g % 2) * coin

    ent_ids, ent_inv = torch.unique(
        torch.cat([batch[:, 0], batch[:, 2], neg_ids.view(-1)]), return_inverse=True
    )
    rel_ids, rel_inv = torch.unique(batch[:, 1], return_inverse=True)
    ent_rows = model.entities.index_select(0, ent_ids).requires_grad_()  # (U, D)
    rel_rows = model.relations.index_select(0, rel_ids).requires_grad_()  # (distinct, D)

    h = ent_rows.index_select(0, ent_inv[:b])  # (P, D)
    t = ent_rows.index_select(0, ent_inv[b : 2 * b])  # (P, D)
    r = rel_rows.index_select(0, rel_inv)  # (P, D)
    cand = ent_rows.index_select(0, ent_inv[2 * b :]).view(g, cfg.negatives, cfg.dim)  # (G, M, D)
    loss = chunk_loss(h, r, t, cand, tail_chunks, cfg)
    loss.backward()
    new = optimizer.step(
        {
            "entities": (ent_ids, ent_rows.detach(), ent_rows.grad),
            "relations": (rel_ids, rel_rows.detach(), rel_rows.grad),
        }
    )
    model.write_rows(ent_ids, new["entities"], rel_ids, new["relations"])
    return float(loss.detach())


def train_epoch(
    model: TransE,
    optimizer: RowAdam,
    triples: torch.Tensor,
    generator: torch.Generator,
    on_batch: Callable[[int, float], None] | None = None,
) -> float:
    """One pass over ``triples`` in a shuffled order; returns the mean batch loss.

    Args:
        model: The model; its device is the one training runs on.
        optimizer: From :func:`make_optimizer`.
        triples: (T, 3) int64 head, relation, tail ids on the CPU.
        generator: CPU generator for the order and the negatives.
        on_batch: Called with (positives in the batch, loss) after every step.
    """
    model.train()
    device = model.entities.device
    cfg = model.config
    order = torch.randperm(triples.shape[0], generator=generator)
    total, steps = 0.0, 0
    for start in range(0, triples.shape[0], cfg.batch_size):
        batch = triples[order[start : start + cfg.batch_size]].to(device)  # (P, 3)
        value = train_step(model, optimizer, batch, generator)
        total += value
        steps += 1
        if on_batch is not None:
            on_batch(min(cfg.batch_size, triples.shape[0] - start), value)
    return total / max(steps, 1)


def _filter_lists(
    queries: np.ndarray, known: np.ndarray, key_cols: tuple[int, int], target_col: int, n: int
) -> tuple[np.ndarray, np.ndarray]:
    """For each query, the known answers on ``target_col`` sharing its two other ids.

    Returns (query row, answer id) pairs covering every known triple that matches,
    the query's own answer included.
    """
    a, b = key_cols
    known_key = known[:, a] * n + known[:, b]
    sort = np.argsort(known_key, kind="stable")
    known_key, answers = known_key[sort], known[sort, target_col]
    query_key = queries[:, a] * n + queries[:, b]
    lo = np.searchsorted(known_key, query_key, side="left")
    hi = np.searchsorted(known_key, query_key, side="right")
    counts = hi - lo
    rows = np.repeat(np.arange(len(queries)), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return rows, answers[np.repeat(lo, counts) + offsets]


@torch.no_grad()
def filtered_ranks(
    model: TransE, queries: torch.Tensor, known: torch.Tensor, batch_size: int = 256
) -> torch.Tensor:
    """Filtered ranks of the true head and tail of every query among all entities.

    Every other entity that forms a known triple with the query's remaining two ids
    is removed before ranking (Bordes et al.'s "filtered" setting). Ties count half
    (the mean of the optimistic and pessimistic rank), so an untrained model whose
    distances tie does not look good.

    Args:
        model: Trained model.
        queries: (Q, 3) held-out triples.
        known: (T, 3) every true triple (training and held-out) for the filter.
        batch_size: Queries scored at once against all E entities.

    Returns:
        (2Q,) float ranks: tail predictions first, then head predictions.
    """
    model.eval()
    device = model.entities.device
    p = model.config.p_norm
    ents = model.entities  # (E, D)
    n = max(model.num_entities, model.num_relations)
    q_np, k_np = queries.cpu().numpy(), known.cpu().numpy()
    ranks = []
    # Tail side: anchor h + r against every t; head side: anchor t - r against every h.
    for side, keys, target in (("tail", (0, 1), 2), ("head", (2, 1), 0)):
        rows, cols = _filter_lists(q_np, k_np, keys, target, n)
        rows_t, cols_t = torch.from_numpy(rows), torch.from_numpy(cols)
        for start in range(0, len(q_np), batch_size):
            q = queries[start : start + batch_size].to(device)  # (Q, 3)
            r = model.relations[q[:, 1]]
            if side == "tail":
                anchor = ents[q[:, 0]] + r
            else:
                anchor = ents[q[:, 2]] - r
            dist = cross_distance(anchor, ents, p)  # (Q, E)
            arange = torch.arange(len(q), device=device)
            true = dist[arange, q[:, target]].clone()  # (Q,)
            sel = (rows_t >= start) & (rows_t < start + len(q))
            dist[(rows_t[sel] - start).to(device), cols_t[sel].to(device)] = float("inf")
            less = (dist < true.unsqueeze(1)).sum(1)
            # The true entity was filtered to inf, so equal counts only other entities.
            equal = (dist == true.unsqueeze(1)).sum(1)
            ranks.append((1 + less + 0.5 * equal).float().cpu())
    return torch.cat(ranks)


def rank_metrics(ranks: torch.Tensor) -> dict[str, float]:
    """MRR and Hits@{1,3,10} of filtered ranks."""
    return {
        "mrr": float((1.0 / ranks).mean()),
        "hits_at_1": float((ranks <= 1).float().mean()),
        "hits_at_3": float((ranks <= 3).float().mean()),
        "hits_at_10": float((ranks <= 10).float().mean()),
    }
