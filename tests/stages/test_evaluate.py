import json

import yaml

from stages import evaluate, train
from tests.model.tiny_regrab import tiny_encoder, toy_graph, toy_splits


def test_tiny_end_to_end_writes_metrics(tmp_path):
    enc = tiny_encoder(tmp_path / "bert")
    splits = toy_splits(tmp_path / "splits", n_splits=2)
    graph, features = toy_graph(tmp_path)
    settings = ["2w1s", "3w2s", "3w0s"]
    params = {
        "model": {"encoder": str(enc), "train_layers": 1, "freeze_top_kv": True,
                  "normalize": 5.0, "samples": 2, "langevin_steps": 2},
        "train": {
            "steps": 3,
            "ways": [2, 3],
            "shots": [1, 2],
            "queries": 2,
            "val_every": 3,
            "val_episodes": 5,
            "val_settings": ["2w1s"],
            "dvclive": False,
            "device": "cpu",
        },
        "evaluate": {"settings": settings, "episodes": 20, "queries": 2, "device": "cpu"},
    }
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(
        [
            "--splits",
            str(splits),
            "--graph",
            str(graph),
            "--features",
            str(features),
            "--out",
            str(tmp_path / "models"),
            "--params",
            str(p),
        ]
    )
    metrics_path = tmp_path / "metrics" / "nyt25.json"
    out = evaluate.main(
        [
            "--splits",
            str(splits),
            "--models",
            str(tmp_path / "models"),
            "--metrics",
            str(metrics_path),
            "--plot",
            str(tmp_path / "plots" / "nyt25.png"),
            "--params",
            str(p),
        ]
    )
    metrics = json.loads(metrics_path.read_text())
    assert metrics == out
    assert set(metrics) == {"regrab", "regrab_no_prior", "mtb", "proto", "floor"}
    assert set(metrics["regrab"]) == set(settings)  # zero-shot only for regrab
    for method in ("regrab_no_prior", "mtb", "proto", "floor"):
        assert set(metrics[method]) == {"2w1s", "3w2s"}
    for row in metrics.values():
        for cell in row.values():
            assert set(cell) == {"acc", "ci95"} and 0 <= cell["acc"] <= 100
    assert (tmp_path / "plots" / "nyt25.png").read_bytes()[:4] == b"\x89PNG"
    assert "| regrab |" in (tmp_path / "metrics" / "nyt25.md").read_text()
    per_split = json.loads((tmp_path / "metrics" / "nyt25_splits.json").read_text())
    assert set(per_split) == {"split_0", "split_1"}


def test_paper_protocol_one_model_per_setting(tmp_path):
    enc = tiny_encoder(tmp_path / "bert")
    splits = toy_splits(tmp_path / "splits")
    graph, features = toy_graph(tmp_path)
    params = {
        "model": {"encoder": str(enc), "train_layers": -1, "samples": 2, "langevin_steps": 1},
        "train": {"methods": ["regrab", "mtb"], "steps": 2, "queries": 2, "val_every": 2,
                  "val_episodes": 3, "val_settings": ["2w1s"], "dvclive": False,
                  "per_setting": ["2w1s", "3w0s"], "device": "cpu"},
        "evaluate": {"methods": ["regrab", "mtb"], "settings": ["2w1s", "3w0s"],
                     "episodes": 5, "queries": 2, "floor": False, "device": "cpu"},
    }
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--out", str(tmp_path / "models"), "--params", str(p)])
    models = tmp_path / "models" / "split_0"
    assert (models / "regrab" / "2w1s" / "model.pt").exists()
    assert (models / "regrab" / "3w0s" / "model.pt").exists()
    assert not (models / "mtb" / "3w0s").exists()  # no zero-shot model without a prior
    out = evaluate.main(["--splits", str(splits), "--models", str(tmp_path / "models"),
                         "--metrics", str(tmp_path / "m.json"), "--plot",
                         str(tmp_path / "p.png"), "--params", str(p)])
    assert set(out["regrab"]) == {"2w1s", "3w0s"} and set(out["mtb"]) == {"2w1s"}
