"""``pair``: BERT-PAIR (Gao et al., EMNLP 2019, "FewRel 2.0"), at the readout level.

The paper concatenates the query sentence and one support sentence into one BERT input,
``[CLS] query [SEP] support [SEP]`` with token type ids 0 and 1, and encodes the pair
jointly, so that every token of one sentence attends to every token of the other. A linear
layer on the [CLS] output scores whether the two sentences express the same relation. The
score of way n is the average of that score over the way's K supports. In the FewRel
toolkit's pair model (``models/pair.py``) the layer gives two logits (different, same); they
are averaged over the K shots, the mean "same" logit is the way's logit, and the model trains
with N-way cross-entropy over them. For none-of-the-above it adds one more logit, the
smallest mean "different" logit over the ways.

Where ours differs, and why:

* **Joint encoding of the readout tokens, not of the words.** Encoding every (query,
  support) pair through the whole transformer costs Q N K encoder passes per episode and
  would defeat the per-sentence cache of the frozen encoder layers; it is infeasible on
  the CPU. Instead, each sentence is first encoded on its own by the shared encoder, and a
  small trained transformer encodes the pair from the sentences' readout vectors. The
  ``markers_mean`` readout concatenates ``blocks`` = 4 blocks of H features ([E1] state,
  [E2] state, head-entity mean, tail-entity mean). Each block becomes one token: a shared
  ``Linear(H, width)`` plus a learned segment embedding (query 0, support 1, BERT's token
  type ids) plus a learned slot embedding (which readout block), then a LayerNorm, as in
  BERT's embedding layer. The pair's sequence is ``[CLS] q_1..q_4 x_1..x_4`` with a learned
  [CLS] token; ``layers`` standard post-LN ``nn.TransformerEncoderLayer`` (BERT's layout)
  run over its 2 blocks + 1 tokens, and ``Linear(width, 1)`` on the [CLS] output gives the
  same-relation logit s(q, x). Every query token attends to every support token, as in
  BERT-PAIR, but over 9 readout tokens instead of two sentences' words. If D is not a
  multiple of ``blocks`` (another readout), the whole encoding is one token per sentence.
  With ``pooling: markers`` (D = 2 H) and ``blocks`` = 4 each token would be half a marker
  state; set ``blocks`` = 2 there.
* **One layer only lets [CLS] read the pair.** With ``layers`` = 1 (the default, for CPU
  cost) the other tokens' outputs are not used, so q and x interact only through [CLS]'s
  attention over both sentences' tokens (one softmax over all 9) and the nonlinear
  LayerNorm and feed-forward after it. So s is not a sum of a query term and a support term,
  but token-to-token cross-attention needs ``layers`` >= 2. On isotropic toy classes two
  layers learned to match blocks much faster than one.
* **One "same" logit, averaged.** s(q, x) is one logit; the way logit is its mean over the
  K shots, as the toolkit's mean "same" logit, and the predictive is the softmax over ways
  (one "sample", S = 1), like the other baselines. Training is the shared episodic
  cross-entropy over ways, which is the toolkit's loss, so no pair-level loss is added.
  There is no "different" logit: none-of-the-above is answered by the project's confidence
  threshold (:mod:`model.evaluation.nota`), as for every method.
* **A fixed metric in the pair score** (``metric_temperature`` T > 0). s(q, x) is the [CLS]
  score plus ``-g |q - x|^2 / 2`` on the D-dimensional encodings, g a learned gain that starts
  at 1 / T (proto's logits at T = ``model.langevin.temperature``): BERT-PAIR starts from a
  pre-trained encoder that already matches the two sentences, ours from a random layer.
  On NYT-25's 10 training relations the learned [CLS] score alone fitted them (training loss
  0.14) and stayed at or below the untrained encoder on the validation relations (52% at 5-way,
  floor 55%; 77% with the term).
* **Cheap pairs.** The tokens of each query and each support are computed once per episode
  and shared by their pairs through broadcasting. Only [CLS] reads the last layer, so that
  layer runs at [CLS] alone (:func:`cls_layer`); with one layer, keys and values are then
  projected once per sentence, and a pair costs one attention read, the output projection
  and one feed-forward. On one CPU thread a 10-way 5-shot training step (Q = 50,
  D = 1536, forward and backward) took about 0.03 s, against 0.46 s for the whole layer on
  every pair's 9 tokens; two layers take about 0.55 s (the first runs on all 9 tokens of
  every pair).
* **Ways are not coupled.** A way's score reads its own supports only (``couples_ways`` is
  False), and permuting a way's shots changes nothing.

Shapes:
    B episodes, N ways, K shots, Q queries, D encoding size, T readout blocks (tokens per
    sentence), H = D / T block size, W token width, P pairs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from model.config import PairConfig, RegrabConfig
from model.methods.base import PriorFreeHead, episode_chunks, metric_log_gain, require_shots
from model.methods.registry import Method
from model.posterior.logits import similarity_logits

if TYPE_CHECKING:
    from model.prior.graph import RelationGraph


#: Segment (token type) ids, as BERT's: the query is the first sentence of a pair.
QUERY, SUPPORT = 0, 1


def cls_layer(layer: nn.TransformerEncoderLayer, cls: torch.Tensor,
              parts: list[torch.Tensor]) -> torch.Tensor:
    """The output of one post-LN ``layer`` at [CLS] alone, the sequence being [CLS] then the
    tokens of ``parts`` in order; the same as ``layer(sequence)[..., 0, :]``.

    Only [CLS] reads the last layer's output, so the other positions' queries, attention
    outputs and feed-forwards are skipped. Keys and values are projected on the tensors as
    given, before broadcasting: a sentence's tokens shared by many pairs are projected once.

    Shapes:
        cls: (..., W), parts: (..., t_i, W), all broadcastable over ``...`` -> (..., W)
    """
    attn = layer.self_attn
    heads = attn.num_heads
    w_q, w_k, w_v = attn.in_proj_weight.chunk(3)
    b_q, b_k, b_v = attn.in_proj_bias.chunk(3)
    q = F.linear(cls, w_q, b_q).unflatten(-1, (heads, -1))  # (..., heads, W / heads)
    q = q * q.shape[-1] ** -0.5
    tokens = [cls[..., None, :], *parts]
    keys = [F.linear(t, w_k, b_k).unflatten(-1, (heads, -1)) for t in tokens]  # (.., t, h, d)
    values = [F.linear(t, w_v, b_v).unflatten(-1, (heads, -1)) for t in tokens]
    logits = [torch.einsum("...hd,...thd->...th", q, k) for k in keys]  # (..., t_i, heads)
    lead = torch.broadcast_shapes(*(e.shape[:-2] for e in logits))
    logits = torch.cat([e.expand(*lead, -1, -1) for e in logits], dim=-2)  # (..., 1 + t, h)
    p = F.dropout(torch.softmax(logits, dim=-2), attn.dropout, layer.training)
    read = sum(torch.einsum("...th,...thd->...hd", p_t, v)
               for p_t, v in zip(p.split([v.shape[-3] for v in values], dim=-2), values,
                                 strict=True))  # (..., heads, W / heads)
    x = layer.norm1(cls + layer.dropout1(attn.out_proj(read.flatten(-2))))  # (..., W)
    ff = layer.linear2(layer.dropout(layer.activation(layer.linear1(x))))
    return layer.norm2(x + layer.dropout2(ff))


class PairHead(PriorFreeHead):
    """A same-relation scorer of (query, support) pairs, averaged over each way's shots; see
    the module doc."""

    def __init__(self, config: PairConfig, dim: int) -> None:
        super().__init__()
        if config.layers < 1:
            raise ValueError(f"pair needs layers >= 1, got {config.layers}")
        self.config = config
        self.blocks = config.blocks if config.blocks > 0 and dim % config.blocks == 0 else 1
        w = config.width
        self.project = nn.Linear(dim // self.blocks, w)
        self.segment = nn.Parameter(torch.randn(2, w) * 0.02)
        self.slot = nn.Parameter(torch.randn(self.blocks, w) * 0.02)
        self.norm = nn.LayerNorm(w)
        self.cls = nn.Parameter(torch.randn(w) * 0.02)
        # Post-LN, as BERT: the layout cls_layer computes.
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(w, config.heads, config.ff, config.dropout,
                                       batch_first=True, norm_first=False)
            for _ in range(config.layers))
        self.out = nn.Linear(w, 1)
        self.log_gain = metric_log_gain(config.metric_temperature)  # fixed metric (module doc)

    def tokens(self, x: torch.Tensor, segment: int) -> torch.Tensor:
        """The readout tokens of sentences of one segment (``QUERY`` or ``SUPPORT``).

        Shapes:
            x: (..., D) -> (..., T, W)
        """
        x = x.reshape(*x.shape[:-1], self.blocks, -1)  # (..., T, H)
        return self.norm(self.project(x) + self.segment[segment] + self.slot)

    def same(self, query: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
        """s(q, x): the same-relation logit of each pair, from [CLS] after the layers.

        The tokens of one sentence may be shared by many pairs through broadcasting; with
        one layer they are never copied per pair.

        Shapes:
            query: (..., T, W), support: (..., T, W) (broadcastable) -> (...)
        """
        cls, parts = self.cls, [query, support]  # (W,): one [CLS] for every pair
        if len(self.layers) > 1:  # every pair's own sequence
            lead = torch.broadcast_shapes(query.shape[:-2], support.shape[:-2])
            x = torch.cat([t.expand(*lead, -1, -1) for t in (cls[None], query, support)],
                          dim=-2)  # (..., 2 T + 1, W)
            x = x.reshape(-1, *x.shape[-2:])  # (P, 2 T + 1, W)
            for layer in self.layers[:-1]:
                x = layer(x)
            x = x.reshape(*lead, *x.shape[-2:])  # (..., 2 T + 1, W)
            cls, parts = x[..., 0, :], [x[..., 1:, :]]
        return self.out(cls_layer(self.layers[-1], cls, parts))[..., 0]

    def scores(self, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The mean of s(q, x) over each way's shots, for every query.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, Q, N)
        """
        qt = self.tokens(query, QUERY)[:, :, None, None]  # (B, Q, 1, 1, T, W)
        st = self.tokens(support, SUPPORT)[:, None]  # (B, 1, N, K, T, W)
        s = self.same(qt, st)  # (B, Q, N, K)
        if self.config.metric_temperature > 0:
            b, n, k, d = support.shape
            near = similarity_logits(query, support.reshape(b, n * k, d), "euclidean", 1.0)
            s = s + self.log_gain.exp() * near.reshape(b, -1, n, k)
        return s.mean(-1)  # (B, Q, N)

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """N-way logits of every query, as one "sample" (S = 1), in chunks of episodes of at
        most ``chunk_pairs`` pairs.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, 1, Q, N)
        """
        require_shots(support, "pair")
        _, n, k, _ = support.shape
        per_episode = max(1, query.shape[1] * n * k)  # pairs of one episode
        return episode_chunks(self.scores, support, query, self.config.chunk_pairs // per_episode)


def _pair(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> PairHead:
    return PairHead(config.pair, dim)


METHODS = (
    Method("pair", _pair, "query-support pairs encoded jointly at the readout level, the "
           "same-relation logit averaged over shots (BERT-PAIR, Gao et al.)", seed=10,
           sizes="pair"),
)
