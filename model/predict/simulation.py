"""A simulated user labelling a pool sentence by sentence: what each strategy's labels buy.

Each episode has N relations (ways), a few labelled sentences of each to start with, a pool
of unlabelled sentences of each (shuffled together, so the pool's order tells nothing) and
held-out query sentences of each that measure the accuracy. At every step a strategy
(:mod:`model.predict.active`) ranks the pool under the current posterior, the user labels
the top sentence (its relation is revealed and it joins that way's support), the posterior
is refitted, and the query accuracy is recorded: once before the first label and after
every label.

Every strategy runs on the same episodes (supports, pools and queries) with posterior
samples from the same seed, and ``random`` draws its order from a generator seeded by the
caller, so two methods given the same seed label the same sentences in ``random``.

The support grows unevenly across the ways. As :class:`~model.predict.predictor.Predictor`
does, the ways of an episode run in groups of equal K, one group as one episode of the head
(exact where each way's prototype reads its own support only: ``couples_ways`` false); a
head that couples its ways uses every way's first K sentences, K the smallest count. Groups
of the same K and size are batched across episodes.

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

from model.episodes import EpisodeSampler
from model.evaluation.uncertainty import mc_log_probs
from model.predict.active import acquisition_scores, check_strategy, pick, random_scores
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


def group_logits(head: torch.nn.Module, enc: torch.Tensor, h: torch.Tensor | None,
                 support: np.ndarray, counts: np.ndarray, evaluated: np.ndarray,
                 generator: torch.Generator | None) -> torch.Tensor:
    """Per-sample logits of every simulated user's evaluated sentences against its support.

    Args:
        head: the method's head, in eval mode.
        enc: sentence encodings; the row arrays index into them.
        h: each user's prior means (None for heads without a prior).
        support: each way's labelled rows in the order labelled; the first ``counts`` count.
        counts: labelled sentences per way.
        evaluated: the rows scored (pool, then queries).
        generator: seeds the posterior samples.

    Shapes:
        enc: (n, D), h: (R, N, D) or None, support: (R, N, K_max), counts: (R, N),
        evaluated: (R, Q') -> (R, S, Q', N)
    """
    r, n = counts.shape
    used = counts if not head.couples_ways else np.repeat(counts.min(1, keepdims=True), n, 1)
    dev = enc.device
    parts = []
    for k in np.unique(used):
        mine = used == k  # (R, N)
        sizes = mine.sum(1)
        for size in np.unique(sizes[sizes > 0]):
            users = np.flatnonzero(sizes == size)  # (G,)
            ways = np.nonzero(mine[users])[1].reshape(len(users), size)  # (G, N_k), sorted
            idx = support[users[:, None], ways, :k]  # (G, N_k, K)
            sup = enc[torch.from_numpy(idx).to(dev)]  # (G, N_k, K, D)
            qry = enc[torch.from_numpy(evaluated[users]).to(dev)]  # (G, Q', D)
            hg = None if h is None else h[torch.from_numpy(users).to(dev)[:, None],
                                          torch.from_numpy(ways).to(dev)]  # (G, N_k, D)
            logits = head.sample_logits(sup, qry, hg, generator)  # (G, S, Q', N_k)
            parts.append((users, ways, logits))
    s = max(p[2].shape[1] for p in parts)  # a deterministic head gives S = 1
    out = torch.empty(r, n, s, evaluated.shape[1], dtype=parts[0][2].dtype, device=dev)
    for users, ways, logits in parts:
        out[torch.from_numpy(users).to(dev)[:, None], torch.from_numpy(ways).to(dev)] = \
            logits.expand(-1, s, -1, -1).permute(0, 3, 1, 2)  # (G, N_k, S, Q')
    return out.permute(0, 2, 3, 1)  # (R, S, Q', N)


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
        strategies: names of :data:`model.predict.active.STRATEGIES`, each run on every
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
    acc = np.zeros((labels + 1, b, a))
    everyone = np.arange(b)
    for step in range(labels + 1):
        for j, s in enumerate(strategies):
            # ``random`` needs no scores of the pool: only its queries are scored.
            with_pool = s != "random" and step < labels
            scored = np.concatenate([episodes.pool, episodes.query], 1) if with_pool else \
                episodes.query
            logits = group_logits(head, enc, h, support[j], counts[j], scored,
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
