"""The small predict inputs the command tests share: one tiny 3-way problem."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

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


def fewrel_record(row: dict) -> dict:
    """A toy table row as a FewRel record ``{tokens, h, t}``."""
    return {"tokens": row["tokens"],
            "h": ["h", "Q1", [list(range(row["head_start"], row["head_end"]))]],
            "t": ["t", "Q2", [list(range(row["tail_start"], row["tail_end"]))]]}


def one_error(capsys, call: Callable[[], object], code: int = 2) -> str:
    """Run a command's ``call``: it must exit ``code`` with exactly one ``error:`` line on
    stderr and no traceback; returns that line."""
    with pytest.raises(SystemExit) as exc:
        call()
    assert exc.value.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err, err
    return err.strip()
