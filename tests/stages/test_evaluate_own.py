import json

import pytest
import yaml

from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import evaluate_own, prepare_own, split_fewrel, train
from tests.conftest import project_params
from tests.model.tiny_regrab import (
    labels_of,
    tiny_encoder,
    toy_graph,
    toy_table,
    toy_train_sections,
)
from tests.stages.own_folder import benchmark_files, own_folder

OWN_SECTION = {"min_sentences": 10, "max_bad_rows": 5, "heldout_share": 0.5, "seed": 0}
EVAL_SECTION = {"settings": ["2w1s", "2w2s", "3w1s"], "episodes": 6, "per_relation": 10,
                "seed": 0}


def _outputs(root, p, own):
    return evaluate_own.main(["--own", str(own), "--models", str(root / "models" / "fewrel"),
                              "--metrics", str(root / "m" / "own.json"), "--table",
                              str(root / "m" / "own.md"), "--params", str(p)])


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Own relations prepared, half held out, the rest joined to a toy FewRel split whose
    models (regrab, proto) train on them: relations outside the graph take its fallback."""
    root = tmp_path_factory.mktemp("own")
    enc = tiny_encoder(root / "bert")
    graph, features = toy_graph(root)
    params = project_params(**toy_train_sections(enc), prepare_own=OWN_SECTION,
                            evaluate_own=EVAL_SECTION,
                            split_fewrel={"seed": 0, "heldout_relations": 2,
                                          "max_per_relation": 8})
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    bench = benchmark_files(root)
    own = own_folder(root / "own")
    summary = prepare_own.main(["--own", str(own), "--test", str(bench["test"]), "--train",
                                str(bench["train"]), "--out", str(root / "prepared"),
                                "--params", str(p)])
    write_parquet(toy_table(["P1", "P2", "P3", "P4", "P5"], 12, seed=0),
                  root / "train_wiki.parquet", FEWSHOT_SCHEMA)
    write_parquet(toy_table(["P6", "P7", "P8"], 12, seed=1), root / "val_wiki.parquet",
                  FEWSHOT_SCHEMA)
    split_fewrel.main(["--train", str(root / "train_wiki.parquet"), "--test",
                       str(root / "val_wiki.parquet"), "--own",
                       str(root / "prepared" / "train.parquet"), "--out",
                       str(root / "fewrel"), "--params", str(p)])
    train.main(["--splits", str(root / "fewrel"), "--graph", str(graph), "--features",
                str(features), "--relations", str(labels_of(graph)), "--out",
                str(root / "models" / "fewrel"), "--params", str(p)])
    return root, p, summary


def test_scores_fewrels_models_on_the_heldout_own_relations(project):
    root, p, summary = project
    assert len(summary["heldout"]) == 2 and len(summary["train"]) == 2
    result = _outputs(root, p, root / "prepared")
    metrics = json.loads((root / "m" / "own.json").read_text())
    assert metrics["heldout"] == summary["heldout"] and metrics["own_relations"] == 4
    assert metrics["scored"] == summary["heldout"]  # never trained on, so all scored
    # Two held-out relations: the 3-way setting is skipped and said so.
    assert set(metrics["settings_skipped"]) == {"3w1s"}
    assert set(metrics["accuracy"]) == {"regrab", "proto", "floor"}
    assert set(metrics["accuracy"]["regrab"]) == {"2w1s", "2w2s"}
    assert "regrab_minus_floor" in metrics["vs_floor"]
    # Outside the graph, REGRAB's priors read the names the team wrote.
    kinds = metrics["priors"]["regrab"]
    assert kinds["label"] == 6 * 2 * 2 and kinds["graph"] == 0
    table = (root / "m" / "own.md").read_text()
    assert "# Own relations" in table and "Skipped 3w1s" in table and "| regrab |" in table
    assert result["accuracy"] == metrics["accuracy"]


def test_no_own_relations_is_a_report_not_an_error(tmp_path, project):
    root, p, _ = project
    own = tmp_path / "own"
    own.mkdir()
    (own / "README.md").write_text("# nothing yet\n")
    bench = benchmark_files(tmp_path)
    prepare_own.main(["--own", str(own), "--test", str(bench["test"]), "--train",
                      str(bench["train"]), "--out", str(tmp_path / "prepared"),
                      "--params", str(p)])
    result = evaluate_own.main(["--own", str(tmp_path / "prepared"), "--models",
                                str(tmp_path / "no-models"), "--metrics",
                                str(tmp_path / "own.json"), "--table",
                                str(tmp_path / "own.md"), "--params", str(p)])
    assert result == {"own_relations": 0, "trained": [], "heldout": []}
    assert "No own relations" in (tmp_path / "own.md").read_text()
    assert json.loads((tmp_path / "own.json").read_text())["own_relations"] == 0
