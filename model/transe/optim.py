"""Training TransE row by row: the row-wise Adam, one step and one epoch.

* The embedding tables are dense tensors outside autograd. A step gathers the
  rows its batch uses into small leaf tensors, back-propagates into those, and
  :class:`RowAdam` updates just those rows, so a step costs O(rows in the batch)
  rather than O(E * D), with no sparse tensors involved.
* Negatives are shared by a chunk of positives (:func:`model.transe.model.chunk_loss`);
  a short last batch is padded by repeating rows so that every chunk is full.
* All randomness (shuffling, negatives, the corrupted side) comes from one CPU
  ``torch.Generator`` whose state goes into checkpoints, so a resumed run repeats
  an uninterrupted one exactly on CPU.

Shapes:
    T: triples in the training set, P: positive triples in a batch, E: entities,
    R: relations, D: embedding size, G: chunks in a batch, M: negatives per chunk,
    U: distinct entity rows a batch touches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from model.transe.model import TransE, chunk_loss


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
