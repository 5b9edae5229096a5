"""Stage ``headline``: the few numbers of one benchmark that ``dvc exp show`` lists.

``evaluate`` and ``transfer`` write hundreds of numbers per benchmark (every method, setting,
paired difference, calibration and NOTA value); declared as DVC metrics they made
``dvc exp show`` a table of about 950 columns. They stay in their files (DVC outputs, read
with ``dvc metrics show metrics/nyt25.json``); this stage keeps, for one benchmark:

- ``<benchmark>.<setting>``: REGRAB's accuracy %, mean over splits, for every few-shot setting
  (zero-shot ones have no baseline to beat);
- ``<benchmark>.<set>``: REGRAB's accuracy % on each transfer set with this benchmark's
  checkpoints, mean over the transfer settings;
- ``<benchmark>.best.<setting>`` and ``<benchmark>.best.<set>``: the same for the strongest
  baseline (per setting the best of them; per transfer set the one with the best mean).

Baselines are every method but REGRAB, its ablations (``regrab_*``) and ``floor`` (the
untrained encoder, a lower bound rather than a competitor). The numbers are copied or averaged
from the input files, never recomputed from episodes, so they agree with the full tables.

Plain ``dvc exp show`` is still wider than a terminal: it adds a column for every key of
``params.yaml`` and every stage dep (about 250), and DVC has no setting to hide them. Each
:data:`VIEWS` entry is a ``--keep`` pattern whose table fits 200 columns with an experiment row
(``tests/stages/test_headline.py`` renders them with DVC's own table code)::

    dvc exp show --drop '.*' --keep 'Experiment|Created|(nyt25|fewrel)[.][0-9s]'

The full tables: ``metrics/<benchmark>.md`` and ``metrics/transfer.md``; every number:
``dvc metrics show --json metrics/nyt25.json``; what changed against a revision:
``dvc metrics diff HEAD --targets metrics/nyt25.json metrics/transfer.json``.

Usage:
    python -m stages.headline --benchmark nyt25 --metrics metrics/nyt25.json \\
        --transfer metrics/transfer.json --out metrics/nyt25_headline.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pipeline import stage_cli
from pipeline.errors import PipelineError, run_cli
from pipeline.headline import headline
from pipeline.report import REFERENCE, write_json_ordered

#: ``dvc exp show --drop '.*' --keep <pattern>`` views of the headline for the default
#: benchmarks (``--keep`` matches column names from their start).
VIEWS = {
    "regrab": r"Experiment|Created|(nyt25|fewrel)[.][0-9s]",
    "nyt25 vs best": r"Experiment|Created|nyt25[.](best[.])?[0-9]",
    "fewrel vs best": r"Experiment|Created|fewrel[.](best[.])?[0-9]",
    "transfer and run": (r"Experiment|Created|(nyt25|fewrel)[.](best[.])?semeval"
                         r"|build_graph[.]features$|model[.]encoder[.]name$|train[.]steps$"),
}


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise PipelineError(f"cannot read metrics file {path}: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = stage_cli.parser(__doc__, paragraph=True, prog="python -m stages.headline")
    parser.add_argument("--benchmark", required=True, help="key of params.yaml benchmarks")
    parser.add_argument("--metrics", required=True, type=Path,
                        help="the benchmark's metrics JSON (stage evaluate)")
    parser.add_argument("--transfer", type=Path, default=None,
                        help="metrics JSON of stage transfer (optional)")
    parser.add_argument("--out", required=True, type=Path, help="headline metrics JSON")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Write the headline metrics of one benchmark; return them."""
    args = build_parser().parse_args(argv)
    transfer = _read(args.transfer) if args.transfer is not None else None
    numbers, which = headline(args.benchmark, _read(args.metrics), transfer)
    write_json_ordered(numbers, args.out)
    row = numbers[args.benchmark]
    for column, method in which.items():
        print(f"{args.benchmark} {column}: {REFERENCE} {row[column]:.2f}, "
              f"strongest baseline {method} {row['best'][column]:.2f}")
    return numbers


if __name__ == "__main__":
    run_cli(main)
