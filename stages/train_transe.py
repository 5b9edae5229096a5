"""Stage train_transe: TransE relation features from Wikidata triples.

Reads triples (``TRIPLES_SCHEMA``), holds out a small slice for a filtered-MRR
check, trains TransE (``model/transe/model.py``) on the rest and writes one embedding
per relation (``embeddings_schema(dim)``). Checkpoints (tables, optimiser
moments, epoch, generator state, config) are written atomically every
``checkpoint_every`` epochs; a rerun with the same data and params resumes from
the last one and ends with the same embeddings (bit for bit on CPU) as a run
that was never stopped (:mod:`model.transe.training`).

The report (a git-tracked DVC output) holds only what the data and params decide, so a rerun
writes it byte for byte, resumed or not; how the run went (``train_seconds``,
``triples_per_second``, ``resumed_from_epoch``) goes to ``<report stem>.timing.json`` beside
it, which git ignores and DVC does not track.

Usage:
    python -m stages.train_transe --triples data/wikidata/triples.parquet \\
        --out data/features/transe.parquet --checkpoint-dir data/checkpoints/transe \\
        --report data/features/transe.metrics.json [--params params.yaml]
"""

from __future__ import annotations

import os

# libgomp reads OMP_WAIT_POLICY once, when torch is loaded. With its default spin-waiting,
# 2 threads ran 5-10x slower than 1 on a shared 2-core machine (measured); passive waiting
# keeps the 2-thread speed-up. It only takes effect when this module loads torch first
# (python -m stages.train_transe); a value set by the caller wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# MKL's reproducibility conditions: no thread count chosen at run time (MKL_DYNAMIC is TRUE
# by default). params.yaml's one thread is what makes the output independent of the load.
os.environ.setdefault("MKL_DYNAMIC", "FALSE")
os.environ.setdefault("OMP_DYNAMIC", "FALSE")

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

from model.transe.config import TrainTransEParams  # noqa: E402
from model.transe.training import train  # noqa: E402
from pipeline import stage_cli  # noqa: E402
from pipeline.config import load_section  # noqa: E402
from pipeline.errors import run_cli  # noqa: E402
from pipeline.io import read_parquet, write_json, write_parquet  # noqa: E402
from pipeline.schemas import TRIPLES_SCHEMA, embeddings_schema  # noqa: E402

#: Report keys that change from run to run with the machine's speed, not with the data.
TIMING_KEYS = ("train_seconds", "triples_per_second", "resumed_from_epoch")


def timing_path(report: Path) -> Path:
    """Where the wall-clock numbers of ``report`` go: ``transe.metrics.json`` ->
    ``transe.timing.json``."""
    return report.with_name(report.name.split(".")[0] + ".timing.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--triples", required=True, type=Path, help="TRIPLES_SCHEMA Parquet")
    parser.add_argument("--out", required=True, type=Path, help="relation embeddings Parquet")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="folder for the resumable checkpoint (none: no checkpoints)",
    )
    parser.add_argument(
        "--report",
        type=Path,
        default=None,
        help="metrics JSON (default: OUT with suffix .metrics.json)",
    )
    stage_cli.add_params(parser)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Train TransE on the triples and write relation embeddings plus a metrics report.

    Returns:
        The report, with the wall-clock numbers that go to :func:`timing_path` instead of
        the report file.
    """
    args = parse_args(argv)
    params = load_section(TrainTransEParams, "train_transe", args.params)
    device = stage_cli.threads_and_device(params.threads, params.device,
                                          "params.yaml train_transe.device")
    table, report = train(read_parquet(args.triples, TRIPLES_SCHEMA), params, device,
                          args.checkpoint_dir)
    dim = params.model.dim
    write_parquet(table, args.out, embeddings_schema(dim))
    report_path = args.report or args.out.with_suffix(".metrics.json")
    timing = {key: report[key] for key in TIMING_KEYS if key in report}
    write_json({k: v for k, v in report.items() if k not in TIMING_KEYS}, report_path)
    write_json(timing, timing_path(report_path))
    print(f"wrote {table.num_rows} relation embeddings (dim {dim}) to {args.out}; trained in "
          f"{timing.get('train_seconds')} s ({timing.get('triples_per_second')} triples/s)")
    return report


if __name__ == "__main__":
    run_cli(main)
