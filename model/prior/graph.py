"""The global relation graph, read from Parquet: node features, weighted edges, labels.

:class:`RelationGraph` is what :class:`~model.prior.gcn.GraphPrior` is built from: one node
per relation with its embedding (TransE or the authors' own, ``embeddings_schema``), the
edges of the graph stage (``GRAPH_SCHEMA``; edges to relations without features are dropped)
and, when a relations table is given (``RELATIONS_SCHEMA``), each relation's Wikidata label
and description.

Shapes:
    R relations in the graph, F feature size, E edges.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)


@dataclass
class RelationGraph:
    """Node features and edges of the relation graph, indexed by relation id."""

    relations: list[str]
    features: torch.Tensor  # (R, F)
    edge_index: torch.Tensor  # (2, E)
    edge_weight: torch.Tensor  # (E,)
    labels: list[str | None] | None = None  # per relation; None: no labels were given
    descriptions: list[str | None] | None = None  # per relation, where the table has them

    @classmethod
    def from_tables(cls, graph: pa.Table, features: pa.Table,
                    relations: pa.Table | None = None) -> RelationGraph:
        """Build from GRAPH_SCHEMA and embeddings_schema tables; edges to unknown nodes dropped.

        ``relations`` (``RELATION_TEXT_SCHEMA`` columns) gives each node its label and
        description; nodes it lacks get none.
        """
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
        labels = descriptions = None
        if relations is not None:
            named = dict(zip(relations.column("relation").to_pylist(),
                             relations.column("label").to_pylist(), strict=True))
            labels = [(named.get(r) or "").strip() or None for r in rel]
            if not any(labels):
                raise PipelineError("the relations table labels none of the graph's relations; "
                                    "rebuild data/wikidata/relations.parquet")
            if "description" in relations.column_names:
                said = dict(zip(relations.column("relation").to_pylist(),
                                relations.column("description").to_pylist(), strict=True))
                descriptions = [(said.get(r) or "").strip() or None for r in rel]
        return cls(rel, feats, edge_index, torch.from_numpy(weight[keep].copy()), labels,
                   descriptions)
