"""Training episodes whose prior reads the wrong relation (``train.wrong_prior_rate``).

A user's relation names can be wrong, swapped or missing; a prior that only ever saw right ones
in training cannot learn how far to trust one. A share of the training episodes with shots
(zero-shot episodes have no sentence to weigh a wrong prior against) therefore gets its ways'
prior rows corrupted, one of :data:`KINDS` drawn uniformly:

* ``shuffle``: the episode's ways read each other's relation (a random derangement);
* ``replace``: each way reads another training relation, one outside the episode;
* ``blank``: no way reads anything (row -1: the learned fallback vector, no text).

A prior row carries both the graph term and the label sentence, so both are wrong together, as
in the shuffled stress sets. The episode's sentences and the queries' labels are left alone:
only what the prior says about the ways changes.

Shapes:
    N ways of the episode.
"""

from __future__ import annotations

import numpy as np
import torch

#: How an episode's prior rows are corrupted, drawn uniformly.
KINDS = ("shuffle", "replace", "blank")


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A random permutation of ``range(n)`` that moves every element (n >= 2)."""
    while True:
        perm = rng.permutation(n)
        if not np.any(perm == np.arange(n)):
            return perm


def corrupt_rows(rows: torch.Tensor, pool: torch.Tensor, kind: str, rng: np.random.Generator
                 ) -> torch.Tensor:
    """The episode's prior rows after a corruption of ``kind``.

    Args:
        rows: graph row of each way (-1: none).
        pool: graph rows of every training relation (``replace`` draws from those outside
            the episode; with too few left it shuffles).
        kind: one of :data:`KINDS`.
        rng: the run's generator.

    Shapes:
        rows: (1, N), pool: (R_train,) -> (1, N)
    """
    n = rows.shape[-1]
    if kind == "blank" or n < 2:
        return torch.full_like(rows, -1)
    if kind == "replace":
        outside = pool[~torch.isin(pool, rows.reshape(-1))]
        if len(outside) >= n:
            pick = torch.from_numpy(rng.choice(len(outside), size=n, replace=False))
            return outside[pick.to(outside.device)].reshape(rows.shape)
    if kind not in KINDS:
        raise ValueError(f"unknown corruption {kind!r}; one of {KINDS}")
    perm = torch.from_numpy(derangement(n, rng)).to(rows.device)
    return rows[..., perm]
