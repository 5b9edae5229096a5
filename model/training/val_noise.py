"""What ``regrab-predict`` flags a support sentence by: the suspicion cutoff of a trained model,
chosen on its validation relations.

When a model has finished training, :func:`measure` draws :data:`EPISODES` seeded
:data:`SETTING` episodes of the split's validation relations (never its test relations; ways
capped by them), plants one mislabelled support sentence in each
(:func:`~model.evaluation.support_noise.plant_wrong`) and scores every support sentence's
suspicion (:func:`~model.evaluation.support_noise.support_suspicion`). The cutoff is the one
that flags the planted sentences best, by F1 (one sentence in N K is wrong, so F1 weighs a
flagged clean sentence as heavily as a missed wrong one); the record keeps the AUROC and the
shares flagged of the wrong and of the clean sentences at that cutoff.

Its generators are its own, seeded from the run's validation seed, and the global torch
generator is put back after: the training's RNG streams, weights and metrics are those of a
run without it.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from model.episodes import EpisodeSampler, Setting
from model.evaluation.support_noise import detection_of_wrong, plant_wrong, suspicion_batches
from model.files.checkpoint import Checkpoint
from model.files.suspicion_cutoff import SuspicionCutoff
from model.methods.base import FewShotModel
from model.training.state import Run
from model.training.val_scores import on_validation
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

#: The validation setting the cutoff is chosen on (ways capped by the validation relations).
SETTING = Setting(5, 5)
#: Validation episodes, one planted sentence each.
EPISODES = 200


def best_f1_cutoff(score: np.ndarray, wrong: np.ndarray) -> float:
    """The cutoff that maximises F1 of flagging ``score > cutoff`` for the ``wrong`` ones:
    the midpoint between the lowest flagged score and the next one below it (ties: the
    highest cutoff, flagging the fewest)."""
    s = np.asarray(score, dtype=np.float64).ravel()
    w = np.asarray(wrong, dtype=bool).ravel()
    order = np.argsort(-s, kind="stable")
    s, w = s[order], w[order]
    last = np.concatenate([np.flatnonzero(np.diff(s) != 0), [len(s) - 1]])  # end of each value
    tp = np.cumsum(w)[last]
    flagged = last + 1
    f1 = 2 * tp / (flagged + w.sum())
    i = int(np.argmax(f1))
    below = s[last[i] + 1] if last[i] + 1 < len(s) else s[last[i]] - 1.0
    return float((s[last[i]] + below) / 2)


@torch.no_grad()
def setting_cutoff(model: FewShotModel, enc: torch.Tensor, sampler: EpisodeSampler,
                   rows: torch.Tensor, seed: int, batch: int = 250
                   ) -> SuspicionCutoff | None:
    """The record (None when the validation split cannot supply the episodes).

    Shapes:
        enc: (n, D) encodings of the sentences the sampler's rows index, rows: (R_val,)
    """
    ways, shots = min(SETTING.ways, len(sampler.relations)), SETTING.shots
    if ways < 2:
        return None
    try:  # one query per way: the queries are not scored, the sentence to plant is left
        clean = sampler.sample(np.random.default_rng([seed, 0]), ways, shots, 1, EPISODES)
        noisy = plant_wrong(sampler, clean, np.random.default_rng([seed, 1]))
    except PipelineError:  # too few sentences in a relation
        return None
    found = suspicion_batches(model.head, enc, noisy.relation, noisy.support, rows, batch)
    keep = ~np.isnan(found)
    score, wrong = found[keep], noisy.wrong[keep]
    cutoff = float(f"{best_f1_cutoff(score, wrong):.9g}")
    flagged = score > cutoff
    auroc = detection_of_wrong(score, wrong)["auroc"]
    hit, false = 100 * flagged[wrong].mean(), 100 * flagged[~wrong].mean()
    reason = (f"the highest F1 for the planted sentence on {EPISODES} {ways}-way {shots}-shot "
              "validation episodes with one support sentence replaced by one of another way "
              f"(flags {hit:.1f}% of them and {false:.1f}% of the others; AUROC {auroc:.1f}%)")
    return SuspicionCutoff(ways, shots, EPISODES, cutoff, round(float(auroc), 6),
                           round(float(hit), 6), round(float(false), 6), reason)


@torch.no_grad()
def measure(run: Run, best: Checkpoint) -> SuspicionCutoff | None:
    """The cutoff of the best model of a finished run (None when the validation split cannot
    supply its episodes).

    ``run.model`` gets the best weights (:func:`model.training.val_scores.on_validation`).
    """
    start = time.perf_counter()
    with on_validation(run, best) as (model, enc, rows):
        found = setting_cutoff(model, enc, run.val_s, rows, run.val_seed + 2000)
    log.info("%s: support suspicion cutoff on the validation relations: %s in %.1f s",
             run.name, "none" if found is None else f"{found.cutoff:.4g} ({found.reason})",
             time.perf_counter() - start)
    return found
