"""A simulated user labelling a pool sentence by sentence: what each strategy's labels buy.

Each episode has N relations (ways), a few labelled sentences of each to start with, a pool
of unlabelled sentences of each (shuffled together, so the pool's order tells nothing) and
held-out query sentences of each that measure the accuracy. At every step a strategy
(:mod:`model.predict.active`) ranks the pool under the current posterior, the user labels
the top sentence (its relation is revealed and it joins that way's support), the posterior
is refitted, and the query accuracy is recorded: once before the first label and after
every label.

Every strategy runs on the same episodes (supports, pools and queries) with posterior
samples from the same seed (``typiclust``'s k-means seeded by it too), and ``random`` draws
its order from a generator seeded by the caller, so two methods given the same seed label
the same sentences in ``random``.

The support grows unevenly across the ways. As :class:`~model.predict.predictor.Predictor`
does, every user's support is one episode padded to its largest count with each way's count
(:func:`model.methods.base.head_logits`): a head that takes counts scores each way with its
own sentences (REGRAB with ``predictive: gaussian``: its posterior predictive), any other
gets each way's sentences repeated in order up to that count. All users are one batch.

Shapes:
    B episodes, A strategies, R simulated users scored together (one per episode), N ways,
    K0 start shots, P pool sentences per episode, Q held-out queries per episode, S posterior
    samples, D encoding size, L labels added.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model.episodes import EpisodeSampler, cycled
from model.evaluation.uncertainty import mc_log_probs
from model.posterior.shots import head_logits
from model.predict.active import (
    READS_ENCODINGS,
    acquisition_scores,
    check_strategy,
    pick,
    random_scores,
)
from model.predict.typiclust import typiclust_picks
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class PoolEpisodes:
    """Sentence rows of B labelling episodes; way n of episode b is relation
    ``relation[b, n]`` of the sampler.

    Attributes:
        relation: (B, N) sampler relation index of each way.
        start: (B, N, K0) rows labelled at the start.
        pool: (B, P) rows of the unlabelled pool, shuffled across the ways.
        pool_way: (B, P) the way of each pool sentence (revealed when it is labelled).
        query: (B, Q) held-out rows, way after way.
        query_way: (B, Q) their ways.
    """

    relation: np.ndarray
    start: np.ndarray
    pool: np.ndarray
    pool_way: np.ndarray
    query: np.ndarray
    query_way: np.ndarray

    @property
    def rows(self) -> np.ndarray:
        """Every sentence row the episodes use, sorted, once each."""
        return np.unique(np.concatenate([self.start.ravel(), self.pool.ravel(),
                                         self.query.ravel()]))

    def remapped(self, rows: np.ndarray) -> PoolEpisodes:
        """The same episodes with each sentence row replaced by its position in ``rows``
        (sorted; e.g. :attr:`rows`, to index encodings of those sentences only)."""
        def at(x: np.ndarray) -> np.ndarray:
            return np.searchsorted(rows, x)

        return PoolEpisodes(self.relation, at(self.start), at(self.pool), self.pool_way,
                            at(self.query), self.query_way)


def sample_pool_episodes(sampler: EpisodeSampler, rng: np.random.Generator, ways: int,
                         start: int, pool: int, queries: int, count: int) -> PoolEpisodes:
    """Draw ``count`` labelling episodes: ``start`` labelled, ``pool`` unlabelled and
    ``queries`` held-out sentences per way, all different sentences.

    Raises:
        PipelineError: too few relations, or a relation with fewer than
            ``start + pool + queries`` sentences.
    """
    eps = sampler.sample(rng, ways, start + pool, queries, count)  # support (B, N, K0 + p)
    b, n = eps.relation.shape
    rows = eps.support[:, :, start:].reshape(b, n * pool)
    way = np.broadcast_to(np.repeat(np.arange(n), pool), (b, n * pool))
    order = np.argsort(rng.random((b, n * pool)), axis=1)
    q = eps.query.shape[2]
    return PoolEpisodes(eps.relation, eps.support[:, :, :start],
                        np.take_along_axis(rows, order, 1), np.take_along_axis(way, order, 1),
                        eps.query.reshape(b, n * q),
                        np.broadcast_to(np.repeat(np.arange(n), q), (b, n * q)).copy())


def support_logits(head: torch.nn.Module, enc: torch.Tensor, h: torch.Tensor | None,
                   support: np.ndarray, counts: np.ndarray, evaluated: np.ndarray,
                   generator: torch.Generator | None) -> torch.Tensor:
    """Per-sample logits of every simulated user's evaluated sentences against its support.

    Args:
        head: the method's head, in eval mode.
        enc: sentence encodings; the row arrays index into them.
        h: each user's prior means (None for heads without a prior).
        support: each way's labelled rows in the order labelled; the first ``counts`` count.
        counts: labelled sentences per way (at least one each).
        evaluated: the rows scored (pool, then queries).
        generator: seeds the posterior samples.

    Shapes:
        enc: (n, D), h: (R, N, D) or None, support: (R, N, K_max), counts: (R, N),
        evaluated: (R, Q') -> (R, S, Q', N)
    """
    dev = enc.device
    rows = cycled(support[:, :, :int(counts.max())], counts)  # (R, N, K)
    sup = enc[torch.from_numpy(rows).to(dev)]  # (R, N, K, D)
    qry = enc[torch.from_numpy(evaluated).to(dev)]  # (R, Q', D)
    return head_logits(head, sup, qry, h, generator, torch.from_numpy(counts).to(dev))


def encoding_scores(enc: torch.Tensor, episodes: PoolEpisodes, support: np.ndarray,
                    counts: np.ndarray, labelled: torch.Tensor,
                    generator: torch.Generator) -> torch.Tensor:
    """``typiclust``'s pick in every episode as scores: 1 for the pick, 0 elsewhere.

    Shapes:
        enc: (n, D), support: (B, N, K), counts: (B, N) with equal sums, labelled: (B, P)
        -> (B, P)
    """
    b, n = counts.shape
    rows = np.stack([np.concatenate([support[i, w, :counts[i, w]] for w in range(n)])
                     for i in range(b)])  # (B, L)
    taken = typiclust_picks(enc[torch.from_numpy(rows).to(enc.device)],
                            enc[torch.from_numpy(episodes.pool).to(enc.device)], ~labelled,
                            generator)  # (B,)
    scores = torch.zeros(labelled.shape, dtype=torch.float64)
    scores[torch.arange(b), taken] = 1.0
    return scores


@torch.no_grad()
def simulate(head: torch.nn.Module, enc: torch.Tensor, h: torch.Tensor | None,
             episodes: PoolEpisodes, strategies: Sequence[str], labels: int, seed: int,
             order: torch.Generator, what: str = "this model", fix: str | None = None,
             progress: Callable[[int], None] | None = None) -> np.ndarray:
    """Query accuracy of a simulated user of every strategy, before and after each label.

    Args:
        head: the method's head, in eval mode.
        enc: encodings of the sentences the episodes' rows index.
        h: the prior means of each episode's ways (None for heads without a prior).
        episodes: from :func:`sample_pool_episodes`.
        strategies: names of :data:`model.predict.config.STRATEGIES`, each run on every
            episode, each once.
        labels: pool sentences labelled per episode (at most its pool).
        seed: seeds the posterior samples, each strategy's from the same seed: before the
            first label every strategy sees the same samples, and a strategy's numbers do not
            depend on which others run beside it.
        order: seeds the ``random`` strategy's draws.
        what: the model, in the error of a strategy it cannot run.
        fix: the end of that error (default: :func:`check_strategy`'s).
        progress: called with the step after each step.

    Returns:
        accuracy (fraction of the queries right), (L + 1, B, A): row t after t labels.

    Raises:
        PipelineError: a strategy the head cannot run (``bald`` without posterior samples),
            or more labels than the pool holds.

    Shapes:
        enc: (n, D), h: (B, N, D) or None -> (L + 1, B, A)
    """
    b, n = episodes.relation.shape
    a, p = len(strategies), episodes.pool.shape[1]
    if labels > p:
        raise PipelineError(f"{labels} labels per episode need a pool of as many sentences; "
                            f"the pool holds {p}")
    if not strategies or len(set(strategies)) < a:
        raise PipelineError(f"strategies {list(strategies)}: name each strategy once, and at "
                            "least one")
    dev = enc.device
    k0 = episodes.start.shape[2]
    support = np.zeros((a, b, n, k0 + labels), dtype=np.int64)  # (A, B, N, K0 + L)
    support[:, :, :, :k0] = episodes.start
    counts = np.full((a, b, n), k0, dtype=np.int64)
    truth = torch.from_numpy(episodes.query_way).to(dev)  # (B, Q)
    labelled = torch.zeros(a, b, p, dtype=torch.bool, device=dev)
    gens = [torch.Generator(device=dev).manual_seed(seed) for _ in strategies]
    clusters = [torch.Generator().manual_seed(seed) for _ in strategies]  # typiclust's k-means
    acc = np.zeros((labels + 1, b, a))
    everyone = np.arange(b)
    for step in range(labels + 1):
        for j, s in enumerate(strategies):
            # ``random`` and ``typiclust`` need no scores of the pool: only queries are scored.
            with_pool = s != "random" and s not in READS_ENCODINGS and step < labels
            scored = np.concatenate([episodes.pool, episodes.query], 1) if with_pool else \
                episodes.query
            logits = support_logits(head, enc, h, support[j], counts[j], scored,
                                    gens[j])  # (B, S, P + Q or Q, N)
            if not bool(torch.isfinite(logits).all()):
                raise PipelineError(f"{what} gave non-finite logits (NaN or inf); check the "
                                    "checkpoint's weights or retrain it")
            if step == 0 and j == 0:
                for name in strategies:
                    check_strategy(name, logits.shape[1], what, *([fix] if fix else []))
            guess = mc_log_probs(logits[:, :, scored.shape[1] - truth.shape[1]:]).argmax(-1)
            acc[step, :, j] = (guess == truth).double().mean(1).cpu().numpy()
            if step == labels:
                continue
            if s in READS_ENCODINGS:
                scores = encoding_scores(enc, episodes, support[j], counts[j], labelled[j],
                                         clusters[j])
            else:
                scores = (acquisition_scores(s, logits[:, :, :p], what) if with_pool else
                          random_scores((b, p), order))  # (B, P)
            taken = pick(scores.to(dev), labelled[j]).cpu().numpy()  # (B,)
            way = episodes.pool_way[everyone, taken]
            support[j, everyone, way, counts[j, everyone, way]] = episodes.pool[everyone, taken]
            counts[j, everyone, way] += 1
            labelled[j, torch.arange(b, device=dev), torch.from_numpy(taken).to(dev)] = True
        if progress is not None and step < labels:
            progress(step)
    return acc
