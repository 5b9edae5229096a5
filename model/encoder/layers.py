"""One transformer layer run on its own, for BERT's and MPNet's layouts.

The encoder runs its top layers apart from the model (:mod:`model.encoder.sentence` decides
which layers train; :mod:`model.encoder.frozen_cache` runs the frozen ones once and the top
ones on their output). Both need the same layer-level mechanics, which live here: which
layouts a layer can have (:func:`is_bert_layer`, :func:`takes_position_bias`), the pieces of
its attention (:func:`attention_projections`, :func:`attention_output`), the mask and MPNet's
relative position bias a layer takes when called alone (:func:`layer_mask`,
:func:`position_bias`), a whole layer (:func:`run_layer`), and a layer evaluated at a few
token positions only (:func:`layer_at`).

Shapes (letters as in :mod:`model`):
    B sentences of a batch, L tokens, P token positions read by the pooling, H model hidden
    size.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def is_bert_layer(layer: nn.Module) -> bool:
    """Whether ``layer`` is laid out as BERT's (``attention.self.{query,key,value}``, ...).

    Such a layer runs on its own as ``layer(hidden, mask)``; MPNet's layers also take the
    relative position bias their model computes (:func:`takes_position_bias`), and others
    need their whole model around them.
    """
    att = getattr(getattr(layer, "attention", None), "self", None)
    return all(hasattr(att, k) for k in ("query", "key", "value", "num_attention_heads")) and (
        hasattr(layer, "intermediate") and hasattr(layer, "output")
    )


def takes_position_bias(model: nn.Module) -> bool:
    """Whether ``model``'s layers run one by one given its relative position bias (MPNet).

    Such a model's ``encoder.compute_position_bias(hidden)`` gives the bias every layer adds
    to its attention scores, and a layer runs as ``layer(hidden, mask, position_bias=bias)``.
    """
    encoder = getattr(model, "encoder", None)
    return callable(getattr(encoder, "compute_position_bias", None))


def attention_projections(layer: nn.Module) -> tuple[nn.Module, nn.Linear, nn.Linear, nn.Linear]:
    """The self-attention module of a BERT or MPNet layer and its query, key and value."""
    if is_bert_layer(layer):
        att = layer.attention.self
        return att, att.query, att.key, att.value
    att = layer.attention.attn
    return att, att.q, att.k, att.v


def attention_output(layer: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``f(ctx, residual)``: the output projection, dropout, residual and norm that follow a BERT
    or MPNet layer's attention."""
    if is_bert_layer(layer):
        return layer.attention.output
    out = layer.attention

    def attend(ctx: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return out.LayerNorm(out.dropout(out.attn.o(ctx)) + residual)

    return attend


def layer_mask(model: nn.Module, hidden: torch.Tensor, attention_mask: torch.Tensor):
    """The attention mask in the form ``model``'s layers take when called one by one."""
    from transformers.masking_utils import create_bidirectional_mask

    return create_bidirectional_mask(
        config=model.config, inputs_embeds=hidden, attention_mask=attention_mask
    )


def position_bias(model: nn.Module, length: int, pos: torch.Tensor | None = None,
                  like: torch.Tensor | None = None) -> torch.Tensor | None:
    """MPNet's relative position bias for queries at ``pos`` (every token when None).

    None for BERT layers, which have no such bias. With ``pos`` None the model's own
    ``compute_position_bias`` runs on ``like`` (the layer input), so the bias is the model's
    exactly.

    Shapes:
        pos: (B, P) -> (B, heads, P, L); like: (B, L, H) -> (B, heads, L, L)
    """
    if not takes_position_bias(model) or is_bert_layer(model.encoder.layer[-1]):
        return None
    encoder = model.encoder
    if pos is None:
        return encoder.compute_position_bias(like)
    keys = torch.arange(length, device=pos.device)
    bucket = encoder.relative_position_bucket(keys[None, None, :] - pos[..., None])  # (B, P, L)
    return encoder.relative_attention_bias(bucket).permute(0, 3, 1, 2)  # (B, heads, P, L)


def run_layer(layer: nn.Module, hidden: torch.Tensor, mask, bias: torch.Tensor | None):
    """One whole layer, BERT's (``bias`` None) or MPNet's (with its position bias).

    Shapes:
        hidden: (B, L, H) -> (B, L, H)
    """
    if bias is None:
        return layer(hidden, mask)
    return layer(hidden, mask, position_bias=bias)[0]


def layer_at(
    layer: nn.Module,
    hidden: torch.Tensor | None,
    key_mask: torch.Tensor,
    pos: torch.Tensor | None,
    picked: torch.Tensor | None = None,
    kv: tuple[torch.Tensor, torch.Tensor] | None = None,
    used: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """One BERT or MPNet layer evaluated only at token positions ``pos`` (all tokens as keys).

    The same computation as ``layer(hidden, mask)[:, pos]`` written out with the layer's own
    modules, so that only P queries run. ``picked`` (the layer input at ``pos``) and ``kv``
    (key and value projections of the whole input) may be given precomputed instead of
    ``hidden``. With ``used`` (how many of each row's P positions are real, the rest padding)
    the output projection and feed-forward, most of the layer's work, run on the real
    positions only, and padded positions come out as zeros: rows pad to the longest entity
    pair, about 1.7x the mean on NYT-25. An MPNet layer takes ``bias``, its relative position
    bias for the queries at ``pos`` (see :func:`position_bias`).

    Shapes:
        hidden: (B, L, H), key_mask: (B, L), pos: (B, P), used: (B,),
        bias: (B, heads, P, L) -> (B, P, H)
    """
    att, query, key, value = attention_projections(layer)
    heads, size = att.num_attention_heads, att.attention_head_size
    if picked is None:
        picked = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, P, H)
    if kv is None:
        kv = (key(hidden), value(hidden))
    b, length = kv[0].shape[:2]
    q = query(picked).view(b, -1, heads, size).transpose(1, 2)  # (B, heads, P, size)
    k = kv[0].view(b, length, heads, size).transpose(1, 2)  # (B, heads, L, size)
    v = kv[1].view(b, length, heads, size).transpose(1, 2)  # (B, heads, L, size)
    mask = key_mask[:, None, None, :].bool()  # (B, 1, 1, L)
    if bias is not None:  # added to the scores, as MPNet's own attention does
        mask = bias.to(q.dtype).masked_fill(~mask, float("-inf"))  # (B, heads, P, L)
    ctx = nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=att.dropout.p if layer.training else 0.0
    )
    ctx = ctx.transpose(1, 2).reshape(b, -1, heads * size)  # (B, P, H)

    attend = attention_output(layer)
    if used is None:
        attended = attend(ctx, picked)
        return layer.output(layer.intermediate(attended), attended)  # (B, P, H)
    real = torch.arange(ctx.shape[1], device=ctx.device)[None, :] < used[:, None]  # (B, P)
    attended = attend(ctx[real], picked[real])  # (R, H), R real positions
    out = ctx.new_zeros(ctx.shape)
    out[real] = layer.output(layer.intermediate(attended), attended)
    return out  # (B, P, H)
