"""A checkpoint crafted to run code is refused by every loader, and the code never runs.

Each hostile file would create ``MARKER`` if anything unpickled it: a raw pickle, the same
object inside torch's zip format, a model folder whose config.json or safetensors header is
hostile. Each loader (regrab-predict, regrab-score, evaluate, train's resume) must stop (or,
for resume, start over) with one line, and the marker must never appear.

Checkpoints that run no code but do not fit are refused in one line too, before they cost
anything: sizes that would end in an OOM kill, weights of other shapes or NaN, an encoder
that is not on this machine (no download) or is a pickle, and, for regrab-score, models of
different encoders in one folder.
"""

import json
import os
import pickle
import shutil
import struct
from pathlib import Path

import pytest
import torch
import yaml

from cli import predict, score
from model.files.checkpoint import read_payload, save_payload
from pipeline.errors import PipelineError, run_cli
from stages import evaluate, train
from tests.cli.test_score import _fewrel_json
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_table

TRAIN = {"steps": 2, "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_every": 2,
         "val_episodes": 5, "val_settings": ["2w1s"], "dvclive": False, "device": "cpu",
         "methods": ["regrab", "proto"]}


class Planted:
    """Unpickling this calls ``os.system`` (the classic hostile pickle)."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def hostile_files(folder: Path, marker: Path) -> dict[str, Path]:
    """One file (or folder) per way of hiding code in a checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    out["raw_pickle"] = folder / "raw.bin"
    out["raw_pickle"].write_bytes(pickle.dumps({"format": "regrab-model-2",
                                                "config": Planted(marker)}))
    out["torch_zip"] = folder / "zip.bin"
    torch.save({"format": "regrab-model-2", "config": Planted(marker)}, out["torch_zip"])
    # A model folder whose config.json nests 100,000 deep and whose weights are a pickle.
    deep = folder / "deep_json"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    shutil.copy(out["torch_zip"], deep / "model.safetensors")
    # A safetensors file whose header claims 2^60 bytes.
    out["huge_header"] = folder / "huge.bin"
    out["huge_header"].write_bytes(struct.pack("<Q", 2**60) + b"{}")
    # A valid safetensors framing whose metadata tree nests far too deep.
    meta = {"format": "regrab-model-3", "tree": "[" * 5000 + "]" * 5000}
    header = json.dumps({"__metadata__": meta}).encode()
    out["deep_tree"] = folder / "deep_tree.bin"
    out["deep_tree"].write_bytes(struct.pack("<Q", len(header)) + header)
    # A folder with a well-formed config but pickled "weights".
    bad_weights = folder / "pickled_weights"
    bad_weights.mkdir()
    (bad_weights / "config.json").write_text(json.dumps(
        {"format": "regrab-model-folder-1", "config": {}, "graph": {}}))
    shutil.copy(out["torch_zip"], bad_weights / "model.safetensors")
    out["deep_json"], out["pickled_weights"] = deep, bad_weights
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    enc, splits, graph, features = toy_project(root)
    params = project_params(**{
        "model": {"encoder": {"name": str(enc), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2}},
        "train": TRAIN,
        "evaluate": {"episodes": 4, "queries": 2, "device": "cpu", "methods": ["proto"],
                     "settings": ["2w1s"], "floor": False, "nota_rates": []},
    })
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    args = ["--splits", str(splits), "--graph", str(graph), "--features", str(features),
            "--relations", str(labels_of(graph)), "--params", str(p)]
    train.main([*args, "--out", str(root / "models")])
    marker = root / "MARKER"
    return {"root": root, "splits": splits, "params": p, "train_args": args, "marker": marker,
            "hostile": hostile_files(root / "hostile", marker)}


KINDS = ["raw_pickle", "torch_zip", "deep_json", "huge_header", "deep_tree", "pickled_weights"]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err, "no error printed"
    assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


@pytest.mark.parametrize("kind", KINDS)
def test_predict_refuses(project, kind, tmp_path, capsys):
    support = tmp_path / "s.jsonl"
    support.write_text(json.dumps({"relation": "P6", "text": "[E1]w1[/E1] verb6 [E2]w2[/E2] ."})
                       + "\n")
    with pytest.raises(SystemExit) as exc:
        predict.main(["--checkpoint", str(project["hostile"][kind]), "--support", str(support),
                      "--queries", str(support), "--out", str(tmp_path / "p.jsonl"),
                      "--device", "cpu"])
    assert exc.value.code == 2
    line = _one_error_line(capsys)
    assert "checkpoint" in line or "model folder" in line
    assert not project["marker"].exists()
    assert not (tmp_path / "p.jsonl").exists()


def _models_with(project, tmp_path, kind: str, name: str) -> Path:
    """A copy of the trained models whose proto model is replaced by a hostile file."""
    models = tmp_path / "models"
    shutil.copytree(project["root"] / "models", models)
    target = models / "split_0" / "proto"
    (target / "model.safetensors").unlink()
    src = project["hostile"][kind]
    if src.is_dir():
        shutil.rmtree(target)
        shutil.copytree(src, target)
        if name != "model.safetensors":
            pytest.skip("a folder has one layout")
    else:
        shutil.copy(src, target / name)
    return models


@pytest.mark.parametrize("kind", ["raw_pickle", "torch_zip", "huge_header", "deep_tree"])
@pytest.mark.parametrize("name", ["model.safetensors", "model.pt"])
def test_evaluate_refuses(project, kind, name, tmp_path, capsys):
    models = _models_with(project, tmp_path, kind, name)
    with pytest.raises(SystemExit) as exc:
        run_cli(evaluate.main, ["--splits", str(project["splits"]), "--models", str(models),
                                "--metrics", str(tmp_path / "m.json"),
                                "--plot", str(tmp_path / "p.png"), "--params",
                                str(project["params"])])
    assert exc.value.code == 2
    line = _one_error_line(capsys)
    assert "split_0/proto" in line
    if kind in ("raw_pickle", "torch_zip"):
        assert "old pickle format" in line and "regrab-models convert" in line
    assert not project["marker"].exists() and not (tmp_path / "m.json").exists()


@pytest.mark.parametrize("kind", ["raw_pickle", "torch_zip", "deep_tree"])
def test_score_refuses(project, kind, tmp_path, capsys):
    models = _models_with(project, tmp_path, kind, "model.safetensors")
    data = _fewrel_json(tmp_path / "d.json", toy_table(["Q91", "Q92", "Q93"], 8, seed=2))
    with pytest.raises(SystemExit) as exc:
        score.main(["--data", str(data), "--models", str(models), "--out",
                    str(tmp_path / "x"), "--settings", "3w1s", "--params",
                    str(project["params"])])
    assert exc.value.code == 2
    assert "split_0/proto" in _one_error_line(capsys)
    assert not project["marker"].exists()


@pytest.mark.parametrize("kind", ["raw_pickle", "torch_zip", "deep_tree"])
def test_train_resume_refuses_planted_state(project, kind, tmp_path, caplog):
    out = tmp_path / "models"
    for name in ("state.safetensors", "state.pt", "model.pt"):
        folder = out / "split_0" / "proto"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(project["hostile"][kind], folder / name)
    params = yaml.safe_load(project["params"].read_text())
    params["train"]["methods"] = ["proto"]
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    args = [a if a != str(project["params"]) else str(p) for a in project["train_args"]]
    with caplog.at_level("WARNING"):
        train.main([*args, "--out", str(out)])
    assert not project["marker"].exists()
    warned = [r.getMessage() for r in caplog.records if "state.safetensors" in r.getMessage()]
    assert len(warned) == 1 and "starting over" in warned[0] and "\n" not in warned[0]
    # Trained from scratch; the older version's pickles are gone, never loaded.
    names = sorted(x.name for x in (out / "split_0" / "proto").iterdir())
    assert names == ["model.safetensors"]


def test_the_bait_runs_code_when_unpickled(tmp_path):
    """The hostile files are real: an unrestricted unpickler runs their code."""
    marker = tmp_path / "RAN"
    files = hostile_files(tmp_path / "h", marker)
    pickle.loads(files["raw_pickle"].read_bytes())  # noqa: S301 - that is the point
    assert marker.exists()
    marker.unlink()
    torch.load(files["torch_zip"], weights_only=False)  # noqa: S614 - that is the point
    assert marker.exists()


def test_no_unrestricted_unpickling_in_project_code():
    """No loader of user files may unpickle freely; the converter uses the restricted one."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for folder in ("cli", "model", "pipeline", "stages", "benchmarks", "scripts"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            for needle in ("weights_only=False", "pickle.load(", "pickle.loads(",
                           "torch.load(path)"):
                if needle in text:
                    offenders.append(f"{path.relative_to(root)}: {needle}")
            if "torch.load(" in text and path.name != "checkpoint.py":
                offenders.append(f"{path.relative_to(root)}: torch.load")
    assert offenders == []


def _edited(project, tmp_path, edit, method: str = "regrab") -> Path:
    """A copy of a trained checkpoint whose data tree ``edit`` changed in place."""
    payload = read_payload(project["root"] / "models" / "split_0" / method / "model.safetensors")
    edit(payload)
    path = tmp_path / "edited.safetensors"
    save_payload(path, payload)
    return path


def _set(*keys_value):
    *keys, value = keys_value

    def edit(payload):
        node = payload
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return edit


def _first_head_weight(payload, value):
    key = next(k for k in payload["state"] if k.startswith("head."))
    payload["state"][key] = value


def _nan_weight(payload):
    key = next(k for k, v in payload["state"].items() if k.startswith("encoder."))
    payload["state"][key] = payload["state"][key].clone()
    payload["state"][key].view(-1)[0] = float("nan")


def _pickled_encoder(project, payload):
    folder = project["root"] / "pickled_encoder"
    if not folder.exists():
        shutil.copytree(project["root"] / "bert", folder)
        (folder / "model.safetensors").unlink()
        torch.save({"w": Planted(project["marker"])}, folder / "pytorch_model.bin")
    payload["config"]["encoder"]["name"] = str(folder)


#: (edit of the file's tree, what the one line says). Each would otherwise end in an OOM
#: kill, a long allocation, a traceback or a download.
UNFIT = {
    "feature_dim": (_set("graph_feature_dim", 300_000_000), "relation features 300000000 wide"),
    "edges": (_set("graph_edges", 10**10), "'prior.edge_index' has shape"),
    "graph_size": (lambda p: p.update(graph_relations=p["graph_relations"][:-1]),
                   "'prior.propagated' has shape"),
    "samples": (_set("config", "langevin", "eval_samples", 10**9),
                "config.langevin.eval_samples = 1000000000: expected a number >= 0 and <= "),
    "gnn_width": (_set("config", "prior", "hidden", 10**9), "config.prior.hidden = "),
    "shape": (lambda p: _first_head_weight(p, torch.zeros(7, 7)), "has shape [7, 7]"),
    "extra_key": (_set("state", "head.extra", torch.zeros(1)), "weight 'head.extra'"),
    "nan": (_nan_weight, "non-finite weights (NaN or inf) in 'encoder."),
    "hub_id": (_set("config", "encoder", "name", "some-org/not-a-local-model"),
               "'some-org/not-a-local-model' is not available locally"),
    "val_scores_nan": (_set("val_scores", 0, "quantiles", "max_prob", 50, float("nan")),
                       "malformed validation scores (nan is not a finite number)"),
    "val_scores_type": (_set("val_scores", 0, "ways", [5] * 10**5),
                        "malformed validation scores (ways [5, 5, 5"),
    "support_noise_nan": (lambda p: p.update(support_noise={
        "ways": 5, "shots": 5, "episodes": 200, "cutoff": float("nan"), "auroc": 90.0,
        "flagged_wrong": 80.0, "flagged_clean": 2.0, "reason": "x"}),
        "malformed support_noise cutoff (cutoff nan is not a finite number)"),
}


@pytest.mark.parametrize("case", [*UNFIT, "pickled_encoder"])
def test_predict_refuses_a_checkpoint_that_does_not_fit(project, case, tmp_path, capsys,
                                                        monkeypatch):
    import huggingface_hub

    # Had the hub been asked, this would say so instead of waiting on retries.
    def no_network(*args, **kwargs):
        if not kwargs.get("local_files_only"):
            raise AssertionError("the hub was contacted")
        return real(*args, **kwargs)
    real = huggingface_hub.snapshot_download
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("REGRAB_ALLOW_DOWNLOAD", raising=False)
    if case == "pickled_encoder":
        edit, message = (lambda p: _pickled_encoder(project, p)), "holds pickled weights"
    else:
        edit, message = UNFIT[case]
    path = _edited(project, tmp_path, edit)
    support = tmp_path / "s.jsonl"
    support.write_text("".join(json.dumps({"relation": r, "text": f"[E1]w1[/E1] {v} "
                                           "[E2]w2[/E2] ."}) + "\n"
                               for r, v in (("P6", "verb6"), ("P7", "verb7"))))
    with pytest.raises(SystemExit) as exc:
        predict.main(["--checkpoint", str(path), "--support", str(support), "--queries",
                      str(support), "--out", str(tmp_path / "p.jsonl"), "--device", "cpu"])
    assert exc.value.code == 2
    line = _one_error_line(capsys)
    assert message in line and str(path) in line, line
    assert not project["marker"].exists() and not (tmp_path / "p.jsonl").exists()


def test_a_graph_larger_than_memory_is_refused_before_it_is_allocated(project, tmp_path,
                                                                      monkeypatch):
    """Sizes within the limits that the machine cannot hold: refused from the estimate."""
    from model.files import loader

    monkeypatch.setattr(loader, "available_memory", lambda: 1000)
    path = _edited(project, tmp_path, lambda p: None)
    with pytest.raises(PipelineError, match=r"9 relations, 8 features and 18 edges, which needs"):
        loader.load_model(path)
    # A gnn head whose sizes need more than that is refused before it is built too.
    monkeypatch.setattr(loader, "available_memory", lambda: 2**34)
    config = read_payload(path)["config"]
    big = {**config, "method": "gnn", "gnn": {"width": 16000, "growth": 16000, "layers": 60,
                                              "metric_hidden": 16, "chunk_pairs": 1024}}
    path = _edited(project, tmp_path, _set("config", big), method="proto")
    with pytest.raises(PipelineError, match="asks for a gnn head of .* GiB"):
        loader.load_model(path)


def test_a_cached_hub_encoder_loads_without_the_network(project, tmp_path, monkeypatch):
    """A hub id a checkpoint names is taken from the local cache; a download needs the
    user's REGRAB_ALLOW_DOWNLOAD=1."""
    import huggingface_hub

    from model.encoder.files import resolve_encoder_path

    snapshot = tmp_path / "hub" / "models--org--enc" / "snapshots" / "abc"
    shutil.copytree(project["root"] / "bert", snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("REGRAB_ALLOW_DOWNLOAD", raising=False)
    assert resolve_encoder_path("org/enc", local_only=True) == str(snapshot)
    with pytest.raises(PipelineError, match="REGRAB_ALLOW_DOWNLOAD=1"):
        resolve_encoder_path("org/other", local_only=True)
    monkeypatch.setenv("REGRAB_ALLOW_DOWNLOAD", "1")
    assert resolve_encoder_path("org/other", local_only=True) == "org/other"
    # params.yaml's own hub ids are left to the pipeline (the user chose them).
    assert resolve_encoder_path("org/other") == "org/other"


def test_score_names_which_models_use_which_encoder(project, tmp_path, capsys):
    """Models of two encoders in one --models folder, no method on every split."""
    models = tmp_path / "models"
    (models / "split_1").mkdir(parents=True)
    shutil.copytree(project["root"] / "models" / "split_0" / "regrab",
                    models / "split_0" / "regrab")
    other = tmp_path / "other_encoder"
    shutil.copytree(project["root"] / "bert", other)
    _edited(project, tmp_path, _set("config", "encoder", "name", str(other)), method="proto")
    (models / "split_1" / "proto").mkdir()
    shutil.copy(tmp_path / "edited.safetensors", models / "split_1" / "proto" / "model.safetensors")
    data = _fewrel_json(tmp_path / "d.json", toy_table(["Q91", "Q92", "Q93"], 8, seed=2))
    with pytest.raises(SystemExit) as exc:
        score.main(["--data", str(data), "--models", str(models), "--out",
                    str(tmp_path / "x"), "--settings", "3w1s", "--params",
                    str(project["params"])])
    assert exc.value.code == 2
    line = _one_error_line(capsys)
    assert "different encoders" in line
    # Each encoder is named by its first 80 characters (tmp_path's length varies).
    assert f"split_1/proto use {str(other)[:80]}" in line and "split_0/regrab use " in line
