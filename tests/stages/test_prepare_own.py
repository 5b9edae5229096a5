import json

import pyarrow.parquet as pq
import pytest
import yaml

from model.own_data import heldout_count
from pipeline.errors import run_cli
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import prepare_own, split_fewrel
from tests.conftest import project_params
from tests.model.tiny_regrab import toy_table
from tests.stages.own_folder import benchmark_files, fewrel_records, own_folder, toy_rows

SECTION = {"min_sentences": 10, "max_bad_rows": 5, "heldout_share": 0.25, "seed": 0}


def _argv(tmp_path, own, **section):
    bench = benchmark_files(tmp_path)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(prepare_own={**SECTION, **section})))
    return ["--own", str(own), "--test", str(bench["test"]), "--train", str(bench["train"]),
            "--out", str(tmp_path / "out"), "--params", str(params)]


def _files(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_a_small_folder_is_checked_named_and_split(tmp_path):
    own = own_folder(tmp_path / "own")
    summary = prepare_own.main(_argv(tmp_path, own))
    out = tmp_path / "out"
    train, held = pq.read_table(out / "train.parquet"), pq.read_table(out / "heldout.parquet")
    assert train.schema.equals(FEWSHOT_SCHEMA) and held.schema.equals(FEWSHOT_SCHEMA)
    # 4 relations, a quarter held out: rounded to 1, raised to the 2 an episode needs.
    assert len(summary["heldout"]) == 2 and len(summary["train"]) == 2
    assert set(summary["heldout"]) | set(summary["train"]) == {
        "founded_by", "works_for", "member_of_band", "capital_of"}
    assert sorted(set(held["relation"].to_pylist())) == summary["heldout"]
    assert sorted(set(train["relation"].to_pylist())) == summary["train"]
    assert train.num_rows + held.num_rows == 4 * 12  # founded_by: 6 from each file
    rel = summary["relations"]["founded_by"]
    assert rel["files"] == ["labelled.json", "more.jsonl"] and rel["sentences"] == 12
    rows = {r["relation"]: r for r in (train.to_pylist() + held.to_pylist())}
    assert rows["works_for"]["relation_name"] == "works for"
    # The JSONL sentence reads back as the toy sentence it was written from.
    first = toy_rows("works_for", 12)[0]
    got = next(r for r in train.to_pylist() + held.to_pylist() if r["relation"] == "works_for")
    assert (got["tokens"], got["head_start"], got["tail_end"]) == (
        first["tokens"], first["head_start"], first["tail_end"])
    assert summary["files"]["more.jsonl"]["skipped"] == 1  # one bad line, within the limit
    texts = json.loads((out / "relations.json").read_text())
    assert texts["works_for"] == ["works for"] and texts["capital_of"] == ["capital of"]
    assert texts["founded_by"][1].startswith("the person")
    before = _files(out)
    prepare_own.main(_argv(tmp_path, own))
    assert _files(out) == before  # seeded: the same bytes
    other = prepare_own.main(_argv(tmp_path, own, seed=3, heldout_share=0.0))
    assert other["heldout"] == [] and len(other["train"]) == 4


def test_a_folder_with_no_data_file_has_no_own_relations(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "README.md").write_text("# nothing yet\n")
    summary = prepare_own.main(_argv(tmp_path, own))
    assert summary["relations"] == {} and summary["train"] == summary["heldout"] == []
    assert pq.read_table(tmp_path / "out" / "train.parquet").num_rows == 0
    assert pq.read_table(tmp_path / "out" / "heldout.parquet").num_rows == 0


def test_heldout_count():
    assert [heldout_count(n, 0.25) for n in (0, 1, 2, 4, 10, 20)] == [0, 1, 2, 2, 3, 5]
    assert heldout_count(10, 0.0) == 0 and heldout_count(3, 1.0) == 3


def _break(own, case):
    """Spoil the good folder ``own`` one way; return what the error line must name."""
    texts = json.loads((own / "relations.json").read_text())
    if case == "not json":
        (own / "labelled.json").write_text('{"founded_by": [')
        return ["labelled.json", "not valid JSON"]
    if case == "not fewrel":
        (own / "labelled.json").write_text("[1, 2]")
        return ["labelled.json", "FewRel-format"]
    if case == "bad lines":
        lines = (own / "more.jsonl").read_text().splitlines()
        (own / "more.jsonl").write_text("\n".join(lines + ["not json"] * 5) + "\n")
        return ["more.jsonl", "6 malformed rows", "max_bad_rows=5", "line 2"]
    if case == "too few":
        data = json.loads((own / "labelled.json").read_text())
        data["capital_of"] = data["capital_of"][:4]
        (own / "labelled.json").write_text(json.dumps(data))
        return ["labelled.json", "'capital_of' has 4 usable sentences", "min_sentences=10"]
    if case == "no name":
        del texts["works_for"]
        (own / "relations.json").write_text(json.dumps(texts))
        return ["relations.json", "no name for relation 'works_for'", "more.jsonl"]
    if case == "no relations file":
        (own / "relations.json").unlink()
        return ["relations.json", "no name for relation", "new file"]
    if case == "blank name":
        texts["works_for"] = ["  ", "x"]
        (own / "relations.json").write_text(json.dumps(texts))
        return ["relations.json", "'works_for'", "non-empty name"]
    if case == "other format":
        (own / "table.csv").write_text("a,b\n")
        return ["table.csv", "not an own-data file"]
    if case == "test key":
        data = {"P1": fewrel_records(toy_rows("works_for", 12))}
        (own / "extra.json").write_text(json.dumps(data))
        (own / "relations.json").write_text(json.dumps({**texts, "P1": ["whole of"]}))
        return ["extra.json", "'P1' is a test relation of val_wiki", "own_P1"]
    if case == "training key":
        (own / "extra.json").write_text(json.dumps(
            {"P10": fewrel_records(toy_rows("works_for", 12))}))
        (own / "relations.json").write_text(json.dumps({**texts, "P10": ["x"]}))
        return ["extra.json", "'P10' is a training relation of train_wiki"]
    if case == "test name":
        texts["capital_of"] = ["Part  Of", "a part of the object"]
        (own / "relations.json").write_text(json.dumps(texts))
        return ["relations.json", "'capital_of'", "test relation P1 of val_wiki"]
    raise AssertionError(case)


CASES = ["not json", "not fewrel", "bad lines", "too few", "no name", "no relations file",
         "blank name", "other format", "test key", "training key", "test name"]


@pytest.mark.parametrize("case", CASES)
def test_each_bad_file_is_one_error_line_and_nothing_is_written(tmp_path, capsys, case):
    own = own_folder(tmp_path / "own")
    argv = _argv(tmp_path, own)
    prepare_own.main(argv)
    before = _files(tmp_path / "out")
    capsys.readouterr()
    must = _break(own, case)
    with pytest.raises(SystemExit) as exc:
        run_cli(prepare_own.main, argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for part in must:
        assert part in err, (part, err)
    assert _files(tmp_path / "out") == before  # the previous outputs, whole
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_own_relations_join_fewrel_training_after_the_heldout_draw(tmp_path):
    own = own_folder(tmp_path / "own")
    summary = prepare_own.main(_argv(tmp_path, own))
    base = tmp_path / "fewrel"
    from pipeline.io import write_parquet

    write_parquet(toy_table([f"P{i}" for i in range(1, 9)], 6, seed=0),
                  base / "train.parquet", FEWSHOT_SCHEMA)
    write_parquet(toy_table(["P11", "P12", "P13"], 6, seed=1), base / "test.parquet",
                  FEWSHOT_SCHEMA)
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(split_fewrel={
        "seed": 0, "heldout_relations": 3, "max_per_relation": 4})))
    args = ["--train", str(base / "train.parquet"), "--test", str(base / "test.parquet"),
            "--params", str(params)]
    plain = split_fewrel.main([*args, "--out", str(tmp_path / "plain")])
    joined = split_fewrel.main([*args, "--out", str(tmp_path / "joined"), "--own",
                                str(tmp_path / "out" / "train.parquet")])
    p, j = plain["splits"]["split_0"], joined["splits"]["split_0"]
    assert j["val"] == p["val"] and j["test"] == p["test"]  # the draw is FewRel's alone
    assert j["train"] == sorted(p["train"] + summary["train"]) and j["own"] == summary["train"]
    assert not set(summary["heldout"]) & set(j["train"] + j["val"] + j["test"])
    table = pq.read_table(tmp_path / "joined" / "split_0" / "train.parquet")
    assert table.num_rows == 4 * len(j["train"])  # own relations capped alike
    for part in ("val", "test"):
        assert (tmp_path / "joined" / "split_0" / f"{part}.parquet").read_bytes() == (
            tmp_path / "plain" / "split_0" / f"{part}.parquet").read_bytes()
