"""Stage ``train``: meta-train every method in ``train.methods`` on every NYT-25 split.

For each split and method: N-way K-shot episodes from the training relations (ways and shots
drawn per step from ``train.ways`` / ``train.shots``, zero-shot episodes for ``regrab`` with
probability ``train.zero_shot_rate``), loss = -log p(y_Q | x_Q, x_S, y_S, G), AdamW with
linear warm-up and linear decay, validation on the validation relations from cached
encodings, best model kept. Training resumes from ``state.safetensors`` after a kill, and a finished
model whose params are unchanged is skipped.

Outputs ``{out}/split_{i}/{method}/model.safetensors`` (best validation; config, params, step,
graph, trained weights and the uncertainty on the validation relations that ``regrab-predict``
abstains by, added to a finished model of an older version that lacks it: loads without
params.yaml) and, while training, ``state.safetensors`` (the same plus optimizer, scheduler
and RNG states).

Usage:
    python -m stages.train --splits data/splits --graph data/graph/graph.parquet \
        --features data/features/transe.parquet \
        --relations data/wikidata/relations.parquet --out models [--params params.yaml]
"""


from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from model.config import ModelParams
from model.encoder.frozen_cache import LowerCache
from model.episodes import Setting
from model.files.checkpoint import MODEL_FILE, read_checkpoint
from model.methods import registry
from model.methods.registry import config_for_method
from model.training.config import load_comparison, load_train
from model.training.jobs import (
    Shared,
    load_graph,
    measure_finished,
    needs_measuring,
    plan,
    reused,
    split_dirs,
    train_one,
    warm_cache,
)
from model.training.loop import TokenCache
from pipeline import stage_cli
from pipeline.cluster import add_cluster_argument
from pipeline.config import load_section
from pipeline.errors import PipelineError, run_cli
from pipeline.io import file_digest, remove_stale_temporaries, write_json
from pipeline.workers import JobFiles, run_jobs, usable_workers

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--features", type=Path, required=True)
    parser.add_argument("--relations", type=Path, default=None,
                        help="relation labels (RELATIONS_SCHEMA), read by model.prior.text")
    parser.add_argument("--out", type=Path, required=True)
    stage_cli.add_params(parser)
    parser.add_argument("--benchmark", default=None,
                        help="an entry of params.yaml benchmarks: train with its `train` keys "
                             "in place of the train section's")
    add_cluster_argument(parser, "training jobs")
    args = parser.parse_args(argv)
    stage_cli.start_logging()
    cfg = load_train(args.params, args.benchmark)
    comparison = load_comparison(args.params, cfg.methods)
    model_params = load_section(ModelParams, "model", args.params)
    uses_graph = any(registry.get(m).uses_graph for m in (*cfg.methods, *comparison.methods))
    if uses_graph and model_params.prior.text and args.relations is None:
        # Fail before any work: the label prior reads the relations' labels.
        raise PipelineError("model.prior.text needs the relations' labels: pass --relations "
                            "data/wikidata/relations.parquet, or set model.prior.text: false")
    inputs = {"graph": file_digest(args.graph), "features": file_digest(args.features)}
    if args.relations is not None:
        inputs["relations"] = file_digest(args.relations)
    device = stage_cli.threads_and_device(cfg.threads, cfg.device, "params.yaml train.device")
    graph = load_graph(args.graph, args.features, args.relations) if uses_graph else None
    # summary.json is written atomically too: a kill during that write leaves its temporary.
    remove_stale_temporaries(args.out)
    t0 = time.perf_counter()
    settings = [Setting.parse(s) for s in cfg.per_setting] or [None]
    if not any(s is None or s.shots > 0 or registry.get(m).zero_shot
               for m in (*cfg.methods, *comparison.methods) for s in settings):
        raise PipelineError(
            f"nothing to train: train.per_setting {list(cfg.per_setting)} is zero-shot only, "
            f"and none of train.methods {list(cfg.methods)} has zero-shot models; add a "
            "setting with shots (e.g. 5w1s) or a zero-shot method (regrab)")
    configs = {m: config_for_method(model_params, m) for m in (*cfg.methods,
                                                               *comparison.methods)}
    jobs = plan(split_dirs(args.splits, cfg.splits), args.out, cfg, comparison, configs,
                inputs)
    done = [reused(job) for job in jobs]
    todo = [job for job, summary in zip(jobs, done, strict=True) if summary is None]
    unmeasured = [job for job, summary in zip(jobs, done, strict=True) if summary is not None
                  and needs_measuring(read_checkpoint(job.out / MODEL_FILE))]
    workers = usable_workers(cfg.workers, device, len(todo))
    log.info("%d models, %d to train, %d worker(s)", len(jobs), len(todo), workers)
    shared = Shared(configs, graph, device, TokenCache(), LowerCache())
    if todo or unmeasured:
        t_warm = time.perf_counter()
        warm_cache([*todo, *unmeasured], cfg, shared)
        log.info("frozen layers encoded for %d split(s) in %.0f s",
                 len({job.split_dir for job in [*todo, *unmeasured]}),
                 time.perf_counter() - t_warm)
    for job in unmeasured:
        measure_finished(job, shared)
    # Forked workers inherit ``shared`` (graph, tokens, warm cache) through the closure; one
    # torch thread each (threads) uses the cores better than one process with several. On a
    # failure a model still training on another worker finishes (and is reused next run).
    # On a cluster a job gets its split and its model folder, and sends the folder back.
    trained = iter(run_jobs(lambda job: train_one(job, shared), todo, workers=workers,
                            threads=cfg.threads, describe=lambda job: job.name, log=log,
                            cluster=args.cluster, gpu=device != "cpu",
                            files=JobFiles(reads=lambda job: [job.split_dir],
                                           writes=lambda job: [job.out])))
    summaries = [summary if summary is not None else next(trained) for summary in done]
    log.info("%d models in %.1f s", len(summaries), time.perf_counter() - t0)
    write_json({"models": summaries}, args.out / "summary.json")
    return {"models": summaries}


if __name__ == "__main__":
    run_cli(main)
