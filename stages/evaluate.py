"""Stage ``evaluate``: few-shot, zero-shot and none-of-the-above accuracy and calibration.

Scores every trained method on the test relations of each split (:mod:`model.evaluation.splits`:
the episodes, NOTA thresholds and calibration measures), then writes the DVC metrics, the
report, tables and plots. Every number is computed per split and reported as the mean over
splits with a Student-t 95% interval of the split means (:mod:`pipeline.report`); the
pooled-episode interval is a secondary number in the report.

Usage:
    python -m stages.evaluate --splits data/splits --models models \
        --metrics metrics/nyt25.json --plot plots/nyt25.png [--params params.yaml]
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.encoder.frozen_cache import LowerCache
from model.evaluation import shots
from model.evaluation.config import EvalConfig
from model.evaluation.splits import evaluate_split, merge_shares, method_shares
from model.training.config import ComparisonConfig, load_comparison
from pipeline import detection, plots, report, stage_cli, support_noise
from pipeline.cluster import add_cluster_argument
from pipeline.config import load_section
from pipeline.errors import PipelineError, run_cli
from pipeline.fewrel import load_relation_descriptions
from pipeline.io import atomic_paths, remove_stale_temporaries
from pipeline.workers import JobFiles, run_jobs, usable_workers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Job:
    """Some methods of one split, scored in one process from an empty frozen-layer cache."""

    split_dir: Path
    split_index: int
    cfg: EvalConfig  # its methods, and whether it scores the floor
    capped: dict[str, int]
    methods: tuple[str, ...]  # every method of the split, in order


def split_jobs(splits: Path, names: tuple[str, ...], cfg: EvalConfig,
               comparison: ComparisonConfig, workers: int) -> list[Job]:
    """The jobs of ``names``: one per split, or, with fewer splits than ``workers``, the
    split's methods dealt round-robin into one job per worker (the first also scores the
    floor)."""
    jobs = []
    for i, name in enumerate(names):
        tail = name.rsplit("_", 1)[-1]
        index = int(tail) if tail.isdigit() else i
        extra = comparison.methods if comparison.runs_on(name) else ()
        methods = (*cfg.methods, *extra)
        capped = {m: comparison.episodes for m in extra}
        jobs.extend(Job(splits / name, index, part, capped, methods)
                    for part in method_shares(cfg, methods, len(names), workers))
    return jobs


def score_job(job: Job, models: Path, device: str, descriptions: dict[str, str | None]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The job's cells and NOTA cells."""
    with torch.no_grad():
        return evaluate_split(job.split_dir, models, job.cfg, device, LowerCache(),
                              job.split_index, job.capped, descriptions)


def score_jobs(jobs: list[Job], models: Path, cfg: EvalConfig, device: str,
               descriptions: dict[str, str | None] | None = None, cluster: str | None = None
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Cells and NOTA cells per split, in the order of the split's methods (floor last);
    on the Dask scheduler at ``cluster``, if given."""
    results = run_jobs(functools.partial(score_job, models=models, device=device,
                                         descriptions=dict(descriptions or {})), jobs,
                       workers=usable_workers(cfg.workers, device, len(jobs)),
                       threads=cfg.threads, log=log, cost=lambda job: len(job.cfg.methods),
                       describe=lambda job: f"{job.split_dir.name}: "
                                            + ", ".join(job.cfg.methods),
                       cluster=cluster, gpu=device != "cpu", files=JobFiles(
                           reads=lambda job: [job.split_dir, models / job.split_dir.name]))
    return merge_shares((job.split_dir.name, job.methods, *result)
                        for job, result in zip(jobs, results, strict=True))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--metrics", type=Path, required=True,
                        help="DVC metrics: headline accuracies, paired diffs, ECE, NOTA")
    parser.add_argument("--plot", type=Path, required=True, help="accuracy bar chart (PNG)")
    parser.add_argument("--table", type=Path, default=None,
                        help="markdown tables (default: metrics path with .md)")
    parser.add_argument("--report", type=Path, default=None,
                        help="full report JSON (default: <metrics stem>_report.json)")
    parser.add_argument("--reliability", type=Path, default=None,
                        help="reliability diagrams (default: <plot stem>_reliability.png)")
    parser.add_argument("--selective", type=Path, default=None,
                        help="selective-prediction curves CSV (default: <plot stem>_selective.csv)")
    parser.add_argument("--roc", type=Path, default=None,
                        help="out-of-set detection ROC curves CSV (default: <plot stem>"
                             "_detection.csv)")
    parser.add_argument("--benchmark", default="nyt25",
                        help="name of the benchmark: prefix of the headline metrics, plot title")
    parser.add_argument("--relations", type=Path, default=None,
                        help="relation names and descriptions (FewRel's pid2name.json format): "
                             "descriptions of test relations outside a model's graph, read by "
                             "priors with model.prior.descriptions")
    stage_cli.add_params(parser)
    add_cluster_argument(parser, "scoring jobs")
    args = parser.parse_args(argv)
    stage_cli.start_logging()
    cfg = load_section(EvalConfig, "evaluate", args.params)
    device = stage_cli.threads_and_device(cfg.threads, cfg.device, "params.yaml evaluate.device")
    if not args.splits.is_dir():
        raise PipelineError(f"{args.splits} is not a folder; run the split stage first")
    names = cfg.splits or tuple(sorted(p.name for p in args.splits.glob("split_*")
                                       if (args.models / p.name).is_dir()))
    if not names:
        raise PipelineError(f"no split in {args.splits} has models in {args.models}; train first")
    outputs = [args.metrics,
               args.report or args.metrics.with_name(args.metrics.stem + "_report.json"),
               args.table or args.metrics.with_suffix(".md"), args.plot,
               args.reliability or args.plot.with_name(args.plot.stem + "_reliability.png"),
               args.selective or args.plot.with_name(args.plot.stem + "_selective.csv"),
               args.roc or args.plot.with_name(args.plot.stem + "_detection.csv")]
    for path in outputs:  # what a kill during the last write left, as train removes its own
        remove_stale_temporaries(path.parent, [path.name])
    t0 = time.perf_counter()
    comparison = load_comparison(args.params, cfg.methods)
    jobs = split_jobs(args.splits, names, cfg, comparison, usable_workers(cfg.workers, device))
    said = load_relation_descriptions(args.relations)
    per_split, nota = score_jobs(jobs, args.models, cfg, device, said, args.cluster)
    summary = (report.summarise(per_split, nota) | detection.summarise_uncertainty(per_split, nota)
               | support_noise.summarise(per_split))
    metrics = report.headline_metrics(summary, args.benchmark,
                                      (*cfg.methods, *comparison.methods))
    metrics |= detection.headline_detection(summary) | support_noise.headline(summary)
    summary["shots"] = shots.summarise(per_split, cfg.unequal_settings)
    if shots.headline(summary["shots"]):
        metrics["shots"] = shots.headline(summary["shots"])
    settings = list(cfg.settings) + [f"{cfg.noisy}_noisy"] * (cfg.noisy is not None)
    unequal = [n for s in cfg.unequal_settings for n in shots.UnequalSetting.parse(s).names()]
    note = (f"Test relations of {len(names)} split(s), {cfg.episodes} episodes per setting "
            f"and split ({cfg.unequal_episodes} for the unequal-shot ones: {{N}}w1-5s, its "
            "_cut1 twin cut to one sentence per way, its _step protocol), "
            f"{cfg.queries} queries per way. `floor`: frozen pre-trained encoder, "
            "entity-mean pooling, cosine similarity to the renormalised mean of the unit "
            "support encodings (no training); its ECE reflects an arbitrary temperature of 1 "
            "and is no calibration claim, its AURC (a ranking measure) is comparable.")
    # All outputs are renamed into place together at the end: a failed write (disk full)
    # leaves the previous metrics, tables and plots, never new metrics beside old plots.
    with atomic_paths(*outputs) as (metrics_tmp, report_tmp, table_tmp, plot_tmp,
                                    reliability_tmp, selective_tmp, roc_tmp):
        report.write_json_ordered(metrics, metrics_tmp)
        report.write_json_ordered(summary, report_tmp, digits=4)
        table_tmp.write_text(report.markdown_report(summary, settings + unequal, note)
                             + "\n".join(detection.markdown_detection(summary)
                                         + support_noise.markdown(summary)
                                         + shots.markdown(summary["shots"])) + "\n")
        plots.plot_accuracy(summary, settings, plot_tmp, args.benchmark)
        plots.plot_reliability(summary, list(cfg.methods), settings, reliability_tmp)
        report.write_selective_csv(summary, selective_tmp)
        detection.write_roc_csv(summary, roc_tmp)
    log.info("evaluate done in %.0f s", time.perf_counter() - t0)
    return metrics


if __name__ == "__main__":
    run_cli(main)
