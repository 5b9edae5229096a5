from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import split_nyt

SIZES = {"train": 4, "val": 2, "test": 3}


def _table(n_relations: int = 10, per_relation: int = 30, small: dict | None = None) -> pa.Table:
    rows = []
    for r in range(n_relations):
        relation = f"P{r + 1}"
        for i in range((small or {}).get(relation, per_relation)):
            rows.append(
                {
                    "instance_id": f"x-{relation}-{i}",
                    "relation": relation,
                    "relation_name": relation,
                    "tokens": ["a", "b", "c"],
                    "head_start": 0,
                    "head_end": 1,
                    "tail_start": 2,
                    "tail_end": 3,
                    "head_id": None,
                    "tail_id": None,
                }
            )
    return pa.Table.from_pylist(rows, schema=FEWSHOT_SCHEMA)


def test_splits_are_disjoint_complete_and_written(tmp_path: Path) -> None:
    table = _table()
    summary = split_nyt.make_splits(table, tmp_path, [7, 8], SIZES, min_instances=20)
    assert set(summary["splits"]) == {"split_0", "split_1"}
    for name, split in summary["splits"].items():
        parts = [set(split[p]) for p in split_nyt.PARTS]
        assert [len(p) for p in parts] == [4, 2, 3]
        assert not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
        for part, relations in zip(split_nyt.PARTS, parts, strict=True):
            written = pq.read_table(tmp_path / name / f"{part}.parquet")
            assert written.schema.equals(FEWSHOT_SCHEMA)
            assert set(written["relation"].to_pylist()) == relations
            assert written.num_rows == 30 * len(relations)
    assert yaml.safe_load((tmp_path / "splits.yaml").read_text()) == summary


def test_same_seed_same_split_different_seeds_differ() -> None:
    relations = [f"P{i}" for i in range(25)]
    sizes = {"train": 10, "val": 5, "test": 10}
    first = split_nyt.split_relations(relations, 3, sizes)
    assert first == split_nyt.split_relations(relations, 3, sizes)
    draws = {str(split_nyt.split_relations(relations, s, sizes)) for s in range(5)}
    assert len(draws) == 5


def test_split_asking_for_too_many_relations() -> None:
    with pytest.raises(PipelineError, match="asks for 9 relations.*only 5"):
        split_nyt.split_relations([f"P{i}" for i in range(5)], 0, SIZES)


def test_small_relations_are_skipped_and_listed(tmp_path: Path) -> None:
    table = _table(small={"P3": 5})
    summary = split_nyt.make_splits(table, tmp_path, [1], SIZES, min_instances=20)
    assert summary["skipped_relations"] == {"P3": 5}
    split = summary["splits"]["split_0"]
    assert "P3" not in split["train"] + split["val"] + split["test"]


def test_skipping_that_leaves_too_few_relations_is_an_error(tmp_path: Path) -> None:
    table = _table(n_relations=9, small={"P1": 2})
    with pytest.raises(PipelineError, match="only 8 are usable"):
        split_nyt.make_splits(table, tmp_path, [1], SIZES, min_instances=20)


def test_duplicate_seeds_rejected(tmp_path: Path) -> None:
    with pytest.raises(PipelineError, match="duplicates"):
        split_nyt.make_splits(_table(), tmp_path, [1, 1], SIZES, min_instances=1)


def _params(tmp_path: Path, **overrides) -> Path:
    """A params file with a complete split_nyt section (params.yaml's, with ``overrides``)."""
    from tests.conftest import project_params

    section = {**project_params()["split_nyt"], **overrides}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"split_nyt": section, "train": {"x": 1}}))
    return path


def _main(tmp_path: Path, params: Path) -> None:
    pq.write_table(_table(), tmp_path / "nyt.parquet")
    split_nyt.main(["--data", str(tmp_path / "nyt.parquet"), "--out", str(tmp_path / "splits"),
                    "--params", str(params)])


def test_main_reads_validated_params(tmp_path: Path) -> None:
    params = _params(tmp_path, seeds=[4, 5], train_relations=4, val_relations=2,
                     test_relations=3, min_instances=20)
    _main(tmp_path, params)
    summary = yaml.safe_load((tmp_path / "splits" / "splits.yaml").read_text())
    assert [s["seed"] for s in summary["splits"].values()] == [4, 5]
    assert [len(summary["splits"]["split_0"][p]) for p in split_nyt.PARTS] == [4, 2, 3]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"train_relations": 0}, r"split_nyt.train_relations = 0: expected a number >= 1"),
        ({"min_instances": -1}, r"split_nyt.min_instances = -1: expected a number >= 1"),
        ({"seeds": [1, "two"]}, r"split_nyt.seeds\[1\] = 'two': expected an integer"),
        ({"seeds": 3}, r"split_nyt.seeds = 3: expected a list"),
        ({"val_relations": True}, r"split_nyt.val_relations = True: expected an integer"),
        ({"tset_relations": 3}, r"split_nyt has unknown key\(s\) \['tset_relations'\]"),
    ],
)
def test_main_rejects_bad_params(tmp_path: Path, overrides: dict, message: str) -> None:
    with pytest.raises(PipelineError, match=message):
        _main(tmp_path, _params(tmp_path, **overrides))
    assert not (tmp_path / "splits").exists()
