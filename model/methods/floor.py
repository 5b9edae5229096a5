"""The untrained floor: frozen pre-trained encoder, entity-mean pooling, cosine prototypes.

A query is scored by the cosine between its encoding and each way's prototype, the prototype
being the mean of the way's unit support encodings. Cosine means both sides are unit length: the
mean of unit vectors is shorter than 1 (the more its shots disagree, the shorter), so it is
renormalised before the dot product; without that a way with scattered shots is penalised
for its spread rather than its direction.

Shapes:
    B episodes, N ways, K shots, Q queries, D encoding size (see :mod:`model`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch.nn import functional

from model.encoder.config import EncoderConfig
from model.encoder.sentence import SentenceEncoder
from model.methods.base import PrototypeHead
from model.posterior.shots import support_mean


class CosinePrototypeHead(PrototypeHead):
    """Prototype = mean of the unit support encodings; logits = cosine(query, prototype) / T."""

    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__("dot", temperature)

    def sample_logits(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        shots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Cosine logits of every query against the prototypes, as one "sample" (S = 1).

        Shapes:
            support: (B, N, K, D), query: (B, Q, D), shots: (B, N) or None -> (B, 1, Q, N)
        """
        unit = functional.normalize(support, dim=-1)  # (B, N, K, D)
        v = functional.normalize(support_mean(unit, shots), dim=-1)  # (B, N, D)
        x = functional.normalize(query, dim=-1)  # (B, Q, D)
        return super().sample_logits(v[:, :, None], x)


def floor_encoder(like: EncoderConfig, device: str | torch.device) -> SentenceEncoder:
    """The frozen pre-trained encoder with entity-mean pooling.

    It keeps the trained models' markers and split point so that it shares their cache of
    frozen-layer states (unless they cache top-layer keys/values instead).
    """
    cfg = dataclasses.replace(like, pooling="entity_mean", dropout=0.0, freeze_top_kv=False,
                              normalize=0.0, block_norm=False)
    return SentenceEncoder.from_config(cfg).to(device).eval()
