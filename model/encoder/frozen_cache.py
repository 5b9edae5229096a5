"""CPU caching of the encoder's frozen part: what makes end-to-end training fit two cores.

With ``train_layers: t >= 0`` the embeddings and the lower layers of a
:class:`~model.encoder.sentence.SentenceEncoder`
never change and run in eval mode, so their output for
a sentence is a constant. :class:`LowerCache` computes it once per sentence (:func:`lower`)
and shares it between splits and methods; a training step then runs only the top ``t``
layers on the cached states (:func:`upper`).

Two further savings, both exact up to float rounding:

* pooling reads the last layer only at a few tokens (the two markers, the entity spans'
  tokens; :func:`pool_positions`), so the last layer runs its queries, attention output and
  feed-forward on those tokens alone (:func:`~model.encoder.layers.layer_at`; keys and values
  still see the whole sentence) and :func:`pool_at` pools them;
* with ``freeze_top_kv`` the top layer's key and value projections are frozen as well, so the
  cache keeps its keys|values and its inputs at those tokens instead of the hidden states
  (:func:`top_kv`), and a step runs :func:`upper_kv` on them.

:func:`encode_rows` and :func:`encode_all` run the encoder's plain forward when all of it
trains, and :func:`lower` then :func:`upper` otherwise, through the cache when one is given.
How one layer runs on its own (BERT's or MPNet's) is :mod:`model.encoder.layers`.

Shapes (letters as in :mod:`model`):
    B sentences of a batch, L tokens, H model hidden size, D sentence encoding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from model.encoder.layers import (
    attention_projections,
    is_bert_layer,
    layer_at,
    layer_mask,
    position_bias,
    run_layer,
    takes_position_bias,
)
from model.encoder.sentence import SentenceEncoder
from model.encoder.tokens import TokenizedSet


@dataclass(frozen=True, slots=True)
class FrozenStates:
    """One sentence's output of the frozen part (one :class:`LowerCache` entry).

    Attributes:
        hidden: (L_i, H) states after the frozen layers; with ``kv`` set, only the top layer's
            inputs at the P_i tokens pooling reads, (P_i, H), since keys and values cover the
            rest.
        kv: with ``freeze_top_kv``, the top layer's keys|values over the sentence, (L_i, 2 H).
    """

    hidden: torch.Tensor
    kv: torch.Tensor | None = None


def _span_lengths(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Token counts of the head and tail spans: 2 x (B,)."""
    return (batch["head"][:, 2] - batch["head"][:, 1],
            batch["tail"][:, 2] - batch["tail"][:, 1])


def _reads_markers(encoder: SentenceEncoder) -> bool:
    return encoder.config.pooling in ("markers", "markers_mean")


def _reads_spans(encoder: SentenceEncoder) -> bool:
    return encoder.config.pooling in ("entity_mean", "markers_mean")


def pool_positions(encoder: SentenceEncoder, batch: dict) -> torch.Tensor:
    """The token positions the pooling reads, laid out as :func:`pool_at` expects.

    ``[E1]`` and ``[E2]`` first when the pooling reads markers, then the head span's tokens,
    then the tail span's; rows are right-padded with position 0.

    Shapes:
        batch["head"]: (B, 3) -> (B, P)
    """
    head, tail = batch["head"], batch["tail"]
    cols = []
    if _reads_markers(encoder):
        cols.append(torch.stack([head[:, 0], tail[:, 0]], dim=1))  # (B, 2)
    if _reads_spans(encoder):
        nh, nt = _span_lengths(batch)
        j = torch.arange(max(int((nh + nt).max()), 1), device=head.device)[None, :]  # (1, W)
        pos = torch.where(j < nh[:, None], head[:, 1:2] + j, tail[:, 1:2] + j - nh[:, None])
        cols.append(torch.where(j < (nh + nt)[:, None], pos, 0))  # (B, W)
    return torch.cat(cols, dim=1)  # (B, P)


def positions_used(encoder: SentenceEncoder, batch: dict) -> torch.Tensor:
    """How many of each row's :func:`pool_positions` are real (not padding): (B,)."""
    n = torch.zeros(batch["head"].shape[0], dtype=torch.long, device=batch["head"].device)
    if _reads_markers(encoder):
        n = n + 2
    if _reads_spans(encoder):
        nh, nt = _span_lengths(batch)
        n = n + nh + nt
    return n


def pool_at(encoder: SentenceEncoder, out: torch.Tensor, batch: dict) -> torch.Tensor:
    """The encoding from the last layer's states at :func:`pool_positions`.

    The same as :meth:`SentenceEncoder.pool` on the whole sentence.

    Shapes:
        out: (B, P, H) -> (B, D)
    """
    parts, m = [], 0
    if _reads_markers(encoder):
        parts += [out[:, 0], out[:, 1]]  # 2 x (B, H)
        m = 2
    if _reads_spans(encoder):
        nh, nt = _span_lengths(batch)
        j = torch.arange(out.shape[1] - m, device=out.device)[None, :]  # (1, W)
        for lo, n in ((torch.zeros_like(nh), nh), (nh, nt)):
            inside = (j >= lo[:, None]) & (j < (lo + n)[:, None])  # (B, W)
            w = inside.to(out.dtype) / inside.sum(1, keepdim=True).clamp(min=1)
            parts.append(torch.einsum("bw,bwh->bh", w, out[:, m:]))  # (B, H)
    return encoder.finish(torch.cat(parts, dim=-1))  # (B, D)


@torch.no_grad()
def lower(encoder: SentenceEncoder, batch: dict) -> torch.Tensor:
    """Hidden states after the frozen part (embeddings + lower layers), no gradient.

    Shapes:
        batch["input_ids"]: (B, L) -> (B, L, H)
    """
    layers = encoder.layers()
    if not (is_bert_layer(layers[0]) or takes_position_bias(encoder.model)):
        # Layers that need their model around them only freeze all together
        # (SentenceEncoder allows train_layers 0 or -1 for them): the model's output.
        out = encoder.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return out.last_hidden_state  # (B, L, H)
    hidden = encoder.model.embeddings(input_ids=batch["input_ids"])  # (B, L, H)
    mask = layer_mask(encoder.model, hidden, batch["attention_mask"])
    bias = position_bias(encoder.model, hidden.shape[1], like=hidden)
    for layer in layers[: encoder.split]:
        hidden = run_layer(layer, hidden, mask, bias)
    return hidden  # (B, L, H)


def upper(encoder: SentenceEncoder, hidden: torch.Tensor, batch: dict) -> torch.Tensor:
    """Trained top layers and pooling on cached lower states.

    Shapes:
        hidden: (B, L, H) -> (B, D)
    """
    layers = encoder.layers()[encoder.split :]
    if len(layers) == 0:
        return encoder.pool(hidden, batch)
    mask = layer_mask(encoder.model, hidden, batch["attention_mask"])
    if len(layers) > 1:
        bias = position_bias(encoder.model, hidden.shape[1], like=hidden)
        for layer in layers[:-1]:
            hidden = run_layer(layer, hidden, mask, bias)
    pos = pool_positions(encoder, batch)
    out = layer_at(layers[-1], hidden, batch["attention_mask"], pos,
                   used=positions_used(encoder, batch),
                   bias=position_bias(encoder.model, hidden.shape[1], pos))
    return pool_at(encoder, out, batch)  # (B, D)


@torch.no_grad()
def top_kv(encoder: SentenceEncoder, hidden: torch.Tensor, batch: dict) -> FrozenStates:
    """Frozen keys|values of the top layer and its inputs at the pooled tokens (cacheable).

    Shapes:
        hidden: (B, L, H) -> FrozenStates(hidden (B, P, H), kv (B, L, 2H))
    """
    _, _, key, value = attention_projections(encoder.layers()[-1])
    pos = pool_positions(encoder, batch)  # (B, P)
    picked = hidden.gather(1, pos[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, P, H)
    kv = torch.cat([key(hidden), value(hidden)], dim=-1)  # (B, L, 2H)
    return FrozenStates(hidden=picked, kv=kv)


def upper_kv(encoder: SentenceEncoder, picked: torch.Tensor, kv: torch.Tensor,
             batch: dict) -> torch.Tensor:
    """Top layer at the two markers from cached keys/values (``freeze_top_kv``).

    Shapes:
        picked: (B, P, H), kv: (B, L, 2H) -> (B, D)
    """
    k, v = kv.chunk(2, dim=-1)  # 2 x (B, L, H)
    bias = position_bias(encoder.model, kv.shape[1], pool_positions(encoder, batch))
    out = layer_at(encoder.layers()[-1], None, batch["attention_mask"], None,
                   picked=picked, kv=(k, v), used=positions_used(encoder, batch),
                   bias=bias)  # (B, P, H)
    return pool_at(encoder, out, batch)  # (B, D)


def pad_hidden(states: list[torch.Tensor]) -> torch.Tensor:
    """Right-pad per-sentence states to one batch.

    Shapes:
        states: B x (L_i, X) -> (B, max L_i, X)
    """
    return nn.utils.rnn.pad_sequence(states, batch_first=True)


class LowerCache:
    """Outputs of the frozen part per sentence, computed once and shared between models.

    The key is the frozen part's identity (model, markers, split point, kv caching and, with
    kv caching, the pooling) plus the sentence's token ids and entity spans, so the same
    sentence in several splits (or methods) is encoded once, and a sentence id reused for
    another text can never hit a stale entry.
    """

    def __init__(self) -> None:
        self._states: dict[tuple, FrozenStates] = {}

    @staticmethod
    def frozen_key(encoder: SentenceEncoder) -> tuple:
        """What, besides the sentence, decides the frozen part's outputs (see the class)."""
        c = encoder.config
        pooling = c.pooling if encoder.kv_cached else None  # which tokens are kept
        return (c.name, c.markers, c.marker_init, encoder.split, encoder.kv_cached, pooling)

    @staticmethod
    def _key(fk: tuple, tokens: TokenizedSet, i: int) -> tuple:
        return (fk, tokens.ids[i].tobytes(), tokens.head[i].tobytes(), tokens.tail[i].tobytes())

    def __len__(self) -> int:
        return len(self._states)

    def copy(self) -> LowerCache:
        """A cache holding the same entries (shared, not copied); what it adds stays its own."""
        other = LowerCache()
        other._states = dict(self._states)
        return other

    def states(
        self,
        encoder: SentenceEncoder,
        tokens: TokenizedSet,
        rows: np.ndarray,
        batch_size: int = 64,
        progress: bool = False,
    ) -> list[FrozenStates]:
        """Frozen-part outputs of ``rows`` (computing the missing ones, shortest first).

        Shapes:
            rows: (B,) -> B entries (see :class:`FrozenStates`)
        """
        fk = self.frozen_key(encoder)
        keys = [self._key(fk, tokens, i) for i in rows]
        todo = sorted({i for i, k in zip(rows, keys, strict=True) if k not in self._states},
                      key=lambda i: len(tokens.ids[i]))
        starts = range(0, len(todo), batch_size)
        if progress and todo:
            from tqdm import tqdm

            starts = tqdm(starts, desc="frozen layers", unit="batch", leave=False)
        device = next(encoder.parameters()).device
        for s in starts:
            part = np.asarray(todo[s : s + batch_size])
            batch = tokens.batch(part, device=device)
            hidden = lower(encoder, batch)  # (B, L, H)
            if encoder.kv_cached:
                top = top_kv(encoder, hidden, batch)
                picked, kv = top.hidden.cpu(), top.kv.cpu()  # (B, P, H), (B, L, 2H)
                used = positions_used(encoder, batch).cpu()  # (B,)
            else:
                hidden = hidden.cpu()
            for j, i in enumerate(part):
                n = len(tokens.ids[i])
                key = self._key(fk, tokens, i)
                if encoder.kv_cached:
                    self._states[key] = FrozenStates(picked[j, : used[j]].clone(),
                                                     kv[j, :n].clone())
                else:
                    self._states[key] = FrozenStates(hidden[j, :n].clone())
        return [self._states[k] for k in keys]


def encode_rows(
    encoder: SentenceEncoder,
    tokens: TokenizedSet,
    rows: np.ndarray,
    cache: LowerCache | None,
    batch_size: int = 64,
) -> torch.Tensor:
    """Encode sentences ``rows``, through the cache when the encoder has a frozen part.

    Gradients flow when called with grad enabled. Each batch is padded to its own longest
    sentence only.

    Shapes:
        rows: (B,) -> (B, D)
    """
    device = next(encoder.parameters()).device
    rows = np.asarray(rows, dtype=np.int64)
    out = []
    for s in range(0, len(rows), batch_size):
        part = rows[s : s + batch_size]
        batch = tokens.batch(part, device=device)
        if encoder.config.train_layers < 0:
            out.append(encoder(batch))
            continue
        if cache is None or encoder.split == 0:  # frozen embeddings only: nothing worth caching
            out.append(upper(encoder, lower(encoder, batch), batch))
            continue
        states = cache.states(encoder, tokens, part)
        hidden = [st.hidden for st in states]
        if encoder.kv_cached:
            picked = pad_hidden(hidden).to(device)  # (B, P, H)
            kv = pad_hidden([st.kv for st in states]).to(device)  # (B, L, 2H)
            out.append(upper_kv(encoder, picked, kv, batch))
        else:
            out.append(upper(encoder, pad_hidden(hidden).to(device), batch))  # (B, L, H) in
    return torch.cat(out)  # (B, D)


#: Batches between two updates of :func:`encode_all`'s progress bar.
PROGRESS_BATCHES = 16


@torch.no_grad()
def encode_all(
    encoder: SentenceEncoder,
    tokens: TokenizedSet,
    cache: LowerCache | None,
    batch_size: int = 64,
    progress: str | None = None,
) -> torch.Tensor:
    """Encode every sentence once, in eval mode, batched by length (least padding).

    ``progress`` (a description) shows a bar of the batches; the batches, and so the
    encodings, are the same with it or without.

    Shapes:
        -> (n, D) in the original sentence order
    """
    was_training = encoder.training
    encoder.eval()
    order = np.argsort([len(x) for x in tokens.ids], kind="stable")
    if cache is not None and encoder.split > 0:
        cache.states(encoder, tokens, order, batch_size, progress=True)
    if progress is None:
        enc = encode_rows(encoder, tokens, order, cache, batch_size)
    else:
        from tqdm import tqdm

        step = batch_size * PROGRESS_BATCHES  # whole batches: the same batches as without
        parts = []
        with tqdm(total=len(order), desc=progress, unit="sentence") as bar:
            for s in range(0, len(order), step):
                parts.append(encode_rows(encoder, tokens, order[s : s + step], cache,
                                         batch_size))
                bar.update(len(parts[-1]))
        enc = torch.cat(parts)
    out = torch.empty_like(enc)
    out[torch.from_numpy(order).to(enc.device)] = enc
    encoder.train(was_training)
    return out
