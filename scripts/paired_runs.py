"""Compare two runs of one method on the same episodes: per-episode paired differences.

Two models folders of one benchmark (say the default and a ``dvc exp run -S ...`` variant,
copied aside) hold checkpoints of the same method trained on the same splits. Each split's
test episodes are drawn as ``evaluate`` draws them (``params.yaml``'s ``evaluate`` section, so
the same episodes as the pipeline's metrics), scored with both checkpoints, and the difference
B - A is reported per setting (with A's and B's accuracies): the mean over splits, its t 95%
interval over splits (two or more splits) and the normal 95% interval over the pooled paired
episodes.

Usage:
    python scripts/paired_runs.py --splits data/benchmarks/fewrel --a models-names/fewrel \
        --b models/fewrel --methods regrab,proto_label --settings 5w0s,5w1s \
        [--relations names.json] [--episodes N] [--out diff.json]

Relation descriptions are read as the ``evaluate`` stage reads them (dvc.yaml):
``--relations``, by default the pipeline's ``data/raw/fewrel/pid2name.json`` when it exists;
without them a test relation outside a model's graph is read by its name alone and the
zero-shot scores fall below the pipeline's metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

import stages  # noqa: F401  (declares params.yaml's sections)
from model.encoder.frozen_cache import LowerCache
from model.evaluation.config import EvalConfig
from model.evaluation.splits import evaluate_split
from pipeline import report
from pipeline.config import load_section, set_threads
from pipeline.errors import PipelineError, run_cli
from pipeline.fewrel import load_relation_descriptions
from pipeline.io import atomic_path

#: What the evaluate stage reads (dvc.yaml), relative to the project root.
RELATIONS = Path("data/raw/fewrel/pid2name.json")


def episodes_of(models: Path, split_dir: Path, index: int, cfg: EvalConfig,
                descriptions: dict[str, str | None] | None = None,
                other_training: bool = False) -> dict[str, dict[str, np.ndarray]]:
    """``{method: {setting: per-episode accuracy}}`` of one split's checkpoints
    (``other_training``: trained on other training data than the split's, see
    :func:`model.evaluation.splits.evaluate_split`)."""
    with torch.no_grad():
        cells, _ = evaluate_split(split_dir, models, cfg, "cpu", LowerCache(), index,
                                  descriptions=descriptions, other_training=other_training)
    return {m: {s: np.asarray(c["episodes"], float) for s, c in row.items()}
            for m, row in cells.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", type=Path, required=True, help="the benchmark's split folders")
    parser.add_argument("--a", type=Path, required=True, help="models folder of run A")
    parser.add_argument("--b", type=Path, required=True, help="models folder of run B")
    parser.add_argument("--methods", required=True, help="comma-separated methods")
    parser.add_argument("--settings", required=True, help="comma-separated {N}w{K}s")
    parser.add_argument("--relations", type=Path, default=None,
                        help="relation names and descriptions (FewRel's pid2name.json format), "
                             "as the evaluate stage reads them: descriptions of test relations "
                             f"outside a model's graph (default: {RELATIONS} when it exists)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    parser.add_argument("--episodes", type=int, default=0,
                        help="test episodes per split and setting, drawn as evaluate draws them "
                             "(default 0: evaluate.episodes)")
    parser.add_argument("--out", type=Path, default=None, help="JSON of the differences")
    parser.add_argument("--a-other-training", action="store_true",
                        help="A's models may have trained on other training data than the "
                             "splits' (the promoted models, before new data); they are still "
                             "refused if they trained or validated on a test relation")
    args = parser.parse_args(argv)
    base = load_section(EvalConfig, "evaluate", args.params)
    if args.episodes < 0:
        raise PipelineError(f"--episodes must be 0 (evaluate's) or more, got {args.episodes}")
    cfg = dataclasses.replace(base, episodes=args.episodes or base.episodes,
                              methods=tuple(args.methods.split(",")),
                              settings=tuple(args.settings.split(",")), nota_rates=(),
                              nota_settings=(), floor=False, temperature_episodes=0, splits=())
    set_threads(base.threads)
    relations = args.relations or (RELATIONS if RELATIONS.is_file() else None)
    said = load_relation_descriptions(relations)
    names = sorted(p.name for p in args.splits.glob("split_*")
                   if (args.a / p.name).is_dir() and (args.b / p.name).is_dir())
    if not names:
        raise PipelineError(f"no split of {args.splits} has models under both {args.a} and "
                            f"{args.b}; give two models folders of this benchmark")
    # {method: {setting: {split: (A's, B's per-episode accuracy)}}}
    pairs: dict[str, dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]] = {}
    for name in names:
        index = int(name.rsplit("_", 1)[-1])
        a = episodes_of(args.a, args.splits / name, index, cfg, said, args.a_other_training)
        b = episodes_of(args.b, args.splits / name, index, cfg, said)
        for m in cfg.methods:
            for s in a.get(m, {}):
                if s in b.get(m, {}):
                    pairs.setdefault(m, {}).setdefault(s, {})[name] = (a[m][s], b[m][s])
    out: dict = {}
    for m, by_setting in pairs.items():
        for s, by_pair in by_setting.items():
            by_split = {k: (pb - pa) * 100 for k, (pa, pb) in by_pair.items()}
            means = [float(d.mean()) for d in by_split.values()]
            pooled = np.concatenate(list(by_split.values()))
            out.setdefault(m, {})[s] = {
                "diff": round(float(np.mean(means)), 2),
                "ci95": (round(report.interval(means)["ci95"], 2) if len(means) > 1 else None),
                "episode_ci95": round(report.normal_ci95(pooled), 2),
                "per_split": {k: round(v, 2) for k, v in zip(by_split, means, strict=True)},
                "a": round(float(np.mean([pa.mean() * 100 for pa, _ in by_pair.values()])), 2),
                "b": round(float(np.mean([pb.mean() * 100 for _, pb in by_pair.values()])), 2)}
            row = out[m][s]
            between = f" ± {row['ci95']:.2f} over splits" if row["ci95"] is not None else ""
            print(f"{m} {s}: A {row['a']:.2f}, B {row['b']:.2f}, "
                  f"B - A = {row['diff']:+.2f}{between} "
                  f"(± {row['episode_ci95']:.2f} over {len(pooled)} paired episodes)")
    if args.out is not None:
        with atomic_path(args.out) as tmp:
            tmp.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    run_cli(main)
