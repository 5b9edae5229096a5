"""The small predict inputs the command tests share: one tiny 3-way problem."""

from __future__ import annotations

import json
from pathlib import Path

from model.predict.sentences import parse_sentence
from tests.model.tiny_regrab import toy_table

RELATIONS = ["P6", "P7", "P8"]


def write_predict_inputs(root: Path) -> list[dict]:
    """Write ``support.jsonl`` (3 ways x 2 shots) and ``queries.jsonl`` (three queries) into
    ``root``; returns the toy rows they were made from."""
    rows = toy_table(RELATIONS, 4, seed=4).to_pylist()
    support = [{"relation": r["relation"], "text": parse_sentence(r).marked()}
               for r in rows if int(r["instance_id"].rsplit("-", 1)[1]) < 2]
    queries = [{"text": parse_sentence(r).marked()} for r in rows[2::4]]
    (root / "support.jsonl").write_text("".join(json.dumps(s) + "\n" for s in support))
    (root / "queries.jsonl").write_text("".join(json.dumps(q) + "\n" for q in queries))
    return rows
