import numpy as np
import pytest
import torch

from model.episodes import (
    EpisodeSampler,
    Setting,
    episode_accuracy,
    gather_episodes,
    mean_ci95,
)
from model.methods.proto import PrototypeHead
from pipeline.errors import PipelineError


def _sampler(per=6, rels=4):
    return EpisodeSampler([f"P{i}" for i in range(rels) for _ in range(per)])


def test_sample_shapes_and_disjoint_rows():
    s = _sampler()
    ep = s.sample(np.random.default_rng(0), 3, 2, 3, 50)
    assert ep.relation.shape == (50, 3) and ep.support.shape == (50, 3, 2)
    assert ep.query.shape == (50, 3, 3)
    for b in range(50):
        assert len(set(ep.relation[b])) == 3
        rows = np.concatenate([ep.support[b].ravel(), ep.query[b].ravel()])
        assert len(set(rows)) == len(rows)
        for n in range(3):  # every row of way n belongs to relation[b, n]
            assert set(rows.reshape(-1)[:0]) == set()
            assert all(r // 6 == ep.relation[b, n] for r in ep.support[b, n])
            assert all(r // 6 == ep.relation[b, n] for r in ep.query[b, n])


def test_seeded_sampling_repeats():
    a = _sampler().sample(np.random.default_rng(5), 4, 1, 2, 10)
    b = _sampler().sample(np.random.default_rng(5), 4, 1, 2, 10)
    assert np.array_equal(a.support, b.support) and np.array_equal(a.query, b.query)


def test_bad_episode_requests():
    s = _sampler(per=6, rels=4)
    with pytest.raises(PipelineError, match="K\\+Q"):
        s.sample(np.random.default_rng(0), 2, 4, 3, 1)
    with pytest.raises(PipelineError, match="5-way"):
        s.sample(np.random.default_rng(0), 5, 1, 1, 1)
    with pytest.raises(PipelineError):
        Setting.parse("five-way")
    assert Setting.parse("10w0s") == Setting(10, 0)


@pytest.mark.parametrize("similarity", ["dot", "euclidean"])
def test_gather_and_accuracy_on_separable_encodings(similarity):
    s = _sampler(per=6, rels=4)
    enc = torch.eye(4).repeat_interleave(6, 0) * 5 + 0.01 * torch.randn(24, 4)
    ep = s.sample(np.random.default_rng(0), 3, 1, 2, 20)
    support, query, labels = gather_episodes(enc, ep)
    assert support.shape == (20, 3, 1, 4) and query.shape == (20, 6, 4)
    assert labels.shape == (20, 6)
    head = PrototypeHead(similarity, temperature=10.0).eval()
    acc = episode_accuracy(head, enc, ep, torch.full((4,), -1), batch_size=7)
    assert acc.shape == (20,) and acc.min() == 1.0
    shuffled = enc[torch.randperm(24, generator=torch.Generator().manual_seed(0))]
    assert episode_accuracy(head, shuffled, ep, torch.full((4,), -1)).mean() < 0.9


def test_mean_ci95():
    mean, ci = mean_ci95(np.array([0.0, 1.0] * 50))
    assert mean == pytest.approx(50.0)
    assert ci == pytest.approx(1.96 * np.std([0.0, 1.0] * 50, ddof=1) / 10 * 100)
