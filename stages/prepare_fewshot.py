"""Convert FewRel-format JSON files into one validated Parquet table each.

Each ``RAW/<name>.json`` listed in ``prepare_fewshot.datasets`` is parsed by
:mod:`pipeline.fewrel` into one ``FEWSHOT_SCHEMA`` table; records it skips are
counted by reason in ``report.json``. The output folder appears whole or not at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipeline import stage_cli
from pipeline.config import load_section
from pipeline.data_sections import PrepareFewshotParams, check_datasets
from pipeline.errors import run_cli
from pipeline.fewrel import convert, load_json, load_relation_names
from pipeline.io import atomic_dir, write_json, write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA


def prepare(raw: Path, out: Path, datasets: list[str], pid2name: Path | None) -> dict[str, Any]:
    """Convert each ``raw/<name>.json``; write ``out/<name>.parquet`` and ``out/report.json``.

    Every dataset is converted into a temporary folder that replaces ``out`` only when all
    succeeded, so a failure in any dataset leaves the previous ``out`` (or none).
    """
    check_datasets(datasets)
    names, names_skipped = load_relation_names(pid2name)
    if names_skipped:
        print(f"{pid2name}: skipped {names_skipped} malformed entries (their ids stand in)")
    reports: dict[str, Any] = {}
    with atomic_dir(out) as tmp:
        for name in datasets:
            table, report = convert(name, load_json(raw / f"{name}.json"), names)
            write_parquet(table, tmp / f"{name}.parquet", FEWSHOT_SCHEMA)
            report["relation_names_skipped"] = names_skipped
            reports[name] = report
            print(f"{name}: kept {report['kept']} instances of {report['relations']} "
                  f"relations, skipped {report['skipped']} "
                  f"{report['skipped_by_reason'] or ''}".rstrip())
        write_json(reports, tmp / "report.json")
    return reports


def main(argv: list[str] | None = None) -> None:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--raw", default="data/raw/fewrel", help="folder with FewRel JSON files")
    parser.add_argument("--out", default="data/fewshot")
    parser.add_argument("--pid2name", default=None, help="defaults to RAW/pid2name.json")
    stage_cli.add_params(parser)
    args = parser.parse_args(argv)
    cfg = load_section(PrepareFewshotParams, "prepare_fewshot", args.params)
    raw = Path(args.raw)
    pid2name = Path(args.pid2name) if args.pid2name else raw / "pid2name.json"
    prepare(raw, Path(args.out), list(cfg.datasets), pid2name)


if __name__ == "__main__":
    run_cli(main)
