"""The relation graph as a k-nearest-neighbour graph over relation embeddings.

As in the paper (appendix, "10-nearest neighbor graph"), relation ``i`` links to the ``k``
relations whose embeddings have the highest cosine similarity to its own. The graph is made
undirected: an edge joins ``i`` and ``j`` whenever either is among the other's ``k`` nearest,
so degrees are at least ``k``. No self loops. Each edge is written in both directions with
weight ``cos(i, j)`` (``GRAPH_SCHEMA``), sorted by (src, dst), so the output does not depend
on the row order of the input. The ``build_graph`` stage reads the embeddings and writes the
table; :mod:`model.prior.graph` reads it back for the prior.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.errors import PipelineError
from pipeline.io import read_parquet
from pipeline.schemas import GRAPH_SCHEMA, embeddings_schema

#: Rows of the similarity matrix computed at once, bounding memory at BLOCK * R.
BLOCK = 1024


def read_embeddings(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Relation ids and the float32 (R, D) matrix from an ``embeddings_schema`` file."""
    table = read_parquet(path)
    names = table.schema.names
    if "relation" not in names or "embedding" not in names:
        raise PipelineError(
            f"{path} lacks 'relation'/'embedding' columns; pass a relation-embeddings Parquet"
        )
    kind = table.schema.field("embedding").type
    if not pa.types.is_fixed_size_list(kind):
        raise PipelineError(
            f"{path}: 'embedding' is {kind}, not a fixed-size float list; rebuild it with "
            "train_transe or import_embeddings"
        )
    table = read_parquet(path, embeddings_schema(kind.list_size))
    ids = np.asarray(table["relation"].to_pylist(), dtype=object)
    column = table["embedding"].combine_chunks()
    vectors = column.flatten().to_numpy(zero_copy_only=False).astype(np.float32)
    return ids, vectors.reshape(len(ids), kind.list_size)


def unit_rows(ids: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm in float64, after checking they can be."""
    if not np.isfinite(vectors).all():
        bad = ids[~np.isfinite(vectors).all(axis=1)]
        raise PipelineError(
            f"embeddings of {list(bad[:5])} hold NaN or infinity; retrain or re-import them"
        )
    x = vectors.astype(np.float64)
    norms = np.linalg.norm(x, axis=1)
    if (norms == 0).any():
        raise PipelineError(
            f"embeddings of {list(ids[norms == 0][:5])} are zero vectors, so their cosine "
            "similarity is undefined; drop those relations or retrain"
        )
    return x / norms[:, None]


def knn_edges(unit: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Undirected kNN edges by cosine similarity, each listed in both directions.

    Ties in similarity are broken towards the lower row index, so the result is
    deterministic.

    Shapes:
        unit: (R, D) unit rows -> src (E2,), dst (E2,), weight (E2,) float32,
        with E2 twice the number of undirected edges.
    """
    r = unit.shape[0]
    pairs = []
    for start in range(0, r, BLOCK):
        sim = unit[start : start + BLOCK] @ unit.T  # (block, R)
        rows = np.arange(sim.shape[0])
        sim[rows, start + rows] = -np.inf  # no self loops
        # Sort by (-similarity, column); lexsort is stable and keys go last-first.
        cols = np.broadcast_to(np.arange(r), sim.shape)
        order = np.lexsort((cols, -sim), axis=1)[:, :k]  # (block, k)
        pairs.append(np.stack([np.repeat(start + rows, k), order.reshape(-1)], axis=1))
    directed = np.concatenate(pairs)  # (R * k, 2)
    # Undirected: keep each pair once as (low, high), then emit both directions.
    undirected = np.unique(np.sort(directed, axis=1), axis=0)  # (E, 2)
    lo, hi = undirected[:, 0], undirected[:, 1]
    # One dot product per pair gives the two directions bit-identical weights.
    weight = np.einsum("ij,ij->i", unit[lo], unit[hi]).astype(np.float32)
    src = np.concatenate([lo, hi])
    dst = np.concatenate([hi, lo])
    return src, dst, np.concatenate([weight, weight])


def build_graph(ids: np.ndarray, vectors: np.ndarray, k: int) -> pa.Table:
    """The undirected kNN graph over relation embeddings as a ``GRAPH_SCHEMA`` table."""
    if k < 1:
        raise PipelineError(f"k={k}; the graph needs k >= 1 neighbours per relation")
    if len(ids) <= k:
        raise PipelineError(
            f"k={k} but only {len(ids)} relations; k must be below the number of relations"
        )
    if len(set(ids.tolist())) != len(ids):
        raise PipelineError("relation ids repeat in the embeddings file; rebuild it")
    src, dst, weight = knn_edges(unit_rows(ids, vectors), k)
    src_ids, dst_ids = ids[src], ids[dst]
    order = np.lexsort((dst_ids.astype(str), src_ids.astype(str)))
    return pa.table(
        {
            "src": pa.array(src_ids[order].tolist(), type=pa.string()),
            "dst": pa.array(dst_ids[order].tolist(), type=pa.string()),
            "weight": pa.array(weight[order], type=pa.float32()),
        },
        schema=GRAPH_SCHEMA,
    )
