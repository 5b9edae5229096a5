"""The ``transfer`` stage's report: its DVC metrics and its markdown tables.

:func:`headline` gathers, per transfer set and benchmark, the accuracy, the paired differences
with the untrained floor and with REGRAB, the calibration (ECE), the prior kinds, the
out-of-set detection and the unequal-shot gains; :func:`markdown` writes every set x
benchmark table. Both read the summaries :func:`model.evaluation.transfer.score_table` makes
and lay out the tables of :mod:`pipeline.report`, :mod:`pipeline.detection` and
:mod:`model.evaluation.shots` (whose unequal-shot tables are the model's, so this module sits
beside them rather than in ``pipeline/``).
"""

from __future__ import annotations

from typing import Any

from model.evaluation import shots
from model.evaluation.config import TransferParams
from pipeline import detection, report


def paired_ci(cell: dict[str, Any]) -> float:
    """The interval of a paired difference: over splits, or over episodes with one split."""
    return cell["ci95"] if cell["ci95"] is not None else cell["episode_ci95"]


def headline(results: dict[str, dict[str, dict[str, Any]]],
             shuffled: list[str] | None = None) -> dict[str, Any]:
    """The DVC metrics: accuracy, paired differences with the floor, ECE, prior kinds."""
    acc: dict[str, Any] = {}
    paired: dict[str, Any] = {}
    ece: dict[str, Any] = {}
    priors: dict[str, Any] = {}
    vs_regrab: dict[str, Any] = {}
    uncertainty: dict[str, Any] = {}
    unequal: dict[str, Any] = {}
    for name, by_bench in results.items():
        for bench, summary in by_bench.items():
            found = detection.headline_detection(summary)
            if found:
                uncertainty.setdefault(name, {})[bench] = found
            acc.setdefault(name, {})[bench] = {
                m: {s: round(c["mean"], 2) for s, c in row.items()}
                for m, row in summary["accuracy"].items()}
            paired.setdefault(name, {})[bench] = {
                k: {s: {"diff": round(c["diff"], 2), "ci95": round(paired_ci(c), 2)}
                    for s, c in row.items()}
                for k, row in summary["vs_floor"].items()}
            ece.setdefault(name, {})[bench] = {
                m: {s: round(c["ece"]["mean"], 2) for s, c in row.items()}
                for m, row in summary["calibration"].items() if m != "floor"}
            priors.setdefault(name, {})[bench] = summary["priors"]
            if shots.headline(summary["shots"]):
                unequal.setdefault(name, {})[bench] = shots.headline(summary["shots"])
            vs_regrab.setdefault(name, {})[bench] = {
                k: {s: {"diff": round(c["diff"], 2),
                        "ci95": None if c["ci95"] is None else round(c["ci95"], 2)}
                    for s, c in row.items()}
                for k, row in summary["paired"].items() if not k.startswith("floor")}
    return {**acc, "paired": paired, "vs_regrab": vs_regrab, "ece": ece, "priors": priors,
            "uncertainty": {k: v for k, v in uncertainty.items() if v}, "shots": unequal,
            "shuffled": sorted(shuffled or [])}


def markdown(results: dict[str, dict[str, dict[str, Any]]], params: TransferParams) -> str:
    """Every set x benchmark table, with the paired differences with the floor."""
    parts = []
    for name, by_bench in results.items():
        for bench, summary in by_bench.items():
            rel = summary["relations"]
            note = (f"{params.sets[name].title}: {len(rel['relations_scored'])} relations, at "
                    f"most {params.per_relation or 'all'} sentences each; checkpoints of "
                    f"{bench} ({len(summary['splits'])} split(s)), {params.episodes} episodes "
                    f"per setting and split. Priors (ways): "
                    + "; ".join(f"{m}: " + ", ".join(f"{k} {n}" for k, n in c.items())
                                for m, c in summary["priors"].items()))
            skipped = summary.get("skipped_settings") or {}
            if skipped:
                note += (f". Not scored: {', '.join(skipped)} ("
                         + next(iter(skipped.values())) + ")")
            parts.append(f"## {name}, {bench} checkpoints\n\n"
                         + report.markdown_report(summary, [*params.settings, *(
                             n for s in summary["shots"]["gain"]
                             for n in shots.UnequalSetting.parse(s).names())], note)
                         + "\n".join(detection.markdown_detection(
                             summary, "other episodes of the same relations")
                                     + shots.markdown(summary["shots"])) + "\n")
            rows = [[k] + [f"{c[s]['diff']:+.2f} ± {paired_ci(c[s]):.2f}" if s in c else "–"
                           for s in params.settings]
                    for k, c in summary["vs_floor"].items()]
            parts.append("Paired difference with the untrained floor, points (± t 95% CI over "
                         "splits; one split: normal 95% CI over its paired episodes)\n\n"
                         + "\n".join(["| comparison | " + " | ".join(params.settings) + " |",
                                      "|---|" + "---:|" * len(params.settings)]
                                     + ["| " + " | ".join(r) + " |" for r in rows]) + "\n")
    return "\n".join(parts)
