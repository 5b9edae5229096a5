"""Build tuning splits whose scoring relations are in no NYT-25 test set.

Every NYT-25 relation is a test relation of some split, so hyper-parameters chosen on any
NYT-25 validation part leak into a test set. A tuning split keeps a split's training and
validation parts and replaces its test part by ``--relations`` relations of FewRel's
``train_wiki`` (which shares no relation with NYT-25), ``--per-relation`` sentences each.
``stages.train`` / ``stages.evaluate`` then run on ``--out`` unchanged.

Usage:
    python scripts/make_tuning_splits.py --splits data/splits --heldout \
        data/fewshot/train_wiki.parquet --out data/tune [--relations 16 --per-relation 100]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

from pipeline.errors import PipelineError, run_cli
from pipeline.io import read_parquet, write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--relations", type=int, default=16)
    parser.add_argument("--per-relation", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    held = read_parquet(args.heldout, FEWSHOT_SCHEMA)
    rel = np.asarray(held.column("relation").to_pylist())
    names = sorted(set(rel))
    if len(names) < args.relations:
        raise PipelineError(f"{args.heldout} has {len(names)} relations; lower --relations")
    rng = np.random.default_rng(args.seed)
    chosen = sorted(rng.choice(names, args.relations, replace=False).tolist())
    rows = np.concatenate([np.flatnonzero(rel == r)[: args.per_relation] for r in chosen])
    test = held.take(pa.array(np.sort(rows)))
    splits = sorted(args.splits.glob("split_*"))
    if not splits:
        raise PipelineError(f"no split_* in {args.splits}; run the split stage first")
    for split in splits:
        nyt = set()
        for part in ("train", "val", "test"):
            nyt |= set(read_parquet(split / f"{part}.parquet").column("relation").to_pylist())
        if nyt & set(chosen):
            raise PipelineError(f"{split.name} shares relations with the tuning set; pick others")
        dest = args.out / split.name
        dest.mkdir(parents=True, exist_ok=True)
        for part in ("train", "val"):
            shutil.copyfile(split / f"{part}.parquet", dest / f"{part}.parquet")
        write_parquet(test, dest / "test.parquet", FEWSHOT_SCHEMA)
    print(f"{len(splits)} tuning splits in {args.out}: test = {len(chosen)} train_wiki "
          f"relations x {args.per_relation} sentences ({', '.join(chosen)})")


if __name__ == "__main__":
    run_cli(main)
