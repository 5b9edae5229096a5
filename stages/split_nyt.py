"""Split the NYT-25 relations into disjoint train / val / test relation sets.

The paper samples 10 training, 5 validation and 10 test relations once; we
draw one split per seed so results can be averaged. Each split is written as
``split_<i>/{train,val,test}.parquet`` and ``splits.yaml`` lists the
relations of every split.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import stage_cli
from pipeline.config import load_section
from pipeline.data_sections import SplitParams, check_seeds
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_dir, read_fewshot, write_parquet, write_yaml
from pipeline.schemas import FEWSHOT_SCHEMA

PARTS = ("train", "val", "test")


def split_relations(relations: list[str], seed: int, sizes: dict[str, int]) -> dict[str, list[str]]:
    """Draw disjoint relation sets of the given sizes with a seeded permutation."""
    needed = sum(sizes.values())
    if needed > len(relations):
        raise PipelineError(
            f"split asks for {needed} relations ({sizes}) but only {len(relations)} are usable; "
            "lower split_nyt.*_relations or split_nyt.min_instances"
        )
    order = np.random.default_rng(seed).permutation(sorted(relations))
    parts: dict[str, list[str]] = {}
    start = 0
    for part in PARTS:
        parts[part] = sorted(str(r) for r in order[start:start + sizes[part]])
        start += sizes[part]
    return parts


def make_splits(table: pa.Table, out: Path, seeds: list[int], sizes: dict[str, int],
                min_instances: int) -> dict[str, Any]:
    """Write one folder per seed and return the ``splits.yaml`` content."""
    check_seeds(seeds)
    counts = table.group_by("relation").aggregate([("instance_id", "count")]).to_pydict()
    per_relation = dict(zip(counts["relation"], counts["instance_id_count"], strict=True))
    too_small = {r: n for r, n in sorted(per_relation.items()) if n < min_instances}
    usable = sorted(r for r in per_relation if r not in too_small)
    if too_small:
        print(f"skipped {len(too_small)} relations with fewer than {min_instances} instances: "
              f"{too_small}")
    summary: dict[str, Any] = {
        "min_instances": min_instances,
        "skipped_relations": too_small,
        "splits": {},
    }
    for index, seed in enumerate(seeds):
        parts = split_relations(usable, seed, sizes)
        folder = out / f"split_{index}"
        for part, relations in parts.items():
            mask = pc.is_in(table["relation"], value_set=pa.array(relations, pa.string()))
            write_parquet(table.filter(mask), folder / f"{part}.parquet", FEWSHOT_SCHEMA)
        summary["splits"][f"split_{index}"] = {"seed": seed, **parts}
    write_yaml(summary, out / "splits.yaml")
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--data", default="data/fewshot/val_nyt.parquet")
    parser.add_argument("--out", default="data/splits")
    stage_cli.add_params(parser)
    args = parser.parse_args(argv)
    cfg = load_section(SplitParams, "split_nyt", args.params)
    sizes = {part: getattr(cfg, f"{part}_relations") for part in PARTS}
    table = read_fewshot(args.data)
    with atomic_dir(args.out) as tmp:  # the folder appears whole or not at all
        summary = make_splits(table, tmp, list(cfg.seeds), sizes, cfg.min_instances)
    print(f"wrote {len(summary['splits'])} splits of {sizes} relations to {args.out}")


if __name__ == "__main__":
    run_cli(main)
