"""The trainer's bookkeeping: the run record, the resume point, reusing a finished model.

Resuming and reusing compare the run's fingerprint (:func:`model.training.config.fingerprint`)
with the one saved in the file, so a changed setting that does not change the model
(threads, which methods or splits to train) neither restarts a run nor retrains a finished
model.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.config import upgrade
from model.encoder.frozen_cache import LowerCache
from model.encoder.tokens import TokenizedSet
from model.episodes import EpisodeSampler
from model.files.checkpoint import Checkpoint, ResumePoint, read_checkpoint, save_checkpoint
from model.files.score_quantiles import ScoreQuantiles
from model.files.suspicion_cutoff import SuspicionCutoff
from model.methods.base import FewShotModel
from model.prior.labels import LabelText
from model.training.config import TrainConfig
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


@dataclass
class Run:
    """Everything one training run carries from step to step."""

    model: FewShotModel
    method: str
    name: str
    sched: TrainConfig
    train_tok: TokenizedSet
    val_tok: TokenizedSet
    train_s: EpisodeSampler
    val_s: EpisodeSampler
    ways: list[int]
    train_rows: torch.Tensor
    cache: LowerCache | None
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    rng: np.random.Generator
    noise: torch.Generator
    val_seed: int
    step: int = 0
    best: float = -1.0
    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    labels: LabelText | None = None
    pretrained: dict[str, torch.Tensor] | None = None  # trainable encoder weights at the start


def same_params(saved: dict[str, Any] | None, params: dict[str, Any]) -> bool:
    """Whether a file saved with the fingerprint ``saved`` was made with ``params``.

    The saved model config is read as today's code reads it (:func:`model.config.upgrade`):
    keys added since are filled with the values its model was built with, so a model from
    before a new key (``model.heads``, say) is reused while the key keeps that value.
    """
    if isinstance(saved, dict) and isinstance(saved.get("model"), dict):
        saved = {**saved, "model": upgrade(saved["model"])}
    return saved == params


def resume(run: Run, state_path: Path, params: dict[str, Any]) -> bool:
    """Continue from ``state.safetensors`` when it was written with the same fingerprint.

    An unreadable, foreign or hostile file is never used: one warning, and training starts
    over.
    """
    if not state_path.exists():
        return False
    try:
        state = read_checkpoint(state_path)
    except PipelineError as exc:
        log.warning("%s: %s; starting over", run.name, exc)
        return False
    if not same_params(state.params, params):
        log.warning("%s: state.safetensors was made with other params or data; starting over",
                    run.name)
        return False
    point = state.resume
    if point is None or state.step is None or state.history is None:
        log.warning("%s: state.safetensors holds no resume point; starting over", run.name)
        return False
    run.model.load_state_dict({**run.model.state_dict(), **state.state}, strict=True)
    run.optimizer.load_state_dict(point.optimizer)
    run.scheduler.load_state_dict(point.scheduler)
    run.rng.bit_generator.state = point.rng_numpy
    torch.set_rng_state(point.rng_torch)
    run.noise.set_state(point.rng_noise)
    run.step, run.best, run.history = state.step, point.best, state.history
    log.info("%s: resumed at step %d", run.name, run.step)
    return True


def save_state(run: Run, path: Path, params: dict[str, Any]) -> None:
    """The resume point: weights plus optimizer, scheduler and every RNG state."""
    point = ResumePoint(
        best=run.best, optimizer=run.optimizer.state_dict(),
        scheduler=run.scheduler.state_dict(), rng_numpy=run.rng.bit_generator.state,
        rng_torch=torch.get_rng_state(), rng_noise=run.noise.get_state())
    save_checkpoint(path, Checkpoint.of(run.model, params=params, step=run.step,
                                        history=run.history, resume=point))


def finish(best_path: Path, summary: dict[str, Any], history: list[dict[str, Any]],
           val_scores: tuple[ScoreQuantiles, ...] | None = None,
           support_noise: SuspicionCutoff | None = None) -> None:
    """Mark the best model as done (a rerun with the same params and inputs reuses it), with
    its uncertainty on the validation relations (:mod:`model.training.val_scores`) and its
    suspicion cutoff (:mod:`model.training.val_noise`)."""
    best = read_checkpoint(best_path)
    save_checkpoint(best_path, dataclasses.replace(best, done=True, summary=summary,
                                                   history=history, val_scores=val_scores,
                                                   support_noise=support_noise))


def finished_summary(best_path: Path, state_path: Path,
                     params: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of a finished model trained with ``params``, else None."""
    if not best_path.exists() or state_path.exists():
        return None
    try:
        best = read_checkpoint(best_path)
    except PipelineError:  # another version's model: train it again
        return None
    if best.done and same_params(best.params, params):
        return best.summary
    return None
