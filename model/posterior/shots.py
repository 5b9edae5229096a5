"""Ways with unequal shots: a padded support with per-way counts, and fair scores of it.

An episode whose ways have unequal shots is a support padded to the largest count K plus each
way's count (B, N). :func:`head_logits` scores it in one call: a head with ``unequal_shots``
takes the counts, one with ``balanced_members`` an average over balanced subsamples
(:mod:`model.posterior.subsample`), any other each way's sentences repeated up to K
(:func:`oversample`).
The helpers read only a way's real shots (:func:`support_mean`, :func:`support_sum`,
:func:`shot_mask`, :func:`shot_counts`); :func:`scored_prototypes` is how the prototype
baselines keep a way with more shots from drawing the queries (docs/model.md#unequal-shots).
The heads of :mod:`model.methods` and the callers that score episodes import it.

Shapes:
    B episodes, N ways, K shots (the largest), Q queries, D encoding size.
"""

from __future__ import annotations

import numpy as np
import torch

from model.posterior.logits import similarity_logits
from model.posterior.subsample import subsample_logits
from pipeline.errors import PipelineError


def unequal(support: torch.Tensor, shots: torch.Tensor | None) -> bool:
    """Whether ``shots`` says that some way has fewer than the padded K shots.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None
    """
    return shots is not None and bool((shots != support.shape[2]).any())


def shot_mask(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor | None:
    """1 for a way's real shots, 0 for its padding (None when every way has K).

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> (B, N, K, 1) or None
    """
    if not unequal(support, shots):
        return None
    k = torch.arange(support.shape[2], device=support.device)
    return (k < shots[..., None].to(support.device)).to(support.dtype)[..., None]


def shot_counts(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor | int:
    """K, or each way's own count as a float tensor when they differ.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> int or (B, N, 1)
    """
    if not unequal(support, shots):
        return support.shape[2]
    return shots.to(device=support.device, dtype=support.dtype)[..., None]


def support_sum(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor:
    """Sum of each way's real shots (padding left out).

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> (B, N, D)
    """
    mask = shot_mask(support, shots)
    return support.sum(2) if mask is None else (support * mask).sum(2)


def support_mean(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor:
    """Mean of each way's real shots; exactly ``support.mean(2)`` when every way has K.

    Shapes:
        support: (B, N, K, D) with every way's count >= 1, shots: (B, N) or None -> (B, N, D)
    """
    if not unequal(support, shots):
        return support.mean(2)
    return support_sum(support, shots) / shot_counts(support, shots)


def require_every_way(shots: torch.Tensor) -> None:
    """Refuse a way without sentences in an episode for a head built for equal shots."""
    if bool((shots < 1).any()):
        raise PipelineError("this method needs K >= 1 support sentences for every way when "
                            "the ways have unequal shots; give every relation a sentence")


def oversample(support: torch.Tensor, shots: torch.Tensor) -> torch.Tensor:
    """Every way's shots repeated in order up to K (slot j holds shot ``j mod k_r``): random
    oversampling to equal shots (Ochal et al., 2023) made deterministic, what a user of a
    method built for equal shots does.

    Shapes:
        support: (B, N, K, D), shots: (B, N) with every count >= 1 -> (B, N, K, D)
    """
    require_every_way(shots)
    k = torch.arange(support.shape[2], device=support.device)
    slot = k % shots[..., None].to(support.device)  # (B, N, K)
    return support.gather(2, slot[..., None].expand_as(support))


def head_logits(head: torch.nn.Module, support: torch.Tensor, query: torch.Tensor,
                h: torch.Tensor | None, generator: torch.Generator | None = None,
                shots: torch.Tensor | None = None) -> torch.Tensor:
    """``head.sample_logits`` of an episode batch whose ways may have unequal shots.

    ``support`` is padded to the largest count K and ``shots`` holds each way's count. When
    every way has K (or ``shots`` is None) the head is called exactly as for a balanced
    episode; otherwise a head with ``unequal_shots`` gets the counts, a head with
    ``balanced_members`` M > 0 the average of M balanced subsamples
    (:func:`~model.posterior.subsample.subsample_logits`), and any other head
    the support oversampled to K shots per way (:func:`oversample`).

    Shapes:
        support: (B, N, K, D), query: (B, Q, D), h: (B, N, D) or None, shots: (B, N) or None
        -> (B, S, Q, N)
    """
    if not unequal(support, shots):
        return head.sample_logits(support, query, h, generator)
    if getattr(head, "unequal_shots", False):
        return head.sample_logits(support, query, h, generator, shots=shots)
    members = getattr(head, "balanced_members", 0)
    if members > 0:
        require_every_way(shots)
        return subsample_logits(head, support, query, h, generator, shots, members)
    return head.sample_logits(oversample(support, shots), query, h, generator)


def normalised(v: torch.Tensor, support: torch.Tensor, shots: torch.Tensor | None
               ) -> torch.Tensor:
    """Prototypes rescaled to the mean length of their way's support encodings.

    A mean of k encodings is shorter than they are (by the spread it averages away, more so
    for larger k), so with Euclidean or dot logits it lies closer to every query and a way
    with more shots draws predictions; at the encodings' own length only its direction
    counts (normalised, cosine-like prototypes).

    Shapes:
        v: (B, N, D), support: (B, N, K, D), shots: (B, N) or None -> (B, N, D)
    """
    length = support_mean(torch.linalg.vector_norm(support, dim=-1, keepdim=True), shots)
    return v * (length / torch.linalg.vector_norm(v, dim=-1, keepdim=True).clamp(min=1e-12))


def pooled_scatter(support: torch.Tensor, shots: torch.Tensor | None) -> torch.Tensor:
    """``tr Sigma``, the expected squared distance of an encoding from its relation's mean,
    estimated from the episode's own support: every way's scatter around its mean, pooled
    over the ways (``sum |x - m_r|^2 / sum (k_r - 1)``); 0 when no way has two shots.

    Shapes:
        support: (B, N, K, D), shots: (B, N) or None -> (B, 1, 1)
    """
    mask = shot_mask(support, shots)
    resid = (support - support_mean(support, shots)[:, :, None]).pow(2).sum(-1, keepdim=True)
    if mask is not None:
        resid = resid * mask
    k = shot_counts(support, shots)
    dof = ((k - 1) * torch.ones(support.shape[:2] + (1,), dtype=support.dtype,
                                device=support.device)).clamp(min=0).sum((1, 2))  # (B,)
    total = resid.sum((1, 2, 3))
    return torch.where(dof > 0, total / dof.clamp(min=1), torch.zeros_like(total)).view(-1, 1, 1)


#: How a prototype baseline scores ways with unequal shots (``model.langevin.prototype_scoring``).
PROTOTYPE_SCORINGS = ("mean", "normalised", "unbiased")


def scored_prototypes(query: torch.Tensor, v: torch.Tensor, support: torch.Tensor,
                      shots: torch.Tensor | None, spread: torch.Tensor | float, scoring: str,
                      similarity: str, temperature: float,
                      extra: torch.Tensor | None = None) -> torch.Tensor:
    """``sim(q, v) / T`` of prototypes ``v`` built from ``support``, as ``scoring`` says.

    ``mean``: as they are. ``normalised``: each at the mean length of its way's encodings
    (:func:`normalised`). ``unbiased`` (Euclidean): the squared distance less the part its
    prototype's own sampling noise adds, ``E |q - v_r|^2 = |q - mu_r|^2 + tr Sigma * spread_r``
    (spread 1/k_r for a support mean), with ``tr Sigma`` pooled over the episode's ways
    (:func:`pooled_scatter`), so a way with more shots is no closer to every query. It moves a
    query's logits by the same amount when every way has the same shots, so balanced episodes
    score exactly as ``mean``; with dot similarity the dot product is unbiased already.
    ``extra`` is any further expected squared distance a way's prototype adds (a prior
    mean's own error, for ``proto_label``), subtracted likewise.

    Shapes:
        query: (B, Q, D), v: (B, N, D), support: (B, N, K, D), shots: (B, N) or None,
        spread: (B, N, 1) or a number, extra: (B, N, 1) or None -> (B, Q, N)
    """
    if scoring == "normalised":
        v = normalised(v, support, shots)
    logits = similarity_logits(query, v, similarity, temperature)
    if scoring == "unbiased" and similarity == "euclidean":
        bias = pooled_scatter(support, shots) * spread  # (B, N, 1)
        if extra is not None:
            bias = bias + extra
        logits = logits + 0.5 * bias.transpose(1, 2) / temperature
    return logits


def padded_support(enc: torch.Tensor, shots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """One padded episode from the sentences of each way, way after way: each way's
    sentences repeated in order up to the largest count (a way without any: zeros, masked
    out by its count of 0), and the counts.

    Shapes:
        enc: (sum shots, D) -> support (1, N, K, D), counts (1, N)
    """
    offsets = np.concatenate([[0], np.cumsum(shots)])
    top = max(shots)
    sup = enc.new_zeros(1, len(shots), top, enc.shape[-1])  # (1, N, K, D)
    for n, k in enumerate(shots):
        if k:
            row = [int(offsets[n]) + j % k for j in range(top)]
            sup[0, n] = enc[torch.tensor(row, dtype=torch.long, device=enc.device)]
    return sup, torch.tensor([shots], dtype=torch.long, device=enc.device)
