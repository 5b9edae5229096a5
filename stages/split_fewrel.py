"""Lay out the FewRel benchmark as a split: train_wiki for training, val_wiki for test.

The paper trains on FewRel's 64 ``train_wiki`` relations and reports on the 16 ``val_wiki``
relations. Hyper-parameters and early stopping need relations of their own, never
``val_wiki``: ``heldout_relations`` of ``train_wiki`` are drawn (seeded) as the validation
part. ``max_per_relation`` caps the sentences kept per relation (first ones in file order),
so the CPU default encodes a few thousand sentences instead of FewRel's 56k; 0 keeps all.

A team's own relations (``--own``: ``prepare_own``'s ``train.parquet``) join the train part
after the held-out draw, capped alike, and ``splits.yaml`` lists them under ``own``; with none
(an empty table, the default), every file is written byte for byte as without ``--own``.

Writes ``split_0/{train,val,test}.parquet`` and ``splits.yaml`` (relations of each part),
the layout of the NYT-25 splits, so ``train`` and ``evaluate`` run on it unchanged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import stage_cli
from pipeline.config import load_section
from pipeline.data_sections import SplitFewrelParams
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_dir, read_fewshot, write_parquet, write_yaml
from pipeline.schemas import FEWSHOT_SCHEMA


def cap(table: pa.Table, limit: int) -> pa.Table:
    """The first ``limit`` rows of every relation, in file order (all when 0)."""
    if limit == 0:
        return table
    rel = np.asarray(table.column("relation").to_pylist())
    keep = np.zeros(len(rel), dtype=bool)
    for r in np.unique(rel):
        keep[np.flatnonzero(rel == r)[:limit]] = True
    return table.filter(pa.array(keep))


def make_split(train: pa.Table, test: pa.Table, cfg: SplitFewrelParams,
               own: pa.Table | None = None) -> dict[str, pa.Table]:
    """Train (plus ``own``'s relations) / val (held out of train_wiki) / test (val_wiki)."""
    relations = sorted(set(train.column("relation").to_pylist()))
    if cfg.heldout_relations >= len(relations):
        raise PipelineError(
            f"split_fewrel.heldout_relations={cfg.heldout_relations} leaves no training "
            f"relation of {len(relations)}; lower it"
        )
    overlap = set(relations) & set(test.column("relation").to_pylist())
    if overlap:
        raise PipelineError(f"train and test share relations {sorted(overlap)}; check the files")
    held = set(np.random.default_rng(cfg.seed).permutation(relations)[:cfg.heldout_relations])
    is_held = pa.array([r in held for r in train.column("relation").to_pylist()])
    trained = train.filter(pc.invert(is_held))
    if own is not None and own.num_rows:  # none: the same table, so the same bytes
        clash = set(own.column("relation").to_pylist()) & (
            set(relations) | set(test.column("relation").to_pylist()))
        if clash:
            raise PipelineError(f"own relations {sorted(clash)[:5]} are FewRel relations; "
                                "rename them in data/own and run dvc repro prepare_own")
        trained = pa.concat_tables([trained, own.cast(trained.schema)]).combine_chunks()
    return {
        "train": cap(trained, cfg.max_per_relation),
        "val": cap(train.filter(is_held), cfg.max_per_relation),
        "test": cap(test, cfg.max_per_relation),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--train", type=Path, default=Path("data/fewshot/train_wiki.parquet"))
    parser.add_argument("--test", type=Path, default=Path("data/fewshot/val_wiki.parquet"))
    parser.add_argument("--out", type=Path, default=Path("data/benchmarks/fewrel"))
    parser.add_argument("--own", type=Path, default=None,
                        help="own relations that join the train part (prepare_own's "
                             "train.parquet)")
    stage_cli.add_params(parser)
    args = parser.parse_args(argv)
    cfg = load_section(SplitFewrelParams, "split_fewrel", args.params)
    own = read_fewshot(args.own) if args.own is not None else None
    parts = make_split(read_fewshot(args.train), read_fewshot(args.test), cfg, own)
    summary: dict[str, Any] = {"splits": {"split_0": {"seed": cfg.seed}}}
    with atomic_dir(args.out) as tmp:  # the folder appears whole or not at all
        for name, table in parts.items():
            write_parquet(table, tmp / "split_0" / f"{name}.parquet", FEWSHOT_SCHEMA)
            rels = sorted(set(table.column("relation").to_pylist()))
            summary["splits"]["split_0"][name] = rels
            print(f"{name}: {table.num_rows} sentences of {len(rels)} relations")
        if own is not None and own.num_rows:  # only then, so no own data writes no new key
            summary["splits"]["split_0"]["own"] = sorted(set(own.column("relation").to_pylist()))
        write_yaml(summary, tmp / "splits.yaml")
    return summary


if __name__ == "__main__":
    run_cli(main)
