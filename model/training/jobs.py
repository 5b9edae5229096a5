"""The ``train`` stage's jobs: one model per split, method and setting, planned, reused when
finished with the same fingerprint, trained, and measured.

:func:`plan` lists every model of the stage with its fingerprint (its config, schedule and the
digests of the files it reads); :func:`reused` gives a finished model's summary when that
fingerprint is unchanged; :func:`warm_cache` encodes the frozen layers once before any model
trains; :func:`train_one` trains one model (resuming from its ``state.safetensors``);
:func:`measure_finished` adds what an older version's finished model lacks. ``stages.train``
reads the params and runs the jobs; ``scripts/gpu_table.py`` reads the graph with
:func:`load_graph`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.config import RegrabConfig
from model.encoder.frozen_cache import LowerCache
from model.episodes import Setting
from model.files.checkpoint import (
    LEGACY_FILES,
    MODEL_FILE,
    STATE_FILE,
    Checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from model.methods import registry
from model.methods.registry import build_model
from model.prior.graph import RelationGraph
from model.training import val_noise, val_scores
from model.training.config import ComparisonConfig, TrainConfig, fingerprint
from model.training.loop import TokenCache, frozen_states, prepare, train
from model.training.state import finish, finished_summary, resume
from pipeline.errors import PipelineError
from pipeline.io import atomic_path, file_digest, read_parquet, remove_stale_temporaries
from pipeline.schemas import GRAPH_SCHEMA, RELATION_TEXT_SCHEMA

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
                                                                 RELATION_TEXT_SCHEMA)
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
        with atomic_path(tsv) as tmp:  # a second kill now must not cut the curve short
            tmp.write_text("".join(lines[:1] + kept))
    live = Live(dir=str(folder), resume=True, save_dvc_exp=False, dvcyaml=None,
                report=None, monitor_system=False)
    live.step = step
    return live


@dataclass(frozen=True)
class Job:
    """One model to train: a method on a split (and a setting under the paper's protocol)."""

    split_index: int
    split_dir: Path
    method: str
    setting_index: int
    setting: Setting | None
    out: Path
    #: This run's ``train`` section: the comparison's capped, one setting's N and K only
    #: under the paper's protocol (:meth:`TrainConfig.schedule`).
    sched: TrainConfig
    #: What the model depends on (:func:`model.training.config.fingerprint`).
    params: dict[str, Any]

    @property
    def name(self) -> str:
        """``split/method`` (``/setting`` under the paper's protocol), in messages."""
        tail = "" if self.setting is None else f"/{self.setting.name}"
        return f"{self.split_dir.name}/{self.method}{tail}"

    @property
    def seed_key(self) -> tuple[int, ...]:
        """The model's own seeds: its split, its method's seed stream and its setting."""
        return self.split_index, registry.get(self.method).seed_stream, self.setting_index


@dataclass(frozen=True)
class Shared:
    """What every training job reads and none changes; forked workers inherit it."""

    configs: dict[str, RegrabConfig]  # each method's config, built once
    graph: RelationGraph | None
    device: str
    tokens: TokenCache
    cache: LowerCache  # the warm frozen-layer cache; each job starts from a copy of it


def plan(dirs: list[Path], out: Path, cfg: TrainConfig, comparison: ComparisonConfig,
         configs: dict[str, RegrabConfig], inputs: dict[str, str]) -> list[Job]:
    """Every model of the stage, split by split, method by method, setting by setting.

    A model's fingerprint holds the digests of its split's train and val files too: a
    finished or half-trained model is reused only if its inputs are the same, and the
    params alone miss a new graph (build_graph.features) or a new split of the relations.
    """
    settings = [Setting.parse(s) for s in cfg.per_setting] or [None]
    capped = comparison.schedule(cfg)
    jobs = []
    for si, split_dir in enumerate(dirs):
        digests = {**inputs, "train": file_digest(split_dir / "train.parquet"),
                   "val": file_digest(split_dir / "val.parquet")}
        extra = comparison.methods if comparison.runs_on(split_dir.name) else ()
        for method in (*cfg.methods, *extra):
            base = capped if method in comparison.methods else cfg
            for j, setting in enumerate(settings):
                if setting is not None and setting.shots == 0 and not registry.get(
                        method).zero_shot:
                    continue
                sched = base.schedule(setting)
                folder = out / split_dir.name / method
                jobs.append(Job(si, split_dir, method, j, setting,
                                folder if setting is None else folder / setting.name, sched,
                                fingerprint(configs[method], sched, digests)))
    return jobs


def reused(job: Job) -> dict[str, Any] | None:
    """The summary of the job's finished model when its fingerprint is the same, else None.

    The folder is tidied first: a kill during a checkpoint write leaves its temporary file
    (atomic_path cannot clean up after SIGKILL), which must not be cached, and pickles of an
    older version are never loaded (the model is retrained).
    """
    if job.out.is_dir():
        remove_stale_temporaries(job.out)
        for legacy in LEGACY_FILES:
            if (job.out / legacy).exists():
                log.info("%s: removing %s of an older version", job.out, legacy)
                (job.out / legacy).unlink()
    done = finished_summary(job.out / MODEL_FILE, job.out / STATE_FILE, job.params)
    if done is not None:
        log.info("%s: finished model with the same params, skipped", job.name)
    return done


def measure_finished(job: Job, shared: Shared) -> None:
    """Store the uncertainty on the validation relations and the suspicion cutoff of a
    finished model that an older version trained without them
    (:mod:`model.training.val_scores`, :mod:`model.training.val_noise`), as training would
    have; its weights, metrics and history stay as they are."""
    path = job.out / MODEL_FILE
    best = read_checkpoint(path)
    run = prepare(job.split_dir, job.method, shared.configs[job.method], job.sched,
                  shared.graph, shared.device, shared.tokens, shared.cache.copy(),
                  job.sched.seed, job.seed_key)
    scores = best.val_scores or val_scores.measure(run, best)
    noise = best.support_noise or val_noise.measure(run, best)
    if scores is not None or noise is not None:
        save_checkpoint(path, dataclasses.replace(best, val_scores=scores, support_noise=noise))


def needs_measuring(best: Checkpoint) -> bool:
    """Whether a finished model lacks what training measures on the validation relations."""
    return best.val_scores is None or best.support_noise is None


def train_one(job: Job, shared: Shared, on_step=None) -> dict[str, Any]:
    """Train one model (resuming from its ``state.safetensors``); its summary."""
    job.out.mkdir(parents=True, exist_ok=True)
    best_path, state_path = job.out / MODEL_FILE, job.out / STATE_FILE
    sched = job.sched
    run = prepare(job.split_dir, job.method, shared.configs[job.method], sched, shared.graph,
                  shared.device, shared.tokens, shared.cache.copy(), sched.seed, job.seed_key)
    resume(run, state_path, job.params)
    live = dvclive_logger(job.out, run.step) if sched.dvclive else None
    result = train(run, job.out, job.params, live, on_step)
    summary = {"split": job.split_dir.name, "method": job.method,
               "setting": None if job.setting is None else job.setting.name,
               "best_val_acc": run.best, "best_step": result["best_step"],
               "steps": sched.steps, "final_loss": result["final_loss"]}
    # No wall-clock time in the model folder (a DVC output): a rerun writes it byte for byte.
    finish(best_path, summary, run.history, result["val_scores"], result["support_noise"])
    state_path.unlink(missing_ok=True)
    log.info("%s, %.1f s", summary, result["seconds"])
    return summary


def warm_cache(jobs: list[Job], cfg: TrainConfig, shared: Shared) -> None:
    """Encode, before any model trains, every frozen-layer output the ``jobs`` will read.

    One model per distinct frozen part (and label reading) fills the cache split by split,
    in the order one run after another would. Every job then starts from a copy of this
    cache, so a model's encodings never depend on which models ran before it, in the same
    process or another: one worker or several train the same models.
    """
    models: dict[tuple, Any] = {}
    for method in dict.fromkeys(job.method for job in jobs):
        model_cfg = shared.configs[method]
        model = build_model(model_cfg, shared.graph).to(shared.device)
        key = (LowerCache.frozen_key(model.encoder) if model.encoder.split > 0 else None,
               model.prior is not None and model.prior.config.text)
        models.setdefault(key, model)
    for split_dir in dict.fromkeys(job.split_dir for job in jobs):
        for (frozen, _), model in models.items():
            frozen_states(model, split_dir, cfg, shared.tokens,
                          shared.cache if frozen is not None else None)

