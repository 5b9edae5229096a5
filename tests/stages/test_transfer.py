import json

import pyarrow as pa
import pytest
import yaml

from model.evaluation.config import TransferSet
from model.evaluation.transfer import cut_relations
from model.prior.labels import PRIOR_KINDS
from pipeline.errors import PipelineError
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import train, transfer
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_table, toy_train_sections

RELATIONS = ["P6", "P7", "P8"]


def _named_set(path):
    """Three relations of another domain: two named (SemEval and FewRel-2.0-style keys),
    one a bare property id the graph lacks."""
    table = toy_table(RELATIONS, 9, seed=5).to_pylist()
    keys = {"P6": "Verb6-W1(e1,e2)", "P7": "verb7_w2", "P8": "P98"}
    for row in table:
        row["relation"] = row["relation_name"] = keys[row["relation"]]
    write_parquet(pa.Table.from_pylist(table, schema=FEWSHOT_SCHEMA), path, FEWSHOT_SCHEMA)
    return path


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("transfer")
    enc, splits, graph, features = toy_project(root, n_splits=2)
    params = project_params(**{
        **toy_train_sections(enc),
        "benchmarks": {"toy": {"splits": str(splits), "title": "toy"}},
        "transfer": {"sets": {"other": {"data": str(_named_set(root / "other.parquet")),
                                        "title": "another domain"}},
                     "per_relation": 6, "settings": ["2w1s", "3w2s"], "episodes": 8},
    })
    params["transfer"]["sets"] = {"other": params["transfer"]["sets"]["other"]}  # only ours
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--out", str(root / "models" / "toy"),
                "--params", str(p)])
    return root, p


def _run(root, p):
    return transfer.main(["--models", str(root / "models"), "--metrics",
                          str(root / "m" / "transfer.json"), "--report",
                          str(root / "m" / "transfer_report.json"), "--table",
                          str(root / "m" / "transfer.md"), "--params", str(p)])


def test_scores_every_method_and_the_floor_with_prior_kinds(project):
    root, p = project
    _run(root, p)
    metrics = json.loads((root / "m" / "transfer.json").read_text())
    acc = metrics["other"]["toy"]
    assert set(acc) == {"regrab", "proto", "floor"} and set(acc["floor"]) == {"2w1s", "3w2s"}
    diff = metrics["paired"]["other"]["toy"]["regrab_minus_floor"]["2w1s"]
    assert diff["diff"] == pytest.approx(acc["regrab"]["2w1s"] - acc["floor"]["2w1s"], abs=0.02)
    assert diff["ci95"] is not None and diff["ci95"] > 0
    # Two named relations are read as label priors, the bare id takes the fallback: per
    # setting every episode has N ways, 8 episodes per split, 2 splits.
    kinds = metrics["priors"]["other"]["toy"]["regrab"]
    assert kinds["graph"] == 0 and kinds["label"] > 0 and kinds["fallback"] > 0
    assert sum(kinds[k] for k in PRIOR_KINDS) == 2 * 8 * (2 + 3)
    # What each way's prior read: names only (the checkpoints read no descriptions).
    assert kinds["name+description"] == 0 and kinds["name"] == kinds["label"]
    assert kinds["no text"] == kinds["fallback"]
    assert "proto" not in metrics["priors"]["other"]["toy"]
    table = (root / "m" / "transfer.md").read_text()
    assert "## other, toy checkpoints" in table and "regrab_minus_floor" in table
    report = json.loads((root / "m" / "transfer_report.json").read_text())
    assert report["other"]["toy"]["relations"]["relations_scored"] == [
        "P98", "Verb6-W1(e1,e2)", "verb7_w2"]


def test_one_process_or_several_give_the_same_report(project, tmp_path):
    """Splits are scored in worker processes, or shares of a split's methods when there are
    more workers than splits; the report is the same, byte for byte."""
    root, p = project
    reports = []
    for workers in (1, 3):  # 3 workers, 2 splits: each split's methods in two shares
        params = yaml.safe_load(p.read_text())
        params["evaluate"]["workers"] = workers
        q = tmp_path / f"params_{workers}.yaml"
        q.write_text(yaml.safe_dump(params))
        _run(root, q)
        reports.append((root / "m" / "transfer_report.json").read_text())
    assert reports[0] == reports[1]
    assert list(json.loads(reports[0])["other"]["toy"]["accuracy"]) == [
        "regrab", "proto", "floor"]


def test_names_off_gives_every_outside_way_the_fallback(project, tmp_path):
    root, p = project
    params = yaml.safe_load(p.read_text())
    params["evaluate"]["read_names"] = False
    q = tmp_path / "params.yaml"
    q.write_text(yaml.safe_dump(params))
    _run(root, q)
    kinds = json.loads((root / "m" / "transfer.json").read_text())["priors"]["other"]["toy"]
    assert kinds["regrab"]["label"] == 0 and kinds["regrab"]["fallback"] == 2 * 8 * 5


def test_missing_set_is_one_error(project, tmp_path):
    root, p = project
    params = yaml.safe_load(p.read_text())
    params["transfer"]["sets"]["other"]["data"] = str(tmp_path / "nope.parquet")
    q = tmp_path / "params.yaml"
    q.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="add it to prepare_fewshot.datasets"):
        _run(root, q)


def test_cut_keeps_at_most_n_per_relation_in_file_order():
    table = toy_table(["P1", "P2"], 10, seed=1)
    cut = cut_relations(table, 4, seed=0)
    rel = cut.column("relation").to_pylist()
    assert rel.count("P1") == 4 and rel.count("P2") == 4
    ids = cut.column("instance_id").to_pylist()
    order = table.column("instance_id").to_pylist()
    assert ids == sorted(ids, key=order.index)
    assert cut_relations(table, 4, seed=0).equals(cut) and cut_relations(table, 0, 0) is table


def _texts(tmp_path, entries):
    path = tmp_path / "relations.json"
    path.write_text(json.dumps(entries))
    return str(path)


def _keyed_table():
    rows = toy_table(RELATIONS, 4, seed=2).to_pylist()
    for row in rows:
        row["relation_name"] = f"key name {row['relation']}"
    return pa.Table.from_pylist(rows, schema=FEWSHOT_SCHEMA)


def test_a_relations_file_gives_names_and_descriptions(tmp_path):
    spec = TransferSet(data="x", title="x", relations=_texts(tmp_path, {
        "P6": ["cause of", "the head leads to the tail"], "P7": ["agent using"],
        "P8": ["part of", ""]}))
    table, said = transfer.relation_texts("x", spec, _keyed_table(), seed=0)
    names = dict(zip(table.column("relation").to_pylist(),
                     table.column("relation_name").to_pylist(), strict=True))
    assert names == {"P6": "cause of", "P7": "agent using", "P8": "part of"}
    assert said == {"P6": "the head leads to the tail", "P7": None, "P8": None}


def test_without_a_file_the_table_is_unchanged(tmp_path):
    table = _keyed_table()
    out, said = transfer.relation_texts("x", TransferSet(data="x", title="x"), table, 0)
    assert out.equals(table) and said == dict.fromkeys(RELATIONS)


def test_shuffle_moves_id_name_and_description_together_to_another_relation(tmp_path):
    spec = TransferSet(data="x", title="x", shuffle=True, relations=_texts(tmp_path, {
        r: [f"name {r}", f"description {r}"] for r in RELATIONS}))
    table = _keyed_table()
    out, said = transfer.relation_texts("x", spec, table, seed=0)
    before = table.column("relation").to_pylist()
    after = out.column("relation").to_pylist()
    moved = dict(zip(before, after, strict=True))  # each relation's sentences -> their new id
    assert len(set(moved.values())) == len(RELATIONS)
    assert all(old != new for old, new in moved.items())  # a derangement
    for new, name in zip(after, out.column("relation_name").to_pylist(), strict=True):
        assert name == f"name {new}" and said[new] == f"description {new}"
    again, _ = transfer.relation_texts("x", spec, table, seed=0)
    assert again.equals(out)  # seeded


@pytest.mark.parametrize("entries, message", [
    ({"P6": ["a"], "P7": ["b"]}, "no text for 1 relation"),
    ({"P6": ["a"], "P7": ["b"], "P8": [""]}, "not \\[name, description\\]"),
    ({"P6": ["a"], "P7": ["b"], "P8": "c"}, "not \\[name, description\\]"),
    ([["a"]], "expected a JSON object"),
])
def test_a_bad_relations_file_is_one_error(tmp_path, entries, message):
    spec = TransferSet(data="x", title="x", relations=_texts(tmp_path, entries))
    with pytest.raises(PipelineError, match=message):
        transfer.relation_texts("x", spec, _keyed_table(), seed=0)


def test_zero_shot_settings_are_scored_by_the_methods_that_can(project, tmp_path):
    root, p = project
    params = yaml.safe_load(p.read_text())
    params["transfer"]["settings"] = ["2w1s", "2w0s"]
    q = tmp_path / "params.yaml"
    q.write_text(yaml.safe_dump(params))
    _run(root, q)
    metrics = json.loads((root / "m" / "transfer.json").read_text())
    assert "2w0s" in metrics["other"]["toy"]["regrab"]
    assert "2w0s" not in metrics["other"]["toy"]["proto"]
    # Paired on the same episodes, the mean difference is the difference of the accuracies
    # (each rounded to 0.01 in the metrics).
    toy = metrics["other"]["toy"]
    assert metrics["vs_regrab"]["other"]["toy"]["proto_minus_regrab"]["2w1s"]["diff"] == \
        pytest.approx(toy["proto"]["2w1s"] - toy["regrab"]["2w1s"], abs=0.011)


def test_a_set_scored_for_some_benchmarks_only(project, tmp_path):
    root, p = project
    params = yaml.safe_load(p.read_text())
    params["transfer"]["sets"]["other"]["benchmarks"] = ["nyt25"]  # not the toy benchmark
    params["benchmarks"]["nyt25"] = {"splits": "nope", "title": "x"}
    q = tmp_path / "params.yaml"
    q.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="no benchmark has models"):
        _run(root, q)  # nyt25 has no models here, and toy is not scored on the set
    params["transfer"]["sets"]["other"]["benchmarks"] = ["nyt2"]
    q.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="nyt2.*not in benchmarks"):
        _run(root, q)


def test_settings_with_more_ways_than_the_set_has_are_left_out_and_said(project, tmp_path):
    """A team's own relations can take some of a set's relations into training; the settings
    the set can still play are scored, the others left out with the reason in the table."""
    root, p = project
    params = yaml.safe_load(p.read_text())
    params["transfer"]["settings"] = ["2w1s", "4w1s"]  # the set has 3 relations
    q = tmp_path / "params.yaml"
    q.write_text(yaml.safe_dump(params))
    _run(root, q)
    metrics = json.loads((root / "m" / "transfer.json").read_text())
    assert set(metrics["other"]["toy"]["regrab"]) == {"2w1s"}
    report = json.loads((root / "m" / "transfer_report.json").read_text())
    assert list(report["other"]["toy"]["skipped_settings"]) == ["4w1s"]
    assert "3 usable relations" in report["other"]["toy"]["skipped_settings"]["4w1s"]
    assert ". Not scored: 4w1s (more ways than the 3 usable relations" in \
        (root / "m" / "transfer.md").read_text()
    params["transfer"]["settings"] = ["4w1s"]  # nothing left to play: refused
    q.write_text(yaml.safe_dump(params))
    with pytest.raises(PipelineError, match="has 3 usable relations.*fewer than the ways"):
        _run(root, q)


def test_a_set_that_plays_every_setting_reports_no_skipped_key(project):
    root, p = project
    _run(root, p)
    report = json.loads((root / "m" / "transfer_report.json").read_text())
    assert "skipped_settings" not in report["other"]["toy"]
