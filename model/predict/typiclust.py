"""TypiClust: label the most typical sentence of the largest cluster that holds no label.

Hacohen, Dekel & Weinshall, "Active learning on a budget: opposite strategies suit high and
low budgets" (ICML 2022): with a handful of labels, typical sentences (where the encodings
are dense) teach a model more than the uncertain ones that uncertainty sampling picks. The
labelled and unlabelled encodings are clustered by k-means into one cluster more than there
are labelled sentences; among the clusters that hold no labelled sentence the largest is
chosen, and in it the sentence of highest typicality, the inverse of its mean Euclidean
distance to its nearest neighbours in the cluster (at most :data:`NEIGHBOURS`).

It reads the encodings alone: neither the labels nor the model's predictions, so a pick does
not depend on which relation the user gives the sentences labelled before it, and a ranking
of a whole pool is the sequence of picks with each pick counted as labelled
(:func:`typiclust_order`). In the labelling simulation (docs/results/abstain-and-ask.md,
"Ask: which sentence to label next") it beat random labelling where the uncertainty
strategies did not.

Shapes:
    L labelled sentences, P pool sentences, M = L + P, D encoding size.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm import tqdm

#: Nearest neighbours a sentence's typicality averages over (the paper's 20).
NEIGHBOURS = 20
#: Lloyd iterations of the k-means, at most.
ITERATIONS = 20
#: Rows whose distances to all others :func:`typicality` holds at once.
ROWS = 1024


def kmeans(x: torch.Tensor, k: int, generator: torch.Generator,
           iterations: int = ITERATIONS) -> torch.Tensor:
    """The cluster of every row, for a batch of point sets at once: k-means++ seeding, then
    Lloyd iterations until no centre of any set moves (a cluster left empty keeps its centre).

    Shapes:
        x: (M, D) or (B, M, D) -> (M,) or (B, M), int64 in [0, k)
    """
    single = x.dim() == 2
    x = x.float()[None] if single else x.float()
    b, m, _ = x.shape
    k = min(k, m)
    sets = torch.arange(b)
    sq = x.square().sum(-1)  # (B, M)

    def nearest(c: torch.Tensor) -> torch.Tensor:  # closest of centres (B, k, D): (B, M)
        return (c.square().sum(-1)[:, None, :] - 2.0 * x @ c.transpose(1, 2)).argmin(-1)

    def to(i: torch.Tensor) -> torch.Tensor:  # squared distances to row i of each set: (B, M)
        return (sq + sq[sets, i][:, None] - 2.0 * (x @ x[sets, i][..., None])[..., 0]
                ).clamp(min=0)

    i = torch.randint(m, (b,), generator=generator)
    centres = [x[sets, i]]  # (B, D) each
    closest = to(i)  # (B, M): squared distance to the nearest centre
    for _ in range(1, k):
        total = closest.sum(-1, keepdim=True)
        weights = torch.where(total > 0, closest / total.clamp(min=1e-30),
                              torch.ones_like(closest))
        i = torch.multinomial(weights, 1, generator=generator)[:, 0]
        centres.append(x[sets, i])
        closest = torch.minimum(closest, to(i))
    c = torch.stack(centres, 1)  # (B, k, D)
    assign = nearest(c)  # (B, M)
    for _ in range(iterations):
        members = torch.nn.functional.one_hot(assign, k).to(x.dtype)  # (B, M, k)
        sizes = members.sum(1)[..., None]  # (B, k, 1)
        new = torch.where(sizes > 0, (members.transpose(1, 2) @ x) / sizes.clamp(min=1), c)
        if torch.equal(new, c):
            break
        c = new
        assign = nearest(c)
    return assign[0] if single else assign


def typicality(x: torch.Tensor, neighbours: int = NEIGHBOURS) -> torch.Tensor:
    """Inverse mean Euclidean distance of each row to its nearest other rows (at most
    ``neighbours``); 1 for a lone row.

    Shapes:
        x: (M, D) -> (M,) float64
    """
    k = min(neighbours, x.shape[0] - 1)
    if k < 1:
        return torch.ones(x.shape[0], dtype=torch.float64)
    x = x.double()
    # Row blocks: a pool of tens of thousands would not hold its whole distance matrix.
    near = torch.cat([torch.cdist(rows, x).topk(k + 1, largest=False).values[:, 1:]
                      for rows in x.split(ROWS)])  # the row itself is at distance 0
    return 1.0 / near.mean(-1).clamp(min=1e-12)


def typiclust_picks(labelled: torch.Tensor, pool: torch.Tensor, free: torch.Tensor,
                    generator: torch.Generator) -> torch.Tensor:
    """The pool position to label next in each of a batch of pools: the most typical free
    sentence of the largest cluster without a labelled sentence (the module doc). ``free``
    marks the pool sentences not yet labelled; the others count as labelled. When every
    cluster holds a label (k-means left one empty), the most typical free sentence of the
    pool.

    Shapes:
        labelled: (B, L, D), pool: (B, P, D), free: (B, P) bool with a True in every row and
        as many False in each -> (B,) int64
    """
    free = free.cpu()
    if not bool(free.any(-1).all()):
        raise ValueError("every pool sentence is labelled already")
    done = (~free).sum(-1)
    if bool((done != done[0]).any()):
        raise ValueError("the pools of a batch must have as many labelled sentences each")
    b, offset = labelled.shape[:2]
    x = torch.cat([labelled, pool], 1).double().cpu()  # (B, M, D)
    taken = torch.cat([torch.ones(b, offset, dtype=torch.bool), ~free], 1)  # (B, M)
    assign = kmeans(x, int(taken[0].sum()) + 1, generator)  # (B, M): a cluster more than labels
    picks = torch.empty(b, dtype=torch.int64)
    for i in range(b):
        k = int(assign[i].max()) + 1
        sizes = torch.bincount(assign[i], minlength=k)
        holds_label = torch.zeros(k, dtype=torch.bool).index_fill_(0, assign[i, taken[i]], True)
        sizes = sizes.masked_fill(holds_label, -1)
        if int(sizes.max()) < 1:
            members = offset + torch.nonzero(free[i]).flatten()
        else:
            members = torch.nonzero(assign[i] == int(sizes.argmax())).flatten()
        picks[i] = int(members[int(typicality(x[i, members]).argmax())]) - offset
    return picks


def typiclust_pick(labelled: torch.Tensor, pool: torch.Tensor, free: torch.Tensor,
                   generator: torch.Generator) -> int:
    """:func:`typiclust_picks` of one pool.

    Shapes:
        labelled: (L, D), pool: (P, D), free: (P,) bool with at least one True -> int
    """
    return int(typiclust_picks(labelled[None], pool[None], free[None], generator)[0])


def typiclust_order(labelled: torch.Tensor, pool: torch.Tensor, generator: torch.Generator,
                    picks: int, progress: bool = False) -> np.ndarray:
    """Pool positions in the order to label them: the first ``picks`` by repeated
    :func:`typiclust_pick` (each pick counted as labelled for the next), the rest by their
    typicality in the pool, highest first (:func:`typiclust_ranking`'s order). ``progress``: a
    bar of the picks (one k-means each, so a long ranking shows where it is).

    Shapes:
        labelled: (L, D), pool: (P, D) -> (P,) int64
    """
    return typiclust_ranking(labelled, pool, generator, picks, progress)[0]


def typiclust_ranking(labelled: torch.Tensor, pool: torch.Tensor, generator: torch.Generator,
                      picks: int, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """:func:`typiclust_order` and every pool sentence's :func:`typicality` in the pool (the
    inverse of its mean Euclidean distance to its nearest pool sentences): a score a user
    can read, where the order is the picks'.

    Shapes:
        labelled: (L, D), pool: (P, D) -> (P,) int64, (P,) float64
    """
    p = pool.shape[0]
    free = torch.ones(p, dtype=torch.bool)
    order: list[int] = []
    for _ in tqdm(range(min(picks, p)), desc="typiclust picks", unit="pick",
                  disable=not progress):
        i = typiclust_pick(labelled, pool, free, generator)
        order.append(i)
        free[i] = False
    typical = typicality(pool.double().cpu())
    if len(order) < p:
        rest = torch.nonzero(free).flatten()
        order += rest[torch.argsort(-typical[rest], stable=True)].tolist()
    return np.asarray(order, dtype=np.int64), typical.numpy()
