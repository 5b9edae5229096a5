"""Stage import_embeddings: the paper's released relation features as Parquet.

The REGRAB authors published their TransE relation features (GraphVite on
Wikidata5m) as ``embeddings.pkl``: a pickle of ``{"relations": [828 Pids],
"embeddings": float32 ndarray (828, 512)}``. A pickle can run any function it
names, so it is read with :class:`RestrictedUnpickler`, which resolves only the
globals numpy needs to rebuild an array; containers and strings come from plain
pickle opcodes and need no globals at all. The result is written with
``embeddings_schema(dim)`` in the file's relation order.

Usage:
    python -m stages.import_embeddings --pickle data/raw/regrab_official/embeddings.pkl \\
        --out data/features/official.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from pipeline import stage_cli
from pipeline.embeddings_pickle import embeddings_table, restricted_loads, validate
from pipeline.errors import PipelineError, run_cli
from pipeline.io import write_parquet
from pipeline.schemas import embeddings_schema


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--pickle", required=True, type=Path, help="the released embeddings.pkl")
    parser.add_argument("--out", required=True, type=Path, help="relation embeddings Parquet")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> tuple[list[str], np.ndarray]:
    """Import the released relation features; returns the ids and matrix written."""
    args = parse_args(argv)
    if not args.pickle.is_file():
        raise PipelineError(f"{args.pickle} not found; fetch regrab_official/embeddings.pkl first")
    relations, emb = validate(restricted_loads(args.pickle.read_bytes()))
    write_parquet(embeddings_table(relations, emb), args.out, embeddings_schema(emb.shape[1]))
    print(f"wrote {len(relations)} relation embeddings (dim {emb.shape[1]}) to {args.out}")
    return relations, emb


if __name__ == "__main__":
    run_cli(main)
