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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from model.encoder import LowerCache, TokenizedSet, encode_all, encode_rows
from model.episodes import EpisodeSampler, Setting, episode_accuracy, gather_episodes
from model.graph_prior import RelationGraph
from model.regrab import (
    METHODS,
    FewShotModel,
    build_model,
    config_from_params,
    save_checkpoint,
)
from pipeline.config import load_params, select_device
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path, file_digest, read_parquet, write_json
from pipeline.schemas import FEWSHOT_SCHEMA, GRAPH_SCHEMA

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainConfig:
    """``params.yaml`` section ``train``.

    Attributes:
        methods: methods to train (regrab, regrab_no_prior, mtb, proto).
        splits: which split folders to use (empty: every ``split_*`` found).
        steps: optimisation steps (one episode each) per split and method.
        ways: N drawn uniformly per step (values above the training relations are dropped).
        shots: K drawn uniformly per step (one model covers every K).
        zero_shot_rate: probability of a K=0 episode for regrab (trains the prior directly).
        queries: Q queries per way.
        lr_encoder: AdamW learning rate of the trained encoder layers.
        lr_head: AdamW learning rate of the GCN prior.
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
        dvclive: log curves with dvclive under ``{out}/dvclive``.
        threads: torch intra-op threads (0 = torch default; see :func:`set_threads`).
        per_setting: the paper's protocol: one model per listed setting (e.g. ``[5w1s,
            5w5s]``) in ``{method}/{setting}/``, trained on that N and K only (K = 0:
            regrab only). Empty (default): one model per method on mixed N and K.
    """

    methods: tuple[str, ...] = METHODS
    splits: tuple[str, ...] = ()
    steps: int = 150
    ways: tuple[int, ...] = (5, 10)
    shots: tuple[int, ...] = (1, 5)
    zero_shot_rate: float = 0.2
    queries: int = 5
    lr_encoder: float = 5e-5
    lr_head: float = 1e-3
    weight_decay: float = 0.01
    warmup: float = 0.1
    max_grad_norm: float = 5.0
    val_every: int = 50
    val_episodes: int = 300
    val_settings: tuple[str, ...] = ("5w1s", "5w5s")
    checkpoint_every: int = 25
    seed: int = 0
    device: str = "auto"
    encode_batch: int = 64
    dvclive: bool = True
    threads: int = 1
    per_setting: tuple[str, ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_params(cls, section: dict[str, Any]) -> TrainConfig:
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(section) - names)
        if unknown:
            raise PipelineError(f"params.yaml train section has unknown keys {unknown}")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in section.items()}
        cfg = cls(**values)
        bad = [m for m in cfg.methods if m not in METHODS]
        if bad:
            raise PipelineError(f"train.methods has unknown {bad}; use some of {METHODS}")
        for s in (*cfg.val_settings, *cfg.per_setting):
            Setting.parse(s)
        return cfg


def _split_dirs(splits: Path, names: tuple[str, ...]) -> list[Path]:
    if not splits.is_dir():
        raise PipelineError(f"{splits} is not a folder; run the split stage first")
    dirs = [splits / n for n in names] if names else sorted(splits.glob("split_*"))
    dirs = [d for d in dirs if d.is_dir()]
    if not dirs:
        raise PipelineError(f"no split_* folders in {splits}; run the split stage first")
    return dirs


class TokenCache:
    """Tokenised tables, keyed by file and tokenisation settings (tokenise once)."""

    def __init__(self) -> None:
        self._sets: dict[tuple, tuple[TokenizedSet, list[str]]] = {}

    def get(self, model: FewShotModel, path: Path) -> tuple[TokenizedSet, list[str]]:
        c = model.encoder.config
        key = (str(path), c.name, c.markers, c.max_length)
        if key not in self._sets:
            table = read_parquet(path, FEWSHOT_SCHEMA)
            if table.num_rows == 0:
                raise PipelineError(f"{path} has no sentences; rebuild the splits")
            self._sets[key] = (model.encoder.tokenize(table), table.column("relation").to_pylist())
        return self._sets[key]


def _lr_lambda(steps: int, warmup: float):
    warm = max(1, int(round(steps * warmup)))

    def f(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return max(0.0, (steps - step) / max(1, steps - warm))

    return f


def validate(
    model: FewShotModel,
    tokens: TokenizedSet,
    sampler: EpisodeSampler,
    cfg: TrainConfig,
    cache: LowerCache | None,
    seed: int,
) -> float:
    """Mean accuracy (%) over ``val_settings`` on fixed episodes of the validation split."""
    model.eval()
    enc = encode_all(model.encoder, tokens, cache, cfg.encode_batch)
    rows = model.rows(sampler.relations)
    accs = []
    for i, name in enumerate(cfg.val_settings):
        s = Setting.parse(name)
        if s.shots == 0 and model.prior is None:
            continue
        episodes = sampler.sample(
            np.random.default_rng([seed, i]), s.ways, s.shots, cfg.queries, cfg.val_episodes
        )
        accs.append(episode_accuracy(model.head, enc, episodes, rows).mean() * 100)
    model.train()
    return float(np.mean(accs))


def _optimizer(model: FewShotModel, cfg: TrainConfig) -> torch.optim.Optimizer:
    enc = [p for p in model.encoder.parameters() if p.requires_grad]
    head = [p for p in model.head.parameters() if p.requires_grad]
    groups = [g for g in ({"params": enc, "lr": cfg.lr_encoder},
                          {"params": head, "lr": cfg.lr_head}) if g["params"]]
    if not groups:
        groups = [{"params": [torch.nn.Parameter(torch.zeros(1))], "lr": 0.0}]
    return torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)


def train_one(
    split_dir: Path,
    method: str,
    out_dir: Path,
    params: dict[str, Any],
    graph: RelationGraph | None,
    device: str,
    tokens_cache: TokenCache,
    lower_cache: LowerCache,
    seed_key: tuple[int, ...],
    on_step=None,
    setting: Setting | None = None,
) -> dict[str, Any]:
    """Train one method on one split; returns a summary. ``on_step(step)`` is a test hook.

    With ``setting`` the episodes are that N-way K-shot only (paper protocol).
    """
    cfg = TrainConfig.from_params(params["train"])
    if setting is not None:
        cfg = dataclasses.replace(cfg, ways=(setting.ways,), shots=(setting.shots,),
                                  zero_shot_rate=1.0 if setting.shots == 0 else 0.0)
    model_cfg = config_from_params(params["model"], method)
    # A finished or half-trained model is reused only if its inputs are the same too: the
    # params alone miss a new graph (build_graph.features) or a new split of the relations.
    params = {**params, "inputs": {**params.get("inputs", {}),
                                   "train": file_digest(split_dir / "train.parquet"),
                                   "val": file_digest(split_dir / "val.parquet")}}
    out_dir.mkdir(parents=True, exist_ok=True)
    best_path, state_path = out_dir / "model.pt", out_dir / "state.pt"
    if best_path.exists() and not state_path.exists():
        payload = torch.load(best_path, map_location="cpu", weights_only=False)
        if payload.get("done") and payload.get("params") == params:
            log.info("%s/%s: finished model with the same params, skipped", split_dir.name, method)
            return payload["summary"]

    seeds = np.random.SeedSequence([cfg.seed, *seed_key]).generate_state(3)
    torch.manual_seed(int(seeds[0]))
    model = build_model(model_cfg, graph if model_cfg.uses_graph else None).to(device)
    train_tok, train_rel = tokens_cache.get(model, split_dir / "train.parquet")
    val_tok, val_rel = tokens_cache.get(model, split_dir / "val.parquet")
    train_s = EpisodeSampler(train_rel, f"{split_dir.name} training split")
    val_s = EpisodeSampler(val_rel, f"{split_dir.name} validation split")
    ways = [w for w in cfg.ways if w <= len(train_s.relations)]
    if not ways:
        raise PipelineError(
            f"train.ways={list(cfg.ways)} all exceed the {len(train_s.relations)} training "
            f"relations of {split_dir.name}; lower train.ways"
        )
    for w in ways:
        train_s.check(w, max(cfg.shots), cfg.queries)
    if min(cfg.shots) == 0 and method != "regrab":
        raise PipelineError(f"zero-shot training needs the graph prior; {method} has none")
    for name in cfg.val_settings:
        s = Setting.parse(name)
        val_s.check(s.ways, s.shots, cfg.queries)
    if model.prior is not None:
        model.prior.coverage(train_s.relations, f"{split_dir.name} training")
        model.prior.coverage(val_s.relations, f"{split_dir.name} validation")
    train_rows = model.rows(train_s.relations)
    cache = lower_cache if model.encoder.split > 0 else None
    if cache is not None:  # frozen layers once per sentence, batched by length
        for tok in (train_tok, val_tok):
            order = np.argsort([len(x) for x in tok.ids], kind="stable")
            cache.states(model.encoder, tok, order, cfg.encode_batch, progress=True)

    opt = _optimizer(model, cfg)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg.steps, cfg.warmup))
    rng = np.random.default_rng(int(seeds[1]))
    noise_gen = torch.Generator(device=device).manual_seed(int(seeds[2]))
    step, best, history = 0, -1.0, []
    if state_path.exists():
        state = torch.load(state_path, map_location="cpu", weights_only=False)
        if state.get("params") == params:
            model.load_state_dict(
                {**model.state_dict(), **state["state"]}, strict=True
            )
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
            rng.bit_generator.state = state["rng_numpy"]
            torch.set_rng_state(state["rng_torch"])
            noise_gen.set_state(state["rng_noise"])
            step, best, history = state["step"], state["best"], state["history"]
            log.info("%s/%s: resumed at step %d", split_dir.name, method, step)
        else:
            log.warning("%s/%s: state.pt was made with other params; starting over",
                        split_dir.name, method)

    live = _live(out_dir, resume=step > 0) if cfg.dvclive else None
    last_good = str(state_path) if state_path.exists() else "none"
    model.train()
    bar = tqdm(total=cfg.steps, initial=step, desc=f"{split_dir.name}/{method}", leave=False)
    t0 = time.perf_counter()
    while step < cfg.steps:
        n = int(rng.choice(ways))
        shots = [k for k in cfg.shots if k > 0] or [0]
        k = int(rng.choice(shots))
        if method == "regrab" and cfg.zero_shot_rate > 0 and rng.random() < cfg.zero_shot_rate:
            k = 0
        ep = train_s.sample(rng, n, k, cfg.queries, 1)
        rows = np.concatenate([ep.support.reshape(-1), ep.query.reshape(-1)])
        enc = encode_rows(model.encoder, train_tok, rows, cache, batch_size=len(rows))
        local = type(ep)(ep.relation, np.arange(n * k).reshape(1, n, k),
                         n * k + np.arange(n * cfg.queries).reshape(1, n, cfg.queries))
        support, query, labels = gather_episodes(enc, local)
        h = model.head.prior_means(None, train_rows.to(device)[torch.from_numpy(ep.relation)])
        log_p = model.head.log_predictive(support, query, h, noise_gen)  # (1, NQ, N)
        loss = torch.nn.functional.nll_loss(log_p.reshape(-1, n), labels.reshape(-1))
        if not torch.isfinite(loss):
            raise PipelineError(
                f"loss is {loss.item()} at step {step} of {split_dir.name}/{method}; last good "
                f"checkpoint: {last_good}; lower train.lr_* or model.step_size and rerun"
            )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
        opt.step()
        sched.step()
        step += 1
        bar.update(1)
        history.append({"step": step, "loss": loss.item(), "ways": n, "shots": k})
        if live is not None:
            live.log_metric("train/loss", loss.item())
        if step % cfg.val_every == 0 or step == cfg.steps:
            acc = validate(model, val_tok, val_s, cfg, cache, int(seeds[1]))
            history[-1]["val_acc"] = acc
            if live is not None:
                live.log_metric("val/acc", acc)
            if acc > best:
                best = acc
                save_checkpoint(best_path, model, {"params": params, "step": step,
                                                   "val_acc": acc, "done": False})
        if live is not None:
            live.next_step()
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_checkpoint(state_path, model, {
                "params": params, "step": step, "best": best, "history": history,
                "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                "rng_numpy": rng.bit_generator.state, "rng_torch": torch.get_rng_state(),
                "rng_noise": noise_gen.get_state(),
            })
            last_good = str(state_path)
        if on_step is not None:
            on_step(step)
    bar.close()
    if live is not None:
        live.end()
    payload = torch.load(best_path, map_location="cpu", weights_only=False)
    summary = {"split": split_dir.name, "method": method,
               "setting": None if setting is None else setting.name, "best_val_acc": best,
               "best_step": payload["step"], "steps": cfg.steps,
               "seconds": round(time.perf_counter() - t0, 1),
               "final_loss": float(np.mean([h["loss"] for h in history[-20:]]))}
    payload.update({"done": True, "summary": summary, "history": history})
    with atomic_path(best_path) as tmp:
        torch.save(payload, tmp)
    state_path.unlink(missing_ok=True)
    return summary


def _live(out_dir: Path, resume: bool):
    """A dvclive logger for one model's curves (train/loss, val/acc) under its folder."""
    try:
        from dvclive import Live
    except ImportError:
        return None
    return Live(dir=str(out_dir / "dvclive"), resume=resume, save_dvc_exp=False,
                dvcyaml=None, report=None, monitor_system=False)


def load_graph(graph_path: Path, features_path: Path) -> RelationGraph:
    """Read the relation graph and node features tables."""
    graph = read_parquet(graph_path, GRAPH_SCHEMA)
    features = read_parquet(features_path)
    if "relation" not in features.column_names or "embedding" not in features.column_names:
        raise PipelineError(f"{features_path} is not an embeddings table; rebuild data/features")
    return RelationGraph.from_tables(graph, features)


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
    params["inputs"] = {"graph": file_digest(args.graph), "features": file_digest(args.features)}
    cfg = TrainConfig.from_params(params["train"])
    set_threads(cfg.threads)
    device = select_device(cfg.device)
    graph = load_graph(args.graph, args.features) if "regrab" in cfg.methods else None
    tokens_cache, lower_cache = TokenCache(), LowerCache()
    summaries = []
    t0 = time.perf_counter()
    settings = [Setting.parse(s) for s in cfg.per_setting] or [None]
    for si, split_dir in enumerate(_split_dirs(args.splits, cfg.splits)):
        for method in cfg.methods:
            for j, setting in enumerate(settings):
                if setting is not None and setting.shots == 0 and method != "regrab":
                    continue
                out = args.out / split_dir.name / method
                out = out if setting is None else out / setting.name
                summary = train_one(split_dir, method, out, params, graph, device,
                                    tokens_cache, lower_cache,
                                    (si, METHODS.index(method), j), setting=setting)
                log.info("%s", summary)
                summaries.append(summary)
    write_json({"seconds": round(time.perf_counter() - t0, 1), "models": summaries},
               args.out / "summary.json")
    return {"models": summaries}


def set_threads(threads: int) -> None:
    """Set torch's intra-op threads (0 keeps torch's default).

    On our shared 2-core machine, two OpenMP threads made every small tensor op wait for
    a busy core: one cached-encoding training step took 0.95 s with 2 threads and 0.06 s
    with 1 (benchmarks/bench_train.py), so the default is 1.
    """
    if threads > 0:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    run_cli(main)
