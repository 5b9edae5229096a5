"""A mislabelled support sentence: the noisy episodes, and each support sentence's suspicion.

:func:`plant_wrong` turns the episodes of a setting into the same episodes with one support
sentence of one way (seeded) replaced by a sentence of another way of the episode, one the
episode does not already hold; it records which. The queries stay, so the accuracy on the
noisy episodes is paired with the clean ones.

:func:`support_suspicion` scores how unlikely each support sentence's label is given the
rest of the support (:mod:`model.posterior.suspicion`): a head with a ``gaussian``
posterior (REGRAB, and its ablation without the graph prior) by the leave-one-out posterior
predictive with its prior means, lambda (per episode with ``prior_trust: evidence`` or
``checked``: the evidence rule) and sigma^2; every other head by the leave-one-out prototype
of its encodings, the point estimate a prototype method has. :func:`suspicion_batches` runs
it over episodes and :func:`detection_of_wrong` scores it as a detector of the planted
sentence.

Shapes:
    B episodes, N ways, K shots, Q queries per way, D encoding size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from model.episodes import Episodes, EpisodeSampler
from model.evaluation.uncertainty import detection
from model.posterior.langevin import LangevinSampler
from model.posterior.suspicion import episode_precision, gaussian_suspicion, prototype_suspicion
from pipeline.errors import PipelineError

#: Suffix of a noisy setting's name: ``5w5s_noisy``.
SUFFIX = "_noisy"


def noisy_name(setting: str) -> str:
    return f"{setting}{SUFFIX}"


@dataclass(frozen=True)
class NoisyEpisodes:
    """Episodes with one mislabelled support sentence each (the fields of
    :class:`~model.episodes.Episodes`, plus where the planted sentence is and came from)."""

    relation: np.ndarray  # (B, N)
    support: np.ndarray  # (B, N, K) sentence rows, one of them planted
    query: np.ndarray  # (B, N, Q), as in the clean episodes
    wrong: np.ndarray  # (B, N, K) bool, True at the planted sentence
    source: np.ndarray  # (B,) the way whose relation the planted sentence has


def plant_wrong(sampler: EpisodeSampler, episodes: Episodes, rng: np.random.Generator
                ) -> NoisyEpisodes:
    """``episodes`` with one support sentence per episode replaced by a sentence of another
    of its ways that the episode does not hold (way, slot, source way and sentence drawn
    from ``rng``)."""
    b, n, k = episodes.support.shape
    if n < 2 or k < 1:
        raise PipelineError(f"a mislabelled support sentence needs 2 or more ways and 1 or "
                            f"more shots, not {n} ways and {k} shots")
    support = episodes.support.copy()
    wrong = np.zeros(support.shape, dtype=bool)
    source = np.zeros(b, dtype=np.int64)
    for e in range(b):
        way, slot = int(rng.integers(n)), int(rng.integers(k))
        other = (way + 1 + int(rng.integers(n - 1))) % n
        held = np.concatenate([episodes.support[e].ravel(), episodes.query[e].ravel()])
        pool = np.setdiff1d(sampler.members[episodes.relation[e, other]], held)
        if len(pool) == 0:
            raise PipelineError(
                f"relation {sampler.relations[episodes.relation[e, other]]} has no sentence "
                "left outside its episode to plant as a mislabelled one; give it more "
                "sentences or fewer shots and queries")
        support[e, way, slot] = pool[int(rng.integers(len(pool)))]
        wrong[e, way, slot] = True
        source[e] = other
    return NoisyEpisodes(episodes.relation, support, episodes.query, wrong, source)


def gaussian_sampler(head: Any) -> LangevinSampler | None:
    """The head's sampler when its posterior is the closed-form ``gaussian`` one with a proper
    prior; else None."""
    sampler = getattr(head, "sampler", None)
    if (isinstance(sampler, LangevinSampler) and sampler.config.likelihood == "gaussian"
            and sampler.config.prior_precision > 0):
        return sampler
    return None


def support_suspicion(head: Any, support: torch.Tensor, h: torch.Tensor | None,
                      counts: torch.Tensor | None = None) -> torch.Tensor:
    """Suspicion of every support sentence (module doc), larger: more likely mislabelled.

    Shapes:
        support: (B, N, K, D), h: (B, N, D) or None, counts: (B, N) or None -> (B, N, K)
    """
    sampler = gaussian_sampler(head)
    if sampler is None or h is None:
        return prototype_suspicion(support, counts)
    lam, var = sampler.precision, sampler.variance
    if sampler.config.prior_trust in ("evidence", "checked"):
        lam = episode_precision(support, counts, h, lam, var)
    return gaussian_suspicion(support, h, lam, var, counts)


@torch.no_grad()
def suspicion_batches(head: Any, encodings: torch.Tensor, relation: np.ndarray,
                      support: np.ndarray, relation_rows: torch.Tensor,
                      batch_size: int = 250) -> np.ndarray:
    """:func:`support_suspicion` of every support sentence of the episodes, ``batch_size``
    episodes at a time.

    Shapes:
        encodings: (n, D), relation: (B, N), support: (B, N, K), relation_rows: (R,)
        -> (B, N, K)
    """
    dev = encodings.device
    states = head.prior_states()
    parts = []
    for start in range(0, len(relation), batch_size):
        stop = start + batch_size
        sup = encodings[torch.from_numpy(support[start:stop]).to(dev)]  # (B, N, K, D)
        rows = relation_rows.to(dev)[torch.from_numpy(relation[start:stop]).to(dev)]
        h = head.prior_means(states, rows)
        parts.append(support_suspicion(head, sup, h).float().cpu().numpy())
    return np.concatenate(parts) if parts else np.zeros(support.shape, dtype=np.float32)


def detection_of_wrong(suspicion: np.ndarray, wrong: np.ndarray) -> dict[str, float]:
    """AUROC, AUPR and FPR at 95% TPR (percent) of the suspicion as a detector of the planted
    sentences among all support sentences (NaN scores, a way's only sentence for a point
    estimate, are left out)."""
    s, w = np.asarray(suspicion, dtype=np.float64).ravel(), np.asarray(wrong).ravel()
    keep = ~np.isnan(s)
    return detection(s[keep], w[keep])
