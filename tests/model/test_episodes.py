import numpy as np
import pytest
import torch

from model.episodes import (
    EpisodeSampler,
    Setting,
    episode_accuracy,
    gather_episodes,
    log_predictive_batches,
    mean_ci95,
)
from model.methods.base import PrototypeHead
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


def test_the_episode_loop_batches_in_order():
    """One forward pass per ``batch_size`` episodes, in order: the batches put together are
    the whole set's log-predictive."""
    s = _sampler(per=6, rels=4)
    enc = torch.randn(24, 4, generator=torch.Generator().manual_seed(2))
    ep = s.sample(np.random.default_rng(1), 3, 1, 2, 20)
    head = PrototypeHead("euclidean", temperature=1.0).eval()
    args = (head, enc, ep.relation, ep.support, ep.query.reshape(20, 6), torch.full((4,), -1))
    with torch.no_grad():
        parts = list(log_predictive_batches(*args, batch_size=7))
        whole = next(log_predictive_batches(*args, batch_size=20))
    assert [p.shape[0] for p in parts] == [7, 7, 6]
    assert torch.allclose(torch.cat(parts), whole, atol=1e-6)


def test_mean_ci95():
    mean, ci = mean_ci95(np.array([0.0, 1.0] * 50))
    assert mean == pytest.approx(50.0)
    assert ci == pytest.approx(1.96 * np.std([0.0, 1.0] * 50, ddof=1) / 10 * 100)
    assert np.isnan(mean_ci95(np.array([1.0]))[1])  # no interval from one episode


def test_one_normal_interval_behind_every_episode_interval():
    """mean_ci95, the pooled interval of the report and the paired episode interval of
    transfer are the one helper, to the bit."""
    from model.evaluation.transfer import vs_floor
    from pipeline.report import normal_ci95, pooled_ci95

    a, b = np.array([0.2, 0.6, 1.0]), np.array([0.4, 0.4])
    assert normal_ci95(np.concatenate([a, b])) == pytest.approx(
        1.96 * np.concatenate([a, b]).std(ddof=1) / np.sqrt(5))
    assert mean_ci95(a)[1] == normal_ci95(a) * 100
    assert pooled_ci95([a, b]) == normal_ci95(np.concatenate([a, b])) * 100
    cells = {"split_0": {"regrab": {"2w1s": {"episodes": a}},
                         "floor": {"2w1s": {"episodes": np.zeros(3)}}}}
    assert vs_floor(cells)["regrab_minus_floor"]["2w1s"]["episode_ci95"] == normal_ci95(a * 100)
