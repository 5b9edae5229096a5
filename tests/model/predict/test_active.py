"""Active labelling: the strategies that rank a pool, and the simulated user."""

import numpy as np
import pytest
import torch

from model.episodes import EpisodeSampler
from model.evaluation.uncertainty import uncertainty_scores
from model.methods.base import PrototypeHead
from model.predict import simulation
from model.predict.active import (
    DEFAULT_STRATEGY,
    STRATEGIES,
    acquisition_scores,
    check_strategy,
    pick,
    random_scores,
    ranking,
)
from model.predict.predictor import Predictor
from model.predict.simulation import sample_pool_episodes, simulate, support_logits
from pipeline.errors import PipelineError
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

RELATIONS = ["P6", "P7", "P8"]

# --- strategies ---------------------------------------------------------------------------


def test_each_strategy_ranks_by_its_uncertainty_score():
    logits = torch.randn(2, 6, 4, 3)  # (B, S, P, N)
    scores = uncertainty_scores(logits)
    for strategy, key in (("bald", "mutual_information"), ("entropy", "entropy"),
                          ("margin", "margin")):
        assert torch.equal(acquisition_scores(strategy, logits), scores[key])
    # Margin: the smaller gap between the two top probabilities comes first.
    probs = torch.tensor([[[0.5, 0.45, 0.05], [0.9, 0.05, 0.05]]]).log()  # (S=1, P=2, N=3)
    assert ranking(acquisition_scores("margin", probs).numpy()).tolist() == [0, 1]
    assert set(STRATEGIES) == {"bald", "entropy", "margin", "typiclust", "random"}
    for strategy in ("typiclust", "random"):  # they read no logits
        with pytest.raises(ValueError, match="does not rank by the logits"):
            acquisition_scores(strategy, logits)


def test_bald_is_refused_without_posterior_samples():
    with pytest.raises(PipelineError, match="bald ranks by the disagreement.*proto.*entropy"):
        acquisition_scores("bald", torch.randn(1, 4, 3), "checkpoint x (proto)")
    with pytest.raises(PipelineError, match="unknown; use one of bald, entropy"):
        check_strategy("uncertainty", 10)
    assert check_strategy("bald", 2) == "bald"
    assert DEFAULT_STRATEGY == "typiclust" and check_strategy(DEFAULT_STRATEGY, 1)


def test_random_is_seeded_and_ranking_keeps_ties_in_pool_order():
    a = random_scores((5,), torch.Generator().manual_seed(3))
    b = random_scores((5,), torch.Generator().manual_seed(3))
    assert torch.equal(a, b) and not torch.equal(a, random_scores(
        (5,), torch.Generator().manual_seed(4)))
    assert ranking(np.array([0.2, 0.5, 0.2, np.nan, 0.5])).tolist() == [1, 4, 0, 2, 3]


def test_pick_skips_what_is_labelled():
    scores = torch.tensor([[0.1, 0.9, 0.5], [0.3, 0.3, 0.1]])
    labelled = torch.tensor([[False, True, False], [False, False, False]])
    assert pick(scores, labelled).tolist() == [2, 0]
    with pytest.raises(ValueError, match="no unlabelled"):
        pick(scores, torch.ones(2, 3, dtype=torch.bool))


# --- the simulated user ---------------------------------------------------------------------


def test_pool_episodes_use_every_sentence_once_and_shuffle_the_pool():
    labels = [r for r in "abcd" for _ in range(12)]
    sampler = EpisodeSampler(labels)
    eps = sample_pool_episodes(sampler, np.random.default_rng(0), 3, 2, 4, 3, 20)
    assert eps.start.shape == (20, 3, 2) and eps.pool.shape == (20, 12)
    assert eps.query.shape == eps.query_way.shape == (20, 9)
    rel = np.asarray(labels)
    for b in range(20):
        rows = np.concatenate([eps.start[b].ravel(), eps.pool[b], eps.query[b]])
        assert len(set(rows.tolist())) == len(rows)  # no sentence twice
        ways = np.array(sampler.relations)[eps.relation[b]]
        assert (rel[eps.pool[b]] == ways[eps.pool_way[b]]).all()
        assert (rel[eps.query[b]] == ways[eps.query_way[b]]).all()
        assert (rel[eps.start[b]] == ways[:, None]).all()
    assert not all((eps.pool_way[b] == np.sort(eps.pool_way[b])).all() for b in range(20))
    sub = eps.remapped(eps.rows)
    assert (eps.rows[sub.pool] == eps.pool).all() and (eps.rows[sub.start] == eps.start).all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny REGRAB predictor and the encodings of 6 sentences of each of 3 relations."""
    folder = tmp_path_factory.mktemp("active")
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), "cpu", seed=3)
    rows = toy_table(RELATIONS, 6, seed=3).to_pylist()
    return pred, rows, pred.encode(rows)


def test_support_logits_of_one_user_are_the_predictors(tiny):
    """Unequal shots: the same padded episode from the same seed."""
    pred, rows, enc = tiny
    shots = [1, 3, 2]
    pred.set_support({r: [x for x in rows if x["relation"] == r][:k]
                      for r, k in zip(RELATIONS, shots, strict=True)})
    queries = np.array([5, 11, 17, 4])
    expected = pred.sample_logits(enc[torch.from_numpy(queries)])  # (S, Q, N)
    support = np.array([[[6 * n + j for j in range(3)] for n in range(3)]])  # (1, N, 3)
    model = pred.model
    h = model.head.prior_means(model.head.prior_states(), model.rows(RELATIONS)[None])
    got = support_logits(model.head, enc, h, support, np.array([shots]), queries[None],
                       torch.Generator().manual_seed(3))
    assert expected.shape[0] > 1 and got.shape == (1, *expected.shape)
    torch.testing.assert_close(got[0], expected, rtol=1e-4, atol=1e-4)


def _episodes(n_rel=3, per=10, start=1, pool=4, queries=3, count=6, seed=0):
    labels = [RELATIONS[i % 3] if n_rel == 3 else f"r{i}" for i in range(n_rel)
              for _ in range(per)]
    return sample_pool_episodes(EpisodeSampler(labels), np.random.default_rng(seed), 3,
                                start, pool, queries, count)


def test_simulation_labels_the_pool_one_sentence_at_a_time():
    eps = _episodes()
    # Each relation's sentences sit around its own centre: the head is right on most queries.
    centres = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)) * 3
    enc = centres.repeat_interleave(10, 0) + torch.randn(30, 16)
    head = PrototypeHead("euclidean", 1.0).eval()
    steps = []
    acc = simulate(head, enc, None, eps, ["entropy", "margin", "random"], 6, 0,
                   torch.Generator().manual_seed(1), progress=steps.append)
    assert acc.shape == (7, 6, 3) and steps == list(range(6))
    # Before the first label every strategy has the same support (a deterministic head).
    assert (acc[0] == acc[0, :, :1]).all()
    assert ((acc >= 0) & (acc <= 1)).all() and acc.mean() > 0.5
    # The same order seed labels the same sentences in random, so its curve repeats.
    again = simulate(head, enc, None, eps, ["random"], 6, 0,
                     torch.Generator().manual_seed(1))
    assert np.array_equal(again[:, :, 0], acc[:, :, 2])


def test_typiclust_labels_what_its_pick_says_from_the_encodings():
    eps = _episodes(count=3)
    centres = torch.randn(3, 16, generator=torch.Generator().manual_seed(0)) * 3
    enc = centres.repeat_interleave(10, 0) + torch.randn(30, 16)
    head = PrototypeHead("euclidean", 1.0).eval()
    seen = []
    real = simulation.typiclust_picks

    def spy(labelled, pool, free, generator):
        i = real(labelled, pool, free, generator)
        seen.append((labelled.shape[:2], free.sum(-1).tolist()))
        return i

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simulation, "typiclust_picks", spy)
        acc = simulate(head, enc, None, eps, ["typiclust", "random"], 4, 0,
                       torch.Generator().manual_seed(1))
    assert acc.shape == (5, 3, 2)
    # One batch of picks per step, each seeing one more label than the last.
    assert seen == [((3, 3 + t), [12 - t] * 3) for t in range(4)]
    again = simulate(head, enc, None, eps, ["typiclust"], 4, 0, torch.Generator())
    assert np.array_equal(again[:, :, 0], acc[:, :, 0])


def test_simulation_refuses_bald_for_a_head_without_samples_and_too_many_labels():
    eps, enc = _episodes(count=2), torch.randn(30, 8)
    head = PrototypeHead("euclidean", 1.0).eval()
    with pytest.raises(PipelineError, match="bald ranks.*drop it"):
        simulate(head, enc, None, eps, ["bald"], 2, 0, torch.Generator(), "proto",
                 fix="drop it")
    with pytest.raises(PipelineError, match="pool holds 12"):
        simulate(head, enc, None, eps, ["entropy"], 13, 0, torch.Generator())
    with pytest.raises(PipelineError, match="each strategy once"):
        simulate(head, enc, None, eps, ["entropy", "entropy"], 2, 0, torch.Generator())


def test_bald_runs_on_regrab_and_every_label_joins_one_support(tiny, monkeypatch):
    pred, rows, enc = tiny
    labels = [x["relation"] for x in rows]
    eps = sample_pool_episodes(EpisodeSampler(labels), np.random.default_rng(2), 3, 1, 3, 2,
                               3)
    model = pred.model
    h = model.head.prior_means(model.head.prior_states(),
                               model.rows(RELATIONS)[torch.from_numpy(eps.relation)])
    seen = []
    real = model.head.sample_logits

    def spy(support, query, hg, generator=None, shots=None):
        seen.append(shots.sum(1).tolist() if shots is not None
                    else [support.shape[1] * support.shape[2]] * support.shape[0])
        return real(support, query, hg, generator, shots=shots)

    monkeypatch.setattr(model.head, "sample_logits", spy)
    marks = []
    acc = simulate(model.head, enc, h, eps, ["bald", "random"], 4, 7,
                   torch.Generator().manual_seed(0), progress=lambda t: marks.append(len(seen)))
    assert acc.shape == (5, 3, 2) and len(marks) == 4
    # Every strategy draws its posterior samples from the same seed: before the first label
    # they agree exactly, and a strategy's curve does not depend on the others run with it.
    assert (acc[0, :, 0] == acc[0, :, 1]).all()
    monkeypatch.undo()
    alone = simulate(model.head, enc, h, eps, ["bald"], 4, 7, torch.Generator())
    assert np.array_equal(alone[:, :, 0], acc[:, :, 0])
    # Each label joins exactly one way's support: step t scores 3 + t sentences of support
    # for each of the 3 users of each of the 2 strategies, one padded episode per user.
    bounds = [0, *marks, len(seen)]
    for t in range(5):
        calls = seen[bounds[t]:bounds[t + 1]]
        assert len(calls) == 2 and all(c == [3 + t] * 3 for c in calls)
