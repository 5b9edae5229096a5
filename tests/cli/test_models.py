"""Models a user can take away: export to a folder, convert old pickles, DVC push and pull."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cli import models, predict
from model.files import tensor_file
from model.files.checkpoint import read_payload, save_payload
from model.files.loader import load_model
from model.files.tensor_file import TRANSE_FORMAT
from model.predict.sentences import parse_sentence
from stages import train
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits, toy_table

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {"steps": 2, "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_every": 2,
         "val_episodes": 5, "val_settings": ["2w1s"], "dvclive": False, "device": "cpu",
         "methods": ["regrab"]}
RELATIONS = ["P6", "P7", "P8"]


def tiny_inputs(root: Path, encoder: Path) -> list[str]:
    """Splits, graph, labels and params for a 2-step training run; returns the stage args."""
    toy_splits(root / "splits")
    graph, features = toy_graph(root / "graph")
    params = project_params(**{
        "model": {"encoder": {"name": str(encoder), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2}},
        "train": TRAIN})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    return ["--splits", "splits", "--graph", "graph/graph.parquet", "--features",
            "graph/features.parquet", "--relations",
            str(labels_of(graph).relative_to(root)), "--params", "params.yaml"]


def support_and_queries(folder: Path) -> tuple[Path, Path]:
    rows = toy_table(RELATIONS, 5, seed=4).to_pylist()
    support, queries = [], []
    for r in RELATIONS:
        mine = [x for x in rows if x["relation"] == r]
        support += [{"relation": r, "text": parse_sentence(x).marked()} for x in mine[:2]]
        queries += [{"id": x["instance_id"], "relation": r, "text": parse_sentence(x).marked()}
                    for x in mine[2:]]
    s, q = folder / "support.jsonl", folder / "queries.jsonl"
    s.write_text("".join(json.dumps(x) + "\n" for x in support))
    q.write_text("".join(json.dumps(x) + "\n" for x in queries))
    return s, q


def _predict(checkpoint: Path, folder: Path, out: Path) -> str:
    s, q = support_and_queries(folder)
    predict.main(["--checkpoint", str(checkpoint), "--support", str(s), "--queries", str(q),
                  "--out", str(out), "--device", "cpu", "--seed", "1"])
    return out.read_text()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    encoder = tiny_encoder(root / "bert")
    args = tiny_inputs(root, encoder)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        train.main([*args, "--out", "models"])
    finally:
        os.chdir(cwd)
    return root, root / "models" / "split_0" / "regrab" / "model.safetensors"


def test_exported_folder_alone_predicts_the_same(trained, tmp_path, capsys):
    root, ckpt = trained
    want = _predict(ckpt, tmp_path, tmp_path / "a.jsonl")
    folder = tmp_path / "export"
    models.main(["export", str(ckpt), "--out", str(folder), "--relations",
                 str(root / "graph" / "relations.parquet")])
    assert sorted(p.name for p in folder.iterdir()) == [
        "README.md", "config.json", "encoder", "model.safetensors"]
    meta = json.loads((folder / "config.json").read_text())
    assert meta["labels"]["P1"] and meta["graph"]["relations"][:2] == ["P1", "P2"]
    assert meta["relations"]["train"] == ["P1", "P2", "P3"] and meta["params"]["inputs"]
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: regrab") and "## Training data" in card
    assert not list((folder / "encoder").glob("*.bin"))  # weights as safetensors only
    # The folder alone: hide the encoder the checkpoint was trained with.
    hidden = root / "bert-hidden"
    os.replace(root / "bert", hidden)
    try:
        got = _predict(folder, tmp_path, tmp_path / "b.jsonl")
    finally:
        os.replace(hidden, root / "bert")
    assert got == want


def test_export_refuses_to_overwrite_other_folders(trained, tmp_path, capsys):
    _, ckpt = trained
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(SystemExit) as exc:
        models.main(["export", str(ckpt), "--out", str(tmp_path / "mine")])
    assert exc.value.code == 2 and "not a model folder" in capsys.readouterr().err
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_convert_old_pickles(trained, tmp_path, capsys):
    _, ckpt = trained
    payload = read_payload(ckpt)
    old = tmp_path / "model.pt"
    torch.save({**payload, "format": "regrab-model-2"}, old)  # as older versions wrote it
    s, q = support_and_queries(tmp_path)
    with pytest.raises(SystemExit):
        predict.main(["--checkpoint", str(old), "--queries", str(q), "--support", str(s),
                      "--out", str(tmp_path / "o.jsonl")])
    assert "regrab-models convert" in capsys.readouterr().err
    models.main(["convert", str(old)])
    new = tmp_path / "model.safetensors"
    a, _ = load_model(ckpt)
    b, _ = load_model(new)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values(), strict=True))
    # A TransE state of the older version too.
    transe = {"format": 1, "config": {"dim": 4}, "epoch": 2, "model": {"w": torch.ones(2)},
              "optimizer": {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": []},
              "generator": torch.Generator().get_state(), "losses": [0.5]}
    torch.save(transe, tmp_path / "transe.pt")
    models.main(["convert", str(tmp_path / "transe.pt")])
    fmt, back = tensor_file.load(tmp_path / "transe.safetensors", TRANSE_FORMAT)
    assert back["optimizer"]["state"][0]["step"].item() == 1.0 and back["epoch"] == 2


def test_convert_refuses_what_is_not_plain_data(tmp_path, capsys):
    from tests.cli.test_hostile_checkpoints import hostile_files

    marker = tmp_path / "RAN"
    files = hostile_files(tmp_path / "h", marker)
    for kind in ("raw_pickle", "torch_zip"):
        with pytest.raises(SystemExit) as exc:
            models.main(["convert", str(files[kind]), "--out", str(tmp_path / "x")])
        assert exc.value.code == 2
        assert capsys.readouterr().err.startswith("error: cannot convert")
    assert not marker.exists() and not (tmp_path / "x").exists()


#: What torch's restricted unpickler admits but a checkpoint of tensors and plain data cannot
#: hold, with what the one line names.
NOT_PLAIN = {
    "bytes": (b"ab", "a bytes"),
    "set": ({1, 2}, "a set"),
    "tuple_key": ({(1, 2): 1}, "keys of type tuple"),
    "bool_key": ({True: 1}, "keys of type bool"),
    "float_key": ({1.5: 1}, "keys of type float"),
    "sparse": (torch.eye(3).to_sparse(), "a sparse_coo tensor"),
    "too_deep": (eval("[" * 100 + "]" * 100), "nested deeper than 64"),  # noqa: S307
}


@pytest.mark.parametrize("kind", NOT_PLAIN)
def test_convert_refuses_pickles_of_what_a_checkpoint_cannot_hold(kind, tmp_path, capsys):
    value, named = NOT_PLAIN[kind]
    old = tmp_path / "model.pt"
    torch.save({"format": "regrab-model-2", "config": {}, "state": {}, "extra": value}, old)
    with pytest.raises(SystemExit) as exc:
        models.main(["convert", str(old)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a checkpoint of tensors and plain data" in err[0]
    assert named in err[0] and not (tmp_path / "model.safetensors").exists()


def _typed_wrong(field: str, value):
    def edit(payload):
        if field == "encoder":
            payload["config"]["encoder"] = value
        else:
            payload[field] = value
    return edit


#: Parts of a checkpoint export reads, each of the wrong type, and what the line names.
MISTYPED = {
    "summary": (_typed_wrong("summary", [1]), "list for 'summary'"),
    "summary_split": (_typed_wrong("summary", {"split": [1]}), "'split' is not text"),
    "relations": (_typed_wrong("relations", {"train": [1, 2]}), "not lists of relation ids"),
    "relations_text": (_typed_wrong("relations", {"train": "P1"}),
                       "not lists of relation ids"),
    "params": (_typed_wrong("params", {"inputs": [1]}), "'inputs' is not a mapping"),
    "encoder": (_typed_wrong("encoder", ["x"]), "config.encoder = ['x']"),
}
#: Reports in the shape of evaluate's whose rows are not.
BAD_REPORTS = {
    "row_text": {"split_0": "x"},
    "per_split_number": 5,
}


@pytest.mark.parametrize("case", [*MISTYPED, *BAD_REPORTS])
def test_export_refuses_mistyped_checkpoints_and_reports(trained, case, tmp_path, capsys):
    _, ckpt = trained
    args = ["--out", str(tmp_path / "out"), "--no-encoder"]
    if case in MISTYPED:
        edit, named = MISTYPED[case]
        payload = read_payload(ckpt)
        edit(payload)
        ckpt = tmp_path / "model.safetensors"
        save_payload(ckpt, payload)
    else:
        row = {"per_split": BAD_REPORTS[case], "mean": 1.0, "ci95": 1.0, "n_splits": 1,
               "episodes": 4}
        report = tmp_path / "report.json"
        report.write_text(json.dumps({"accuracy": {"regrab": {"5w1s": row}}}))
        args += ["--report", str(report)]
        named = "is not a report the evaluate stage wrote"
    with pytest.raises(SystemExit) as exc:
        models.main(["export", str(ckpt), *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and named in err[0], err
    assert not (tmp_path / "out").exists()


def test_export_does_not_download_the_encoder_a_checkpoint_names(trained, tmp_path, capsys,
                                                                 monkeypatch):
    _, ckpt = trained
    monkeypatch.delenv("REGRAB_ALLOW_DOWNLOAD", raising=False)
    payload = read_payload(ckpt)
    payload["config"]["encoder"]["name"] = "some-org/not-a-local-model"
    save_payload(tmp_path / "model.safetensors", payload)
    with pytest.raises(SystemExit) as exc:
        models.main(["export", str(tmp_path / "model.safetensors"), "--out",
                     str(tmp_path / "out")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not available locally" in err[0]
    assert "REGRAB_ALLOW_DOWNLOAD=1" in err[0] and not (tmp_path / "out").exists()


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_exported_files_follow_the_umask(trained, umask, tmp_path):
    """safetensors writes 0600 whatever the umask; exported and trained files must not."""
    _, ckpt = trained
    old = os.umask(umask)
    try:
        models.main(["export", str(ckpt), "--out", str(tmp_path / "out")])
        save_payload(tmp_path / "ck.safetensors", read_payload(ckpt))
    finally:
        os.umask(old)
    want = 0o666 & ~umask
    for path in [tmp_path / "ck.safetensors", *(tmp_path / "out").rglob("*.safetensors")]:
        assert path.stat().st_mode & 0o777 == want, path


def _run(cmd: list[str], cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{cmd}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done.stdout


@pytest.mark.slow
def test_dvc_push_then_pull_into_fresh_clone_predicts_without_training(tmp_path):
    """Train in one clone, `dvc push` to a folder remote, `dvc pull` in a fresh clone."""
    dvc = [sys.executable, "-m", "dvc"]
    src = tmp_path / "src"
    src.mkdir()
    encoder = tiny_encoder(tmp_path / "bert")  # stands for the installed encoder package
    args = tiny_inputs(src, encoder)
    stage = {"stages": {"train": {
        "cmd": " ".join([sys.executable, "-m", "stages.train", *args, "--out", "models"]),
        "deps": ["splits", "graph", "params.yaml"],
        "outs": [{"models": {"persist": True}}]}}}
    (src / "dvc.yaml").write_text(yaml.safe_dump(stage))
    remote = tmp_path / "remote"
    _run(["git", "init", "-q", "-b", "main"], src)
    _run([*dvc, "init", "-q"], src)
    _run([*dvc, "remote", "add", "-d", "store", str(remote)], src)
    _run([*dvc, "repro", "-q"], src)
    _run(["git", "add", "-A"], src)
    _run(["git", "commit", "-q", "-m", "trained"], src)
    _run([*dvc, "push", "-q"], src)
    ckpt = Path("models/split_0/regrab/model.safetensors")
    want = _predict(src / ckpt, tmp_path, tmp_path / "src.jsonl")

    fresh = tmp_path / "fresh"
    _run(["git", "clone", "-q", str(src), str(fresh)], tmp_path)
    assert not (fresh / ckpt).exists()
    _run([*dvc, "pull", "-q", "train"], fresh)
    got = _predict(fresh / ckpt, tmp_path, tmp_path / "fresh.jsonl")
    assert got == want
    status = _run([*dvc, "status", "train"], fresh)
    assert "changed" not in status  # pulled, not retrained: the lock matches
    shutil.rmtree(remote)
