"""Stage ``check_params``: every section of ``params.yaml`` checked before any other stage runs.

Each stage validates its own section as it starts, but DVC runs stages in order: a bad value
for ``train`` (``dvc exp run -S train.steps=-5``) used to surface only after every stale stage
upstream of ``train`` had run. This stage is upstream of all of them (``fetch`` reads its
output) and depends on the whole of ``params.yaml``, so DVC runs it first whenever a value
changed, and a mistake is one ``error:`` line before any work.

:func:`model.params_checks.check_params` validates every section with its registered schema
(``pipeline.sections``), then the checks that span sections, made by the stages' own loaders
where they exist (``load_train`` merges ``benchmarks.<name>.train`` into ``train``;
``comparison`` caps ``train.ways``), plus the checks a stage makes on its section as it starts
(``split_nyt.seeds``, ``prepare_fewshot.datasets``, the encoder name).
``orchestration.overrides --check`` and the Prefect flow run this stage's command on a params
tree with their overrides applied (``--overrides``, left out of ``--help``: a file that
``orchestration.checks`` writes), so the overrides' sections are checked first and a failure
names them.

The output holds a fixed sentence, so a stage that reads it is not made stale by a new value
it does not read: DVC reruns only what the changed keys feed.

Usage:
    python -m stages.check_params --params params.yaml --out data/params.checked
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from model.params_checks import check_params
from pipeline import stage_cli
from pipeline.config import load_params
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path

#: What the output holds: the same bytes for every valid params file.
CHECKED = "every section of params.yaml passed its schema and the checks across sections\n"


def build_parser() -> argparse.ArgumentParser:
    parser = stage_cli.parser(__doc__, paragraph=True, raw=True)
    stage_cli.add_params(parser, help="the params file to check (default: params.yaml)")
    parser.add_argument("--out", type=Path, required=True,
                        help="file written when every check passes (a fixed sentence)")
    # The flow's and `regrab-overrides`' request: {before, after, changed, root} as YAML.
    parser.add_argument("--overrides", type=Path, default=None, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    """Check the whole params file; write ``--out`` only when it passes."""
    args = build_parser().parse_args(argv)
    if args.overrides is not None:
        request = yaml.safe_load(args.overrides.read_text())
        if not isinstance(request, dict) or not {"before", "after", "changed",
                                                 "root"} <= set(request):
            raise PipelineError(f"{args.overrides} is not a params check request; it holds "
                                "before, after, changed and root (orchestration.checks)")
        check_params(request["before"], request["after"], request["changed"],
                     Path(request["root"]))
    else:
        params = load_params(args.params)
        check_params(params, params, {}, Path.cwd())
    with atomic_path(args.out) as tmp:
        tmp.write_text(CHECKED)
    print(f"{args.params}: every section checked")


if __name__ == "__main__":
    run_cli(main)
