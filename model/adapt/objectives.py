"""What adapting the encoder to a domain changes, each on the weights a checkpoint stores.

A checkpoint stores the trained top layer of the encoder (its query, attention output and
feed-forward; :meth:`~model.encoder.sentence.SentenceEncoder.trainable_state`), so every
adaptation here changes those weights only and the adapted checkpoint keeps the file format,
the prior and the posterior:

* ``centre`` and ``whiten``: the encoding reads the top layer's output at the pooled tokens
  (the markers and the entity spans), which ends in a LayerNorm ``g * n + b``. Subtracting
  the domain's mean state from those outputs is a new bias ``b - mu``, and dividing by their
  standard deviation per dimension is a new gain ``g / sigma`` (:func:`fold_moments`): the
  domain's sentences then spread over every direction of the encoding instead of sharing one
  offset (anisotropy). No training.
* ``contrastive`` (SimCSE, Gao et al., 2021): two encodings of one sentence that differ by
  dropout in the top layer are pulled together and pushed from the other sentences of the
  batch (:func:`info_nce`), so the top layer learns what tells the domain's sentences apart.
* ``masked``: the same loss between a sentence and its copy with the entities' words masked
  (:func:`masked_copy`; "learning from context", Peng et al., 2020): a view that differs in
  more than dropout, which pulls the encoding towards the context that states the relation.
* ``pseudo``: the prior labels the sentences with the relations a team names, and the top
  layer learns the confident labels (:mod:`model.adapt.pseudo`).

Shapes (letters as in :mod:`model`):
    B sentences of a batch, H model hidden size, D sentence encoding.
"""

from __future__ import annotations

import torch
from torch import nn

from model.encoder.frozen_cache import LowerCache, encode_all
from model.encoder.sentence import SentenceEncoder
from model.encoder.tokens import TokenizedSet
from model.predict.sentences import Sentence

#: The adaptations :func:`model.adapt.run.adapt` knows, with what each does.
OBJECTIVES = {
    "centre": "subtract the domain's mean top-layer state at the pooled tokens (no training)",
    "whiten": "centre, and scale each dimension to unit spread on the domain (no training)",
    "contrastive": "SimCSE: dropout views of each sentence pulled together, the batch's other "
                   "sentences pushed away (trains the top layer)",
    "masked": "contrastive between each sentence and its copy with the entities' words masked, "
              "so the encoding learns the context between them (trains the top layer)",
    "pseudo": "self-training: the prior labels each sentence with one of the relations named "
              "in --relations, and the top layer learns the confident labels, balanced per "
              "relation (trains the top layer)",
}
#: The objectives that train the top layer (the others fold statistics into it).
TRAINED = ("contrastive", "masked", "pseudo")


def output_norm(encoder: SentenceEncoder) -> nn.LayerNorm:
    """The LayerNorm that ends the top layer, whose output the pooling reads."""
    return encoder.layers()[-1].output.LayerNorm


@torch.no_grad()
def pooled_moments(encoder: SentenceEncoder, tokens: TokenizedSet, cache: LowerCache | None,
                   batch_size: int = 64) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Mean and standard deviation of the top layer's output at the pooled tokens.

    Read off the top LayerNorm while every sentence is encoded once (eval mode), so they are
    moments of exactly the states the pooling reads (padding excluded).

    Returns:
        ``(mu, sigma, count)``: (H,), (H,) and the number of token states read.
    """
    norm = output_norm(encoder)
    total = torch.zeros(norm.weight.shape[0], dtype=torch.float64)
    square = torch.zeros_like(total)
    count = 0

    def read(_module, _inputs, out: torch.Tensor) -> None:
        nonlocal count
        flat = out.detach().reshape(-1, out.shape[-1]).double().cpu()  # (R, H)
        total.add_(flat.sum(0))
        square.add_((flat ** 2).sum(0))
        count += flat.shape[0]

    handle = norm.register_forward_hook(read)
    try:
        encode_all(encoder, tokens, cache, batch_size)
    finally:
        handle.remove()
    mu = total / max(count, 1)
    sigma = (square / max(count, 1) - mu ** 2).clamp(min=1e-12).sqrt()
    return mu.float(), sigma.float(), count


@torch.no_grad()
def fold_moments(encoder: SentenceEncoder, mu: torch.Tensor, sigma: torch.Tensor | None
                 ) -> None:
    """Fold ``(x - mu) / sigma`` into the top LayerNorm (``sigma`` None: ``x - mu`` only).

    ``g * n + b - mu`` is the centred output; ``(g * n + b - mu) / sigma`` the whitened one,
    a LayerNorm with gain ``g / sigma`` and bias ``(b - mu) / sigma``. ``sigma`` is rescaled
    to mean 1 first, so that the encoding keeps its length before the blocks are normalised.
    """
    norm = output_norm(encoder)
    norm.bias.sub_(mu.to(norm.bias))
    if sigma is not None:
        scale = (sigma / sigma.mean()).to(norm.weight)
        norm.weight.div_(scale)
        norm.bias.div_(scale)


def masked_copy(sentence: Sentence, mask: str) -> Sentence:
    """``sentence`` with every word of its two entities replaced by ``mask`` (spans kept)."""
    words = list(sentence.tokens)
    for start, end in (sentence.head, sentence.tail):
        words[start:end] = [mask] * (end - start)
    return Sentence(tuple(words), sentence.head, sentence.tail)


def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE between two views: row i of ``a`` and of ``b`` are one sentence.

    Shapes:
        a, b: (B, D) -> ()
    """
    a = nn.functional.normalize(a, dim=-1)
    b = nn.functional.normalize(b, dim=-1)
    logits = a @ b.T / temperature  # (B, B)
    target = torch.arange(a.shape[0], device=a.device)
    return 0.5 * (nn.functional.cross_entropy(logits, target)
                  + nn.functional.cross_entropy(logits.T, target))


def anchor_penalty(params: list[nn.Parameter], start: list[torch.Tensor]) -> torch.Tensor:
    """Squared distance of the trained weights from where they started (L2-SP), which keeps
    the encoding near the space the prior and the posterior were trained in."""
    return sum(((p - s) ** 2).sum() for p, s in zip(params, start, strict=True))
