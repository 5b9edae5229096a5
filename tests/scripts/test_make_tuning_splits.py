"""scripts/make_tuning_splits.py reads its settings from params.yaml's tune_splits section."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.io import read_parquet, write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from scripts import make_tuning_splits
from tests.conftest import ROOT
from tests.model.tiny_regrab import toy_splits, toy_table

HELD = [f"P{i}" for i in range(10, 16)]  # six relations in no split


def project(tmp_path: Path, **section: int) -> tuple[list[str], Path]:
    """The arguments of a run on toy splits, and its params file (tune_splits set)."""
    splits = toy_splits(tmp_path / "splits", n_splits=2)
    held = tmp_path / "train_wiki.parquet"
    write_parquet(toy_table(HELD, per_relation=5, seed=3), held, FEWSHOT_SCHEMA)
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    tree = yaml.safe_load(params.read_text())
    tree["tune_splits"].update(section)
    params.write_text(yaml.safe_dump(tree))
    args = ["--splits", str(splits), "--heldout", str(held), "--out", str(tmp_path / "tune"),
            "--params", str(params)]
    return args, tmp_path / "tune"


def test_the_section_sets_relations_sentences_and_seed(tmp_path):
    args, out = project(tmp_path, relations=3, per_relation=2, seed=7)
    make_tuning_splits.main(args)
    tests = [read_parquet(out / f"split_{s}" / "test.parquet") for s in (0, 1)]
    assert tests[0].equals(tests[1])
    relations = tests[0].column("relation").to_pylist()
    assert len(set(relations)) == 3 and set(relations) <= set(HELD)
    assert all(relations.count(r) == 2 for r in set(relations))
    # The same seed draws the same relations; the train and val parts are the split's own.
    make_tuning_splits.main(args + ["--out", str(tmp_path / "again")])
    assert read_parquet(tmp_path / "again" / "split_0" / "test.parquet").equals(tests[0])
    assert (out / "split_1" / "val.parquet").read_bytes() == \
        (tmp_path / "splits" / "split_1" / "val.parquet").read_bytes()


def test_command_line_overrides_one_run_and_is_checked_by_the_schema(tmp_path):
    args, out = project(tmp_path, relations=3, per_relation=2, seed=7)
    make_tuning_splits.main(args + ["--relations", "5"])
    assert len(set(read_parquet(out / "split_0" / "test.parquet").column("relation")
                   .to_pylist())) == 5
    with pytest.raises(PipelineError, match=r"tune_splits .*per_relation = 0: expected a "
                       "number >= 1"):
        make_tuning_splits.main(args + ["--per-relation", "0"])


def test_bad_section_or_too_many_relations_is_one_line(tmp_path):
    args, _ = project(tmp_path, relations=0)
    with pytest.raises(PipelineError, match="tune_splits.relations = 0: expected a number >= 1"):
        make_tuning_splits.main(args)
    args, _ = project(tmp_path, relations=7)
    with pytest.raises(PipelineError, match="has 6 relations, fewer than tune_splits.relations"):
        make_tuning_splits.main(args)
