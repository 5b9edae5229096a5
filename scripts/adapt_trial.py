"""Measure ``regrab-adapt``'s objectives on SemEval, paired on the same episodes.

SemEval's sentences are split per relation with a seeded permutation: the first half of each
relation's sentences is the domain text the model adapts to (labels discarded), the second
half is scored (at most ``--per-relation`` sentences per relation, as the transfer stage
keeps), so no scored sentence was seen while adapting. For every checkpoint split given, the
REGRAB checkpoint is adapted once per objective and scored on the same seeded episodes as the
unadapted one and ``proto_label`` (and the untrained floor); the differences are paired per
episode, with the t 95% interval over splits (the variance between splits) and the normal
one over the pooled episodes. The names-shuffled stress test (every relation reads another's
name and description) is rerun on the same episodes with ``--shuffled``.

An objective may carry its own options after colons, ``pseudo:lr=1e-4:share=0.3``, so two
settings are scored on the same episodes in one run; ``pseudo`` labels the domain half with
the relations of ``--relations`` (their true names, also under ``--shuffled``).

Usage:
    python scripts/adapt_trial.py --data ../shared/data/fewrel/val_semeval.json \
        --relations ../shared/data/fewrel/semeval_relations.json \
        --models ../repro-clone/models/nyt25 --splits split_0,split_1 \
        --objectives centre,pseudo,pseudo:lr=1e-4 --episodes 300 --out trial.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

import stages  # noqa: F401  (declares params.yaml's sections)
from model.adapt.run import AdaptOptions, adapt, adapted_checkpoint
from model.encoder.frozen_cache import LowerCache
from model.evaluation.config import EvalConfig, TransferSet
from model.evaluation.split_episodes import SplitEpisodes
from model.evaluation.splits import evaluate_episodes
from model.evaluation.transfer import cut_relations, relation_texts
from model.files.checkpoint import save_checkpoint
from model.files.loader import load_model
from model.predict.sentences import parse_sentence
from pipeline import report
from pipeline.config import load_section
from pipeline.errors import run_cli
from pipeline.fewrel import convert, load_relation_texts


def halves(table: pa.Table, seed: int) -> tuple[pa.Table, pa.Table]:
    """Per relation, a seeded half of its sentences to adapt to and the other half to score."""
    relation = np.asarray(table.column("relation").to_pylist())
    rng = np.random.default_rng([seed, 11])
    first, second = [], []
    for r in sorted(set(relation)):
        rows = rng.permutation(np.flatnonzero(relation == r))
        first += rows[: len(rows) // 2].tolist()
        second += rows[len(rows) // 2:].tolist()
    return table.take(sorted(first)), table.take(sorted(second))


def sentences_of(table: pa.Table) -> list:
    return [parse_sentence(r) for r in table.select(
        ["tokens", "head_start", "head_end", "tail_start", "tail_end"]).to_pylist()]


def paired(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, Any]:
    """B - A per setting: mean over splits, t 95% over splits, normal 95% over episodes."""
    out = {}
    for s in a[next(iter(a))]:
        per = [float((b[k][s] - a[k][s]).mean()) * 100 for k in a]
        pooled = np.concatenate([b[k][s] - a[k][s] for k in a])
        out[s] = {"diff": float(np.mean(per)), "ci95": report.interval(per)["ci95"],
                  "episode_ci95": report.normal_ci95(pooled) * 100, "per_split": per}
    return out


def options_of(spec: str, base: AdaptOptions) -> AdaptOptions:
    """``name[:key=value...]`` -> the options of that objective (values as the field's type)."""
    name, *pairs = spec.split(":")
    fields = {f.name: f.type for f in dataclasses.fields(AdaptOptions)}
    over: dict[str, Any] = {"objective": name}
    for pair in pairs:
        key, value = pair.split("=")
        kind = str(getattr(fields[key], "__name__", fields[key]))  # "float | None" too
        over[key] = (value.lower() in ("1", "true", "yes") if "bool" in kind
                     else float(value) if "float" in kind else int(value) if "int" in kind
                     else value)
    return dataclasses.replace(base, **over)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--relations", type=Path, required=True)
    p.add_argument("--models", type=Path, required=True, help="a benchmark's models folder")
    p.add_argument("--splits", default="split_0")
    p.add_argument("--objectives", default="centre,whiten,contrastive")
    p.add_argument("--settings", default="5w1s,5w5s")
    p.add_argument("--episodes", type=int, default=300)
    p.add_argument("--per-relation", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--minutes", type=float, default=8.0)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--anchor", type=float, default=0.0)
    p.add_argument("--share", type=float, default=AdaptOptions.share)
    p.add_argument("--adapt-sentences", type=int, default=0, help="0: the whole half")
    p.add_argument("--shuffled", action="store_true", help="also the names-shuffled test")
    p.add_argument("--only-shuffled", action="store_true", help="the names-shuffled test alone")
    p.add_argument("--reuse", action="store_true",
                   help="score the checkpoints already under --keep instead of adapting")
    p.add_argument("--keep", type=Path, help="folder to keep the adapted checkpoints in")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(2)
    table, _ = convert("val_semeval", json.loads(args.data.read_text()), {})
    adapt_half, score_half = halves(table, args.seed)
    score_half = cut_relations(score_half, args.per_relation, args.seed)
    if args.adapt_sentences:
        adapt_half = adapt_half.take(np.random.default_rng(args.seed).permutation(
            adapt_half.num_rows)[: args.adapt_sentences])
    domain = sentences_of(adapt_half)
    texts = load_relation_texts(args.relations)
    scored = set(score_half.column("instance_id").to_pylist())
    assert not scored & set(adapt_half.column("instance_id").to_pylist())
    base = load_section(EvalConfig, "evaluate", Path("params.yaml"))
    settings = tuple(args.settings.split(","))
    cfg = dataclasses.replace(
        base, methods=("regrab", "proto_label"), settings=settings, splits=(),
        episodes=args.episodes, floor=True, nota_rates=(), nota_settings=(),
        temperature_episodes=0, noisy_setting="", unequal_settings=())
    sets = {"semeval": TransferSet(data="", title="", relations=str(args.relations),
                                   shuffle=False, nota=False, unequal=False, benchmarks=())}
    if args.shuffled or args.only_shuffled:
        sets["semeval_shuffled"] = dataclasses.replace(sets["semeval"], shuffle=True)
    if args.only_shuffled:
        del sets["semeval"]
    splits = args.splits.split(",")
    objectives = [o for o in args.objectives.split(",") if o]
    cache = LowerCache()
    work = Path(tempfile.mkdtemp(prefix="adapt-trial-"))
    records: dict[str, dict[str, Any]] = {}
    acc: dict[str, dict[str, dict[str, dict[str, np.ndarray]]]] = {}
    try:
        for index, split in enumerate(splits):
            for name in ["unadapted", *objectives]:
                folder = work / name / split
                folder.mkdir(parents=True)
                (folder / "regrab").mkdir()
                src = args.models / split / "regrab" / "model.safetensors"
                if name == "unadapted":
                    shutil.copy(src, folder / "regrab" / "model.safetensors")
                    (folder / "proto_label").symlink_to(
                        (args.models / split / "proto_label").resolve())
                    continue
                if args.reuse:
                    shutil.copy(args.keep / name / split / "regrab" / "model.safetensors",
                                folder / "regrab" / "model.safetensors")
                    continue
                model, ckpt = load_model(src)
                opts = options_of(name, AdaptOptions(
                    minutes=args.minutes, steps=args.steps, lr=args.lr, anchor=args.anchor,
                    seed=args.seed, share=args.share))
                t0 = time.monotonic()
                rec = adapt(model, domain, opts, progress=False, cache=cache,
                            relations=texts if opts.objective == "pseudo" else None)
                rec["wall_s"] = round(time.monotonic() - t0, 1)
                print(f"{split} {name}: {rec}", flush=True)
                records.setdefault(name, {})[split] = rec
                save_checkpoint(folder / "regrab" / "model.safetensors",
                                adapted_checkpoint(ckpt, model, rec))
                if args.keep and not args.reuse:
                    dst = args.keep / name / split / "regrab"
                    dst.mkdir(parents=True, exist_ok=True)
                    shutil.copy(folder / "regrab" / "model.safetensors", dst)
            for set_name, spec in sets.items():
                tab, desc = relation_texts(set_name, spec, score_half, args.seed)
                for name in ["unadapted", *objectives]:
                    run = cfg if name == "unadapted" else dataclasses.replace(
                        cfg, methods=("regrab",), floor=False)
                    eps = SplitEpisodes(split, tab, run, index)
                    eps.descriptions = desc
                    with torch.no_grad():
                        cells, _ = evaluate_episodes(eps, work / name, run, "cpu", cache)
                    for m, row in cells.items():
                        key = m if name == "unadapted" else f"regrab+{name}"
                        for s, c in row.items():
                            acc.setdefault(set_name, {}).setdefault(key, {}).setdefault(
                                split, {})[s] = np.asarray(c["episodes"], float)
                print(f"{split} {set_name} scored: " + ", ".join(
                    f"{k} {s} {acc[set_name][k][split][s].mean():.2f}"
                    for k in acc[set_name] for s in settings), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result: dict[str, Any] = {"adapt_sentences": len(domain),
                              "scored_sentences": score_half.num_rows, "splits": splits,
                              "episodes": args.episodes, "records": records, "sets": {}}
    for set_name, rows in acc.items():
        ref = rows["regrab"]
        result["sets"][set_name] = {
            "accuracy": {k: {s: float(np.mean([v[sp][s].mean() for sp in v])) * 100
                             for s in settings} for k, v in rows.items()},
            "per_split": {k: {sp: {s: float(v[sp][s].mean()) * 100 for s in settings}
                              for sp in v} for k, v in rows.items()},
            "vs_unadapted": {k: paired(ref, v) for k, v in rows.items() if k != "regrab"},
            "vs_proto_label": {k: paired(rows["proto_label"], v) for k, v in rows.items()
                               if k.startswith("regrab")}}
    args.out.write_text(json.dumps(result, indent=1))
    for set_name, res in result["sets"].items():
        for k, d in res["vs_unadapted"].items():
            print(set_name, k, {s: (round(c["diff"], 2), c["ci95"] and round(c["ci95"], 2),
                                    round(c["episode_ci95"], 2)) for s, c in d.items()})
    return result


if __name__ == "__main__":
    run_cli(main)
