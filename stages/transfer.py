"""Stage ``transfer``: score every benchmark's checkpoints on relations and text they never saw.

For each set of ``transfer.sets`` (SemEval-2010 by default; another set is one params entry)
and each benchmark of ``benchmarks`` with trained models, every method trained on every
split is scored with the untrained ``floor`` on the same episodes
(:mod:`model.evaluation.transfer`).
Relations with more than ``transfer.per_relation`` sentences are cut to that many (a seeded
random choice), so a large relation costs no more than a small one.

Writes ``metrics/transfer.json`` (DVC metrics: ``<set>.<benchmark>.<method>.<setting>``
accuracy %, ``paired.<set>.<benchmark>.<method>_minus_floor.<setting>.{diff,ci95}``,
``vs_regrab.<set>.<benchmark>.<method>_minus_regrab.<setting>.{diff,ci95}`` (paired on the
same episodes, t interval over splits), ``shuffled`` (the stress-test sets), ``ece...`` and
``priors.<set>.<benchmark>.<method>``: ways whose prior came from the graph, the relation's
name alone, or the shared fallback, and ways whose prior read a name and description, a name
only, or no text), the tables in
``metrics/transfer.md`` and everything behind them in ``metrics/transfer_report.json``.

Usage:
    python -m stages.transfer --models models --metrics metrics/transfer.json \
        --report metrics/transfer_report.json --table metrics/transfer.md [--params params.yaml]
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from model.episodes import Setting
from model.evaluation.config import EvalConfig, TransferParams
from model.evaluation.transfer import checkpoints, cut_relations, relation_texts, score_table
from model.evaluation.transfer_report import headline, markdown
from pipeline import report, stage_cli
from pipeline.cluster import add_cluster_argument
from pipeline.config import load_benchmarks, load_section
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_paths, check_writable, read_fewshot

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--models", type=Path, default=Path("models"),
                        help="folder of the benchmarks' models folders")
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--table", type=Path, required=True)
    stage_cli.add_params(parser)
    add_cluster_argument(parser, "scoring jobs")
    args = parser.parse_args(argv)
    stage_cli.start_logging()
    params = load_section(TransferParams, "transfer", args.params)
    base = load_section(EvalConfig, "evaluate", args.params)
    benchmarks = load_benchmarks(args.params)
    for out in (args.metrics, args.report, args.table):
        check_writable(out)
    settings = [Setting.parse(s) for s in params.settings]
    device = stage_cli.threads_and_device(base.threads, base.device,
                                          f"{args.params} evaluate.device")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, spec in params.sets.items():
        unknown = sorted(set(spec.benchmarks) - set(benchmarks))
        if unknown:
            raise PipelineError(f"transfer.sets.{name}.benchmarks names {unknown}, not in "
                                f"benchmarks ({', '.join(benchmarks)}); fix the names")
        path = Path(spec.data)
        if not path.is_file():
            raise PipelineError(f"transfer set {name}: {path} not found; add it to "
                                "prepare_fewshot.datasets and run dvc repro prepare_fewshot")
        table = cut_relations(read_fewshot(path), params.per_relation, params.seed)
        table, descriptions = relation_texts(name, spec, table, params.seed)
        for bench in benchmarks:
            if spec.benchmarks and bench not in spec.benchmarks:
                continue
            folder = args.models / bench
            if not folder.is_dir():
                log.warning("no models for %s under %s; skipped", bench, args.models)
                continue
            log.info("%s: %s checkpoints on %d sentences", name, bench, table.num_rows)
            with torch.no_grad():
                # The evaluate section's methods trained on every split (the comparison's
                # run on fewer splits and episodes).
                found = checkpoints(folder, list(base.methods))
                methods = [m for m in base.methods if all(m in p for p in found.values())]
                out = score_table(f"{name} ({path})", table, folder, base, settings, device,
                                  methods=methods or None, episodes=params.episodes,
                                  listed=table.column("relation").to_pylist(),
                                  workers=base.workers, descriptions=descriptions,
                                  nota=spec.nota, unequal=spec.unequal, cluster=args.cluster,
                                  skip_unplayable=True)
            results.setdefault(name, {})[bench] = out["summary"]
    if not results:
        raise PipelineError(f"no benchmark has models under {args.models}; run dvc repro train")
    with atomic_paths(args.metrics, args.report, args.table) as (m_tmp, r_tmp, t_tmp):
        report.write_json_ordered(
            headline(results, [n for n in results if params.sets[n].shuffle]), m_tmp)
        report.write_json_ordered(results, r_tmp, digits=4)
        t_tmp.write_text(markdown(results, params))
    return results


if __name__ == "__main__":
    run_cli(main)
