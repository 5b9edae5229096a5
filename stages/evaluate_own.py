"""Stage ``evaluate_own``: FewRel's trained models on the team's held-out own relations.

The relations ``prepare_own`` held out of training (``heldout.parquet``, with their names and
descriptions from ``relations.json``) are scored like a transfer set
(:func:`model.evaluation.transfer.score_table`): every method of ``evaluate.methods`` trained
on FewRel, with the untrained ``floor`` on the same episodes, in the ``evaluate_own`` settings
that the held-out relations have enough ways for (the others are named as skipped). Priors of
relations outside the graph read the names and descriptions the team wrote.

Writes ``metrics/own.json`` (``accuracy.<method>.<setting>`` %, ``vs_floor``, what was held
out, scored and skipped) and ``metrics/own.md``, together. With no own relations, or none held
out, both say so and no model is loaded.

Usage:
    python -m stages.evaluate_own --own data/own_prepared --models models/fewrel \
        --metrics metrics/own.json --table metrics/own.md [--params params.yaml]
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import torch

from model.episodes import Setting
from model.evaluation.config import EvalConfig
from model.evaluation.own_config import EvaluateOwnParams
from model.evaluation.transfer import checkpoints, cut_relations, score_table
from pipeline import report, stage_cli
from pipeline.config import load_section
from pipeline.errors import run_cli
from pipeline.fewrel import load_json, load_relation_texts
from pipeline.io import atomic_paths, check_writable, read_fewshot

log = logging.getLogger(__name__)


def playable(counts: dict[str, int], settings: list[Setting], queries: int
             ) -> tuple[list[Setting], dict[str, str]]:
    """The settings the relations have enough ways for (each relation needs K + Q sentences
    for the largest K scored), and why each other one is skipped."""
    needed = max(s.shots for s in settings) + queries
    usable = sum(n >= needed for n in counts.values())
    kept = [s for s in settings if s.ways <= usable]
    skipped = {s.name: f"needs {s.ways} held-out relations with {needed} sentences, "
                       f"{usable} have them" for s in settings if s.ways > usable}
    return kept, skipped


def metrics_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The numbers of :func:`score_table`'s summary worth a glance: accuracy, paired
    differences with the floor, where each way's prior came from."""
    return {
        "accuracy": {m: {s: round(c["mean"], 2) for s, c in row.items()}
                     for m, row in summary["accuracy"].items()},
        "vs_floor": {k: {s: {"diff": round(c["diff"], 2),
                             "ci95": round(c["episode_ci95"], 2)} for s, c in row.items()}
                     for k, row in summary["vs_floor"].items()},
        "priors": summary["priors"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = stage_cli.parser(__doc__)
    parser.add_argument("--own", type=Path, default=Path("data/own_prepared"),
                        help="prepare_own's output folder")
    parser.add_argument("--models", type=Path, default=Path("models/fewrel"),
                        help="FewRel's models folder (split_*/<method>/)")
    parser.add_argument("--metrics", type=Path, default=Path("metrics/own.json"))
    parser.add_argument("--table", type=Path, default=Path("metrics/own.md"))
    stage_cli.add_params(parser)
    args = parser.parse_args(argv)
    stage_cli.start_logging()
    cfg = load_section(EvaluateOwnParams, "evaluate_own", args.params)
    base = load_section(EvalConfig, "evaluate", args.params)
    for out in (args.metrics, args.table):
        check_writable(out)
    prepared = load_json(args.own / "summary.json", fix="run dvc repro prepare_own")
    held = read_fewshot(args.own / "heldout.parquet")
    result: dict[str, Any] = {"own_relations": len(prepared["relations"]),
                              "trained": prepared["train"], "heldout": prepared["heldout"]}
    lines = ["# Own relations", ""]
    if not prepared["relations"]:
        lines.append("No own relations: data/own holds no data file "
                     "(docs/pipeline.md, \"Your own labelled relations\").")
    elif not held.num_rows:
        lines.append(f"{len(prepared['relations'])} own relations, all trained on: none is "
                     "held out (prepare_own.heldout_share), so none is scored.")
    else:
        settings = [Setting.parse(s) for s in cfg.settings]
        table = cut_relations(held, cfg.per_relation, cfg.seed)
        counts = {c["values"]: c["counts"]
                  for c in pc.value_counts(table["relation"]).to_pylist()}
        kept, skipped = playable(counts, settings, base.queries)
        result["settings_skipped"] = skipped
        note = (f"FewRel's models on {len(prepared['heldout'])} held-out own relations "
                f"({', '.join(prepared['heldout'])}), at most {cfg.per_relation or 'all'} "
                f"sentences each, {cfg.episodes} episodes per setting; {len(prepared['train'])} "
                "other own relations joined FewRel's training relations.")
        lines += [f"Skipped {s}: {why}." for s, why in skipped.items()]
        if kept:
            texts = load_relation_texts(args.own / "relations.json")
            device = stage_cli.threads_and_device(base.threads, base.device,
                                                  f"{args.params} evaluate.device")
            found = checkpoints(args.models, list(base.methods))
            methods = [m for m in base.methods if all(m in p for p in found.values())]
            with torch.no_grad():
                out = score_table(f"own relations ({args.own})", table, args.models, base,
                                  kept, device, methods=methods or None, episodes=cfg.episodes,
                                  listed=prepared["heldout"], workers=base.workers,
                                  descriptions={k: d for k, (_, d) in texts.items()})
            result["scored"] = out["summary"]["relations"]["relations_scored"]
            result |= metrics_of(out["summary"])
            lines += ["", report.markdown_report(out["summary"], [s.name for s in kept],
                                                 note)]
        else:
            lines += [note, "", "No setting has enough held-out relations: hold more out "
                      "(prepare_own.heldout_share) or list fewer ways in evaluate_own.settings."]
    with atomic_paths(args.metrics, args.table) as (m_tmp, t_tmp):
        report.write_json_ordered(result, m_tmp)
        t_tmp.write_text("\n".join(lines).rstrip() + "\n")
    print(f"{args.metrics}, {args.table}: {result['own_relations']} own relation(s), "
          f"{len(result['heldout'])} held out, {len(result.get('scored', []))} scored")
    return result


if __name__ == "__main__":
    run_cli(main)
