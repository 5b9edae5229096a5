"""What one episode's Langevin chain costs on this machine, measured.

:func:`chain_seconds` times a chain of the configured kind on an episode of the given shape
and extrapolates to ``steps``: the ``gaussian`` chain's recurrence (which stops at its fixed
point, :func:`~model.posterior.langevin.chain_coefficients`) or one step of the softmax
likelihoods' SGLD (gradient and update). The params check and ``regrab-predict`` use it to
refuse a ``model.langevin.steps`` that would run for years, naming what it would cost.

Shapes:
    S samples, N ways, K shots, D encoding size.
"""

from __future__ import annotations

import dataclasses

import torch

from model.posterior.config import LangevinConfig
from model.posterior.langevin import chain_coefficients
from model.posterior.target import langevin_step, log_posterior_grad
from pipeline.budget import seconds_per_call

#: Steps of the ``gaussian`` recurrence timed before extrapolating (milliseconds).
PROBE_STEPS = 10_000
#: Encoding size of the timed episode (MiniLM's two 384-wide marker states).
DIM = 768


def chain_seconds(cfg: LangevinConfig, ways: int, shots: int, dim: int = DIM) -> float:
    """Seconds one episode's chain of ``cfg.steps`` steps takes here (its sampler only)."""
    if cfg.steps == 0:
        return 0.0
    if cfg.likelihood == "gaussian":
        probe = dataclasses.replace(cfg, steps=min(cfg.steps, PROBE_STEPS))
        _, _, ran = chain_coefficients(probe)
        if ran < probe.steps:  # a fixed point: the rest of the chain costs nothing
            return seconds_per_call(lambda: chain_coefficients(probe), repeat=1)
        return seconds_per_call(lambda: chain_coefficients(probe), repeat=1) * (
            cfg.steps / probe.steps)
    samples = max(cfg.samples, cfg.eval_samples)
    v = torch.zeros(1, samples, ways, dim)  # (1, S, N, D)
    support = torch.zeros(1, ways, max(shots, 1), dim)  # (1, N, K, D)
    h = torch.zeros(1, ways, dim)  # (1, N, D)

    def step() -> None:
        grad = log_posterior_grad(v, support, h, temperature=cfg.temperature,
                                  similarity=cfg.similarity, likelihood=cfg.likelihood,
                                  precision=cfg.prior_precision,
                                  variance=cfg.likelihood_variance)
        langevin_step(v, grad, cfg.step_size, 1.0, None)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the time of the work, not of threads contending on a busy machine
    try:
        with torch.no_grad():
            return seconds_per_call(step) * cfg.steps
    finally:
        torch.set_num_threads(threads)
