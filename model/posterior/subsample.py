"""Balanced subsamples: a head built for equal shots, scored on ways with unequal shots.

maml, versa and bmaml fit each episode's classifier to its support (inner gradient steps, an
amortised posterior, SVGD particles), all starting from each way's support mean. Oversampling
a way's sentences up to the largest count gives every way as many examples, but a mean of k
distinct encodings still lies closer to every query (``E|q - m_r|^2 = |q - mu_r|^2 +
tr Sigma / k``) and the copies of one sentence do not widen its way, so the way with the most
distinct sentences draws the queries (docs/model.md#unequal-shots). The other textbook fix for
class imbalance is undersampling: every way cut to the smallest way's count c, which is
balanced but throws sentences away. An ensemble of undersampled fits keeps them all.

:func:`subsample_logits` scores ``members`` balanced episodes cut from one support and returns
their samples side by side, so the Monte Carlo predictive averages the members' probabilities.
Member m takes, of way r's k_r sentences, the c sentences ``(m c + j) mod k_r`` (j < c): the
subsets are drawn in turn rather than at random, so scores repeat without a generator and,
with ``members`` at the largest count, every sentence of every way is used. Episodes whose
ways have equal shots never come here (:func:`model.posterior.shots.head_logits`).

Shapes:
    B episodes, M members, S samples of the head, N ways, K shots (the largest), c the
    smallest way's count, Q queries, D encoding size.
"""

from __future__ import annotations

import math

import torch


def member_slots(shots: torch.Tensor, members: int, count: int) -> torch.Tensor:
    """Which padded slot each member takes, per way: ``(m c + j) mod k_r``.

    Shapes:
        shots: (B, N) with every count >= ``count`` -> (B, M, N, c), M = ``members``,
        c = ``count``
    """
    turn = torch.arange(members, device=shots.device)[:, None] * count \
        + torch.arange(count, device=shots.device)  # (M, c)
    return turn[None, :, None, :] % shots[:, None, :, None]


def balanced_members(support: torch.Tensor, shots: torch.Tensor, members: int,
                     count: int) -> torch.Tensor:
    """The ``members`` balanced supports of ``count`` shots per way (:func:`member_slots`).

    Shapes:
        support: (B, N, K, D) padded, shots: (B, N) -> (B, M, N, c, D)
    """
    b, n, k, d = support.shape
    slot = member_slots(shots.to(support.device), members, count)  # (B, M, N, c)
    full = support[:, None].expand(b, members, n, k, d)
    return full.gather(3, slot[..., None].expand(b, members, n, count, d))


def subsample_logits(head: torch.nn.Module, support: torch.Tensor, query: torch.Tensor,
                     h: torch.Tensor | None, generator: torch.Generator | None,
                     shots: torch.Tensor, members: int) -> torch.Tensor:
    """``head.sample_logits`` of ``members`` balanced subsamples of each episode, each way cut
    to the episode's smallest count; the members' samples side by side. A head that samples
    (``draws()``, S) draws ``ceil(S / M)`` per member, so the ensemble costs about what one
    fit does; a deterministic head (maml) gives one sample per member.

    Episodes are grouped by their smallest count, so each group is one batch of equal-shot
    episodes for the head.

    Shapes:
        support: (B, N, K, D) padded, query: (B, Q, D), h: (B, N, D) or None, shots: (B, N)
        with every count >= 1 -> (B, M S', Q, N), S' = ceil(S / M) or 1
    """
    shots = shots.to(support.device)
    # A head that samples (versa, bmaml) spreads its S samples over the members.
    share = {"draws": math.ceil(head.draws() / members)} if hasattr(head, "draws") else {}
    smallest = shots.min(1).values  # (B,)
    out: torch.Tensor | None = None
    for count in smallest.unique().tolist():
        idx = torch.nonzero(smallest == count).squeeze(1)  # (b,)
        b = len(idx)
        sub = balanced_members(support[idx], shots[idx], members, count)  # (b, M, N, c, D)
        qry = query[idx, None].expand(b, members, *query.shape[1:])  # (b, M, Q, D)
        way_h = None if h is None else h[idx, None].expand(b, members, *h.shape[1:])
        logits = head.sample_logits(sub.flatten(0, 1), qry.flatten(0, 1),
                                    None if way_h is None else way_h.flatten(0, 1),
                                    generator, **share)  # (b M, S', Q, N)
        logits = logits.reshape(b, -1, *logits.shape[2:])  # (b, M S', Q, N)
        if out is None:
            out = logits.new_empty((support.shape[0], *logits.shape[1:]))
        out[idx] = logits
    return out
