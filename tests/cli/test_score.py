import dataclasses
import json
import re

import pyarrow.parquet as pq
import pytest
import yaml

from cli import score
from model.files.checkpoint import read_checkpoint, save_checkpoint
from model.prior.labels import PRIOR_KINDS, TEXT_KINDS
from pipeline.errors import PipelineError
from stages import train
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits, toy_table

TRAIN = {"steps": 2, "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_every": 2,
         "val_episodes": 5, "val_settings": ["2w1s"], "dvclive": False, "device": "cpu",
         "methods": ["regrab", "proto"]}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("score")
    enc = tiny_encoder(root / "bert")
    splits = toy_splits(root / "splits")
    graph, features = toy_graph(root)
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2},
                  "prior": {"descriptions": True}},  # its prior reads descriptions
        "train": TRAIN,
        "evaluate": {"episodes": 10, "queries": 2, "device": "cpu"},
    })
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--out", str(root / "models"),
                "--params", str(p)])
    trained_on = sorted(set(pq.read_table(splits / "split_0" / "train.parquet")
                            .column("relation").to_pylist()))
    return root, p, trained_on


def _fewrel_json(path, table, rename=None):
    """Write a FewRel-format file from a FEWSHOT table (relations renamed by ``rename``)."""
    rows = table.to_pylist()
    data = {}
    for r in rows:
        rel = (rename or {}).get(r["relation"], r["relation"])
        data.setdefault(rel, []).append({
            "tokens": r["tokens"],
            "h": ["h", "Q1", [list(range(r["head_start"], r["head_end"]))]],
            "t": ["t", "Q2", [list(range(r["tail_start"], r["tail_end"]))]]})
    path.write_text(json.dumps(data))
    return path


def test_scores_own_data_with_non_wikidata_labels(trained, tmp_path):
    root, p, trained_on = trained
    # Six relations unknown to the graph (own labels), plus one the model trained on and one
    # with too few sentences.
    table = toy_table(["Q91", "Q92", "Q93", "Q94", "Q95", "Q96", trained_on[0]], 8, seed=3)
    data = _fewrel_json(tmp_path / "own.json", table,
                        {f"Q9{i}": f"works_for_{i}" for i in range(1, 7)})
    raw = json.loads(data.read_text())
    raw["tiny_rel"] = raw["works_for_6"][:2]
    data.write_text(json.dumps(raw))
    out = score.score(["--data", str(data), "--models", str(root / "models"),
                       "--out", str(tmp_path / "scores"), "--settings", "3w1s,3w2s",
                       "--episodes", "10", "--params", str(p)])
    rel = out["relations"]
    assert rel["trained_on"] == [trained_on[0]] and rel["trained_on_excluded"]
    assert rel["too_few_sentences"] == {"tiny_rel": 2}
    assert len(rel["relations_scored"]) == 6
    metrics = json.loads((tmp_path / "scores.json").read_text())  # keyed by --data's name
    assert set(metrics["own"]) == {"regrab", "proto", "floor"}
    assert set(metrics["own"]["regrab"]) == {"3w1s", "3w2s"}
    assert (tmp_path / "scores.md").exists()
    assert json.loads(data.read_text()) == raw  # --data is untouched


def test_relations_file_names_and_describes_the_data(trained, tmp_path, capsys):
    """Bare ids as keys: without --relations every way gets the fallback and reads no text;
    with it, the named relations get a label prior that reads the name and description, and
    the one the file lacks keeps the fallback."""
    root, p, _ = trained
    keys = [f"Q9{i}" for i in range(1, 7)]
    data = _fewrel_json(tmp_path / "ids.json", toy_table(keys, 8, seed=3))
    relations = tmp_path / "relations.json"
    relations.write_text(json.dumps({
        "Q91": ["verb1 w1", "w2 of the w3"], "Q92": ["verb2", "w4 w5"], "Q93": ["verb3 the w6"],
        "Q94": ["verb4", ""], "Q95": ["verb5"], "Q42": ["not in the data", "unused"]}))
    args = ["--data", str(data), "--models", str(root / "models"), "--settings", "3w1s",
            "--episodes", "10", "--params", str(p), "--methods", "regrab"]
    plain = score.score([*args, "--out", str(tmp_path / "plain")])["priors"]["regrab"]
    capsys.readouterr()
    assert plain["fallback"] == plain["no text"] == 30 and plain["name+description"] == 0
    got = score.score([*args, "--out", str(tmp_path / "named"), "--relations", str(relations)])
    printed = capsys.readouterr().out
    counts = got["priors"]["regrab"]
    assert set(counts) == set(PRIOR_KINDS) | set(TEXT_KINDS)
    assert sum(counts[k] for k in PRIOR_KINDS) == sum(counts[k] for k in TEXT_KINDS) == 30
    assert counts["name+description"] > 0 and counts["name"] > 0
    assert counts["label"] == counts["name+description"] + counts["name"]
    assert counts["fallback"] == counts["no text"] > 0  # Q96 only, which the file lacks
    assert got["texts"] == {"named": 5, "described": 2, "missing": ["Q96"], "unused": 1}
    assert (f"--relations {relations}: names for 5 of 6 scored relations (2 with a "
            "description); missing from it: 1 (Q96), named by their key, with no description; "
            "entries naming no relation of --data: 1") in printed
    assert ("text read: " + ", ".join(f"{k} {counts[k]}" for k in TEXT_KINDS)) in printed
    written = json.loads((tmp_path / "named_report.json").read_text())
    assert written["priors"]["regrab"] == counts
    assert written["relations"]["texts"] == got["texts"]
    assert f"regrab ways whose prior read name+description {counts['name+description']}" in (
        (tmp_path / "named.md").read_text())


def test_bad_relations_files_are_one_error_line(trained, tmp_path, capsys):
    root, p, _ = trained
    data = _fewrel_json(tmp_path / "d.json", toy_table(["Q91", "Q92", "Q93"], 8, seed=2))
    bad = tmp_path / "relations.json"
    args = ["--data", str(data), "--models", str(root / "models"), "--settings", "3w1s",
            "--episodes", "2", "--params", str(p), "--methods", "regrab"]
    cases = [
        ("{not json", "not valid JSON"),
        ('["Q91"]', "expected a JSON object"),
        ('{"Q91": ["verb1", 3]}', "not \\[name, description\\]"),
        ('{"Q91": []}', "not \\[name, description\\]"),
        ('{"Q91": ["verb1", "a"], "Q91": ["verb1", "b"]}', "'Q91' is given twice with "
                                                          "different text"),
        ('{"Q91": ["\\udc80"]}', "lone surrogate"),
    ]
    for text, message in cases:
        bad.write_text(text)
        with pytest.raises(SystemExit) as exc:
            score.main([*args, "--out", str(tmp_path / "x"), "--relations", str(bad)])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and err.startswith("error: --relations ")
        assert "\n" not in err and "Traceback" not in err
        assert re.search(message, err), err
    same = tmp_path / "relations_report.json"  # an output that is the relations file
    same.write_text('{"Q91": ["verb1"]}')
    with pytest.raises(SystemExit) as exc:
        score.main([*args, "--out", str(tmp_path / "relations"), "--relations", str(same)])
    assert exc.value.code == 2 and "is also --relations" in capsys.readouterr().err
    assert same.read_text() == '{"Q91": ["verb1"]}'
    assert not list(tmp_path.glob("x*")) and not list(tmp_path.glob("relations.md"))


def test_bad_inputs_are_one_line_errors(trained, tmp_path):
    root, p, _ = trained
    args = ["--models", str(root / "models"), "--out", str(tmp_path / "x"), "--params", str(p)]
    not_fewrel = tmp_path / "list.json"
    not_fewrel.write_text(json.dumps([1, 2, 3]))
    table = toy_table(["Q91", "Q92"], 8, seed=1)
    two = _fewrel_json(tmp_path / "two.json", table)
    cases = [
        (["--data", str(not_fewrel)], "not FewRel-format|expected a JSON object"),
        (["--data", str(tmp_path / "missing.json")], "not found"),
        (["--data", str(two), "--settings", "5w1s"], "fewer than the ways"),
        (["--data", str(two), "--methods", "no_such_method"], "--methods"),
        (["--data", str(two), "--models", str(tmp_path)], "no split_"),
    ]
    for extra, message in cases:
        with pytest.raises(PipelineError, match=message) as exc:
            score.score(extra + args if "--models" not in extra else
                        extra + ["--out", str(tmp_path / "x"), "--params", str(p)])
        assert "\n" not in str(exc.value)
    assert not list(tmp_path.glob("x*"))  # nothing half-written


def _models_with(trained, tmp_path, method, section, **changes):
    """A copy of the trained models whose split_0 ``method`` checkpoint has ``changes`` in its
    config's ``section``; the copy and that checkpoint's path."""
    import shutil

    models = tmp_path / "models"
    shutil.copytree(trained[0] / "models", models)
    path = models / "split_0" / method / "model.safetensors"
    old = read_checkpoint(path)
    config = dataclasses.replace(old.config, **{section: dataclasses.replace(
        getattr(old.config, section), **changes)})
    save_checkpoint(path, dataclasses.replace(old, config=config))
    return models, path


def test_checkpoint_from_another_encoder_is_refused(trained, tmp_path):
    p = trained[1]
    models, _ = _models_with(trained, tmp_path, "proto", "encoder", name="bert-base-uncased")
    data = _fewrel_json(tmp_path / "d.json", toy_table(["Q91", "Q92", "Q93"], 8, seed=2))
    with pytest.raises(PipelineError, match="different encoders"):
        score.score(["--data", str(data), "--models", str(models), "--out",
                     str(tmp_path / "x"), "--settings", "3w1s", "--params", str(p)])


def test_a_checkpoint_whose_chains_would_run_past_a_week_is_refused_before_scoring(
        trained, tmp_path, monkeypatch):
    p = trained[1]
    models, path = _models_with(trained, tmp_path, "regrab", "langevin", steps=10**12,
                                likelihood="softmax")
    scored = []
    monkeypatch.setattr(score, "score_table", lambda *a, **k: scored.append(a))
    data = _fewrel_json(tmp_path / "d.json", toy_table(["Q91", "Q92", "Q93"], 8, seed=2))
    with pytest.raises(PipelineError) as err:
        score.score(["--data", str(data), "--models", str(models), "--out",
                     str(tmp_path / "x"), "--settings", "3w1s", "--params", str(p)])
    assert "(1,000,000,000,000 Langevin steps per chain) would take" in str(err.value)
    assert str(path) in str(err.value) and "fewer model.langevin.steps" in str(err.value)
    assert not scored and not list(tmp_path.glob("x*"))


def test_unequal_settings_are_scored_as_evaluate_scores_them(trained, tmp_path, capsys):
    """``--settings 3w1s,3w1-2s`` (the grammar of evaluate.unequal_settings) scores 3w1-2s
    with its _cut1 and _step episode sets; a malformed one, or one with no N-way K-shot
    setting beside it, is one error line."""
    root, p, trained_on = trained
    table = toy_table(["Q91", "Q92", "Q93", "Q94"], 8, seed=3)
    data = _fewrel_json(tmp_path / "own.json", table)
    out = score.score(["--data", str(data), "--models", str(root / "models"),
                       "--out", str(tmp_path / "scores"), "--settings", "3w1s,3w1-2s",
                       "--episodes", "4", "--params", str(p)])
    want = {"3w1s", "3w1-2s", "3w1-2s_cut1", "3w1-2s_step"}
    assert set(out["metrics"]["own"]["regrab"]) >= want
    assert set(out["metrics"]["shots"]["gain"]["3w1-2s"]) >= {"regrab", "proto"}
    report = json.loads((tmp_path / "scores_report.json").read_text())
    assert report["accuracy"]["regrab"]["3w1-2s"]["episodes"] == 4  # --episodes, per split
    md = (tmp_path / "scores.md").read_text()
    assert "3w1-2s_step" in md
    assert "Step protocol of 3w1-2s" in md
    capsys.readouterr()
    for bad, words in (("3w2-1s", "needs N >= 2 ways and 1 <= a < b"),
                       ("3wXs", "is not like 5w1s (N-way K-shot), or like 5w1-5s"),
                       ("3w1-2s", "has no N-way K-shot setting; unequal ones are scored "
                                  "beside one, as evaluate scores them: add one, e.g. "
                                  "5w1s,3w1-2s")):
        with pytest.raises(SystemExit):
            score.main(["--data", str(data), "--models", str(root / "models"), "--out",
                        str(tmp_path / "x"), "--settings", bad, "--params", str(p)])
        err = capsys.readouterr().err
        assert err.startswith("error: --settings") and words in err
