"""Stage ``evaluate``: few-shot and zero-shot accuracy of every trained model on NYT-25 test.

Each model encodes every test sentence once; episodes are then assembled from the cached
encodings (exact: the encoder sees one sentence at a time). Episodes are seeded per split and
setting, so every method sees the same episodes. Zero-shot settings (``{N}w0s``) are run for
``regrab`` only (prototypes = prior means). Accuracy is the mean over episodes, in percent,
with a normal 95% interval; the overall figure pools the episodes of all splits (equal counts
per split, so it is also the mean of the split means).

An untrained ``floor`` row can be added (``evaluate.floor``): the frozen pre-trained encoder,
entity-mean pooling, cosine prototypes.

Usage:
    python -m stages.evaluate --splits data/splits --models models \
        --metrics metrics/nyt25.json --plot plots/nyt25.png [--params params.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from model.baselines import PrototypeHead
from model.encoder import EncoderConfig, LowerCache, SentenceEncoder, encode_all
from model.episodes import EpisodeSampler, Setting, episode_accuracy, mean_ci95
from model.langevin import LangevinConfig
from model.regrab import METHODS, load_checkpoint
from pipeline.config import load_params, select_device
from pipeline.errors import PipelineError, run_cli
from pipeline.io import atomic_path, read_parquet, write_json
from pipeline.schemas import FEWSHOT_SCHEMA
from stages.train import set_threads

log = logging.getLogger(__name__)

FLOOR = "floor"


@dataclass(frozen=True)
class EvalConfig:
    """``params.yaml`` section ``evaluate``.

    Attributes:
        methods: trained methods to evaluate (each needs ``models/split_i/<method>/model.pt``).
        settings: ``{N}w{K}s`` settings; K = 0 is zero-shot (regrab only).
        episodes: episodes per setting and split.
        queries: queries per way.
        seed: episode seed (same episodes for every method).
        splits: split folders to use (empty: every split with trained models).
        floor: add the untrained frozen-encoder row.
        batch_episodes: episodes per forward pass of a head.
        encode_batch: sentences per encoder batch.
        device: auto | cpu | cuda.
        threads: torch intra-op threads (0 = torch default).
    """

    methods: tuple[str, ...] = METHODS
    settings: tuple[str, ...] = ("5w1s", "5w5s", "10w1s", "10w5s", "5w0s", "10w0s")
    episodes: int = 1000
    queries: int = 5
    seed: int = 1
    splits: tuple[str, ...] = ()
    floor: bool = True
    batch_episodes: int = 250
    encode_batch: int = 64
    device: str = "auto"
    threads: int = 1

    @classmethod
    def from_params(cls, section: dict[str, Any]) -> EvalConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(section) - names)
        if unknown:
            raise PipelineError(f"params.yaml evaluate section has unknown keys {unknown}")
        cfg = cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in section.items()})
        bad = [m for m in cfg.methods if m not in METHODS]
        if bad:
            raise PipelineError(f"evaluate.methods has unknown {bad}; use some of {METHODS}")
        for s in cfg.settings:
            Setting.parse(s)
        if cfg.episodes < 1:
            raise PipelineError("evaluate.episodes must be >= 1 (1000 for the paper's protocol)")
        return cfg


def _floor_encoder(like: EncoderConfig, device: str) -> SentenceEncoder:
    """The frozen pre-trained encoder with entity-mean pooling.

    It keeps the trained models' markers and split point so that it shares their cache of
    frozen-layer states (unless they cache top-layer keys/values instead).
    """
    cfg = dataclasses.replace(like, pooling="entity_mean", dropout=0.0, freeze_top_kv=False,
                              normalize=0.0)
    return SentenceEncoder.from_config(cfg).to(device).eval()


def evaluate_split(
    split_dir: Path,
    models_dir: Path,
    cfg: EvalConfig,
    device: str,
    cache: LowerCache,
    split_index: int,
) -> dict[str, dict[str, np.ndarray]]:
    """Per-episode accuracies ``{method: {setting: (episodes,)}}`` on one split's test set."""
    table = read_parquet(split_dir / "test.parquet", FEWSHOT_SCHEMA)
    relations = table.column("relation").to_pylist()
    sampler = EpisodeSampler(relations, f"{split_dir.name} test split")
    settings = [Setting.parse(s) for s in cfg.settings]
    episodes = {}
    for i, s in enumerate(settings):
        rng = np.random.default_rng([cfg.seed, split_index, i])
        episodes[s.name] = sampler.sample(rng, s.ways, s.shots, cfg.queries, cfg.episodes)
    out: dict[str, dict[str, np.ndarray]] = {}
    tokens: dict[tuple, Any] = {}
    encoder_cfg = None
    for method in cfg.methods:
        out[method] = {}
        loaded: dict[Path, tuple] = {}
        for s in settings:
            # The paper's protocol keeps one model per setting ({method}/{setting}/model.pt);
            # the default keeps one model per method for every setting.
            path = models_dir / split_dir.name / method / s.name / "model.pt"
            if not path.exists():
                path = models_dir / split_dir.name / method / "model.pt"
            if not path.exists():
                if s.shots == 0 and method != "regrab":
                    continue
                raise PipelineError(
                    f"{path} is missing; train {method} on {split_dir.name} (dvc repro train) "
                    "or drop it from evaluate.methods"
                )
            if path not in loaded:
                model, _ = load_checkpoint(path, device)
                model.eval()
                encoder_cfg = model.encoder.config
                key = (encoder_cfg.name, encoder_cfg.markers, encoder_cfg.max_length)
                if key not in tokens:
                    tokens[key] = model.encoder.tokenize(table)
                if model.prior is not None:
                    model.prior.coverage(sampler.relations, f"{split_dir.name} test")
                enc = encode_all(model.encoder, tokens[key], cache, cfg.encode_batch)
                loaded = {path: (model, enc)}  # keep one model in memory at a time
            model, enc = loaded[path]
            if s.shots == 0 and model.prior is None:
                continue
            out[method][s.name] = episode_accuracy(
                model.head, enc, episodes[s.name], model.rows(sampler.relations),
                cfg.batch_episodes
            )
    if cfg.floor:
        like = encoder_cfg or EncoderConfig()
        floor = _floor_encoder(like, device)
        key = (like.name, like.markers, like.max_length)
        tok = tokens.get(key) or floor.tokenize(table)
        enc = torch.nn.functional.normalize(encode_all(floor, tok, cache, cfg.encode_batch), dim=-1)
        head = PrototypeHead(LangevinConfig(similarity="dot", temperature=1.0)).eval()
        rows = torch.full((len(sampler.relations),), -1)
        out[FLOOR] = {s.name: episode_accuracy(head, enc, episodes[s.name], rows,
                                               cfg.batch_episodes)
                      for s in settings if s.shots > 0}
    return out


def summarise(per_split: dict[str, dict[str, dict[str, np.ndarray]]]) -> dict[str, Any]:
    """``{method: {setting: {"acc", "ci95"}}}`` pooling the episodes of every split."""
    methods: dict[str, dict[str, list[np.ndarray]]] = {}
    for split in per_split.values():
        for method, settings in split.items():
            for name, acc in settings.items():
                methods.setdefault(method, {}).setdefault(name, []).append(acc)
    result = {}
    for method, settings in methods.items():
        result[method] = {}
        for name, accs in settings.items():
            acc, ci = mean_ci95(np.concatenate(accs))
            result[method][name] = {"acc": round(acc, 2), "ci95": round(ci, 2)}
    return result


def markdown_table(metrics: dict[str, Any], settings: list[str], note: str = "") -> str:
    """Results as a markdown table (rows methods, columns settings, ``acc ± ci95``)."""
    lines = ["| method | " + " | ".join(settings) + " |",
             "|---|" + "---:|" * len(settings)]
    for method, row in metrics.items():
        cells = [f"{row[s]['acc']:.2f} ± {row[s]['ci95']:.2f}" if s in row else "–"
                 for s in settings]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\n" + note if note else "") + "\n"


def plot(metrics: dict[str, Any], settings: list[str], path: Path) -> None:
    """Grouped bar chart, methods x settings, with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(metrics)
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(1.4 * len(settings) + 2, 4))
    x = np.arange(len(settings))
    for i, m in enumerate(methods):
        acc = [metrics[m].get(s, {}).get("acc", np.nan) for s in settings]
        ci = [metrics[m].get(s, {}).get("ci95", 0.0) for s in settings]
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, acc, width, yerr=ci, label=m,
               capsize=2)
    ax.set_xticks(x, settings)
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 100)
    ax.set_title("NYT-25 test, mean over splits")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--splits", type=Path, required=True)
    parser.add_argument("--models", type=Path, required=True)
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--plot", type=Path, required=True)
    parser.add_argument("--table", type=Path, default=None,
                        help="markdown table (default: metrics path with .md)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = EvalConfig.from_params(load_params(args.params, "evaluate"))
    set_threads(cfg.threads)
    device = select_device(cfg.device)
    if not args.splits.is_dir():
        raise PipelineError(f"{args.splits} is not a folder; run the split stage first")
    names = cfg.splits or tuple(sorted(p.name for p in args.splits.glob("split_*")
                                       if (args.models / p.name).is_dir()))
    if not names:
        raise PipelineError(f"no split in {args.splits} has models in {args.models}; train first")
    t0 = time.perf_counter()
    cache = LowerCache()
    per_split = {}
    with torch.no_grad():
        for i, name in enumerate(names):
            per_split[name] = evaluate_split(args.splits / name, args.models, cfg, device,
                                             cache, int(name.rsplit("_", 1)[-1])
                                             if name.rsplit("_", 1)[-1].isdigit() else i)
            log.info("%s evaluated (%.0f s so far)", name, time.perf_counter() - t0)
    metrics = summarise(per_split)
    settings = list(cfg.settings)
    write_json(metrics, args.metrics)
    write_json({name: summarise({name: res}) for name, res in per_split.items()},
               args.metrics.with_name(args.metrics.stem + "_splits.json"))
    note = (f"NYT-25 test relations, {len(names)} split(s), {cfg.episodes} episodes per setting "
            f"and split, {cfg.queries} queries per way; accuracy % ± 95% CI. `floor`: frozen "
            "encoder, entity-mean pooling, cosine prototypes (no training).")
    table = args.table or args.metrics.with_suffix(".md")
    with atomic_path(table) as tmp:
        tmp.write_text(markdown_table(metrics, settings, note))
    plot(metrics, settings, args.plot)
    log.info("evaluate done in %.0f s", time.perf_counter() - t0)
    return metrics


if __name__ == "__main__":
    run_cli(main)
