import numpy as np
import pytest
import torch

from model.training.wrong_priors import KINDS, corrupt_rows, derangement


def test_derangement_moves_every_way():
    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 10):
        for _ in range(20):
            assert not np.any(derangement(n, rng) == np.arange(n))


@pytest.mark.parametrize("kind", KINDS)
def test_every_way_reads_a_wrong_prior(kind):
    rows = torch.tensor([[4, 7, 1, 9, 3]])
    pool = torch.arange(20)
    out = corrupt_rows(rows, pool, kind, np.random.default_rng(1))
    assert out.shape == rows.shape
    assert not torch.any(out == rows)
    if kind == "shuffle":
        assert sorted(out.reshape(-1).tolist()) == sorted(rows.reshape(-1).tolist())
    if kind == "replace":
        assert not torch.isin(out, rows).any() and torch.isin(out, pool).all()
        assert len(set(out.reshape(-1).tolist())) == 5
    if kind == "blank":
        assert torch.all(out == -1)


def test_replace_shuffles_when_too_few_relations_are_left():
    rows = torch.tensor([[0, 1, 2]])
    out = corrupt_rows(rows, torch.arange(4), "replace", np.random.default_rng(0))
    assert sorted(out.reshape(-1).tolist()) == [0, 1, 2] and not torch.any(out == rows)
