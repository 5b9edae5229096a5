"""TypiClust: clusters of the encodings, and the most typical sentence of an unlabelled one."""

import numpy as np
import pytest
import torch

from model.predict.typiclust import (
    kmeans,
    typicality,
    typiclust_order,
    typiclust_pick,
    typiclust_picks,
)


def blobs(sizes, seed=0, spread=0.1, dim=8):
    """Points around well-separated centres, each blob's first point exactly at its centre."""
    gen = torch.Generator().manual_seed(seed)
    centres = torch.eye(dim)[: len(sizes)] * 10
    parts = []
    for c, k in zip(centres, sizes, strict=True):
        noise = torch.randn(k, dim, generator=gen) * spread
        noise[0] = 0
        parts.append(c + noise)
    return torch.cat(parts).double()


def test_kmeans_finds_separated_clusters_and_repeats_with_its_seed():
    x = blobs([6, 5, 4])
    truth = torch.tensor([0] * 6 + [1] * 5 + [2] * 4)
    a = kmeans(x, 3, torch.Generator().manual_seed(1))
    # The same partition up to the clusters' names.
    pairs = {(int(t), int(c)) for t, c in zip(truth, a, strict=True)}
    assert len(pairs) == 3 and len({c for _, c in pairs}) == 3
    assert torch.equal(a, kmeans(x, 3, torch.Generator().manual_seed(1)))
    assert kmeans(x, 99, torch.Generator().manual_seed(0)).max() < len(x)
    # A batch of sets: each set clustered on its own.
    both = kmeans(torch.stack([x, x.flip(0)]), 3, torch.Generator().manual_seed(1))
    assert both.shape == (2, 15)
    for row, labels in zip(both, (truth, truth.flip(0)), strict=True):
        pairs = {(int(t), int(c)) for t, c in zip(labels, row, strict=True)}
        assert len(pairs) == 3 and len({c for _, c in pairs}) == 3


def test_the_centre_is_the_most_typical_and_a_lone_point_counts_one():
    angle = torch.arange(6, dtype=torch.float64) * torch.pi / 3
    ring = torch.stack([angle.cos(), angle.sin()], 1)  # a hexagon of side 1 around 0
    x = torch.cat([torch.zeros(1, 2, dtype=torch.float64), ring,
                   torch.tensor([[5.0, 0.0]], dtype=torch.float64)])  # and an outlier
    t = typicality(x)
    assert int(t.argmax()) == 0 and int(t.argmin()) == 7
    assert float(t[0]) == pytest.approx(7 / (6 * 1 + 5))  # six at 1, the outlier at 5
    assert typicality(x[:1]).tolist() == [1.0]


def test_typicality_in_row_blocks_is_that_of_the_whole_matrix(monkeypatch):
    from model.predict import typiclust

    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(4))
    whole = typicality(x, neighbours=5)
    monkeypatch.setattr(typiclust, "ROWS", 7)
    torch.testing.assert_close(typicality(x, neighbours=5), whole, rtol=1e-12, atol=0)


def test_pick_takes_the_centre_of_the_unlabelled_cluster():
    x = blobs([6, 8, 5])  # blobs A, B, C
    labelled = torch.stack([x[1], x[15]])  # one sentence of A and one of C
    pool = torch.cat([x[2:6], x[6:14], x[16:]])  # A's rest, all of B, C's rest
    free = torch.ones(len(pool), dtype=torch.bool)
    i = typiclust_pick(labelled, pool, free, torch.Generator().manual_seed(0))
    assert torch.equal(pool[i], x[6])  # B's centre
    # A pool sentence already labelled counts as labelled: B now holds one, and the next
    # pick is another cluster's, never the labelled one.
    free[i] = False
    j = typiclust_pick(labelled, pool, free, torch.Generator().manual_seed(0))
    assert j != i and bool(free[j])
    with pytest.raises(ValueError, match="every pool sentence is labelled"):
        typiclust_pick(labelled, pool, torch.zeros(len(pool), dtype=torch.bool),
                       torch.Generator())


def test_a_batch_picks_as_each_pool_alone_would_and_needs_equal_label_counts():
    x = blobs([6, 8, 5])
    labelled = torch.stack([x[1], x[15]])
    pool = torch.cat([x[2:6], x[6:14], x[16:]])
    other = pool.flip(0)
    free = torch.ones(2, len(pool), dtype=torch.bool)
    got = typiclust_picks(torch.stack([labelled, labelled]), torch.stack([pool, other]), free,
                          torch.Generator().manual_seed(0))
    assert torch.equal(pool[got[0]], x[6]) and torch.equal(other[got[1]], x[6])
    free[0, 0] = False
    with pytest.raises(ValueError, match="as many labelled sentences"):
        typiclust_picks(torch.stack([labelled, labelled]), torch.stack([pool, other]), free,
                        torch.Generator())


def test_order_ranks_every_pool_sentence_once_picks_first():
    x = blobs([6, 8, 5])
    labelled, pool = x[:1], x[1:]
    order = typiclust_order(labelled, pool, torch.Generator().manual_seed(0), 3)
    assert sorted(order.tolist()) == list(range(len(pool)))
    first = typiclust_pick(labelled, pool, torch.ones(len(pool), dtype=torch.bool),
                           torch.Generator().manual_seed(0))
    assert order[0] == first
    # After the picks, the rest in order of typicality in the pool.
    rest = order[3:]
    t = typicality(pool)[torch.from_numpy(rest)]
    assert np.all(np.diff(t.numpy()) <= 0)
