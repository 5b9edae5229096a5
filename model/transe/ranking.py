"""Filtered ranking of held-out triples (Bordes et al.), and its MRR and Hits@k.

A held-out triple (h, r, t) is ranked twice: its tail among every entity as the tail of
(h, r, ?), and its head as the head of (?, r, t). In the "filtered" setting every other
entity that forms a known triple with the query's two remaining ids is left out first, so a
model is not penalised for ranking another true answer higher.

Shapes:
    Q: evaluation queries, E: entities, T: known triples.
"""

from __future__ import annotations

import numpy as np
import torch

from model.transe.model import TransE, cross_distance


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
