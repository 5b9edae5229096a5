"""The prior's held-out weights (``model.prior.mix: heldout``), chosen on validation relations.

Outside training a prior with ``mix: heldout`` is

    h_r = c + w_graph (GCN(G)_r - c) + w_label g (e_r - mean_r' e_r'),

c the graph term's mean over the graph (:class:`~model.prior.gcn.GraphPrior`). g and the GCN
are fitted on the training relations; :func:`fit_mix` picks the two weights for relations the
model did not train on, at every validation, as ``scales: heldout`` fits lambda there.

Shapes:
    n validation sentences, R_val validation relations, D encoding size.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

#: The graph term's weights (its deviation from its mean) that :func:`fit_mix` tries.
MIX_GRAPH = (0.0, 0.25, 0.5, 0.75, 1.0)
#: The label term's weights (times the learned gain g) that :func:`fit_mix` tries.
MIX_LABEL = (0.25, 0.5, 0.75, 1.0, 1.25)


@torch.no_grad()
def fit_mix(prior: nn.Module, groups: list[torch.Tensor], rows: torch.Tensor,
            temperature: float) -> tuple[float, float] | None:
    """Choose ``prior``'s held-out weights on validation relations, set and return them
    (None, and nothing set, unless its config has ``mix: heldout``).

    The weights (graph, label) are taken from :data:`MIX_GRAPH` x :data:`MIX_LABEL` by the
    mean log-probability of every validation sentence under the prior means alone, scored
    against all validation relations as ``softmax(-|x - h_r|^2 / (2 T))``: the zero-shot rule
    on relations the model did not train on. (1, 1), h_r as trained, is on the grid, so the
    choice never reads worse on them; (0, 1) is the label encoding alone.

    Args:
        prior: a :class:`~model.prior.gcn.GraphPrior` (its ``mix`` buffer is set).
        groups: the encodings of each validation relation's sentences.
        rows: each validation relation's graph row (-1: none).
        temperature: T of the zero-shot rule.

    Shapes:
        groups: one (n_r, D) tensor per relation, rows: (R_val,)
    """
    if prior.config.mix != "heldout":
        return None
    was = prior.training
    prior.eval()
    x = torch.cat(groups)  # (n, D)
    label = torch.cat([torch.full((len(g),), i, device=x.device) for i, g in enumerate(groups)])
    best: tuple[float, tuple[float, float]] | None = None
    for weights in itertools.product(MIX_GRAPH, MIX_LABEL):
        prior.mix.copy_(torch.tensor(weights))
        h = prior(rows)  # (R_val, D)
        logp = torch.log_softmax(-torch.cdist(x, h.to(x.dtype)) ** 2 / (2 * temperature), -1)
        score = float(logp[torch.arange(len(x), device=x.device), label].mean())
        if best is None or score > best[0]:
            best = (score, weights)
    prior.mix.copy_(torch.tensor(best[1]))
    prior.train(was)
    return best[1]
