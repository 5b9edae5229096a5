"""Temperature scaling: the fitted temperature is the one the labels were drawn with."""

import numpy as np
import pytest
import torch

from model.evaluation.calibration import fit_temperature, tempered
from model.evaluation.scoring import OUTSIDE


@pytest.mark.parametrize("true_tau", [0.5, 1.0, 3.0])
def test_fit_recovers_the_temperature_labels_were_drawn_with(true_tau):
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(400, 25, 5, generator=g, dtype=torch.float64)  # (B, Q, N)
    probs = torch.softmax(logits / true_tau, -1)
    label = torch.multinomial(probs.reshape(-1, 5), 1, generator=g).reshape(400, 25)
    tau = fit_temperature(torch.log_softmax(logits, -1), label.numpy())
    assert tau == pytest.approx(true_tau, rel=0.08)


def test_tempering_keeps_the_arg_max_and_ignores_outside_queries():
    g = torch.Generator().manual_seed(1)
    log_p = torch.log_softmax(torch.randn(20, 6, 4, generator=g), -1)
    label = np.zeros((20, 6), dtype=np.int64)
    label[:, 3:] = OUTSIDE
    tau = fit_temperature(log_p, label)
    assert torch.equal(tempered(log_p, tau).argmax(-1), log_p.argmax(-1))
    # Only the first three queries count: the same fit from those alone.
    assert tau == pytest.approx(fit_temperature(log_p[:, :3], label[:, :3]))
    with pytest.raises(ValueError, match="no labelled query"):
        fit_temperature(log_p, np.full((20, 6), OUTSIDE))
