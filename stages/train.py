"""Stage ``train``: meta-train every method in ``train.methods`` on every NYT-25 split.

For each split and method: N-way K-shot episodes from the training relations (ways and shots
drawn per step from ``train.ways`` / ``train.shots``, zero-shot episodes for ``regrab`` with
probability ``train.zero_shot_rate``), loss = -log p(y_Q | x_Q, x_S, y_S, G), AdamW with
linear warm-up and linear decay, validation on the validation relations from cached
encodings, best model kept. Training resumes from ``state.safetensors`` after a kill, and a finished
model whose params are unchanged is skipped.

Outputs ``{out}/split_{i}/{method}/model.safetensors`` (best validation; config, params, step, graph
and trained weights: loads without params.yaml) and, while training, ``state.safetensors`` (the same
plus optimizer, scheduler and RNG states).

Usage:
    python -m stages.train --splits data/splits --graph data/graph/graph.parquet \
        --features data/features/transe.parquet \
        --relations data/wikidata/relations.parquet --out models [--params params.yaml]
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.encoder.frozen_cache import LowerCache
from model.episodes import Setting
from model.files.checkpoint import (
    LEGACY_FILES,
    MODEL_FILE,
    STATE_FILE,
    ModelParams,
    build_model,
    config_for_method,
)
from model.methods import registry
from model.prior.gcn import RelationGraph
from model.training.config import TrainConfig, fingerprint, load_comparison, load_train
from model.training.loop import TokenCache, frozen_states, prepare, train
from model.training.state import finish, finished_summary, resume
from pipeline.config import load_section, select_device, set_threads
from pipeline.errors import PipelineError, run_cli
from pipeline.io import file_digest, read_parquet, remove_stale_temporaries, write_json
from pipeline.schemas import GRAPH_SCHEMA, RELATIONS_SCHEMA
from pipeline.workers import run_jobs

log = logging.getLogger(__name__)


def split_dirs(splits: Path, names: tuple[str, ...]) -> list[Path]:
    """The split folders to use (every ``split_*`` when ``names`` is empty)."""
    if not splits.is_dir():
        raise PipelineError(f"{splits} is not a folder; run the split stage first")
    dirs = [splits / n for n in names] if names else sorted(splits.glob("split_*"))
    dirs = [d for d in dirs if d.is_dir()]
    if not dirs:
        raise PipelineError(f"no split_* folders in {splits}; run the split stage first")
    return dirs


def load_graph(graph_path: Path, features_path: Path,
               relations_path: Path | None = None) -> RelationGraph:
    """Read the relation graph, node features and (optionally) relation labels tables."""
    graph = read_parquet(graph_path, GRAPH_SCHEMA)
    features = read_parquet(features_path)
    if "relation" not in features.column_names or "embedding" not in features.column_names:
        raise PipelineError(f"{features_path} is not an embeddings table; rebuild data/features")
    relations = None if relations_path is None else read_parquet(relations_path,
                                                                 RELATIONS_SCHEMA)
    return RelationGraph.from_tables(graph, features, relations)


def dvclive_logger(out_dir: Path, step: int):
    """A dvclive logger for one model's curves (train/loss, val/acc) under its folder.

    On resume the rows logged after the last checkpoint are dropped first, so the curves
    hold one row per step however often the run was killed.
    """
    from dvclive import Live

    folder = out_dir / "dvclive"
    if step == 0:
        return Live(dir=str(folder), resume=False, save_dvc_exp=False, dvcyaml=None,
                    report=None, monitor_system=False)
    for tsv in (folder / "plots" / "metrics").rglob("*.tsv"):
        lines = tsv.read_text().splitlines(keepends=True)
        header = lines[0].rstrip("\n").split("\t") if lines else []
        if "step" not in header or not lines[0].endswith("\n"):
            tsv.unlink()  # cut by the kill before its first row: dvclive starts it again
            continue
        col = header.index("step")
        # A row the kill cut short lacks its newline (and maybe digits of its step): drop it.
        kept = [ln for ln in lines[1:] if ln.endswith("\n")
                and len(ln.split("\t")) == len(header)
                and ln.split("\t")[col].isdigit() and int(ln.split("\t")[col]) < step]
        tsv.write_text("".join(lines[:1] + kept))
    live = Live(dir=str(folder), resume=True, save_dvc_exp=False, dvcyaml=None,
                report=None, monitor_system=False)
    live.step = step
    return live


def train_one(split_dir: Path, method: str, out_dir: Path, model_params: ModelParams,
              cfg: TrainConfig, inputs: dict[str, str], graph: RelationGraph | None,
              device: str, tokens: TokenCache, lower_cache: LowerCache,
              seed_key: tuple[int, ...], on_step=None,
              setting: Setting | None = None) -> tuple[dict[str, Any], bool]:
    """Train one method on one split (or reuse the finished model).

    Returns:
        The model's summary, and whether it was trained now (False: reused as it was).
    """
    params = run_fingerprint(split_dir, method, model_params, cfg, inputs, setting)
    out_dir.mkdir(parents=True, exist_ok=True)
    # A kill during a checkpoint write leaves its temporary file (atomic_path cannot clean
    # up after SIGKILL); the checkpoint itself is intact, the temporary must not be cached.
    remove_stale_temporaries(out_dir)
    best_path, state_path = out_dir / MODEL_FILE, out_dir / STATE_FILE
    for legacy in LEGACY_FILES:  # pickles of an older version: never loaded, retrained
        if (out_dir / legacy).exists():
            log.info("%s: removing %s of an older version", out_dir, legacy)
            (out_dir / legacy).unlink()
    done = finished_summary(best_path, state_path, params)
    if done is not None:
        log.info("%s/%s: finished model with the same params, skipped", split_dir.name, method)
        return done, False
    sched = cfg.schedule(setting)
    run = prepare(split_dir, method, model_params, sched, graph, device, tokens, lower_cache,
                  cfg.seed, seed_key)
    resume(run, state_path, params)
    live = dvclive_logger(out_dir, run.step) if sched.dvclive else None
    result = train(run, out_dir, params, live, on_step)
    summary = {"split": split_dir.name, "method": method,
               "setting": None if setting is None else setting.name, "best_val_acc": run.best,
               "best_step": result["best_step"], "steps": sched.steps,
               "seconds": result["seconds"], "final_loss": result["final_loss"]}
    finish(best_path, summary, run.history)
    state_path.unlink(missing_ok=True)
    return summary, True


def run_fingerprint(split_dir: Path, method: str, model_params: ModelParams, cfg: TrainConfig,
                    inputs: dict[str, str], setting: Setting | None) -> dict[str, Any]:
    """What one model depends on (:func:`model.training.config.fingerprint`).

    A finished or half-trained model is reused only if its inputs are the same too: the
    params alone miss a new graph (build_graph.features) or a new split of the relations.
    """
    inputs = {**inputs, "train": file_digest(split_dir / "train.parquet"),
              "val": file_digest(split_dir / "val.parquet")}
    return fingerprint(config_for_method(model_params, method), cfg.schedule(setting), inputs)


def warm_cache(jobs: list[Job], model_params: ModelParams, cfg: TrainConfig,
               graph: RelationGraph | None, device: str, tokens: TokenCache,
               cache: LowerCache) -> None:
    """Encode, before any model trains, every frozen-layer output the ``jobs`` will read.

    One model per distinct frozen part (and label reading) fills the cache split by split,
    in the order one run after another would. Every job then starts from a copy of this
    cache, so a model's encodings never depend on which models ran before it, in the same
    process or another: one worker or several train the same models.
    """
    models: dict[tuple, Any] = {}
    for method in dict.fromkeys(job.method for job in jobs):
        model_cfg = config_for_method(model_params, method)
        model = build_model(model_cfg, graph if model_cfg.uses_graph else None).to(device)
        key = (LowerCache.frozen_key(model.encoder) if model.encoder.split > 0 else None,
               model.prior is not None and model.prior.config.text)
        models.setdefault(key, model)
    for split_dir in dict.fromkeys(job.split_dir for job in jobs):
        for (frozen, _), model in models.items():
            frozen_states(model, split_dir, cfg, tokens, cache if frozen is not None else None)


@dataclass(frozen=True)
class Job:
    """One model to train: a method on a split (and a setting under the paper's protocol)."""

    split_index: int
    split_dir: Path
    method: str
    setting_index: int
    setting: Setting | None
    out: Path
    cfg: TrainConfig  # the ``train`` section as this method trains (the comparison's capped)


#: What forked training workers share with the stage (set before they start).
_SHARED: dict[str, Any] = {}


def _run_job(job: Job) -> tuple[dict[str, Any], bool, float]:
    """Train (or reuse) one model from the shared state; its summary, trained?, seconds."""
    s = _SHARED
    start = time.perf_counter()
    summary, trained = train_one(
        job.split_dir, job.method, job.out, s["model_params"], job.cfg, s["inputs"],
        s["graph"], s["device"], s["tokens"], s["cache"].copy(),
        (job.split_index, registry.get(job.method).seed_stream, job.setting_index),
        setting=job.setting)
    return summary, trained, time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--features", type=Path, required=True)
    parser.add_argument("--relations", type=Path, default=None,
                        help="relation labels (RELATIONS_SCHEMA), read by model.prior.text")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--benchmark", default=None,
                        help="an entry of params.yaml benchmarks: train with its `train` keys "
                             "in place of the train section's")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
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
    set_threads(cfg.threads)
    device = select_device(cfg.device, "params.yaml train.device")
    graph = load_graph(args.graph, args.features, args.relations) if uses_graph else None
    # summary.json is written atomically too: a kill during that write leaves its temporary.
    remove_stale_temporaries(args.out)
    tokens, lower_cache = TokenCache(), LowerCache()
    t0 = time.perf_counter()
    settings = [Setting.parse(s) for s in cfg.per_setting] or [None]
    if not any(s is None or s.shots > 0 or registry.get(m).zero_shot
               for m in (*cfg.methods, *comparison.methods) for s in settings):
        raise PipelineError(
            f"nothing to train: train.per_setting {list(cfg.per_setting)} is zero-shot only, "
            f"and none of train.methods {list(cfg.methods)} has zero-shot models; add a "
            "setting with shots (e.g. 5w1s) or a zero-shot method (regrab)")
    capped = comparison.schedule(cfg)
    jobs = [Job(si, split_dir, method, j, setting,
                args.out / split_dir.name / method if setting is None
                else args.out / split_dir.name / method / setting.name,
                capped if method in comparison.methods else cfg)
            for si, split_dir in enumerate(split_dirs(args.splits, cfg.splits))
            for method in (*cfg.methods, *(comparison.methods if comparison.runs_on(
                split_dir.name) else ()))
            for j, setting in enumerate(settings)
            if setting is None or setting.shots > 0 or registry.get(method).zero_shot]
    # Models to train now (the rest are finished with the same fingerprint and reused).
    todo = [job for job in jobs if finished_summary(
        job.out / MODEL_FILE, job.out / STATE_FILE,
        run_fingerprint(job.split_dir, job.method, model_params, job.cfg, inputs, job.setting),
    ) is None]
    # CUDA does not survive a fork, and one process keeps a GPU busy: one worker there.
    workers = max(1, min(cfg.workers if device == "cpu" else 1, len(todo)))
    log.info("%d models, %d to train, %d worker(s)", len(jobs), len(todo), workers)
    if todo:
        t_warm = time.perf_counter()
        warm_cache(todo, model_params, cfg, graph, device, tokens, lower_cache)
        log.info("frozen layers encoded for %d split(s) in %.0f s",
                 len({job.split_dir for job in todo}), time.perf_counter() - t_warm)
    _SHARED.update(model_params=model_params, inputs=inputs, graph=graph,
                   device=device, tokens=tokens, cache=lower_cache)
    trained: list[float] = []  # seconds of the models trained (not reused) so far
    results: dict[int, dict[str, Any]] = {}

    def done(i: int, result: tuple[dict[str, Any], bool, float]) -> None:
        summary, was_trained, took = result
        results[i] = summary
        if was_trained:
            trained.append(took)
        log.info("%s", summary)
        left = sum(1 for job in todo if jobs.index(job) not in results)
        eta = left * (sum(trained) / len(trained) if trained else 0.0) / workers
        log.info("model %d of %d done (%s/%s); %.0f s so far, about %.0f min left",
                 len(results), len(jobs), jobs[i].split_dir.name, jobs[i].method,
                 time.perf_counter() - t0, eta / 60)

    try:
        # Forked workers inherit the graph, the tokens and the warm cache; one torch thread
        # each (threads) uses the cores better than one process with several. On a failure
        # a model still training on another worker finishes (and is reused by the next run).
        run_jobs(_run_job, jobs, workers, cfg.threads, done)
    finally:
        _SHARED.clear()
    summaries = [results[i] for i in range(len(jobs))]
    write_json({"seconds": round(time.perf_counter() - t0, 1), "models": summaries},
               args.out / "summary.json")
    return {"models": summaries}


if __name__ == "__main__":
    run_cli(main)
