"""Stage ``train``: meta-train every method in ``train.methods`` on every NYT-25 split.

For each split and method: N-way K-shot episodes from the training relations (ways and shots
drawn per step from ``train.ways`` / ``train.shots``, zero-shot episodes for ``regrab`` with
probability ``train.zero_shot_rate``), loss = -log p(y_Q | x_Q, x_S, y_S, G), AdamW with
linear warm-up and linear decay, validation on the validation relations from cached
encodings, best model kept. Training resumes from ``state.pt`` after a kill, and a finished
model whose params are unchanged is skipped.

Outputs ``{out}/split_{i}/{method}/model.pt`` (best validation; config, params, step, graph
and trained weights: loads without params.yaml) and, while training, ``state.pt`` (the same
plus optimizer, scheduler and RNG states).

Usage:
    python -m stages.train --splits data/splits --graph data/graph/graph.parquet \
        --features data/features/transe.parquet --out models [--params params.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.checkpoint import METHODS, Method, ModelParams
from model.encoder_cache import LowerCache
from model.episodes import Setting
from model.graph_prior import RelationGraph
from model.trainer import Schedule, TokenCache, finish, finished_summary, prepare, resume, train
from pipeline.config import field, load_params, parse_section, select_device, set_threads
from pipeline.errors import PipelineError, run_cli
from pipeline.io import file_digest, read_parquet, remove_stale_temporaries, write_json
from pipeline.schemas import GRAPH_SCHEMA

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """``params.yaml`` section ``train``.

    Attributes:
        methods: methods to train (regrab, regrab_no_prior, mtb, proto).
        splits: which split folders to use (empty: every ``split_*`` found).
        per_setting: the paper's protocol: one model per listed setting (e.g. ``[5w1s,
            5w5s]``) in ``{method}/{setting}/``, trained on that N and K only (K = 0:
            regrab only). Empty: one model per method on mixed N and K.
        steps: optimisation steps (one episode each) per split and method.
        ways: N drawn uniformly per step (values above the training relations are dropped).
        shots: K drawn uniformly per step (one model covers every K).
        zero_shot_rate: probability of a K=0 episode for regrab (trains the prior directly).
        queries: Q/N queries per way.
        lr_encoder: AdamW learning rate of the trained encoder layers.
        lr_head: AdamW learning rate of the head (GCN prior, fallback vector).
        lr_scales: AdamW learning rate of REGRAB's log lambda and log sigma^2 (no decay).
        weight_decay: AdamW weight decay.
        warmup: fraction of steps with linear warm-up, then linear decay to 0.
        max_grad_norm: gradient clipping.
        val_every: validate (and keep the best model) every this many steps and at the end.
        val_episodes: episodes per validation setting (fixed, seeded).
        val_settings: validation settings on the validation relations.
        checkpoint_every: write ``state.pt`` (resume point) every this many steps.
        seed: seed of episodes, initialisation, dropout and Langevin noise.
        device: auto | cpu | cuda.
        encode_batch: sentences per batch when encoding a whole split.
        dvclive: log curves with dvclive under ``{out}/split_i/{method}/dvclive``.
        evidence_weight: weight of REGRAB's empirical-Bayes term, minus the log marginal
            likelihood of the episode's labelled sentences per dimension (gaussian
            likelihood only; see :func:`model.langevin.log_evidence`); 0 turns it off.
        threads: torch intra-op threads (0 = torch default). On our shared 2-core machine
            two OpenMP threads made every small op wait for a busy core: a cached-encoding
            step took 0.95 s with 2 threads and 0.06 s with 1 (benchmarks/bench_train.py).
    """

    methods: tuple[Method, ...]
    splits: tuple[str, ...]
    per_setting: tuple[str, ...]
    steps: int = field(ge=1)
    ways: tuple[int, ...] = field(ge=2)
    shots: tuple[int, ...] = field(ge=0)
    zero_shot_rate: float = field(ge=0, le=1)
    queries: int = field(ge=1)
    lr_encoder: float = field(ge=0)
    lr_head: float = field(ge=0)
    lr_scales: float = field(ge=0)
    weight_decay: float = field(ge=0)
    warmup: float = field(ge=0, le=1)
    max_grad_norm: float = field(gt=0)
    val_every: int = field(ge=1)
    val_episodes: int = field(ge=1)
    val_settings: tuple[str, ...]
    checkpoint_every: int = field(ge=1)
    seed: int
    device: str
    encode_batch: int = field(ge=1)
    dvclive: bool
    evidence_weight: float = field(ge=0)
    threads: int = field(ge=0)

    def __post_init__(self) -> None:
        for s in (*self.val_settings, *self.per_setting):
            Setting.parse(s)
        if not self.methods or not self.ways or not self.shots:
            raise ValueError("train.methods, train.ways and train.shots must not be empty")

    def schedule(self, setting: Setting | None) -> Schedule:
        """The per-run schedule; with ``setting`` only that N-way K-shot (paper protocol)."""
        names = {f.name for f in dataclasses.fields(Schedule)}
        sched = Schedule(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})
        if setting is None:
            return sched
        return dataclasses.replace(sched, ways=(setting.ways,), shots=(setting.shots,),
                                   zero_shot_rate=1.0 if setting.shots == 0 else 0.0)


def split_dirs(splits: Path, names: tuple[str, ...]) -> list[Path]:
    """The split folders to use (every ``split_*`` when ``names`` is empty)."""
    if not splits.is_dir():
        raise PipelineError(f"{splits} is not a folder; run the split stage first")
    dirs = [splits / n for n in names] if names else sorted(splits.glob("split_*"))
    dirs = [d for d in dirs if d.is_dir()]
    if not dirs:
        raise PipelineError(f"no split_* folders in {splits}; run the split stage first")
    return dirs


def load_graph(graph_path: Path, features_path: Path) -> RelationGraph:
    """Read the relation graph and node features tables."""
    graph = read_parquet(graph_path, GRAPH_SCHEMA)
    features = read_parquet(features_path)
    if "relation" not in features.column_names or "embedding" not in features.column_names:
        raise PipelineError(f"{features_path} is not an embeddings table; rebuild data/features")
    return RelationGraph.from_tables(graph, features)


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


def train_one(split_dir: Path, method: str, out_dir: Path, params: dict[str, Any],
              graph: RelationGraph | None, device: str, tokens: TokenCache,
              lower_cache: LowerCache, seed_key: tuple[int, ...], on_step=None,
              setting: Setting | None = None) -> dict[str, Any]:
    """Train one method on one split (or reuse the finished model); returns a summary."""
    cfg = parse_section(TrainConfig, params["train"], "train")
    sched = cfg.schedule(setting)
    # A finished or half-trained model is reused only if its inputs are the same too: the
    # params alone miss a new graph (build_graph.features) or a new split of the relations.
    params = {**params, "inputs": {**params.get("inputs", {}),
                                   "train": file_digest(split_dir / "train.parquet"),
                                   "val": file_digest(split_dir / "val.parquet")}}
    out_dir.mkdir(parents=True, exist_ok=True)
    # A kill during a checkpoint write leaves its temporary file (atomic_path cannot clean
    # up after SIGKILL); the checkpoint itself is intact, the temporary must not be cached.
    remove_stale_temporaries(out_dir)
    best_path, state_path = out_dir / "model.pt", out_dir / "state.pt"
    done = finished_summary(best_path, state_path, params)
    if done is not None:
        log.info("%s/%s: finished model with the same params, skipped", split_dir.name, method)
        return done
    run = prepare(split_dir, method, params, sched, graph, device, tokens, lower_cache,
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
    return summary


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--graph", type=Path, required=True)
    parser.add_argument("--features", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    params = {section: load_params(args.params, section) for section in ("model", "train")}
    cfg = parse_section(TrainConfig, params["train"], "train")
    parse_section(ModelParams, params["model"], "model")  # fail before any work
    params["inputs"] = {"graph": file_digest(args.graph), "features": file_digest(args.features)}
    set_threads(cfg.threads)
    device = select_device(cfg.device)
    graph = load_graph(args.graph, args.features) if "regrab" in cfg.methods else None
    # summary.json is written atomically too: a kill during that write leaves its temporary.
    remove_stale_temporaries(args.out)
    tokens, lower_cache = TokenCache(), LowerCache()
    summaries = []
    t0 = time.perf_counter()
    settings = [Setting.parse(s) for s in cfg.per_setting] or [None]
    for si, split_dir in enumerate(split_dirs(args.splits, cfg.splits)):
        for method in cfg.methods:
            for j, setting in enumerate(settings):
                if setting is not None and setting.shots == 0 and method != "regrab":
                    continue
                out = args.out / split_dir.name / method
                out = out if setting is None else out / setting.name
                summary = train_one(split_dir, method, out, params, graph, device, tokens,
                                    lower_cache, (si, METHODS.index(method), j),
                                    setting=setting)
                log.info("%s", summary)
                summaries.append(summary)
    write_json({"seconds": round(time.perf_counter() - t0, 1), "models": summaries},
               args.out / "summary.json")
    return {"models": summaries}


if __name__ == "__main__":
    run_cli(main)
