"""Graph-based prior p(v_r | G) = N(v_r | h_r, I) with h_r = F(G)_r (paper Eq. 5-6).

F is a graph convolutional network (Kipf & Welling) over the global relation graph whose node
features are relation embeddings (TransE or the authors' own); its last layer projects to the
sentence-encoding size D so that h_r lives where prototypes live. Relations of a split that are
missing from the graph get one shared, learned fallback vector (the authors' code silently gave
them a zero prior); how many there are is logged.

Shapes:
    R relations in the graph, F feature size, D encoding size, N ways.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa
import torch
from torch import nn
from torch_geometric.nn import GCNConv
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from pipeline.config import field
from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphPriorConfig:
    """GCN prior settings (``params.yaml`` section ``model.prior``).

    Attributes:
        kind: ``gcn`` (paper Eq. 6) or ``mlp``: the same network on a graph without edges, i.e.
            a feed-forward network over each relation's own embedding (the paper's ablation).
        layers: GCN layers (paper: 1; "more layers, only very marginal improvement").
        hidden: width of hidden GCN layers (only used when layers > 1).
        normalize_features: scale node features to unit norm first (TransE norms vary).
        scale: initial value of a learned output scale; h_r starts small so the untrained prior
            does not drown the support likelihood.
    """

    kind: Literal["gcn", "mlp"]
    layers: int = field(ge=1)
    hidden: int = field(ge=1)
    normalize_features: bool
    scale: float


@dataclass
class RelationGraph:
    """Node features and edges of the relation graph, indexed by relation id."""

    relations: list[str]
    features: torch.Tensor  # (R, F)
    edge_index: torch.Tensor  # (2, E)
    edge_weight: torch.Tensor  # (E,)

    @classmethod
    def from_tables(cls, graph: pa.Table, features: pa.Table) -> RelationGraph:
        """Build from GRAPH_SCHEMA and embeddings_schema tables; edges to unknown nodes dropped."""
        rel = features.column("relation").to_pylist()
        if len(rel) == 0:
            raise PipelineError("relation feature table is empty; rebuild data/features")
        emb = features.column("embedding").combine_chunks()
        dim = emb.type.list_size
        values = emb.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
        feats = torch.from_numpy(values.reshape(len(rel), dim).copy())
        if not torch.isfinite(feats).all():
            raise PipelineError("relation features contain NaN/inf; rebuild data/features")
        index = {r: i for i, r in enumerate(rel)}
        src = graph.column("src").to_pylist()
        dst = graph.column("dst").to_pylist()
        weight = graph.column("weight").to_numpy(zero_copy_only=False).astype(np.float32)
        pairs = enumerate(zip(src, dst, strict=True))
        keep = [i for i, (s, d) in pairs if s in index and d in index]
        dropped = len(src) - len(keep)
        if dropped:
            log.warning("graph: %d of %d edges touch relations without features; dropped",
                        dropped, len(src))
        edge_index = torch.tensor(
            [[index[src[i]] for i in keep], [index[dst[i]] for i in keep]], dtype=torch.long
        ).reshape(2, -1)
        return cls(rel, feats, edge_index, torch.from_numpy(weight[keep].copy()))


class GraphPrior(nn.Module):
    """h = GCN(features, graph) projected to D, plus a learned fallback for unknown relations."""

    def __init__(self, config: GraphPriorConfig, graph: RelationGraph, out_dim: int) -> None:
        super().__init__()
        self.config = config
        self.relations = list(graph.relations)
        self._index = {r: i for i, r in enumerate(self.relations)}
        feats = graph.features
        if config.normalize_features:
            feats = feats / feats.norm(dim=1, keepdim=True).clamp(min=1e-8)
        # Buffers, so a checkpoint carries its graph and loads without the graph files (the
        # raw features are not saved: only A_hat X below is ever used).
        self.register_buffer("features", feats.clone(), persistent=False)
        edges, weights = graph.edge_index.clone(), graph.edge_weight.clone().clamp(min=0.0)
        if config.kind == "mlp":  # no neighbours: A_hat = I, each relation on its own
            edges, weights = edges[:, :0], weights[:0]
        self.register_buffer("edge_index", edges)
        self.register_buffer("edge_weight", weights)
        # The first GCN layer is A_hat (X W) = (A_hat X) W and X is fixed, so A_hat X is
        # computed once; with one layer a step then only needs the episode's N rows.
        self.register_buffer("propagated", self._propagate(feats))
        dims = [feats.shape[1]] + [config.hidden] * (config.layers - 1) + [out_dim]
        self.convs = nn.ModuleList(GCNConv(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.scale = nn.Parameter(torch.tensor(float(config.scale)))
        self.fallback = nn.Parameter(torch.zeros(out_dim))

    def _propagate(self, x: torch.Tensor) -> torch.Tensor:
        """``A_hat x`` with GCNConv's normalisation (self-loops, symmetric degree scaling).

        Shapes:
            x: (R, F) -> (R, F)
        """
        ei, w = gcn_norm(self.edge_index, self.edge_weight, num_nodes=x.shape[0],
                         add_self_loops=True)
        return torch.zeros_like(x).index_add_(0, ei[1], x[ei[0]] * w[:, None])

    def _first_layer(self, rows: torch.Tensor | None) -> torch.Tensor:
        conv = self.convs[0]
        x = self.propagated if rows is None else self.propagated[rows]
        out = conv.lin(x)
        return out + conv.bias if conv.bias is not None else out

    def coverage(self, relations: list[str], what: str = "split") -> list[str]:
        """The relations absent from the graph (they get the learned fallback prior), logged.

        A set whose relations are all absent (e.g. another domain's labels) still works: every
        way then shares the fallback, and REGRAB's posterior rests on the support alone.
        """
        missing = [r for r in relations if r not in self._index]
        if missing and len(missing) == len(relations):
            log.warning("none of the %d %s relations is in the relation graph (e.g. %s): all "
                        "get the learned fallback prior", len(relations), what, missing[0])
        elif missing:
            log.warning("%d of %d %s relations are not in the graph and get the learned "
                        "fallback prior: %s", len(missing), len(relations), what, missing)
        return missing

    def index(self, relations: list[str]) -> torch.Tensor:
        """Graph row of each relation, -1 for relations absent from the graph."""
        return torch.tensor([self._index.get(r, -1) for r in relations], dtype=torch.long)

    def node_states(self) -> torch.Tensor:
        """GCN output for every relation of the graph.

        Shapes:
            -> (R, D)
        """
        x = self._first_layer(None)
        for conv in self.convs[1:]:
            x = conv(torch.relu(x), self.edge_index, self.edge_weight)
        return x * self.scale  # (R, D)

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        """Prior means for graph rows (-1 = fallback).

        Shapes:
            rows: (...,) -> (..., D)
        """
        safe = rows.clamp(min=0).to(self.features.device)
        if len(self.convs) == 1:
            h = self._first_layer(safe.reshape(-1)).reshape(*safe.shape, -1) * self.scale
        else:
            h = self.node_states()[safe]  # (..., D)
        unknown = (rows < 0).to(h.device)[..., None]
        return torch.where(unknown, self.fallback.expand_as(h), h)
