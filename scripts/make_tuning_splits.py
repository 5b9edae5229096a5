"""Build tuning splits whose scoring relations are in no NYT-25 test set.

Every NYT-25 relation is a test relation of some split, so hyper-parameters chosen on any
NYT-25 validation part leak into a test set. A tuning split keeps a split's training and
validation parts and replaces its test part by ``relations`` relations of FewRel's
``train_wiki`` (which shares no relation with NYT-25), ``per_relation`` sentences each, drawn
with ``seed``: the ``tune_splits`` section of ``params.yaml``. ``stages.train`` /
``stages.evaluate`` then run on ``--out`` unchanged.

Usage:
    python scripts/make_tuning_splits.py --splits data/splits --heldout \
        data/fewshot/train_wiki.parquet --out data/tune [--params params.yaml]

``--relations``, ``--per-relation`` and ``--seed`` override the section for one run (checked
against the same schema).
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa

import stages  # noqa: F401  (declares params.yaml's sections: a misspelt one is refused)
from pipeline.config import load_section, parse_section
from pipeline.data_sections import TuneSplitsParams
from pipeline.errors import PipelineError, run_cli
from pipeline.io import read_parquet, write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def load_params(path: Path, given: dict[str, int | None]) -> TuneSplitsParams:
    """The ``tune_splits`` section of ``path``, with the command line's overrides laid over."""
    params = load_section(TuneSplitsParams, "tune_splits", path)
    changed = {key: value for key, value in given.items() if value is not None}
    if not changed:
        return params
    return parse_section(TuneSplitsParams, {**dataclasses.asdict(params), **changed},
                         "tune_splits (with command-line overrides)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--heldout", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--relations", type=int, help="overrides tune_splits.relations")
    parser.add_argument("--per-relation", type=int, help="overrides tune_splits.per_relation")
    parser.add_argument("--seed", type=int, help="overrides tune_splits.seed")
    args = parser.parse_args(argv)
    params = load_params(args.params, {"relations": args.relations,
                                       "per_relation": args.per_relation, "seed": args.seed})
    held = read_parquet(args.heldout, FEWSHOT_SCHEMA)
    rel = np.asarray(held.column("relation").to_pylist())
    names = sorted(set(rel))
    if len(names) < params.relations:
        raise PipelineError(f"{args.heldout} has {len(names)} relations, fewer than "
                            f"tune_splits.relations = {params.relations}; lower it")
    rng = np.random.default_rng(params.seed)
    chosen = sorted(rng.choice(names, params.relations, replace=False).tolist())
    rows = np.concatenate([np.flatnonzero(rel == r)[: params.per_relation] for r in chosen])
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
          f"relations x {params.per_relation} sentences ({', '.join(chosen)})")


if __name__ == "__main__":
    run_cli(main)
