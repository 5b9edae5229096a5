"""``regrab-score``: score trained checkpoints on your own FewRel-format data.

The file maps relation ids (any strings: Wikidata ids or your own labels) to lists of
``{"tokens": [...], "h": [name, id, [[positions]]], "t": [...]}`` records, as FewRel's JSON
files do. Episodes are drawn from it exactly as ``evaluate`` draws them from a test split, for
every method found under ``--models`` plus the untrained ``floor``, and the same tables (mean
over splits with the between-split interval, paired differences with REGRAB, calibration) are
written.

Before scoring, relations are sorted out and listed:

* fewer than K + Q sentences (the largest K of ``--settings``): skipped;
* trained on by a checkpoint (its training or validation relations): excluded, or kept and
  flagged with ``--keep-trained``;
* absent from a REGRAB checkpoint's relation graph: scored with the learned fallback prior.

Usage:
    regrab-score --data ../shared/data/fewrel/val_nyt.json --models models/fewrel \
        --out metrics/own [--settings 5w1s,5w5s] [--episodes 1000] [--methods regrab,proto]
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import torch

from model import registry
from model.checkpoint import MODEL_FILE, model_file, read_payload
from model.encoder_cache import LowerCache
from model.episodes import Setting
from model.evaluation import EvalConfig, SplitEpisodes, evaluate_episodes
from pipeline import report
from pipeline.config import load_section, select_device, set_threads
from pipeline.errors import PipelineError, run_cli
from pipeline.fewrel import convert, load_json
from pipeline.io import atomic_paths, check_writable

log = logging.getLogger(__name__)


def checkpoints(models: Path, methods: list[str]) -> dict[str, dict[str, Path]]:
    """``{split: {method: model.safetensors}}`` for every trained split under ``models``."""
    found: dict[str, dict[str, Path]] = {}
    for split in sorted(p for p in models.glob("split_*") if p.is_dir()):
        for method in methods:
            path = model_file(split / method)
            if path.is_file():
                found.setdefault(split.name, {})[method] = path
    if not found:
        raise PipelineError(f"no split_*/<method>/{MODEL_FILE} under {models}; train first "
                            "(dvc repro) or point --models at a benchmark's models folder")
    return found


def sort_relations(table: pa.Table, needed: int, trained: set[str],
                   keep_trained: bool,
                   listed: Iterable[str] = ()) -> tuple[pa.Table, dict[str, Any]]:
    """Drop relations with too few sentences and, unless kept, those a model trained on.

    ``listed`` names every relation of the file, so one with no usable sentence (``[]``)
    is counted among the skipped too.
    """
    grouped = table.group_by("relation").aggregate([("relation", "count")]).to_pydict()
    counts = {**dict.fromkeys(listed, 0),
              **dict(zip(grouped["relation"], grouped["relation_count"], strict=True))}
    small = {r: n for r, n in sorted(counts.items()) if n < needed}
    seen = sorted(set(counts) & trained)
    drop = set(small) | (set() if keep_trained else set(seen))
    kept = table.filter(pc.invert(pc.is_in(table["relation"], pa.array(sorted(drop),
                                                                        pa.string()))))
    return kept, {"too_few_sentences": small, "trained_on": seen,
                  "trained_on_excluded": not keep_trained,
                  "relations_scored": sorted(set(counts) - drop)}


def score(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, score, write the tables; returns metrics and the relation lists."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="FewRel-format JSON file")
    parser.add_argument("--models", type=Path, required=True,
                        help="a benchmark's models folder (split_*/<method>/model.safetensors)")
    parser.add_argument("--out", type=Path, required=True,
                        help="output prefix: OUT.json (metrics), OUT.md, OUT_report.json")
    parser.add_argument("--methods", default=None,
                        help="comma-separated (default: every method trained on every split)")
    parser.add_argument("--settings", default="5w1s,5w5s,10w1s,10w5s")
    parser.add_argument("--episodes", type=int, default=None,
                        help="episodes per setting and split (default: evaluate.episodes)")
    parser.add_argument("--keep-trained", action="store_true",
                        help="keep (and flag) relations a checkpoint was trained on")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"),
                        help="evaluate section: queries, seed, batch sizes, device")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    outputs = [args.out.with_name(args.out.name + end) for end in (".json", "_report.json",
                                                                    ".md")]
    check_writable(outputs[0])  # before the scoring, not after it
    methods = [m for m in (args.methods or ",".join(registry.names())).split(",") if m]
    unknown = sorted(set(methods) - set(registry.names()))
    if unknown:
        raise PipelineError(f"--methods has {unknown}; use some of {list(registry.names())}")
    found = checkpoints(args.models, methods)
    everywhere = [m for m in methods if all(m in paths for paths in found.values())]
    if args.methods and everywhere != methods:
        missing = sorted(set(methods) - set(everywhere))
        raise PipelineError(f"{missing} not trained on every split under {args.models}; "
                            "train them or leave them out of --methods")
    methods = everywhere
    settings = [Setting.parse(s) for s in args.settings.split(",") if s]
    if not settings:
        raise PipelineError("--settings is empty; give e.g. 5w1s,5w5s")
    if args.episodes is not None and args.episodes < 1:
        raise PipelineError(f"--episodes {args.episodes}: give 1 or more")
    base = load_section(EvalConfig, "evaluate", args.params)
    cfg = dataclasses.replace(
        base, methods=tuple(methods), settings=tuple(s.name for s in settings), splits=(),
        episodes=args.episodes or base.episodes, nota_rates=(), nota_settings=(), floor=True)

    table, parsed = convert(args.data.stem, load_json(args.data, fix=(
        "give --data a FewRel-format JSON file: {relation: [{tokens, h, t}, ...]}")), {})
    trained: set[str] = set()
    encoders = set()
    for paths in found.values():
        for path in paths.values():
            payload = read_payload(path)
            for part in ("train", "val"):
                trained |= set((payload.get("relations") or {}).get(part, []))
            encoders.add(payload["config"]["encoder"]["name"])
    if len(encoders) > 1:
        raise PipelineError(f"the checkpoints under {args.models} use different encoders "
                            f"{sorted(encoders)}; score one benchmark's models at a time")
    needed = max(s.shots for s in settings) + cfg.queries
    table, relations = sort_relations(table, needed, trained, args.keep_trained,
                                      parsed["instances_per_relation"])
    usable = len(relations["relations_scored"])
    too_many = [s.name for s in settings if s.ways > usable]
    if too_many:
        raise PipelineError(
            f"{args.data} has {usable} usable relations (>= {needed} sentences"
            f"{'' if args.keep_trained else ', not trained on'}), fewer than the ways of "
            f"{too_many}; lower N in --settings" + ("" if args.keep_trained else
                                                    " or pass --keep-trained"))
    print(f"{args.data.name}: {table.num_rows} sentences of {usable} relations scored; "
          f"skipped {len(relations['too_few_sentences'])} with < {needed} sentences; "
          f"{len(relations['trained_on'])} trained on "
          f"({'excluded' if not args.keep_trained else 'kept, flagged'}): "
          f"{relations['trained_on']}")
    set_threads(cfg.threads)
    device = select_device(cfg.device, f"{args.params} evaluate.device")
    per_split, nota = {}, {}
    with torch.no_grad():
        cache = LowerCache()
        for i, split in enumerate(found):
            # The file is no model's split, so no model is checked against one.
            per_split[split], nota[split] = evaluate_episodes(
                SplitEpisodes(split, table, cfg, i), args.models, cfg, device, cache)
    summary = report.summarise(per_split, nota)
    summary["relations"] = {**relations, "parsed": {k: v for k, v in parsed.items()
                                                    if k != "instances_per_relation"}}
    metrics = report.headline_metrics(summary, args.data.stem, tuple(methods))
    note = (f"{args.data.name}: {usable} relations, {cfg.episodes} episodes per setting and "
            f"checkpoint split, {cfg.queries} queries per way; models from {args.models}. "
            f"Relations trained on: {relations['trained_on'] or 'none'}"
            f"{' (kept, flagged)' if args.keep_trained else ' (excluded)'}.")
    text = report.markdown_report(summary, [s.name for s in settings], note)
    with atomic_paths(*outputs) as (metrics_tmp, report_tmp, table_tmp):  # all or none
        report.write_json_ordered(metrics, metrics_tmp)
        report.write_json_ordered(summary, report_tmp)
        table_tmp.write_text(text)
    print(text)
    return {"metrics": metrics, "relations": relations}


def main(argv: list[str] | None = None) -> None:
    """Console entry point ``regrab-score``: one ``error:`` line on bad input."""
    run_cli(score, argv)


if __name__ == "__main__":
    main()
