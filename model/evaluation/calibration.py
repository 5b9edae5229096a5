"""Temperature scaling (Guo et al., 2017): the standard post-hoc calibration baseline.

One temperature ``tau`` per model and setting is fitted on episodes of the split's validation
relations by minimising the negative log-likelihood of the tempered predictive

    p_tau(y = n | x) = p(n | x)^(1/tau) / sum_m p(m | x)^(1/tau),

which for a softmax over logits ``z`` is ``softmax(z / tau)``; for REGRAB's predictive (a mean
of softmaxes over posterior samples) it tempers the mixture. The arg max, hence accuracy, is
unchanged; only the confidence moves. Evaluation reports the ECE after scaling next to the
raw ECE, so a method's calibration is compared with a tempered baseline and not only with an
untempered softmax.

Shapes:
    B episodes, Q queries, N ways.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from model.evaluation.scoring import OUTSIDE

#: Search range of log(tau): tau from 1/20 to 20.
LOG_TAU_RANGE = (-3.0, 3.0)


def tempered(log_p: torch.Tensor, tau: float) -> torch.Tensor:
    """The tempered log-predictive ``log p_tau``.

    Shapes:
        log_p: (..., N) -> (..., N)
    """
    return torch.log_softmax(log_p / tau, dim=-1)


def _nll(log_p: torch.Tensor, label: torch.Tensor, tau: float) -> float:
    out = tempered(log_p, tau).gather(-1, label[..., None])  # (M, 1)
    return float(-out.mean())


def fit_temperature(log_p: torch.Tensor, label: np.ndarray | torch.Tensor) -> float:
    """The ``tau`` that minimises the validation NLL (grid on log tau, then golden section).

    Queries labelled :data:`~model.evaluation.scoring.OUTSIDE` (none-of-the-above) are ignored. The
    NLL is convex in ``1/tau`` for a softmax, so the grid brackets the optimum and the
    golden-section search refines it to about 1e-4 in log tau.

    Shapes:
        log_p: (B, Q, N) log-predictive, label: (B, Q) -> float
    """
    label = torch.as_tensor(np.asarray(label), device=log_p.device)
    keep = label != OUTSIDE
    if not bool(keep.any()):
        raise ValueError("no labelled query to fit a temperature on")
    flat, lab = log_p[keep].double(), label[keep]  # (M, N), (M,)
    grid = np.linspace(*LOG_TAU_RANGE, 61)
    losses = [_nll(flat, lab, math.exp(t)) for t in grid]
    best = int(np.argmin(losses))
    lo, hi = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    ratio = (math.sqrt(5) - 1) / 2
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = _nll(flat, lab, math.exp(a)), _nll(flat, lab, math.exp(b))
    while hi - lo > 1e-4:
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = _nll(flat, lab, math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = _nll(flat, lab, math.exp(b))
    return math.exp((lo + hi) / 2)
