"""Stage ``active_labelling``: which sentence should a user label next? A simulated user.

On the test relations of every split of a benchmark (NYT-25) and on transfer sets (SemEval),
each with the benchmark's checkpoints of every split (as ``evaluate`` and ``transfer`` score
them), a user starts an N-way episode with ``start`` labelled sentences per relation and a
pool of ``pool`` unlabelled ones per relation. A strategy ranks the pool, the user labels
the top sentence (it joins its relation's support), the posterior is refitted, and so on
until ``labels`` more sentences per relation on average; the accuracy on held-out queries
is recorded after every label (:mod:`model.predict.simulation`). Every method and strategy
labels on the same episodes, so every comparison is paired.

Writes ``metrics/active_labelling.json`` (:func:`pipeline.labelling_report.summarise`: per
set, method and strategy the accuracy at every labels-per-relation count, mean over splits
with a t interval, the paired gain over random, and the bar: REGRAB+BALD with
``bar_labels`` per relation minus random at the end), the tables in
``metrics/active_labelling.md`` and ``plots/active_labelling.csv`` (a DVC plot).

Usage:
    python -m stages.active_labelling --models models --metrics metrics/active_labelling.json \
        --table metrics/active_labelling.md --plot plots/active_labelling.csv \
        --relations data/raw/fewrel/pid2name.json [--params params.yaml]
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.predict.config import ActiveLabellingParams
from model.predict.labelling import fill_cache, label_set, plan
from pipeline import labelling_report, report, stage_cli
from pipeline.cluster import add_cluster_argument
from pipeline.config import load_section, set_threads
from pipeline.errors import run_cli
from pipeline.io import atomic_paths, check_writable, remove_stale_temporaries
from pipeline.workers import JobFiles, run_jobs, usable_workers

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--models", type=Path, default=Path("models"),
                        help="folder of the benchmarks' models folders")
    parser.add_argument("--metrics", type=Path, required=True, help="the summary (JSON)")
    parser.add_argument("--table", type=Path, required=True, help="markdown tables")
    parser.add_argument("--plot", type=Path, required=True,
                        help="accuracy vs labels per relation (CSV, a DVC plot)")
    parser.add_argument("--figure", type=Path, default=None,
                        help="the same curves drawn, one panel per set (PNG; default: the "
                             "plot path with .png)")
    parser.add_argument("--relations", type=Path, default=None,
                        help="relation names and descriptions (FewRel's pid2name.json format) "
                             "of the benchmark's test relations, read by priors with "
                             "model.prior.descriptions")
    stage_cli.add_params(parser)
    add_cluster_argument(parser, "labelling jobs")
    args = parser.parse_args(argv)
    stage_cli.start_logging()
    params = load_section(ActiveLabellingParams, "active_labelling", args.params)
    outputs = [args.metrics, args.table, args.plot, args.figure or args.plot.with_suffix(".png")]
    for path in outputs:
        check_writable(path)
        remove_stale_temporaries(path.parent, [path.name])
    device = stage_cli.threads_and_device(params.threads, params.device,
                                          f"{args.params} active_labelling.device")
    t0 = time.perf_counter()
    jobs, titles = plan(args, params)
    workers = usable_workers(params.workers, device, len(jobs))
    with torch.no_grad():
        # The workers' cores encode the frozen layers here, before the workers start.
        set_threads(params.threads * workers)
        cache, tokens = fill_cache(jobs, params, device)
        set_threads(params.threads)
        log.info("frozen layers of %d sentences in %.0f s", len(cache), time.perf_counter() - t0)
        results = run_jobs(
            functools.partial(label_set, params=params, device=device, cache=cache,
                              tokens=tokens), jobs,
            workers=workers, threads=params.threads,
            log=log, describe=lambda job: f"{job.set.name}, {job.split}'s checkpoints",
            cluster=args.cluster, gpu=device != "cpu",
            files=JobFiles(reads=lambda job: [job.models]))
    acc: dict[str, dict[str, dict[str, np.ndarray]]] = {
        name: {m: {} for m in params.methods} for name in titles}
    for job, result in zip(jobs, results, strict=True):
        for m, a in result.items():
            acc[job.set.name][m][job.split] = a
    axis = labelling_report.labels_axis(params.start, params.ways, params.labels)
    summary = labelling_report.summarise(acc, params.methods, axis, params.bar_labels)
    summary["protocol"] = {
        "benchmark": params.benchmark, "splits": sorted({job.split for job in jobs}),
        "episodes": params.episodes, "ways": params.ways, "start": params.start,
        "pool": params.pool, "queries": params.queries, "labels": params.labels * params.ways}
    splits = len(summary["protocol"]["splits"])
    note = (f"Accuracy % on held-out queries (mean over {splits} splits of {params.benchmark} "
            f"checkpoints ± t 95% CI of the split means) against labelled sentences per "
            f"relation. {params.episodes} episodes per set and split, {params.ways}-way, "
            f"starting from {params.start} labelled sentence(s) per relation with a pool of "
            f"{params.pool} unlabelled and {params.queries} held-out sentences per relation; "
            f"one pool sentence labelled at a time, {params.labels * params.ways} in all. "
            "Every strategy labels on the same episodes. `minus random`: the paired "
            "difference with random averaged over the curve, points.")
    with atomic_paths(*outputs) as (metrics_tmp, table_tmp, plot_tmp, figure_tmp):
        report.write_json_ordered(summary, metrics_tmp)
        table_tmp.write_text(labelling_report.markdown(summary, titles, note))
        plot_tmp.write_text(labelling_report.curves_csv(summary, list(titles)))
        labelling_report.plot_curves(summary, titles, figure_tmp)
    log.info("active_labelling done in %.0f s", time.perf_counter() - t0)
    return summary


if __name__ == "__main__":
    run_cli(main)
