"""Convert FewRel-format JSON files into one validated Parquet table each.

FewRel layout: ``{"P413": [{"tokens": [...], "h": [name, qid, [[pos, ...]]],
"t": [...]}, ...]}``. Each record becomes one row of ``FEWSHOT_SCHEMA``; the
first mention of each entity gives its half-open span. Malformed records are
skipped and counted by reason in ``report.json``, never kept and never fatal.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa

from pipeline.config import load_params
from pipeline.errors import PipelineError, run_cli
from pipeline.io import write_json, write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA

#: Dataset names this stage knows, and the file each is read from.
KNOWN_DATASETS = {
    "val_nyt": "val_nyt.json",
    "val_wiki": "val_wiki.json",
    "train_wiki": "train_wiki.json",
    "val_pubmed": "val_pubmed.json",
}


class BadRecord(ValueError):
    """A record that cannot be used; the message is the skip reason."""


def _span(entity: Any, n_tokens: int, side: str) -> tuple[int, int, str | None]:
    if not isinstance(entity, list) or len(entity) < 3:
        raise BadRecord(f"{side}_malformed")
    mentions = entity[2]
    if not isinstance(mentions, list) or not mentions or not isinstance(mentions[0], list):
        raise BadRecord(f"{side}_no_mention")
    positions = mentions[0]
    if not positions or not all(isinstance(p, int) and not isinstance(p, bool) for p in positions):
        raise BadRecord(f"{side}_bad_positions")
    start, end = min(positions), max(positions) + 1
    if start < 0 or end > n_tokens:
        raise BadRecord(f"{side}_span_outside_sentence")
    qid = entity[1] if isinstance(entity[1], str) and entity[1] else None
    return start, end, qid


def parse_record(record: Any) -> dict[str, Any]:
    """Validate one FewRel record and return its span fields, or raise BadRecord."""
    if not isinstance(record, dict):
        raise BadRecord("not_an_object")
    tokens = record.get("tokens")
    if not isinstance(tokens, list) or not tokens:
        raise BadRecord("empty_tokens")
    if not all(isinstance(tok, str) and tok for tok in tokens):
        raise BadRecord("bad_token")
    h_start, h_end, h_id = _span(record.get("h"), len(tokens), "head")
    t_start, t_end, t_id = _span(record.get("t"), len(tokens), "tail")
    if h_start < t_end and t_start < h_end:
        # Entity markers cannot be placed around overlapping mentions.
        raise BadRecord("overlapping_entities")
    return {
        "tokens": tokens,
        "head_start": h_start, "head_end": h_end,
        "tail_start": t_start, "tail_end": t_end,
        "head_id": h_id, "tail_id": t_id,
    }


def convert(
    name: str, data: Any, relation_names: dict[str, str]
) -> tuple[pa.Table, dict[str, Any]]:
    """Turn a loaded FewRel dict into a table and a report of what was skipped."""
    if not isinstance(data, dict):
        raise PipelineError(
            f"{name}: expected a JSON object mapping relation ids to lists; re-fetch it"
        )
    rows: dict[str, list[Any]] = {field.name: [] for field in FEWSHOT_SCHEMA}
    skipped: Counter[str] = Counter()
    per_relation: dict[str, int] = {}
    for relation in sorted(data):
        records = data[relation]
        if not isinstance(records, list):
            skipped["relation_not_a_list"] += 1
            continue
        kept = 0
        for index, record in enumerate(records):
            try:
                fields = parse_record(record)
            except BadRecord as exc:
                skipped[str(exc)] += 1
                continue
            rows["instance_id"].append(f"{name}-{relation}-{index:05d}")
            rows["relation"].append(relation)
            rows["relation_name"].append(relation_names.get(relation, relation))
            for key, value in fields.items():
                rows[key].append(value)
            kept += 1
        per_relation[relation] = kept
    table = pa.table(rows, schema=FEWSHOT_SCHEMA)
    report = {
        "kept": table.num_rows,
        "skipped": sum(skipped.values()),
        "skipped_by_reason": dict(sorted(skipped.items())),
        "relations": len(per_relation),
        "instances_per_relation": per_relation,
    }
    return table, report


def load_json(path: Path) -> Any:
    """Load a JSON file, turning a missing or corrupt file into a one-line error."""
    if not path.is_file():
        raise PipelineError(f"{path} not found; run the fetch stage first (dvc repro fetch)")
    try:
        with path.open("rb") as fh:
            return json.load(fh)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PipelineError(
            f"{path} is not valid JSON ({exc}); re-fetch it with dvc repro -f fetch"
        ) from exc


def load_relation_names(path: Path | None) -> dict[str, str]:
    """Map relation id -> English name from FewRel's ``pid2name.json`` (optional)."""
    if path is None or not path.exists():
        return {}
    data = load_json(path)
    return {pid: value[0] for pid, value in data.items() if isinstance(value, list) and value}


def prepare(raw: Path, out: Path, datasets: list[str], pid2name: Path | None) -> dict[str, Any]:
    """Convert each dataset and write ``out/<name>.parquet`` plus ``out/report.json``."""
    unknown = [name for name in datasets if name not in KNOWN_DATASETS]
    if unknown:
        raise PipelineError(
            f"unknown dataset {unknown[0]!r} in prepare_fewshot.datasets; "
            f"known: {sorted(KNOWN_DATASETS)}"
        )
    names = load_relation_names(pid2name)
    reports: dict[str, Any] = {}
    for name in datasets:
        table, report = convert(name, load_json(raw / KNOWN_DATASETS[name]), names)
        write_parquet(table, out / f"{name}.parquet", FEWSHOT_SCHEMA)
        reports[name] = report
        print(f"{name}: kept {report['kept']} instances of {report['relations']} relations, "
              f"skipped {report['skipped']} {report['skipped_by_reason'] or ''}".rstrip())
    write_json(reports, out / "report.json")
    return reports


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--raw", default="data/raw/fewrel", help="folder with FewRel JSON files")
    parser.add_argument("--out", default="data/fewshot")
    parser.add_argument("--pid2name", default=None, help="defaults to RAW/pid2name.json")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    cfg = load_params(args.params, "prepare_fewshot")
    raw = Path(args.raw)
    pid2name = Path(args.pid2name) if args.pid2name else raw / "pid2name.json"
    prepare(raw, Path(args.out), list(cfg["datasets"]), pid2name)


if __name__ == "__main__":
    run_cli(main)
