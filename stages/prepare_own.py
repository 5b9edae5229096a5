"""Stage ``prepare_own``: check a team's own labelled relations and split off a held-out part.

Reads ``data/own`` (FewRel-format ``.json``, regrab-predict ``.jsonl``, names in
``relations.json``; :mod:`model.own_data`), refuses a relation that is a benchmark's relation
(the keys of ``--test`` and ``--train`` files, and the names of ``--test`` files' relations),
and holds ``prepare_own.heldout_share`` of the relations out (seeded). Writes, all at once or
not at all:

- ``train.parquet``: the relations FewRel's meta-training gets (``split_fewrel --own``);
- ``heldout.parquet``: the held-out relations, which ``evaluate_own`` scores;
- ``relations.json``: every own relation's ``[name, description]`` (pid2name format);
- ``summary.json``: files, sentences and skipped rows, each relation's part.

A folder with no data file (a README alone) gives empty tables: no own relations.

Usage:
    python -m stages.prepare_own --own data/own --test data/fewshot/val_nyt.parquet \
        data/fewshot/val_wiki.parquet --train data/fewshot/train_wiki.parquet \
        --out data/own_prepared [--params params.yaml]
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model.own_data import PrepareOwnParams, Reserved, prepare
from pipeline import stage_cli
from pipeline.config import load_section
from pipeline.errors import run_cli
from pipeline.io import atomic_dir, read_fewshot, write_json, write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--own", type=Path, default=Path("data/own"),
                        help="the folder of own labelled relations")
    parser.add_argument("--test", type=Path, nargs="*", default=[],
                        help="benchmark test files (FEWSHOT_SCHEMA): their relations' keys and "
                             "names are refused")
    parser.add_argument("--train", type=Path, nargs="*", default=[],
                        help="benchmark training files: their relations' keys are refused")
    parser.add_argument("--out", type=Path, default=Path("data/own_prepared"))
    stage_cli.add_params(parser)
    args = parser.parse_args(argv)
    cfg = load_section(PrepareOwnParams, "prepare_own", args.params)
    reserved = [Reserved.from_table(path.stem, role, read_fewshot(path))
                for role, paths in (("test", args.test), ("training", args.train))
                for path in paths]
    train, heldout, texts, summary = prepare(args.own, cfg, reserved)
    with atomic_dir(args.out) as tmp:  # the folder appears whole or not at all
        write_parquet(train, tmp / "train.parquet", FEWSHOT_SCHEMA)
        write_parquet(heldout, tmp / "heldout.parquet", FEWSHOT_SCHEMA)
        write_json({k: [n] if d is None else [n, d] for k, (n, d) in texts.items()},
                   tmp / "relations.json")  # pid2name format
        write_json(summary, tmp / "summary.json")
    if not summary["relations"]:
        print(f"{args.own}: no own relations (no data file)")
    else:
        print(f"{args.own}: {len(summary['relations'])} own relations, {train.num_rows} "
              f"sentences of {len(summary['train'])} for training, {heldout.num_rows} of "
              f"{len(summary['heldout'])} held out {summary['heldout']}")
    return summary


if __name__ == "__main__":
    run_cli(main)
