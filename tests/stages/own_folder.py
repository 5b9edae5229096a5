"""A small ``data/own`` folder for the own-relations tests: FewRel-format and JSONL files,
``relations.json``, and the benchmark files whose relations it must not be."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from model.predict.sentences import Sentence
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from tests.model.tiny_regrab import toy_table

#: Own relation key -> the toy relation whose sentences it gets (its verb word).
OWN = {"founded_by": "O13", "works_for": "O14", "member_of_band": "O16", "capital_of": "O17"}
NAMES = {"founded_by": ["founded by", "the person or group that founded the subject"],
         "works_for": ["works for"], "member_of_band": ["member of band", "a band the "
                                                        "subject plays in"],
         "capital_of": ["capital of", "No description defined"]}


def toy_rows(key: str, n: int, seed: int = 3) -> list[dict]:
    rows = toy_table([OWN[key]], n, seed=seed).to_pylist()
    return [{**r, "relation": key} for r in rows]


def fewrel_records(rows: list[dict]) -> list[dict]:
    return [{"tokens": r["tokens"],
             "h": ["h", "Q1", [list(range(r["head_start"], r["head_end"]))]],
             "t": ["t", "Q2", [list(range(r["tail_start"], r["tail_end"]))]]} for r in rows]


def jsonl_lines(rows: list[dict]) -> list[str]:
    return [json.dumps({"relation": r["relation"], "text": Sentence(
        tuple(r["tokens"]), (r["head_start"], r["head_end"]),
        (r["tail_start"], r["tail_end"])).marked()}) for r in rows]


def own_folder(folder: Path, per_relation: int = 12, bad_lines: int = 1) -> Path:
    """Four relations: two in a FewRel file, one in a JSONL file, and one split between
    the two; ``bad_lines`` malformed JSONL lines; every relation named."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text("# notes\n")
    half = per_relation // 2
    founded = toy_rows("founded_by", per_relation)
    (folder / "labelled.json").write_text(json.dumps({
        "founded_by": fewrel_records(founded[:half]),
        "capital_of": fewrel_records(toy_rows("capital_of", per_relation)),
        "member_of_band": fewrel_records(toy_rows("member_of_band", per_relation))}))
    lines = jsonl_lines(toy_rows("works_for", per_relation) + founded[half:])
    lines[1:1] = ['{"relation": "works_for", "text": "no markers here"}'] * bad_lines
    (folder / "more.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "relations.json").write_text(json.dumps(NAMES))
    return folder


def benchmark_files(folder: Path) -> dict[str, Path]:
    """A test file (relations P1 "part of" and P2 "sport") and a training file (P10, P11)."""
    test = toy_table(["P1", "P2"], 4, seed=0).to_pylist()
    for row in test:
        row["relation_name"] = {"P1": "part of", "P2": "sport"}[row["relation"]]
    paths = {"test": folder / "val_wiki.parquet", "train": folder / "train_wiki.parquet"}
    write_parquet(pa.Table.from_pylist(test, schema=FEWSHOT_SCHEMA), paths["test"],
                  FEWSHOT_SCHEMA)
    write_parquet(toy_table(["P10", "P11"], 4, seed=1), paths["train"], FEWSHOT_SCHEMA)
    return paths
