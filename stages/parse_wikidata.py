"""Parse Wikidata JSON dumps and triple files into deduplicated (head, relation, tail) triples.

The inputs are cut into byte ranges that run as tasks on Dask: a local cluster sized to the
machine by default, or an existing scheduler (``--cluster`` or ``$REGRAB_DASK_ADDRESS``);
``--workers 0`` parses in this process. The tables are the same whichever runs them.
Malformed lines are skipped and counted; a damaged compressed range keeps what came before
the damage and, unless ``--allow-damaged``, fails the stage after every output is written.
A killed run resumes from the ranges it had finished. The library is ``pipeline.wikidata``.

The relations table gives each property's English label, description and aliases, and says
where the label and description came from: the property's entity in a dump, else
``--pid2name`` (which has no aliases). A text field of the wrong shape is skipped and
counted in the report (``malformed_texts`` per input), never fatal.

The report (a git-tracked DVC output) holds only what the inputs decide, so a rerun writes it
byte for byte; how this run went (each input's wall and CPU seconds, the engine and worker
count) goes to ``<report stem>.timing.json`` beside it, which git ignores and DVC does not
track.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from pipeline import stage_cli
from pipeline.errors import PipelineError, run_cli
from pipeline.io import write_json, write_parquet
from pipeline.schemas import RELATIONS_SCHEMA
from pipeline.wikidata.collect import work_dir_for
from pipeline.wikidata.engine import ADDRESS_ENV, parse_inputs
from pipeline.wikidata.formats import usable_cores
from pipeline.wikidata.ranges import DEFAULT_BATCH_BYTES, DEFAULT_RANGE_BYTES
from pipeline.wikidata.tables import (
    Pid2Name,
    first_occurrences,
    load_pid2name,
    relation_coverage,
    relations_table,
    write_triples,
)

#: Per-input report keys that change with the machine's speed, not with the inputs.
TIMING_KEYS = ("seconds", "cpu_seconds")


def timing_path(report: Path) -> Path:
    """Where the run record of ``report`` goes: ``report.json`` -> ``report.timing.json``."""
    return report.with_name(report.name.split(".")[0] + ".timing.json")


def split_timing(report: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split ``report`` into what the inputs decide and how this run went.

    Returns:
        The report without per-input ``seconds``/``cpu_seconds`` and ``settings`` (the
        ``--report`` file), and those (the :func:`timing_path` file).
    """
    inputs = [{k: v for k, v in item.items() if k not in TIMING_KEYS} for item in report["inputs"]]
    timing = {
        "inputs": [{"name": item["name"], **{k: item[k] for k in TIMING_KEYS if k in item}}
                   for item in report["inputs"]],
        "settings": report["settings"],
    }
    kept = {k: v for k, v in report.items() if k != "settings"}
    return {**kept, "inputs": inputs}, timing


def _summary_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for item in report["inputs"]:
        bad = item["malformed_statements"]
        bad = f", {bad} bad statements" if bad else ""
        texts = sum(item["malformed_texts"].values())
        bad += f", {texts} bad property texts" if texts else ""
        dump = item["format"] == "dump"
        what = f"{item['entities']:,} entities" if dump else f"{item['records']:,} rows"
        lines.append(
            f"{item['name']}: {item['distinct_triples']:,} triples ({item['new_triples']:,} "
            f"new) from {what}; {item['malformed_lines']:,} malformed lines{bad}"
        )
        if item["stream_error"]:
            lines.append(
                f"  WARNING: damaged stream ({item['damaged_ranges']} of {item['ranges']} "
                f"ranges), kept what came before: {item['stream_error']}"
            )
    lines.append(
        f"total: {report['triples']:,} distinct triples, {report['relations']:,} relations "
        f"(labels: {report['labels']['dump']} from dumps, {report['labels']['pid2name']} from "
        f"pid2name, {report['labels']['missing']} missing)"
    )
    described, aliases = report["descriptions"], report["aliases"]
    lines.append(
        f"descriptions: {described['dump']} from dumps, {described['pid2name']} from pid2name, "
        f"{described['missing']} missing; {aliases['relations']} relations with aliases "
        f"({aliases['aliases']} in all)"
    )
    for name, cov in report["coverage"].items():
        missing = ", ".join(cov["missing"]) or "none"
        lines.append(
            f"coverage {name}: {cov['covered']} of {cov['relations']} relations; missing: {missing}"
        )
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = stage_cli.parser(__doc__, paragraph=True, prog="python -m stages.parse_wikidata")
    add = parser.add_argument
    add("inputs", nargs="*", type=Path, metavar="INPUT",
        help="Wikidata JSON dumps (.json, .bz2, .gz) and triple files (.tsv, .txt, .csv)")
    add("--out", required=True, type=Path, help="triples Parquet (TRIPLES_SCHEMA)")
    add("--relations-out", type=Path, help="relations Parquet (RELATIONS_SCHEMA)")
    add("--pid2name", type=Path,
        help="FewRel pid2name.json, fallback labels and descriptions")
    add("--report", type=Path, help="JSON report: per-file counts, coverage, damage")
    add("--coverage", nargs="+", action="extend", type=Path, default=[], metavar="FEWREL_JSON",
        help="FewRel-format files whose relation coverage to report; takes every path "
        "after it, so give the inputs before it (or end it with --)")
    add("--workers", type=int, default=usable_cores(),
        help="local Dask workers, one process each (default: all cores); 0 parses in "
        "this process")
    add("--cluster", default=os.environ.get(ADDRESS_ENV) or None, metavar="ADDRESS",
        help=f"existing Dask scheduler, e.g. tcp://host:8786 (default: ${ADDRESS_ENV}); "
        "its workers must see the inputs at the same paths")
    add("--range-mb", type=float, default=DEFAULT_RANGE_BYTES / 2**20,
        help="compressed MiB per work unit")
    add("--batch-mb", type=float, default=DEFAULT_BATCH_BYTES / 2**20,
        help="decompressed MiB parsed at once inside a unit")
    add("--allow-damaged", action="store_true",
        help="exit 0 even if a compressed input is truncated or corrupt")
    add("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the inputs, write triples, relations and report; return the report.

    The returned report also holds the timings and run settings that :func:`split_timing`
    keeps out of the ``--report`` file.
    """
    args = build_parser().parse_args(argv)
    if not args.inputs:
        raise PipelineError(
            "no INPUT files; --coverage takes every path after it, so list the inputs "
            "before --coverage or end its list with --"
        )
    if args.workers < 0 or args.range_mb <= 0 or args.batch_mb <= 0:
        raise PipelineError("--workers must be >= 0, --range-mb and --batch-mb > 0")
    pid2name = load_pid2name(args.pid2name) if args.pid2name else Pid2Name()
    for path in args.coverage:  # check the coverage files before the long parse
        relation_coverage(path, set())

    parsed, store = parse_inputs(
        args.inputs,
        work_dir_for(args.out),
        workers=args.workers,
        address=args.cluster,
        range_bytes=max(1, int(args.range_mb * 2**20)),
        batch_bytes=max(1, int(args.batch_mb * 2**20)),
        progress=not args.no_progress,
    )
    unusable = [
        s.name for s in parsed.stats if s.records and s.records == sum(s.malformed.values())
    ]
    if unusable:
        store.remove()
        raise PipelineError(
            f"no usable line in {unusable} (every line malformed); pass Wikidata JSON dumps "
            "or Qid/Pid/Qid triple files as INPUT (FewRel files go after --coverage)"
        )
    keep = first_occurrences(parsed)
    write_triples(parsed, keep, args.out)
    relations, text_counts = relations_table(parsed, keep, pid2name)
    if args.relations_out:
        write_parquet(relations, args.relations_out, RELATIONS_SCHEMA)
    present = set(relations.column("relation").to_pylist())
    damaged = [s.name for s in parsed.stats if s.damaged_ranges]
    report = {
        "inputs": [stats.to_json() for stats in parsed.stats],
        "triples": int(len(keep)),
        "relations": relations.num_rows,
        **text_counts,  # labels and descriptions by source, aliases
        "pid2name": {
            "names": len(pid2name.names),
            "descriptions": len(pid2name.descriptions),
            "malformed_descriptions": pid2name.malformed_descriptions,
        },
        "coverage": {path.name: relation_coverage(path, present) for path in args.coverage},
        "damaged": bool(damaged),
        "damaged_ranges": sum(s.damaged_ranges for s in parsed.stats),
        "settings": {
            "engine": parsed.engine,
            "workers": None if args.cluster else args.workers,  # the cluster's own count
            "cluster": args.cluster,
            "range_mb": args.range_mb,
        },
    }
    if args.report:
        written, timing = split_timing(report)
        write_json(written, args.report)
        write_json(timing, timing_path(args.report))
    store.remove()
    print("\n".join(_summary_lines(report)))
    if damaged and not args.allow_damaged:
        raise PipelineError(
            f"damaged compressed input(s) {damaged}: outputs hold only what was read before "
            "the damage; download them again, or pass --allow-damaged to accept this"
        )
    return report


if __name__ == "__main__":
    run_cli(main)
