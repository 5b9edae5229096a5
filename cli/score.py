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
* absent from a REGRAB checkpoint's relation graph: scored with a prior read from the
  relation's name (the key, e.g. ``gene_found_in_organism``), or the learned fallback when the
  key is a bare id; the output counts the ways of each kind.

Usage:
    regrab-score --data ../shared/data/fewrel/val_nyt.json --models models/fewrel \
        --out metrics/own [--settings 5w1s,5w5s] [--episodes 1000] [--methods regrab,proto]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch

from cli.guard import refuse_same, run_command
from model.episodes import Setting
from model.evaluation.splits import EvalConfig
from model.evaluation.transfer import score_table
from pipeline import report
from pipeline.config import load_section, select_device, set_threads
from pipeline.fewrel import convert, load_json
from pipeline.io import atomic_paths, check_writable

log = logging.getLogger(__name__)


def score(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse arguments, score, write the tables; returns metrics and the relation lists."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="FewRel-format JSON file")
    parser.add_argument("--models", type=Path, required=True,
                        help="a benchmark's models folder (split_*/<method>/model.safetensors)")
    parser.add_argument("--out", type=Path, required=True,
                        help="output prefix: OUT.json (metrics), OUT.md, OUT_report.json; "
                             "all three are checked before scoring and written together or "
                             "not at all")
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
    for path in outputs:  # every one before the scoring, not after it
        check_writable(path)
        refuse_same(path, "output", {"--data": args.data, "--params": args.params})
    settings = [Setting.parse(s) for s in args.settings.split(",") if s]
    base = load_section(EvalConfig, "evaluate", args.params)
    table, parsed = convert(args.data.stem, load_json(args.data, fix=(
        "give --data a FewRel-format JSON file: {relation: [{tokens, h, t}, ...]}")), {})
    set_threads(base.threads)
    device = select_device(base.device, f"{args.params} evaluate.device")
    with torch.no_grad():
        result = score_table(
            args.data.name, table, args.models, base, settings, device,
            methods=[m for m in args.methods.split(",") if m] if args.methods else None,
            episodes=args.episodes, keep_trained=args.keep_trained,
            listed=parsed["instances_per_relation"])
    summary, cfg, methods = result["summary"], result["cfg"], result["methods"]
    relations = summary["relations"]
    usable, needed = len(relations["relations_scored"]), result["needed"]
    print(f"{args.data.name}: {result['sentences']} sentences of {usable} relations scored; "
          f"skipped {len(relations['too_few_sentences'])} with < {needed} sentences; "
          f"{len(relations['trained_on'])} trained on "
          f"({'excluded' if not args.keep_trained else 'kept, flagged'}): "
          f"{relations['trained_on']}")
    for method, counts in summary["priors"].items():
        print(f"{method} priors over the ways of every episode: "
              + ", ".join(f"{k} {n}" for k, n in counts.items())
              + " (graph: relation graph and label; label: the relation's name alone)")
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
    """Console entry point ``regrab-score``: one ``error:`` line on bad input (exit 2);
    Ctrl-C exits 130, SIGTERM 143, with none of the outputs written."""
    run_command(score, argv)


if __name__ == "__main__":
    main()
