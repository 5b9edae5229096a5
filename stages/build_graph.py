"""Stage build_graph: the global relation graph as a k-nearest-neighbour graph.

As in the paper (appendix, "10-nearest neighbor graph"), relation ``i`` links to
the ``k`` relations whose embeddings have the highest cosine similarity to its
own. The graph is made undirected: an edge joins ``i`` and ``j`` whenever either
is among the other's ``k`` nearest, so degrees are at least ``k``. No self
loops. Each edge is written in both directions with weight ``cos(i, j)``
(``GRAPH_SCHEMA``), sorted by (src, dst), so the output does not depend on the
row order of the input.

Usage:
    python -m stages.build_graph --embeddings data/features/transe.parquet --k 10 \\
        --out data/graph/graph.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pyarrow as pa

from model.prior.config import BuildGraphParams
from model.prior.knn import build_graph, read_embeddings
from pipeline import stage_cli
from pipeline.config import load_section
from pipeline.errors import run_cli
from pipeline.io import write_parquet
from pipeline.schemas import GRAPH_SCHEMA


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--embeddings", required=True, type=Path, help="relation embeddings")
    stage_cli.add_params(parser)
    parser.add_argument("--out", required=True, type=Path, help="GRAPH_SCHEMA Parquet")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> pa.Table:
    """Build the relation graph and write it; returns the edge table."""
    args = parse_args(argv)
    ids, vectors = read_embeddings(args.embeddings)
    cfg = load_section(BuildGraphParams, "build_graph", args.params)
    graph = build_graph(ids, vectors, cfg.k)
    write_parquet(graph, args.out, GRAPH_SCHEMA)
    edges = graph.num_rows // 2
    print(
        f"relation graph: {len(ids)} nodes, {edges} undirected edges "
        f"({graph.num_rows} rows, mean degree {graph.num_rows / len(ids):.1f}) -> {args.out}"
    )
    return graph


if __name__ == "__main__":
    run_cli(main)
