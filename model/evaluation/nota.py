"""None-of-the-above (NOTA) episodes, FewRel 2.0 protocol (Gao et al., 2019).

An N-way K-shot NOTA episode at rate r has ``M = N * Q_way`` queries of which
``round(r * M)`` come from relations of the same split outside the N ways (label
:data:`model.evaluation.scoring.OUTSIDE`) and the rest from the N ways, a random subset of the
``Q_way`` queries per way of the plain episode it is made from. The support holds the N ways
only, so an outside relation can never appear in it. A method answers "none of the above" by
abstaining when its confidence is below a threshold (:func:`model.evaluation.scoring.best_threshold`
picks it on validation episodes).

Shapes:
    B episodes, N ways, K shots, M queries of an episode (all ways and outside together).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from model.episodes import Episodes, EpisodeSampler
from model.evaluation.scoring import OUTSIDE
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class NotaEpisodes:
    """Sentence rows of B NOTA episodes; way n of episode b is relation ``relation[b, n]``.

    Attributes:
        relation: (B, N) index into ``EpisodeSampler.relations``.
        support: (B, N, K) sentence rows.
        query: (B, M) sentence rows.
        label: (B, M) way of each query, ``OUTSIDE`` for a query from another relation.
        query_relation: (B, M) sampler relation index of each query's sentence.
    """

    relation: np.ndarray
    support: np.ndarray
    query: np.ndarray
    label: np.ndarray
    query_relation: np.ndarray


def outside_count(ways: int, queries: int, rate: float) -> int:
    """Outside queries of an episode: ``rate`` of the ``ways * queries``, rounded half up."""
    return int(np.floor(rate * ways * queries + 0.5))


def sample_nota(
    sampler: EpisodeSampler, rng: np.random.Generator, base: Episodes, rate: float
) -> NotaEpisodes:
    """NOTA episodes made from plain ones: same ways and support, some queries from outside.

    Building on plain episodes lets a caller score both with one draw of posterior samples
    per episode (the samples depend on the support only), and makes the NOTA numbers paired
    with the plain ones.

    Args:
        sampler: the sampler that drew ``base`` (sentences of the split by relation).
        rng: the only source of randomness (seeded runs repeat).
        base: B plain N-way episodes with ``Q_way`` queries per way (M = N * Q_way).
        rate: fraction of the M queries that come from outside the N ways, in [0, 1).
    """
    if not 0.0 <= rate < 1.0:
        raise PipelineError(f"NOTA rate {rate} must be in [0, 1); fix evaluate.nota_rates")
    count, ways, queries = base.query.shape
    n_rel = len(sampler.relations)
    total = ways * queries
    n_out = outside_count(ways, queries, rate)
    if n_out and n_rel <= ways:
        raise PipelineError(
            f"NOTA episodes need relations outside the {ways} ways but the {sampler.what} has "
            f"{n_rel}; lower the ways or set evaluate.nota_rates to []"
        )
    query = np.empty((count, total), dtype=np.int64)
    label = np.empty((count, total), dtype=np.int64)
    query_rel = np.empty((count, total), dtype=np.int64)
    inside_rows = base.query.reshape(count, total)
    for b in range(count):
        kept = np.sort(rng.choice(total, size=total - n_out, replace=False))
        query[b, : total - n_out] = inside_rows[b, kept]
        label[b, : total - n_out] = kept // queries
        query_rel[b, : total - n_out] = base.relation[b, kept // queries]
        if n_out:
            pool = np.setdiff1d(np.arange(n_rel), base.relation[b])
            picked = pool[rng.integers(0, len(pool), size=n_out)]
            query[b, total - n_out :] = _distinct_members(sampler, rng, picked)
            label[b, total - n_out :] = OUTSIDE
            query_rel[b, total - n_out :] = picked
    return NotaEpisodes(base.relation, base.support, query, label, query_rel)


def _distinct_members(
    sampler: EpisodeSampler, rng: np.random.Generator, relations: np.ndarray
) -> np.ndarray:
    """One sentence of each listed relation, no sentence twice in the episode."""
    rows = np.empty(len(relations), dtype=np.int64)
    for r in np.unique(relations):
        where = np.flatnonzero(relations == r)
        members = sampler.members[r]
        if len(where) > len(members):
            raise PipelineError(
                f"relation {sampler.relations[r]} has {len(members)} sentences in the "
                f"{sampler.what}, fewer than {len(where)} outside queries; lower the rate"
            )
        rows[where] = members[rng.permutation(len(members))[: len(where)]]
    return rows
