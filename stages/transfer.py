"""Stage ``transfer``: score every benchmark's checkpoints on relations and text they never saw.

For each set of ``transfer.sets`` (SemEval-2010 by default; another set is one params entry)
and each benchmark of ``benchmarks`` with trained models, every method trained on every
split is scored with the untrained ``floor`` on the same episodes
(:mod:`model.evaluation.transfer`).
Relations with more than ``transfer.per_relation`` sentences are cut to that many (a seeded
random choice), so a large relation costs no more than a small one.

Writes ``metrics/transfer.json`` (DVC metrics: ``<set>.<benchmark>.<method>.<setting>``
accuracy %, ``paired.<set>.<benchmark>.<method>_minus_floor.<setting>.{diff,ci95}``,
``vs_regrab.<set>.<benchmark>.<method>_minus_regrab.<setting>.{diff,ci95}`` (paired on the
same episodes, t interval over splits), ``shuffled`` (the stress-test sets), ``ece...`` and
``priors.<set>.<benchmark>.<method>``: ways whose prior came from the graph, the relation's
name alone, or the shared fallback, and ways whose prior read a name and description, a name
only, or no text), the tables in
``metrics/transfer.md`` and everything behind them in ``metrics/transfer_report.json``.

Usage:
    python -m stages.transfer --models models --metrics metrics/transfer.json \
        --report metrics/transfer_report.json --table metrics/transfer.md [--params params.yaml]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from model.episodes import Setting
from model.evaluation import shots
from model.evaluation.config import EvalConfig, TransferParams, TransferSet
from model.evaluation.transfer import checkpoints, cut_relations, score_table
from pipeline import detection, report
from pipeline.cluster import add_cluster_argument
from pipeline.config import load_benchmarks, load_section, select_device, set_threads
from pipeline.errors import PipelineError, run_cli
from pipeline.fewrel import load_relation_texts
from pipeline.io import atomic_paths, check_writable, read_fewshot

log = logging.getLogger(__name__)


def relation_texts(name: str, spec: TransferSet, table: pa.Table, seed: int
                   ) -> tuple[pa.Table, dict[str, str | None]]:
    """The set's table with the names of ``spec.relations`` (when given) and, with
    ``spec.shuffle``, every relation's id, name and description moved to another relation;
    and the descriptions to read, by relation id."""
    keys = sorted(set(table.column("relation").to_pylist()))
    texts: dict[str, tuple[str, str | None]] = {}
    if spec.relations is not None:
        path = Path(spec.relations)
        if not path.is_file():
            raise PipelineError(f"transfer set {name}: relations file {path} not found; add it "
                                "to fetch.files and run dvc repro fetch, or set relations: null")
        texts = load_relation_texts(path)
        missing = [k for k in keys if k not in texts]
        if missing:
            raise PipelineError(f"transfer set {name}: {path} names no text for {len(missing)} "
                                f"relation(s), e.g. {missing[0][:80]!r}; add them to the file")
    first: dict[str, str] = {}
    for r, n in zip(table.column("relation").to_pylist(),
                    table.column("relation_name").to_pylist(), strict=True):
        first.setdefault(r, n)
    names = {k: texts[k][0] if k in texts else first[k] for k in keys}
    said = {k: texts[k][1] if k in texts else None for k in keys}
    ids = {k: k for k in keys}
    if spec.shuffle:
        if len(keys) < 2:
            raise PipelineError(f"transfer set {name}: shuffle needs 2 or more relations")
        rng = np.random.default_rng([seed, 7])
        while True:  # a derangement: no relation keeps its own text
            order = rng.permutation(len(keys))
            if all(int(order[i]) != i for i in range(len(keys))):
                break
        ids = {k: keys[int(order[i])] for i, k in enumerate(keys)}
    rel = [ids[r] for r in table.column("relation").to_pylist()]
    table = table.set_column(table.schema.get_field_index("relation"),
                             table.schema.field("relation"), pa.array(rel, pa.string()))
    table = table.set_column(table.schema.get_field_index("relation_name"),
                             table.schema.field("relation_name"),
                             pa.array([names[r] for r in rel], pa.string()))
    return table, said


def _ci(cell: dict[str, Any]) -> float:
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
                k: {s: {"diff": round(c["diff"], 2), "ci95": round(_ci(c), 2)}
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
            parts.append(f"## {name}, {bench} checkpoints\n\n"
                         + report.markdown_report(summary, [*params.settings, *(
                             n for s in summary["shots"]["gain"]
                             for n in shots.UnequalSetting.parse(s).names())], note)
                         + "\n".join(detection.markdown_detection(
                             summary, "other episodes of the same relations")
                                     + shots.markdown(summary["shots"])) + "\n")
            rows = [[k] + [f"{c[s]['diff']:+.2f} ± {_ci(c[s]):.2f}" if s in c else "–"
                           for s in params.settings]
                    for k, c in summary["vs_floor"].items()]
            parts.append("Paired difference with the untrained floor, points (± t 95% CI over "
                         "splits; one split: normal 95% CI over its paired episodes)\n\n"
                         + "\n".join(["| comparison | " + " | ".join(params.settings) + " |",
                                      "|---|" + "---:|" * len(params.settings)]
                                     + ["| " + " | ".join(r) + " |" for r in rows]) + "\n")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=Path, default=Path("models"),
                        help="folder of the benchmarks' models folders")
    parser.add_argument("--metrics", type=Path, required=True)
    parser.add_argument("--report", type=Path, required=True)
    parser.add_argument("--table", type=Path, required=True)
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    add_cluster_argument(parser, "scoring jobs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    params = load_section(TransferParams, "transfer", args.params)
    base = load_section(EvalConfig, "evaluate", args.params)
    benchmarks = load_benchmarks(args.params)
    for out in (args.metrics, args.report, args.table):
        check_writable(out)
    settings = [Setting.parse(s) for s in params.settings]
    set_threads(base.threads)
    device = select_device(base.device, f"{args.params} evaluate.device")
    results: dict[str, dict[str, dict[str, Any]]] = {}
    for name, spec in params.sets.items():
        unknown = sorted(set(spec.benchmarks) - set(benchmarks))
        if unknown:
            raise PipelineError(f"transfer.sets.{name}.benchmarks names {unknown}, not in "
                                f"benchmarks ({', '.join(benchmarks)}); fix the names")
        path = Path(spec.data)
        if not path.is_file():
            raise PipelineError(f"transfer set {name}: {path} not found; add it to "
                                "prepare_fewshot.datasets and run dvc repro prepare_fewshot")
        table = cut_relations(read_fewshot(path), params.per_relation, params.seed)
        table, descriptions = relation_texts(name, spec, table, params.seed)
        for bench in benchmarks:
            if spec.benchmarks and bench not in spec.benchmarks:
                continue
            folder = args.models / bench
            if not folder.is_dir():
                log.warning("no models for %s under %s; skipped", bench, args.models)
                continue
            log.info("%s: %s checkpoints on %d sentences", name, bench, table.num_rows)
            with torch.no_grad():
                # The evaluate section's methods trained on every split (the comparison's
                # run on fewer splits and episodes).
                found = checkpoints(folder, list(base.methods))
                methods = [m for m in base.methods if all(m in p for p in found.values())]
                out = score_table(f"{name} ({path})", table, folder, base, settings, device,
                                  methods=methods or None, episodes=params.episodes,
                                  listed=table.column("relation").to_pylist(),
                                  workers=base.workers, descriptions=descriptions,
                                  nota=spec.nota, unequal=spec.unequal, cluster=args.cluster)
            results.setdefault(name, {})[bench] = out["summary"]
    if not results:
        raise PipelineError(f"no benchmark has models under {args.models}; run dvc repro train")
    with atomic_paths(args.metrics, args.report, args.table) as (m_tmp, r_tmp, t_tmp):
        report.write_json_ordered(
            headline(results, [n for n in results if params.sets[n].shuffle]), m_tmp)
        report.write_json_ordered(results, r_tmp, digits=4)
        t_tmp.write_text(markdown(results, params))
    return results


if __name__ == "__main__":
    run_cli(main)
