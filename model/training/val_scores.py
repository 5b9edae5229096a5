"""What ``regrab-predict`` abstains by: a trained model's uncertainty on its validation relations.

When a model has finished training, :func:`measure` scores its best weights on seeded
episodes of the split's validation relations (never its test relations), from encodings
computed once. For each of :data:`SETTINGS` (ways capped by the validation relations),
:data:`EPISODES` episodes give the temperature that fits their in-set queries
(:func:`~model.evaluation.calibration.fit_temperature`) and the quantiles at 0, 0.01, ..., 1
of every uncertainty score (:func:`~model.evaluation.uncertainty.uncertainty_scores`) on
them. The setting's default abstain score is the one with the highest AUROC
(:func:`~model.evaluation.uncertainty.detection`) for telling outside queries from in-set
ones on as many none-of-the-above episodes (:func:`~model.evaluation.nota.sample_nota`,
:data:`OUTSIDE_RATE` of the queries from validation relations outside the ways, the ways cut
so that at least one relation is left outside). With fewer than three validation relations
none is left outside, and the default is :data:`FALLBACK`; the record says why.

Its generators are its own, seeded from the run's validation seed, and the global torch
generator is put back after: the training's RNG streams, weights and metrics are those of a
run without it.

Shapes:
    B episodes, S posterior samples, N ways, K shots, Q queries of an episode (all ways).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from model.encoder.frozen_cache import encode_all
from model.episodes import EpisodeSampler, Setting, log_predictive_batches
from model.evaluation.calibration import fit_temperature
from model.evaluation.nota import sample_nota
from model.evaluation.scoring import OUTSIDE
from model.evaluation.uncertainty import SCORES, detection, mc_log_probs, uncertainty_scores
from model.files.checkpoint import Checkpoint
from model.files.score_quantiles import LEVELS, ScoreQuantiles
from model.methods.base import FewShotModel
from model.training.state import Run
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

#: Settings whose score distributions a checkpoint keeps (ways capped by the validation
#: relations); ``regrab-predict`` uses the one closest to the user's support.
SETTINGS = (Setting(5, 1), Setting(5, 5))
#: Episodes per setting, for the in-set quantiles and again for the outside-query AUROC.
EPISODES = 200
#: Share of the queries of an AUROC episode that come from outside its ways.
OUTSIDE_RATE = 0.5
#: The default abstain score when no validation relation is left for outside queries.
FALLBACK = "max_prob"


def _sample_logits(model: FewShotModel, enc: torch.Tensor, relation: np.ndarray,
                   support: np.ndarray, query: np.ndarray, rows: torch.Tensor,
                   generator: torch.Generator, batch: int) -> torch.Tensor:
    """Per-sample logits of every query of the episodes.

    Shapes:
        relation: (B, N), support: (B, N, K), query: (B, Q) -> (B, S, Q, N)
    """
    return torch.cat([x.double() for x in log_predictive_batches(
        model.head, enc, relation, support, query, rows, batch, generator, samples=True)])


def _quantiles(values: torch.Tensor) -> tuple[float, ...]:
    """Quantiles at :data:`LEVELS`, rounded to 9 significant digits (stays non-decreasing)."""
    q = np.quantile(values.cpu().numpy().ravel(), LEVELS)
    return tuple(float(f"{x:.9g}") for x in np.maximum.accumulate(q))


@torch.no_grad()
def setting_scores(model: FewShotModel, enc: torch.Tensor, sampler: EpisodeSampler,
                   rows: torch.Tensor, setting: Setting, queries: int, seed: int,
                   batch: int = 250) -> ScoreQuantiles | None:
    """One setting's record (None when the validation split cannot supply its episodes).

    Args:
        model: the trained model, in eval mode.
        enc: encodings of the validation sentences the sampler's rows index.
        sampler: the validation relations' sentences.
        rows: graph row of each sampler relation (-1 unknown; ignored without a prior).
        setting: N and K (N capped by the relations).
        queries: queries per way, fewer when a relation has too few sentences.
        seed: seeds the episodes and the posterior samples.
        batch: episodes per forward pass.

    Shapes:
        enc: (n, D), rows: (R_val,)
    """
    n_rel = len(sampler.relations)
    ways, shots = min(setting.ways, n_rel), setting.shots
    q = min(queries, min(len(m) for m in sampler.members) - shots)
    if ways < 2 or q < 1:
        return None
    gen = torch.Generator(device=enc.device).manual_seed(seed)
    eps = sampler.sample(np.random.default_rng([seed, 0]), ways, shots, q, EPISODES)
    label = np.tile(np.repeat(np.arange(ways), q), (EPISODES, 1))  # (B, Q)
    logits = _sample_logits(model, enc, eps.relation, eps.support,
                            eps.query.reshape(EPISODES, ways * q), rows, gen, batch)
    log_p = mc_log_probs(logits)  # (B, Q, N)
    tau = fit_temperature(log_p, label)
    scores = uncertainty_scores(logits, tau, log_p)
    quantiles = {k: _quantiles(v) for k, v in scores.items()}
    default, auroc, reason = FALLBACK, {}, ""
    out_ways = min(setting.ways, n_rel - 1)
    if out_ways < 2:
        reason = (f"{FALLBACK}: the {n_rel} validation relations leave none outside a "
                  f"{ways}-way episode to draw outside queries from")
    else:
        try:
            base = sampler.sample(np.random.default_rng([seed, 1]), out_ways, shots, q,
                                  EPISODES)
            nota = sample_nota(sampler, np.random.default_rng([seed, 2]), base, OUTSIDE_RATE)
        except PipelineError as exc:  # a relation with too few sentences for outside queries
            reason = f"{FALLBACK}: no outside-query episodes could be drawn ({exc})"
        else:
            out_logits = _sample_logits(model, enc, nota.relation, nota.support, nota.query,
                                        rows, gen, batch)
            outside = nota.label == OUTSIDE
            found = uncertainty_scores(out_logits, tau)
            auroc = {k: round(detection(v.cpu().numpy(), outside)["auroc"], 6)
                     for k, v in found.items() if k in quantiles}
            default = max((k for k in SCORES if k in auroc), key=lambda k: auroc[k])
            reason = (f"{default}: the highest AUROC ({auroc[default]:.1f}%) for outside "
                      f"queries on {EPISODES} {out_ways}-way {shots}-shot validation episodes "
                      f"with {OUTSIDE_RATE:.0%} of the queries from other validation relations")
    return ScoreQuantiles(ways, shots, EPISODES * ways * q, float(f"{tau:.9g}"), quantiles,
                          default, auroc, reason)


@contextmanager
def on_validation(run: Run, best: Checkpoint
                  ) -> Iterator[tuple[FewShotModel, torch.Tensor, torch.Tensor]]:
    """The best model in eval mode, the encodings of the validation sentences and the graph
    rows of the validation relations, with the global torch generator put back after.

    ``run.model`` gets the best weights (what was saved, WiSE-FT mix and fitted scales
    included); training is over, so nothing reads the last step's weights after this.
    """
    model = run.model
    with torch.random.fork_rng(devices=[]):
        model.load_state_dict({**model.state_dict(), **best.state}, strict=True)
        model.eval()
        enc = encode_all(model.encoder, run.val_tok, run.cache, run.sched.encode_batch)
        yield model, enc, model.rows(run.val_s.relations).to(enc.device)


@torch.no_grad()
def measure(run: Run, best: Checkpoint) -> tuple[ScoreQuantiles, ...] | None:
    """Every setting's record for the best model of a finished run (None when the validation
    split supplies no setting; the best weights are put in ``run.model``, :func:`on_validation`).
    """
    start = time.perf_counter()
    with on_validation(run, best) as (model, enc, rows):
        found = [setting_scores(model, enc, run.val_s, rows, s, run.sched.queries,
                                run.val_seed + 1000 + i)
                 for i, s in enumerate(SETTINGS)]
    kept = tuple(dict((s.name, s) for s in found if s is not None).values())
    log.info("%s: uncertainty on the validation relations (%s) in %.1f s", run.name,
             ", ".join(f"{s.name} default {s.default}" for s in kept) or "none",
             time.perf_counter() - start)
    return kept or None
