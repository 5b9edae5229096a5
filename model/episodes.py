"""N-way K-shot episode sampling and evaluation on cached sentence encodings.

The encoder sees one sentence at a time (no cross-sentence attention), so encoding every
sentence of a split once and assembling episodes from the cache gives exactly the numbers that
re-encoding each episode would, at a tiny fraction of the cost (see benchmarks/bench_eval.py).

Settings and sampling need numpy only; torch is imported by the loops that score episodes,
so the params schemas that parse settings (``train``, ``evaluate``) load without it.

Shapes:
    B episodes, N ways, K shots, Q queries per way, D encoding size, R graph relations.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipeline.errors import PipelineError
from pipeline.report import normal_ci95

if TYPE_CHECKING:
    import torch

_SETTING = re.compile(r"^(\d+)w(\d+)s$")


@dataclass(frozen=True)
class Setting:
    """One evaluation setting, written ``{N}w{K}s`` (``5w0s`` is 5-way zero-shot)."""

    ways: int
    shots: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        match = _SETTING.match(text)
        if not match:
            raise PipelineError(f"setting {text!r} is not like 5w1s (N-way K-shot)")
        ways = int(match.group(1))
        if ways < 2:
            raise PipelineError(
                f"setting {text} has {ways} way(s): with fewer than 2 candidates every answer "
                "is right, so every method would score 100%; give 2 or more ways, e.g. 5w1s")
        return cls(ways, int(match.group(2)))

    @property
    def name(self) -> str:
        return f"{self.ways}w{self.shots}s"


@dataclass(frozen=True)
class Episodes:
    """Sentence rows of B episodes; way n of episode b is relation ``relation[b, n]``.

    With ``shots``, way n of episode b has ``shots[b, n]`` sentences: the first ones of its
    support row, the rest repeating them in order up to K (so a head that needs equal shots
    reads them oversampled, and one that takes counts masks the repeats out).
    """

    relation: np.ndarray  # (B, N) index into EpisodeSampler.relations
    support: np.ndarray  # (B, N, K) sentence rows
    query: np.ndarray  # (B, N, Q) sentence rows
    shots: np.ndarray | None = None  # (B, N) shots per way; None: every way has K


def cycled(rows: np.ndarray, shots: np.ndarray) -> np.ndarray:
    """Each way's first ``shots`` rows repeated in order to fill its K slots.

    Shapes:
        rows: (B, N, K), shots: (B, N) with every count >= 1 -> (B, N, K)
    """
    slot = np.arange(rows.shape[2]) % np.maximum(shots, 1)[..., None]  # (B, N, K)
    return np.take_along_axis(rows, slot, axis=2)


class EpisodeSampler:
    """Samples episodes from sentences grouped by relation."""

    def __init__(self, sentence_relations: list[str], what: str = "split") -> None:
        self.what = what
        self.relations = sorted(set(sentence_relations))
        labels = np.array([self.relations.index(r) for r in sentence_relations]) if len(
            sentence_relations
        ) else np.zeros(0, dtype=np.int64)
        self.members = [np.flatnonzero(labels == i) for i in range(len(self.relations))]

    def check(self, ways: int, shots: int, queries: int) -> None:
        """Raise when the split cannot supply ``ways`` relations of ``shots + queries``."""
        if ways < 1 or shots < 0 or queries < 1:
            raise PipelineError(f"need ways >= 1, shots >= 0, queries >= 1 (got {ways}, "
                                f"{shots}, {queries})")
        if ways > len(self.relations):
            raise PipelineError(
                f"{ways}-way episodes need {ways} relations but the {self.what} has "
                f"{len(self.relations)}; lower the ways or use a split with more relations"
            )
        small = [(r, len(m)) for r, m in zip(self.relations, self.members, strict=True)
                 if len(m) < shots + queries]
        if small:
            r, n = small[0]
            raise PipelineError(
                f"K+Q={shots}+{queries} exceeds the {n} instances of relation {r} in the "
                f"{self.what}; lower shots/queries"
            )

    def sample(
        self, rng: np.random.Generator, ways: int, shots: int, queries: int, count: int
    ) -> Episodes:
        """Draw ``count`` episodes; relations and sentences without replacement per episode."""
        self.check(ways, shots, queries)
        n_rel = len(self.relations)
        rel = np.argsort(rng.random((count, n_rel)), axis=1)[:, :ways]  # (B, N)
        rows = np.empty((count, ways, shots + queries), dtype=np.int64)
        for b in range(count):
            for n in range(ways):
                members = self.members[rel[b, n]]
                rows[b, n] = members[rng.permutation(len(members))[: shots + queries]]
        return Episodes(rel, rows[:, :, :shots], rows[:, :, shots:])

    def sample_unequal(self, rng: np.random.Generator, shots: np.ndarray, queries: int
                       ) -> Episodes:
        """Episodes whose way n of episode b has ``shots[b, n]`` support sentences (at least
        one) and ``queries`` queries; relations and sentences as :meth:`sample` draws them.

        Shapes:
            shots: (B, N) -> support (B, N, max shots), cycled (see :class:`Episodes`)
        """
        shots = np.asarray(shots, dtype=np.int64)
        if shots.size and shots.min() < 1:
            raise PipelineError("unequal-shot episodes need at least one shot per way")
        count, ways = shots.shape
        top = int(shots.max()) if shots.size else 1
        drawn = self.sample(rng, ways, top, queries, count)
        return Episodes(drawn.relation, cycled(drawn.support, shots), drawn.query, shots)


def gather_episodes(encodings: torch.Tensor, episodes: Episodes) -> tuple[torch.Tensor, ...]:
    """Support, query and query labels of episodes from cached encodings.

    Shapes:
        encodings: (n, D) -> support (B, N, K, D), query (B, N*Q, D), labels (B, N*Q)
    """
    import torch

    dev = encodings.device
    support = encodings[torch.from_numpy(episodes.support).to(dev)]  # (B, N, K, D)
    b, n, q = episodes.query.shape
    query = encodings[torch.from_numpy(episodes.query.reshape(b, n * q)).to(dev)]  # (B, NQ, D)
    labels = torch.arange(n, device=dev).repeat_interleave(q).expand(b, -1)  # (B, NQ)
    return support, query, labels


def log_predictive_batches(
    head: torch.nn.Module,
    encodings: torch.Tensor,
    relation: np.ndarray,
    support: np.ndarray,
    query: np.ndarray,
    relation_rows: torch.Tensor,
    batch_size: int = 250,
    generator: torch.Generator | None = None,
    samples: bool = False,
    shots: np.ndarray | None = None,
) -> Iterator[torch.Tensor]:
    """The one episode loop: log-predictive of every query, ``batch_size`` episodes at a time
    (with ``samples``, the per-sample logits it averages instead).

    Batches are drawn in order with one generator, so every caller
    (:func:`episode_accuracy`, :func:`model.evaluation.scoring.score_episodes`) gives the
    same predictions for the same episodes and seed.

    Args:
        head: a REGRAB or baseline head in eval mode.
        encodings: sentence encodings; the row arrays index into them.
        relation: sampler relation index of every way.
        support: sentence rows of the support.
        query: sentence rows of the queries, all ways of an episode together.
        relation_rows: graph row of each sampler relation (-1 unknown; ignored without prior).
        batch_size: episodes per forward pass.
        generator: seeds the posterior samples of a head that samples at evaluation.
        samples: yield ``head.sample_logits`` (the log-predictive is
            :func:`model.methods.base.mc_log_predictive` of them, for every head).
        shots: each way's count when they differ (``support`` cycled as in
            :class:`Episodes`), scored as :func:`~model.posterior.shots.head_logits` says: a
            head with ``unequal_shots`` reads the counts, one with ``balanced_members``
            averages balanced subsamples, any other reads the cycled rows, i.e. the support
            oversampled to equal shots. None: every way has K.

    Shapes:
        encodings: (n, D), relation: (B, N), support: (B, N, K), query: (B, Q),
        shots: (B, N) or None
        -> one (B_batch, Q, N) tensor per batch ((B_batch, S, Q, N) with ``samples``)
    """
    import torch

    from model.posterior.shots import head_logits

    dev = encodings.device
    states = head.prior_states()
    counts = shots is not None and (getattr(head, "unequal_shots", False)
                                    or getattr(head, "balanced_members", 0) > 0)
    for start in range(0, len(relation), batch_size):
        stop = start + batch_size
        sup = encodings[torch.from_numpy(support[start:stop]).to(dev)]  # (B, N, K, D)
        qry = encodings[torch.from_numpy(query[start:stop]).to(dev)]  # (B, Q, D)
        rows = relation_rows.to(dev)[torch.from_numpy(relation[start:stop]).to(dev)]  # (B, N)
        h = head.prior_means(states, rows)
        k = torch.from_numpy(shots[start:stop]).to(dev) if counts else None
        if samples:
            yield head_logits(head, sup, qry, h, generator, k)
        elif k is not None and bool((k != sup.shape[2]).any()):
            yield head.log_predictive(sup, qry, h, generator, shots=k)
        else:
            yield head.log_predictive(sup, qry, h, generator)


def episode_accuracy(
    head: torch.nn.Module,
    encodings: torch.Tensor,
    episodes: Episodes,
    relation_rows: torch.Tensor,
    batch_size: int = 250,
    generator: torch.Generator | None = None,
) -> np.ndarray:
    """Accuracy of every episode, computed from cached encodings in batches.

    Args:
        head: a REGRAB or baseline head (in eval mode).
        encodings: sentence encodings of the split.
        episodes: from :meth:`EpisodeSampler.sample` on the same split.
        relation_rows: graph row of each sampler relation (-1 unknown; ignored without prior).
        batch_size: episodes per forward pass.
        generator: seeds the posterior samples of a head that samples at evaluation.

    Shapes:
        encodings: (n, D), relation_rows: (R_split,) -> (B,)
    """
    import torch

    b, n, q = episodes.query.shape
    labels = torch.arange(n, device=encodings.device).repeat_interleave(q)  # (N*Q,)
    with torch.no_grad():
        accs = [(log_p.argmax(-1) == labels).float().mean(1).cpu().numpy()  # (B_batch,)
                for log_p in log_predictive_batches(
                    head, encodings, episodes.relation, episodes.support,
                    episodes.query.reshape(b, n * q), relation_rows, batch_size, generator,
                    shots=episodes.shots)]
    return np.concatenate(accs)


def mean_ci95(acc: np.ndarray) -> tuple[float, float]:
    """Mean accuracy and the half-width of its normal 95% interval, both in percent."""
    acc = np.asarray(acc, dtype=np.float64)
    return float(acc.mean() * 100), float(normal_ci95(acc) * 100)
