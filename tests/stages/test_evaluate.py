import csv
import json
import shutil

import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import evaluate, train
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits, toy_table

TRAIN = {"steps": 3, "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_every": 3,
         "val_episodes": 5, "val_settings": ["2w1s"], "dvclive": False, "device": "cpu"}


def _train(tmp_path, splits, params):
    graph, features = toy_graph(tmp_path)
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--out", str(tmp_path / "models"),
                "--params", str(p)])
    return p


def _evaluate(tmp_path, splits, p, name="nyt25"):
    return evaluate.main([
        "--splits", str(splits), "--models", str(tmp_path / "models"),
        "--metrics", str(tmp_path / "metrics" / f"{name}.json"),
        "--plot", str(tmp_path / "plots" / f"{name}.png"), "--params", str(p)])


def test_tiny_end_to_end_writes_metrics_reports_and_plots(tmp_path):
    enc = tiny_encoder(tmp_path / "bert")
    splits = toy_splits(tmp_path / "splits", n_splits=2)
    settings = ["2w1s", "3w2s", "3w0s"]
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2}},
        "train": TRAIN,
        "evaluate": {"settings": settings, "episodes": 20, "queries": 2, "device": "cpu",
                     "nota_settings": ["2w1s"], "nota_rates": [0.25, 0.5],
                     "nota_episodes": 10, "noisy_setting": "3w2s",
                     "unequal_settings": ["3w1-2s"], "unequal_episodes": 6},
    })
    p = _train(tmp_path, splits, params)
    out = _evaluate(tmp_path, splits, p)
    metrics = json.loads((tmp_path / "metrics" / "nyt25.json").read_text())
    assert metrics == out
    assert list(metrics) == ["nyt25", "paired", "ece", "ece_ts", "nota", "detection", "aurc",
                             "support_noise", "shots"]
    acc = metrics["nyt25"]
    assert set(acc) == {"regrab", "regrab_no_prior", "mtb", "proto", "proto_label", "floor"}
    # zero-shot only for the methods with a prior (regrab; proto_label's label mean); the
    # unequal-shot setting brings its twin cut to one sentence and its step protocol
    unequal = {"3w1-2s", "3w1-2s_cut1", "3w1-2s_step"}
    assert set(acc["regrab"]) == set(acc["proto_label"]) == {*settings, "3w2s_noisy"} | unequal
    for method in ("regrab_no_prior", "mtb", "proto", "floor"):
        assert set(acc[method]) == {"2w1s", "3w2s", "3w2s_noisy"} | unequal
    # A mislabelled support sentence: every method's cost (paired) and its detector's AUROC.
    noise = metrics["support_noise"]
    assert noise["setting"] == "3w2s_noisy" and set(noise["auroc"]) == set(acc)
    assert all(0 <= v <= 100 for v in noise["auroc"].values())
    assert noise["cost"]["proto"] == pytest.approx(
        acc["proto"]["3w2s_noisy"] - acc["proto"]["3w2s"], abs=0.02)
    assert set(noise["cost_minus_regrab"]) == set(acc) - {"regrab"}
    report_md = (tmp_path / "metrics" / "nyt25.md").read_text()
    assert "A mislabelled support sentence (3w2s_noisy" in report_md
    shots = metrics["shots"]
    assert set(shots["step_share"]) == set(acc)
    assert all(0 <= v <= 100 for v in shots["step_share"].values())
    gain = shots["gain"]["3w1-2s"]["proto"]
    assert gain["diff"] == pytest.approx(acc["proto"]["3w1-2s"] - acc["proto"]["3w1-2s_cut1"],
                                         abs=0.02)
    assert "Step protocol of 3w1-2s" in report_md
    assert all(0 <= v <= 100 for row in acc.values() for v in row.values())
    assert set(metrics["paired"]) == {f"{m}_minus_regrab" for m in
                                      ("regrab_no_prior", "mtb", "proto", "proto_label",
                                       "floor")}
    diff = metrics["paired"]["mtb_minus_regrab"]["2w1s"]
    assert set(diff) == {"diff", "ci95"}
    assert diff["diff"] == pytest.approx(acc["mtb"]["2w1s"] - acc["regrab"]["2w1s"], abs=0.02)
    assert set(metrics["ece"]) == {"regrab", "regrab_no_prior", "mtb", "proto",
                                   "proto_label"}  # no floor
    # Temperature scaling: every trained method, the few-shot settings (fitted on 2-way
    # validation episodes: the toy split has 2 validation relations).
    assert set(metrics["ece_ts"]) == set(metrics["ece"])
    assert set(metrics["ece_ts"]["proto"]) == {"2w1s", "3w2s"}
    assert set(metrics["nota"]["floor"]) == {"2w1s_r25", "2w1s_r50"}
    full = json.loads((tmp_path / "metrics" / "nyt25_report.json").read_text())
    assert full["splits"] == ["split_0", "split_1"]
    cell = full["accuracy"]["regrab"]["2w1s"]
    assert cell["n_splits"] == 2 and set(cell["per_split"]) == {"split_0", "split_1"}
    assert cell["episodes"] == 40 and cell["pooled_ci95"] > 0
    thresholds = full["nota"]["mtb"]["2w1s_r50"]["per_split"]["split_0"]
    # Compact: a split's NOTA cell without every score's detection figures and ROC curve
    # (the detection section summarises them), and no per-split figures of every score.
    assert set(thresholds) == {"acc", "threshold", "abstained", "outside", "val_ways",
                               "best", "best_point"}
    scores = full["detection"]["regrab"]["2w1s_r50"]["scores"]["max_prob"]["auroc"]
    assert set(scores) == {"mean", "ci95", "n_splits"}
    assert set(full["detection"]["regrab"]["2w1s_r50"]["best"]["auroc"]["per_split"]) == {
        "split_0", "split_1"}  # the chosen score's, which the paired test reads
    assert "per_split" not in full["selective_scores"]["regrab"]["2w1s"]["max_logit"]["aurc"]
    # Out-of-set detection: every score of a sampling head, point scores of the others; the
    # best score is one the head has.
    det = full["detection"]
    assert set(det["regrab"]["2w1s_r50"]["scores"]) >= {"max_prob", "entropy_ts",
                                                         "mutual_information", "max_logit"}
    assert "mutual_information" not in det["proto"]["2w1s_r50"]["scores"]
    assert set(det["proto"]["2w1s_r50"]["best"]["chosen"].values()) <= set(
        det["proto"]["2w1s_r50"]["scores"])
    assert set(full["detection_paired"]) == {
        "regrab_posterior_gain", *(f"regrab_minus_{m}" for m in
                                   ("regrab_no_prior", "mtb", "proto", "proto_label", "floor"))}
    assert all(0 <= v <= 100 for v in metrics["detection"]["mtb"]["2w1s_r25"].values())
    assert set(full["selective_scores"]["regrab"]["2w1s"]["max_logit"]) == {"aurc", "acc80"}
    assert thresholds["outside"] == 0.5 and thresholds["val_ways"] == 1  # toy val: 2 relations
    assert len(full["calibration"]["proto"]["3w2s"]["bins"]["count"]) == 15
    ts = full["calibration"]["proto"]["3w2s"]["ece_ts"]
    assert set(ts["temperature"]) == {"split_0", "split_1"}
    assert all(0.04 < t < 21 for t in ts["temperature"].values())
    md = (tmp_path / "metrics" / "nyt25.md").read_text()
    assert "| regrab |" in md and "t 95% CI" in md and "None-of-the-above" in md
    assert "after temperature scaling" in md
    plots = tmp_path / "plots"
    for png in ("nyt25.png", "nyt25_reliability.png"):
        assert (plots / png).read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader((plots / "nyt25_selective.csv").open()))
    assert len(rows) == 100 and "regrab_3w0s" in rows[0] and "floor_2w1s" in rows[0]
    roc = list(csv.DictReader((plots / "nyt25_detection.csv").open()))
    assert len(roc) == 51 and "regrab_2w1s_r50" in roc[0] and "Out-of-set detection" in md
    # NOTA queries ride along with the plain episodes: without them nothing else changes.
    params["evaluate"]["nota_rates"] = []
    p.write_text(yaml.safe_dump(params))
    plain = _evaluate(tmp_path, splits, p, "plain")
    assert plain["nyt25"] == metrics["nyt25"] and plain["ece"] == metrics["ece"]
    assert plain["aurc"] == metrics["aurc"]
    assert "nota" not in plain and "detection" not in plain


def test_paper_protocol_one_model_per_setting(tmp_path):
    enc = tiny_encoder(tmp_path / "bert")
    splits = toy_splits(tmp_path / "splits")
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": -1, "freeze_top_kv": False},
                  "langevin": {"samples": 2, "steps": 1}},
        "train": {"methods": ["regrab", "mtb"], "steps": 2, "queries": 2, "val_every": 2,
                  "val_episodes": 3, "val_settings": ["2w1s"], "dvclive": False,
                  "per_setting": ["2w1s", "3w0s"], "device": "cpu"},
        "evaluate": {"methods": ["regrab", "mtb"], "settings": ["2w1s", "3w0s"],
                     "episodes": 5, "queries": 2, "floor": False, "device": "cpu",
                     "nota_rates": []},
    })
    p = _train(tmp_path, splits, params)
    models = tmp_path / "models" / "split_0"
    assert (models / "regrab" / "2w1s" / "model.safetensors").exists()
    assert (models / "regrab" / "3w0s" / "model.safetensors").exists()
    assert not (models / "mtb" / "3w0s").exists()  # no zero-shot model without a prior
    out = _evaluate(tmp_path, splits, p)
    assert set(out["nyt25"]["regrab"]) == {"2w1s", "3w0s"} and set(out["nyt25"]["mtb"]) == {
        "2w1s"}
    assert "nota" not in out


def test_refuses_a_model_trained_on_another_split(tmp_path):
    enc = tiny_encoder(tmp_path / "bert")
    splits = toy_splits(tmp_path / "splits")
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": False}},
        "train": {**TRAIN, "methods": ["mtb"], "steps": 1, "val_every": 1},
        "evaluate": {"methods": ["mtb"], "settings": ["2w1s"], "episodes": 3, "queries": 2,
                     "floor": False, "device": "cpu", "nota_rates": []},
    })
    p = _train(tmp_path, splits, params)
    assert "nyt25" in _evaluate(tmp_path, splits, p)  # its own split is fine
    other = tmp_path / "other"
    shutil.copytree(splits, other)
    write_parquet(toy_table(["P6", "P1", "P2"], 12, seed=99), other / "split_0" / "train.parquet",
                  FEWSHOT_SCHEMA)
    with pytest.raises(PipelineError) as err:
        _evaluate(tmp_path, other, p)
    message = str(err.value)
    assert "\n" not in message and "split_0" in message and "model.safetensors" in message
    assert "trained on another split" in message and "retrain" in message


def test_comparison_runs_on_fewer_splits_and_episodes_and_workers_agree(tmp_path):
    """The comparison's methods train and score on the listed splits and the first episodes
    only, paired with REGRAB there; one scoring process or two give the same report."""
    enc = tiny_encoder(tmp_path / "bert")
    splits = toy_splits(tmp_path / "splits", n_splits=2)
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2}},
        "train": {**TRAIN, "methods": ["regrab", "proto"]},
        "comparison": {"methods": ["proto", "maml"], "splits": ["split_1"], "episodes": 8},
        "evaluate": {"methods": ["regrab", "proto"], "settings": ["2w1s", "3w2s"],
                     "episodes": 20, "queries": 2, "device": "cpu", "nota_rates": [],
                     "temperature_episodes": 10, "workers": 1},
    })
    p = _train(tmp_path, splits, params)
    assert (tmp_path / "models/split_1/maml/model.safetensors").exists()
    assert not (tmp_path / "models/split_0/maml").exists()
    one = _evaluate(tmp_path, splits, p, "one")
    params["evaluate"]["workers"] = 2
    p.write_text(yaml.safe_dump(params))
    two = _evaluate(tmp_path, splits, p, "two")
    assert one == two
    reports = [json.loads((tmp_path / "metrics" / f"{n}_report.json").read_text())
               for n in ("one", "two")]
    assert reports[0] == reports[1]
    acc = reports[0]["accuracy"]
    assert list(acc) == ["regrab", "proto", "maml", "floor"]
    maml, proto = acc["maml"]["2w1s"], acc["proto"]["2w1s"]
    assert (maml["n_splits"], maml["episodes"]) == (1, 8)  # proto: every split and episode
    assert (proto["n_splits"], proto["episodes"]) == (2, 40)
    diff = reports[0]["paired"]["maml_minus_regrab"]["2w1s"]
    assert set(diff["per_split"]) == {"split_1"}  # paired where both ran
    md = (tmp_path / "metrics" / "one.md").read_text()
    assert "Scored on fewer splits or episodes" in md and "maml (1 split(s), 8 episodes" in md
