import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import split_fewrel
from tests.conftest import ROOT, project_params
from tests.model.tiny_regrab import toy_table


def _run(tmp_path, train_rel, test_rel, **section):
    write_parquet(toy_table(train_rel, 6, seed=0), tmp_path / "train.parquet", FEWSHOT_SCHEMA)
    write_parquet(toy_table(test_rel, 6, seed=1), tmp_path / "test.parquet", FEWSHOT_SCHEMA)
    params = project_params(split_fewrel=section)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return split_fewrel.main(["--train", str(tmp_path / "train.parquet"), "--test",
                              str(tmp_path / "test.parquet"), "--out", str(tmp_path / "out"),
                              "--params", str(tmp_path / "params.yaml")])


def _relations(path):
    return sorted(set(pq.read_table(path).column("relation").to_pylist()))


def test_heldout_relations_validate_and_val_wiki_is_test(tmp_path):
    train = [f"P{i}" for i in range(1, 9)]
    summary = _run(tmp_path, train, ["P11", "P12", "P13"], seed=0, heldout_relations=3,
                   max_per_relation=4)
    out = tmp_path / "out" / "split_0"
    tr, va, te = (_relations(out / f"{p}.parquet") for p in ("train", "val", "test"))
    assert len(va) == 3 and len(tr) == 5 and not set(tr) & set(va)
    assert set(tr) | set(va) == set(train) and te == ["P11", "P12", "P13"]
    assert pq.read_table(out / "train.parquet").num_rows == 5 * 4  # capped per relation
    assert summary["splits"]["split_0"]["val"] == va
    again = _run(tmp_path, train, ["P11", "P12", "P13"], seed=0, heldout_relations=3,
                 max_per_relation=4)
    assert again == summary  # seeded
    _run(tmp_path, train, ["P11"], seed=0, heldout_relations=3, max_per_relation=0)
    assert pq.read_table(out / "train.parquet").num_rows == 5 * 6  # 0 keeps all


def test_no_own_relations_write_the_same_bytes(tmp_path):
    """An empty own table (prepare_own with no data file) changes no byte of any output,
    so train and everything after it see the same split."""
    train = [f"P{i}" for i in range(1, 9)]
    _run(tmp_path, train, ["P11", "P12"], seed=0, heldout_relations=3, max_per_relation=4)
    before = {p.relative_to(tmp_path / "out"): p.read_bytes()
              for p in sorted((tmp_path / "out").rglob("*")) if p.is_file()}
    write_parquet(toy_table([], 1, seed=0), tmp_path / "own.parquet", FEWSHOT_SCHEMA)
    split_fewrel.main(["--train", str(tmp_path / "train.parquet"), "--test",
                       str(tmp_path / "test.parquet"), "--own", str(tmp_path / "own.parquet"),
                       "--out", str(tmp_path / "out"), "--params", str(tmp_path / "params.yaml")])
    after = {p.relative_to(tmp_path / "out"): p.read_bytes()
             for p in sorted((tmp_path / "out").rglob("*")) if p.is_file()}
    assert after == before and len(before) == 4


def test_own_relations_that_are_fewrel_relations_are_refused(tmp_path):
    write_parquet(toy_table(["P2", "P21"], 6, seed=2), tmp_path / "own.parquet", FEWSHOT_SCHEMA)
    params = tmp_path / "params.yaml"
    _run(tmp_path, ["P1", "P2", "P3"], ["P9"], seed=0, heldout_relations=1, max_per_relation=0)
    with pytest.raises(PipelineError, match=r"own relations \['P2'\] are FewRel relations"):
        split_fewrel.main(["--train", str(tmp_path / "train.parquet"), "--test",
                           str(tmp_path / "test.parquet"), "--own", str(tmp_path / "own.parquet"),
                           "--out", str(tmp_path / "out2"), "--params", str(params)])
    assert not (tmp_path / "out2").exists()


def test_bad_input_leaves_nothing_half_written(tmp_path):
    with pytest.raises(PipelineError, match="heldout_relations=4 leaves no training"):
        _run(tmp_path, ["P1", "P2", "P3", "P4"], ["P9"], seed=0, heldout_relations=4,
             max_per_relation=0)
    with pytest.raises(PipelineError, match="share relations"):
        _run(tmp_path, ["P1", "P2", "P3"], ["P3"], seed=0, heldout_relations=1,
             max_per_relation=0)
    with pytest.raises(PipelineError, match="split_fewrel.heldout_relations = 0"):
        _run(tmp_path, ["P1", "P2"], ["P9"], seed=0, heldout_relations=0, max_per_relation=0)
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.*"))


def test_dvc_runs_train_and_evaluate_once_per_benchmark():
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        names = {stage.addressing for stage in repo.index.stages}
    benchmarks = project_params()["benchmarks"]
    for name in benchmarks:
        assert {f"train@{name}", f"evaluate@{name}"} <= names
    assert {"split_fewrel", "split_nyt"} <= names
