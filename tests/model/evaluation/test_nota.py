import numpy as np
import pytest

from model.episodes import EpisodeSampler
from model.evaluation.nota import outside_count, sample_nota
from model.evaluation.scoring import OUTSIDE
from pipeline.errors import PipelineError


def _sampler(per=20, rels=8):
    return EpisodeSampler([f"P{i}" for i in range(rels) for _ in range(per)])


@pytest.mark.parametrize("rate", [0.0, 0.15, 0.5])
def test_nota_episodes_fraction_and_no_outside_relation_in_support(rate):
    s = _sampler()
    base = s.sample(np.random.default_rng(1), 5, 2, 5, 200)
    ep = sample_nota(s, np.random.default_rng(0), base, rate)
    assert np.array_equal(ep.support, base.support)  # same ways and support as the plain ones
    inside = ep.label != OUTSIDE
    assert all(set(ep.query[b][inside[b]]) <= set(base.query[b].ravel()) for b in range(200))
    m = 25
    assert ep.query.shape == ep.label.shape == ep.query_relation.shape == (200, m)
    assert ep.support.shape == (200, 5, 2)
    n_out = (ep.label == OUTSIDE).sum(1)
    assert (n_out == outside_count(5, 5, rate)).all()
    assert n_out[0] == int(np.floor(rate * m + 0.5))
    for b in range(200):
        ways = set(ep.relation[b])
        outside = ep.query_relation[b][ep.label[b] == OUTSIDE]
        assert not ways & set(outside)  # outside queries come from other relations
        support_rel = {r // 20 for r in ep.support[b].ravel()}
        assert support_rel == ways  # the support holds the N ways only
        assert (ep.query[b] // 20 == ep.query_relation[b]).all()
        assert (ep.relation[b][ep.label[b][inside[b]]] == ep.query_relation[b][inside[b]]).all()
        rows = np.concatenate([ep.support[b].ravel(), ep.query[b]])
        assert len(set(rows)) == len(rows)  # no sentence twice in an episode


def test_nota_sampling_repeats_and_refuses_without_outside_relations():
    s = _sampler()
    base = s.sample(np.random.default_rng(0), 3, 1, 4, 10)
    a = sample_nota(s, np.random.default_rng(3), base, 0.5)
    b = sample_nota(s, np.random.default_rng(3), base, 0.5)
    assert np.array_equal(a.query, b.query) and np.array_equal(a.label, b.label)
    with pytest.raises(PipelineError, match="outside the 8 ways"):
        sample_nota(s, np.random.default_rng(0), s.sample(np.random.default_rng(0), 8, 1, 2, 1),
                    0.5)
    with pytest.raises(PipelineError, match="nota_rates"):
        sample_nota(s, np.random.default_rng(0), base, 1.0)
