"""Self-training on pseudo-labels: the prior names the domain's sentences, the top layer learns.

A REGRAB checkpoint classifies with no labelled sentence at all: its prior reads each
relation's name (and description) through the encoder into a prototype h_r
(:meth:`~model.prior.gcn.GraphPrior.add_names`), and the head's zero-shot rule scores a
sentence against those (K = 0 in :mod:`model.posterior.langevin`). The ``pseudo`` objective
lets that prior label the domain's unlabelled sentences with the relations a team names in a
relations file (:func:`pseudo_labels`), keeps the confident ones, balanced per relation
(:func:`select`), and trains the stored top layer with the cross-entropy of each kept
sentence's similarities to the prior means (:meth:`PseudoTarget.loss`, with the head's own
similarity and temperature), so the domain's sentences gather around the relation the prior
gave them. :func:`model.adapt.run.adapt` labels once more half-way, with the trained encoder
(names read again), when ``relabel`` is on.

Shapes (letters as in :mod:`model`):
    n sentences, M named relations, B sentences of a batch, D sentence encoding.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.encoder.frozen_cache import LowerCache, encode_all
from model.encoder.tokens import TokenizedSet
from model.methods.base import FewShotModel
from model.posterior.logits import similarity_logits
from model.prior.gcn import GraphPrior
from pipeline.errors import PipelineError

#: Relation id -> (name, description or None), as :func:`pipeline.fewrel.load_relation_texts`
#: reads a relations file.
RelationTexts = Mapping[str, tuple[str, str | None]]


def relations_digest(relations: RelationTexts) -> str:
    """sha256 of the relations' ids, names and descriptions (sorted by id): what the prior
    labelled the sentences with."""
    rows = [[k, *relations[k]] for k in sorted(relations)]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode("utf-8")).hexdigest()


def check_relations(model: FewShotModel, relations: RelationTexts | None) -> list[str]:
    """The relation ids to label with; refuses a model whose prior reads no names, or fewer
    than two relations."""
    prior = model.prior
    if not isinstance(prior, GraphPrior) or not prior.config.text:
        raise PipelineError(
            f"the pseudo objective needs a prior that reads relation names (a regrab "
            f"checkpoint trained with model.prior.text: true); this is a "
            f"{model.config.method} checkpoint without one; use another --objective")
    if not relations:
        raise PipelineError(
            "the pseudo objective labels your sentences with your relations' names: pass "
            "--relations FILE ({\"id\": [\"name\", \"description\"], ...}) with 2 or more")
    if len(relations) < 2:
        raise PipelineError(f"--relations names {len(relations)} relation; the pseudo "
                            "objective needs 2 or more to label your sentences with")
    return list(relations)


@torch.no_grad()
def prior_means(model: FewShotModel, relations: RelationTexts, cache: LowerCache | None,
                batch_size: int = 64) -> torch.Tensor:
    """h_r of every relation of ``relations``, read from its name by the current encoder, as
    evaluation and ``regrab-predict`` read them (the names are not saved with the model).

    Shapes:
        -> (M, D)
    """
    ids = check_relations(model, relations)
    model.prior.add_names({r: relations[r][0] for r in ids}, model.encoder, cache, batch_size,
                          descriptions={r: relations[r][1] for r in ids})
    return model.head.prior_means(None, model.rows(ids)[None])[0]


@torch.no_grad()
def zero_shot_probabilities(model: FewShotModel, x: torch.Tensor, means: torch.Tensor,
                            seed: int, chunk: int = 512) -> torch.Tensor:
    """The head's zero-shot predictive of every sentence over the M relations (no support:
    the prior alone), with its posterior samples drawn from a generator seeded by ``seed``.

    Shapes:
        x: (n, D), means: (M, D) -> (n, M)
    """
    gen = torch.Generator(device=x.device).manual_seed(seed)
    support = x.new_zeros(1, means.shape[0], 0, means.shape[1])  # (1, M, 0, D)
    out = [model.head.log_predictive(support, part[None], means[None], gen)[0]
           for part in x.split(chunk)]  # (chunk, M) each
    return torch.cat(out).exp()


def select(probs: np.ndarray, share: float) -> np.ndarray:
    """The sentences kept: each relation keeps at most ``ceil(share * n / M)`` of the
    sentences the prior gives it (its top probability), its most confident first.

    So at most about ``share`` of the sentences are kept, and no relation holds more than an
    equal part of them: a relation whose name draws most sentences (a vague name) cannot
    take the training over, and a relation given few keeps all of them.

    Shapes:
        probs: (n, M) -> (kept,) sorted sentence indices
    """
    n, m = probs.shape
    labels, confidence = probs.argmax(1), probs.max(1)
    cap = math.ceil(share * n / m)
    kept: list[np.ndarray] = []
    for r in range(m):
        mine = np.flatnonzero(labels == r)
        kept.append(mine[np.argsort(-confidence[mine], kind="stable")][:cap])
    return np.sort(np.concatenate(kept))


@dataclass(frozen=True)
class PseudoTarget:
    """One round of pseudo-labels: each sentence's relation (-1: not kept) and the prior
    means it is pulled towards, fixed for the round.

    Shapes:
        labels: (n,), means: (M, D)
    """

    labels: np.ndarray
    means: torch.Tensor
    similarity: str
    temperature: float

    @property
    def kept(self) -> np.ndarray:
        """Indices of the kept sentences."""
        return np.flatnonzero(self.labels >= 0)

    def loss(self, x: torch.Tensor, rows: np.ndarray) -> torch.Tensor:
        """Cross-entropy of the sentences ``rows`` (encoded as ``x``) against their
        pseudo-relations, over the similarities to every prior mean.

        Shapes:
            x: (B, D), rows: (B,) -> ()
        """
        target = torch.as_tensor(self.labels[rows], dtype=torch.long, device=x.device)
        logits = similarity_logits(x, self.means.to(x), self.similarity, self.temperature)
        return nn.functional.cross_entropy(logits, target)  # (B, M) logits


def pseudo_labels(model: FewShotModel, tokens: TokenizedSet, cache: LowerCache | None,
                  relations: RelationTexts, share: float, seed: int
                  ) -> tuple[PseudoTarget, dict[str, float]]:
    """Label every sentence of ``tokens`` with the prior (eval mode, current encoder), keep
    the confident ones (:func:`select`); returns the round's target and what it kept.

    Shapes:
        tokens: n sentences
    """
    model.eval()
    means = prior_means(model, relations, cache)  # (M, D)
    with torch.no_grad():
        x = encode_all(model.encoder, tokens, cache)  # (n, D)
        probs = zero_shot_probabilities(model, x, means, seed).cpu().numpy()  # (n, M)
    kept = select(probs, share)
    labels = np.full(len(probs), -1, dtype=np.int64)
    labels[kept] = probs[kept].argmax(1)
    counts = np.bincount(labels[kept], minlength=probs.shape[1])
    cfg = model.head.config
    stats = {"kept": int(len(kept)), "relations_kept": int((counts > 0).sum()),
             "most_per_relation": int(counts.max()),
             "confidence_kept": round(float(probs[kept].max(1).mean()), 4),
             "confidence_all": round(float(probs.max(1).mean()), 4)}
    return PseudoTarget(labels, means.detach(), cfg.similarity, cfg.temperature), stats
