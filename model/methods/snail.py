"""``snail``: a simple neural attentive meta-learner (Mishra et al., ICLR 2018).

In the paper, an episode is a sequence: the labelled supports, each as an
(encoding, one-hot label) pair, followed by the query with an all-zero label. Two kinds of
causal block alternate over this sequence, and each concatenates its output to its input:

* dense block with dilation d: ``[x_t, tanh(W_f [x_t, x_{t-d}]) * sigmoid(W_g [x_t, x_{t-d}])]``
  (a causal convolution of kernel 2 with a gated activation). A TC block stacks dense blocks
  with dilations 1, 2, 4, ... so that the receptive field covers the sequence.
* attention block: single-head causal soft attention,
  ``[x_t, sum_{u <= t} softmax_u(q_t . k_u / sqrt(d_k)) v_u]``.

The few-shot network is attention, TC, attention, TC, attention, then a 1x1 convolution.
Its output at the query's position gives the N-way logits. The paper shuffles the supports
at random in every episode.

Where ours differs, and why:

* **N-agnostic, way-equivariant labels: one sequence per candidate way.** One-hot labels and
  an N-way output fix N in the weights, and a sequence model depends on the order of its
  inputs. For each candidate way n we run the sequence with the label feature
  ``[1{y_i = n}, 1]`` on each support (belongs to n, labelled) and ``[0, 0]`` on the query,
  and the output at the query's position is the logit of way n. Other ways' supports stay
  in the sequence, so a way's score depends on them (``couples_ways``).
* **A content order, not a random one.** The supports are sorted by their projection
  ``<x, u>`` onto a fixed random unit vector ``u``: a buffer drawn from seed 0 and saved with
  the head. The order comes from the encodings alone, never from the way or shot index.
  Permuting the ways therefore permutes the logits exactly, up to float rounding; exact
  ties need two identical encodings. As in the paper, the order carries no meaning the
  model could rely on; unlike the paper's, it is the same every time an episode is seen.
* **Queries share the support prefix.** Each query has its own sequence
  ``[s_1 .. s_M, q]``. The network is causal and the supports' order does not depend on the
  query, so the M support positions are the same in every query's sequence. They are
  computed once per episode and candidate way; then each query's position reads them
  (:meth:`SnailHead.trunk`). This is exactly one sequence per query, so no query can affect
  another's prediction, and it costs N (M + Q) positions instead of N Q (M + 1).
* **A fixed metric in the attention** (``metric_temperature`` T > 0). Each attention block
  adds ``-g |e_t - e_u|^2 / 2`` on the D-dimensional encodings e to its logit of position t
  reading support u, less the row's largest such term (so a query reading itself, which
  gets 0, counts as its nearest support); g is a learned gain that starts at 1 / T (proto's
  logits at T = ``model.langevin.temperature``).
  On NYT-25's 10 training relations the learned keys alone fitted them (training loss 0.02) and
  stayed at or below the untrained encoder on the validation relations (56% at 5-way, floor 55%;
  74% with the term).
* **Fixed depth, smaller widths.** A TC block has ``len(dilations)`` dense blocks for any
  sequence length (the paper uses ceil(log2 T)). The default dilations 1..32 cover up to
  64 positions, which includes 10-way 5-shot (51); attention reaches further anyway.
  Filters and attention sizes are about a quarter of the paper's miniImageNet net
  (128 filters, attention (64, 32), (256, 128), (512, 256)). The D-dimensional encoding is
  first projected to ``width`` with a LayerNorm, where the paper has a CNN embedding.

Shapes:
    B episodes, N ways, K shots, M = N K supports, C = N candidate ways, Q queries,
    G = B C sequences' prefixes, D encoding size, F features per position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from model.config import RegrabConfig, SnailConfig
from model.methods.base import PriorFreeHead, episode_chunks, metric_log_gain, require_shots
from model.methods.registry import Method
from model.posterior.logits import similarity_logits

if TYPE_CHECKING:
    from model.prior.graph import RelationGraph


#: The label features of a position: "belongs to the candidate way" and "is labelled".
LABEL_FEATURES = 2


class DenseBlock(nn.Module):
    """A causal convolution of kernel 2 and dilation d with a gated activation, concatenated
    to its input."""

    def __init__(self, dim: int, filters: int, dilation: int) -> None:
        super().__init__()
        self.dilation = dilation
        self.filters = filters
        self.conv = nn.Linear(2 * dim, 2 * filters)  # taps x_t and x_{t-d}; filter and gate

    def forward(self, x: torch.Tensor, m: int) -> torch.Tensor:
        """Support t reads position t - d (zeros before the start); each query, at position
        M, reads support M - d.

        Shapes:
            x: (G, M + Q, F) (the M supports, then the queries) -> (G, M + Q, F + filters)
        """
        d = self.dilation
        s, q = x[:, :m], x[:, m:]
        before_s = F.pad(s, (0, 0, d, 0))[:, :m]  # (G, M, F)
        if d <= m:
            before_q = s[:, m - d:m - d + 1].expand_as(q)  # (G, Q, F)
        else:
            before_q = torch.zeros_like(q)
        z = self.conv(torch.cat([x, torch.cat([before_s, before_q], dim=1)], dim=-1))
        gated = torch.tanh(z[..., :self.filters]) * torch.sigmoid(z[..., self.filters:])
        return torch.cat([x, gated], dim=-1)


class AttentionBlock(nn.Module):
    """Single-head causal soft attention, concatenated to its input."""

    def __init__(self, dim: int, key: int, value: int) -> None:
        super().__init__()
        self.query = nn.Linear(dim, key)
        self.key = nn.Linear(dim, key)
        self.value = nn.Linear(dim, value)
        self.scale = key ** -0.5

    def forward(self, x: torch.Tensor, m: int, bias: torch.Tensor | None = None
                ) -> torch.Tensor:
        """Support t attends to supports 0..t; each query attends to every support and
        itself. ``bias`` (the fixed metric) is added to the logits of reading the supports.

        Shapes:
            x: (G, M + Q, F) (the M supports, then the queries), bias: (G, M + Q, M)
            -> (G, M + Q, F + value)
        """
        t = x.shape[1]
        q, k, v = self.query(x), self.key(x), self.value(x)  # (G, M + Q, key or value)
        to_supports = q @ k[:, :m].transpose(1, 2)  # (G, M + Q, M)
        to_self = (q * k).sum(-1, keepdim=True)  # (G, M + Q, 1)
        row = torch.arange(t, device=x.device)[:, None]
        # A support reads supports up to itself (its own column among them); a query reads
        # every support and, in the last column, itself.
        future = torch.arange(m, device=x.device)[None, :] > row  # (M + Q, M)
        logits = torch.cat([to_supports.masked_fill(future, float("-inf")),
                            to_self.masked_fill(row < m, float("-inf"))], dim=-1)
        logits = logits * self.scale
        if bias is not None:
            logits = logits + F.pad(bias, (0, 1))  # reading itself: no term
        w = torch.softmax(logits, dim=-1)  # (G, M + Q, M + 1)
        read = w[..., :m] @ v[:, :m] + w[..., m:] * v  # (G, M + Q, value)
        return torch.cat([x, read], dim=-1)


class SnailHead(PriorFreeHead):
    """Per-candidate-way SNAIL sequences over content-ordered supports; see the module doc."""

    couples_ways = True

    def __init__(self, config: SnailConfig, dim: int) -> None:
        super().__init__()
        direction = torch.randn(dim, generator=torch.Generator().manual_seed(0))
        self.register_buffer("direction", direction / direction.norm())  # the content order
        self.config = config
        self.embed = nn.Sequential(nn.Linear(dim, config.width), nn.LayerNorm(config.width))
        blocks: list[nn.Module] = []
        f = config.width + LABEL_FEATURES
        for i, (key, value) in enumerate(config.attention):
            if i > 0:  # attention, TC, attention, TC, attention
                for d in config.dilations:
                    blocks.append(DenseBlock(f, config.filters, d))
                    f += config.filters
            blocks.append(AttentionBlock(f, key, value))
            f += value
        self.blocks = nn.ModuleList(blocks)
        self.out = nn.Linear(f, 1)
        self.log_gain = metric_log_gain(config.metric_temperature)  # fixed metric (module doc)

    def sample_logits(self, support: torch.Tensor, query: torch.Tensor,
                      h: torch.Tensor | None = None, generator: torch.Generator | None = None
                      ) -> torch.Tensor:
        """N-way logits of every query, as one "sample" (S = 1), in chunks of episodes of
        at most ``chunk_positions`` sequence positions.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, 1, Q, N)
        """
        require_shots(support, "snail")
        n, k = support.shape[1:3]
        positions = n * (n * k + query.shape[1])  # of one episode's N sequences
        return episode_chunks(self.scores, support, query, self.config.chunk_positions // positions)

    def sequences(self, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Every candidate way's sorted, labelled support prefix, then the query inputs.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (G, M + Q, F)
        """
        b, n, k, d = support.shape
        x, order = self.content_order(support)  # (B, M, D), (B, M)
        way = torch.arange(n, device=support.device)
        label = way.repeat_interleave(k)[order]  # (B, M)
        member = (label[:, None, :] == way[None, :, None]).to(x.dtype)  # (B, C, M)
        s = self.embed(x)[:, None].expand(-1, n, -1, -1)  # (B, C, M, W)
        s = torch.cat([s, member[..., None], torch.ones_like(member)[..., None]], dim=-1)
        q = self.embed(query)[:, None].expand(-1, n, -1, -1)  # (B, C, Q, W)
        q = F.pad(q, (0, LABEL_FEATURES))  # the query's label features are zero
        return torch.cat([s, q], dim=2).reshape(b * n, n * k + query.shape[1], -1)

    def content_order(self, support: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The supports sorted by their projection on ``direction``, and that order.

        Shapes:
            support: (B, N, K, D) -> (B, M, D), (B, M)
        """
        b, n, k, d = support.shape
        x = support.reshape(b, n * k, d)
        with torch.no_grad():
            key = (x.double() * self.direction.double()).sum(-1)  # (B, M)
            order = torch.argsort(key, dim=-1, stable=True)  # (B, M)
        return x.gather(1, order[..., None].expand(-1, -1, d)), order

    def metric(self, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor | None:
        """The fixed metric of every sequence's positions over its sorted supports, each row
        less its largest entry (module doc); None with ``metric_temperature`` 0.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (G, M + Q, M)
        """
        if self.config.metric_temperature <= 0:
            return None
        x, _ = self.content_order(support)  # (B, M, D)
        bias = self.log_gain.exp() * similarity_logits(torch.cat([x, query], dim=1), x,
                                                       "euclidean", 1.0)  # (B, M + Q, M)
        bias = bias - bias.max(-1, keepdim=True).values.detach()
        return bias.repeat_interleave(support.shape[1], dim=0)  # sequence g = b N + c

    def trunk(self, x: torch.Tensor, m: int, bias: torch.Tensor | None = None) -> torch.Tensor:
        """All blocks over the shared prefix ``x[:, :m]`` and the queries after it, each at
        position M of its own sequence.

        ``trunk(x[:, list(range(m)) + [m + i]], m + 1)[:, -1]`` is
        ``trunk(x, m)[:, m + i]``: sharing the prefix is exact.

        Shapes:
            x: (G, M + Q, F) -> (G, M + Q, F')
        """
        for block in self.blocks:
            x = block(x, m, bias) if isinstance(block, AttentionBlock) else block(x, m)
        return x

    def scores(self, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The output at each query's position in each candidate way's sequence.

        Shapes:
            support: (B, N, K, D), query: (B, Q, D) -> (B, Q, N)
        """
        b, n, k, _ = support.shape
        x = self.trunk(self.sequences(support, query), n * k,
                       self.metric(support, query))[:, n * k:]  # (G, Q, F')
        return self.out(x)[..., 0].reshape(b, n, -1).transpose(1, 2)  # (B, Q, N)


def _snail(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> SnailHead:
    return SnailHead(config.snail, dim)


METHODS = (
    Method("snail", _snail, "causal attention and temporal convolutions over the labelled "
           "supports, then the query (Mishra et al.)", seed=9, sizes="snail"),
)
