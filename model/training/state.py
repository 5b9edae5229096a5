"""The trainer's bookkeeping: the resume point, and whether a finished model can be reused.

Both compare the run's fingerprint (:func:`model.training.config.fingerprint`) with the one
saved in the file, so a changed setting that does not change the model (threads, which
methods or splits to train) neither restarts a run nor retrains a finished model.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from model.files.checkpoint import read_payload, save_model, save_payload
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.training.loop import Run

log = logging.getLogger(__name__)


def resume(run: Run, state_path: Path, params: dict[str, Any]) -> bool:
    """Continue from ``state.safetensors`` when it was written with the same fingerprint.

    An unreadable, foreign or hostile file is never used: one warning, and training starts
    over.
    """
    if not state_path.exists():
        return False
    try:
        state = read_payload(state_path)
    except PipelineError as exc:
        log.warning("%s: %s; starting over", run.name, exc)
        return False
    if state.get("params") != params:
        log.warning("%s: state.safetensors was made with other params or data; starting over",
                    run.name)
        return False
    run.model.load_state_dict({**run.model.state_dict(), **state["state"]}, strict=True)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.rng.bit_generator.state = state["rng_numpy"]
    torch.set_rng_state(state["rng_torch"])
    run.noise.set_state(state["rng_noise"])
    run.step, run.best, run.history = state["step"], state["best"], state["history"]
    log.info("%s: resumed at step %d", run.name, run.step)
    return True


def save_state(run: Run, path: Path, params: dict[str, Any]) -> None:
    """The resume point: weights plus optimizer, scheduler and every RNG state."""
    save_model(path, run.model, {
        "params": params, "step": run.step, "best": run.best, "history": run.history,
        "optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(),
        "rng_numpy": run.rng.bit_generator.state, "rng_torch": torch.get_rng_state(),
        "rng_noise": run.noise.get_state(),
    })


def finish(best_path: Path, summary: dict[str, Any], history: list[dict[str, Any]]) -> None:
    """Mark the best model as done: a rerun with the same params and inputs reuses it."""
    payload = read_payload(best_path)
    payload.update({"done": True, "summary": summary, "history": history})
    save_payload(best_path, payload)


def finished_summary(best_path: Path, state_path: Path,
                     params: dict[str, Any]) -> dict[str, Any] | None:
    """The summary of a finished model trained with ``params``, else None."""
    if not best_path.exists() or state_path.exists():
        return None
    try:
        payload = read_payload(best_path)
    except PipelineError:  # another version's model: train it again
        return None
    if payload.get("done") and payload.get("params") == params:
        return payload["summary"]
    return None
