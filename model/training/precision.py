"""How a training step runs on the hardware: precision, optimizer kernel, padding.

Three choices that change how fast a step runs, not what it computes (up to rounding):

* ``train.precision: bf16`` runs the encoder's forward and backward under bfloat16 autocast
  while the weights, their gradients and AdamW's moments stay float32 (the master copy). Only
  the encoder runs in bf16: its encodings are cast back to float32 before the prior, the
  posterior and the loss, whose Euclidean distances between encodings of norm 10 would lose
  their last digits in bf16's 8 bits of mantissa. bf16 has float32's exponent range, so no
  loss scaling is needed. ``fp32`` runs everything in float32, exactly as before.
* On CUDA AdamW runs as one fused kernel over all parameters (``fused=True``, the same update
  rule); on a CPU it stays the default implementation, so CPU runs are unchanged bit for bit.
* ``train.length_buckets: b`` encodes an episode's sentences in ``b`` batches of similar
  length (sorted, cut into ``b`` near-equal parts, each padded to its own longest) instead of
  one batch padded to the longest sentence of the episode; 1 is the one batch, as before.

Validation, the label prior's refresh and evaluation keep float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import numpy as np
import torch

from model.encoder.frozen_cache import LowerCache, encode_rows
from model.encoder.sentence import SentenceEncoder
from model.encoder.tokens import TokenizedSet

#: Values of ``train.precision``.
PRECISIONS = ("fp32", "bf16")


def autocast(device: torch.device | str, precision: str) -> contextlib.AbstractContextManager:
    """The encoder's autocast for ``precision`` on ``device`` (no-op for ``fp32``)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=torch.bfloat16)


def optimizer_options(params: Iterable[torch.Tensor]) -> dict[str, bool]:
    """Extra AdamW arguments: the fused kernel when every parameter is on CUDA, else none
    (the default implementation, so CPU results stay as they were)."""
    params = list(params)
    if params and all(p.is_cuda and p.is_floating_point() for p in params):
        return {"fused": True}
    return {}


def bucket_positions(tokens: TokenizedSet, rows: np.ndarray, buckets: int) -> list[np.ndarray]:
    """Positions in ``rows`` sorted by token count and cut into at most ``buckets``
    near-equal parts (a row listed twice is encoded twice, as in one batch)."""
    order = np.argsort([len(tokens.ids[i]) for i in rows], kind="stable")
    return [p for p in np.array_split(order, max(1, min(buckets, len(rows)))) if len(p)]


def encode_episode(encoder: SentenceEncoder, tokens: TokenizedSet, rows: np.ndarray,
                   cache: LowerCache | None, buckets: int, precision: str) -> torch.Tensor:
    """Encode one training episode's sentences with gradients, float32 out.

    With ``buckets`` 1 and ``fp32`` this is exactly one :func:`encode_rows` call over all
    rows, the step as it always was.

    Shapes:
        rows: (B,) -> (B, D), in the order of ``rows``
    """
    rows = np.asarray(rows, dtype=np.int64)
    with autocast(next(encoder.parameters()).device, precision):
        if buckets <= 1:
            return encode_rows(encoder, tokens, rows, cache, batch_size=len(rows)).float()
        parts = bucket_positions(tokens, rows, buckets)
        enc = torch.cat([encode_rows(encoder, tokens, rows[p], cache, batch_size=len(p))
                         for p in parts]).float()  # (B, D) in bucket order
    where = torch.from_numpy(np.argsort(np.concatenate(parts))).to(enc.device)  # (B,)
    return enc[where]


@contextlib.contextmanager
def encoder_precision(encoder: SentenceEncoder, precision: str) -> Iterator[None]:
    """Autocast for other encoder passes of a step (the label prior's label sentences);
    cast what they return with ``.float()``."""
    with autocast(next(encoder.parameters()).device, precision):
        yield
