"""The commands run registered versions by name: `--model regrab`, `regrab-models list`,
`promote` and `rollback`, in a toy git + DVC project holding a real tiny trained model."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from cli import models, predict, score, suggest
from model.files.checkpoint import read_checkpoint, save_checkpoint
from model.predict.sentences import parse_sentence
from pipeline import registry
from stages import train
from tests.cli.test_score import _fewrel_json
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, tiny_encoder, toy_graph, toy_splits, toy_table

DVC = [sys.executable, "-m", "dvc"]
RELATIONS = ["P6", "P7", "P8"]
MEMBER = Path("models") / registry.DEFAULT_MEMBER
TRAIN = {"steps": 2, "ways": [2, 3], "shots": [1, 2], "queries": 2, "val_every": 2,
         "val_episodes": 5, "val_settings": ["2w1s"], "dvclive": False, "device": "cpu",
         "methods": ["regrab"]}

pytestmark = pytest.mark.slow  # git and dvc in subprocesses, a model trained for 2 steps


def git_dvc(cwd: Path, *cmd: str) -> None:
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)


def new_project(root: Path, remote: Path) -> Path:
    root.mkdir()
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@example.com"],
                ["git", "config", "user.name", "t"], [*DVC, "init", "-q"],
                [*DVC, "remote", "add", "-d", "store", str(remote)]):
        git_dvc(root, *cmd)
    return root


def commit(root: Path, message: str, headline: dict | None) -> None:
    """Track models/ with DVC, write (or leave out) the NYT-25 headline, commit."""
    metrics = root / "metrics" / "nyt25_headline.json"
    metrics.parent.mkdir(exist_ok=True)
    if headline is not None:
        metrics.write_text(json.dumps({"nyt25": headline}))
    git_dvc(root, *DVC, "add", "-q", "models")
    git_dvc(root, "git", "add", "-A")
    git_dvc(root, "git", "commit", "-qm", message)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """Two registered versions of a trained NYT-25 model (v0.2.0's head perturbed), v0.2.0
    promoted after v0.1.0, both pushed to the project's DVC remote."""
    tmp = tmp_path_factory.mktemp("registered")
    inputs = tmp / "inputs"
    inputs.mkdir()
    encoder = tiny_encoder(inputs / "bert")
    splits = toy_splits(inputs / "splits")
    graph, features = toy_graph(inputs / "graph")
    params = inputs / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(**{
        "model": {"encoder": {"name": str(encoder), "train_layers": 1, "freeze_top_kv": True,
                              "normalize": 5.0}, "langevin": {"samples": 2, "steps": 2}},
        "train": TRAIN, "evaluate": {"episodes": 10, "queries": 2, "device": "cpu"}})))
    root = new_project(tmp / "project", tmp / "remote")
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--params", str(params),
                "--out", str(root / "models" / "nyt25")])
    (root / "models" / "nyt25" / "split_0" / "regrab" / "dvclive").mkdir(exist_ok=True)
    first = tmp / "v1.safetensors"
    shutil.copy(root / MEMBER / "model.safetensors", first)
    commit(root, "first model", {"5w1s": 70.5, "5w5s": 80.25})
    registry.promote(root, registry.register(root).version)
    git_dvc(root, *DVC, "push", "-q")  # as make repro does after each run
    old = read_checkpoint(first)
    torch.manual_seed(7)
    state = {k: v + 0.5 * torch.randn_like(v) if k.startswith("head.") and v.is_floating_point()
             else v for k, v in old.state.items()}
    save_checkpoint(root / MEMBER / "model.safetensors", dataclasses.replace(old, state=state))
    second = tmp / "v2.safetensors"
    shutil.copy(root / MEMBER / "model.safetensors", second)
    commit(root, "second model", {"5w1s": 71.0, "5w5s": 81.0, "10w1s": 60.0, "10w5s": 70.0})
    registry.promote(root, registry.register(root).version)
    git_dvc(root, *DVC, "push", "-q")
    sentences = sentence_files(tmp)
    return {"root": root, "v1": first, "v2": second, "params": params, **sentences}


def sentence_files(folder: Path) -> dict[str, Path]:
    rows = toy_table(RELATIONS, 5, seed=4).to_pylist()
    support, queries = [], []
    for r in RELATIONS:
        mine = [x for x in rows if x["relation"] == r]
        support += [{"relation": r, "text": parse_sentence(x).marked()} for x in mine[:2]]
        queries += [{"id": x["instance_id"], "text": parse_sentence(x).marked()}
                    for x in mine[2:]]
    s, q = folder / "support.jsonl", folder / "queries.jsonl"
    s.write_text("".join(json.dumps(x) + "\n" for x in support))
    q.write_text("".join(json.dumps(x) + "\n" for x in queries))
    return {"support": s, "queries": q}


def predicted(project: dict, model: str, out: Path) -> list:
    predict.main(["--model", model, "--support", str(project["support"]), "--queries",
                  str(project["queries"]), "--out", str(out), "--device", "cpu", "--seed", "1"])
    return [json.loads(line)["probabilities"] for line in out.read_text().splitlines()]


def test_predict_by_name_list_rollback_and_promote(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(project["root"])
    by_path = [predicted(project, str(project[v]), tmp_path / f"{v}.jsonl")
               for v in ("v1", "v2")]
    assert by_path[0] != by_path[1]  # the versions differ in what they predict
    capsys.readouterr()

    # The promoted version, pulled from the DVC remote: the local cache is gone.
    shutil.rmtree(project["root"] / ".dvc" / "cache")
    assert predicted(project, "regrab", tmp_path / "a.jsonl") == by_path[1]
    out = capsys.readouterr().out
    assert "model regrab#prod = regrab@v0.2.0 (prod)" in out and "nyt25/split_0/regrab" in out
    assert predicted(project, "regrab@v0.1.0:nyt25/split_0/regrab",
                     tmp_path / "b.jsonl") == by_path[0]
    assert "model regrab@v0.1.0 = regrab@v0.1.0, commit" in capsys.readouterr().out

    models.main(["list"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["version", "stage", "registered", "commit",
                                "nyt25", "5w1s/5w5s/10w1s/10w5s", "fewrel", "5w1s/5w5s/10w1s/10w5s"]
    v1, v2 = lines[1].split(), lines[2].split()
    assert v1[:2] == ["v0.1.0", "-"] and v1[5:] == ["70.50/80.25/-/-", "-"]  # no FewRel file
    assert v2[:2] == ["v0.2.0", "prod"] and v2[5:] == ["71.00/81.00/60.00/70.00", "-"]
    assert lines[-1].startswith("promoted (prod): regrab@v0.2.0")

    models.main(["rollback"])
    assert capsys.readouterr().out.startswith(
        "rolled back: prod was regrab@v0.2.0, is now regrab@v0.1.0")
    assert predicted(project, "regrab", tmp_path / "c.jsonl") == by_path[0]
    assert "= regrab@v0.1.0 (prod)" in capsys.readouterr().out

    models.main(["promote", "regrab@v0.2.0"])
    assert capsys.readouterr().out.startswith(
        "promoted: prod was regrab@v0.1.0, is now regrab@v0.2.0")
    models.main(["promote", "regrab@v0.2.0"])
    assert "in prod already; nothing changed" in capsys.readouterr().out
    assert registry.assignments(project["root"]) == ["v0.1.0", "v0.2.0", "v0.1.0", "v0.2.0"]


def test_suggest_and_score_take_a_name(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(project["root"])
    suggest.main(["--model", "regrab", "--support", str(project["support"]), "--pool",
                  str(project["queries"]), "--out", str(tmp_path / "ranked.jsonl"),
                  "--device", "cpu", "--strategy", "entropy"])
    assert "= regrab@v0.2.0 (prod)" in capsys.readouterr().out
    assert len((tmp_path / "ranked.jsonl").read_text().splitlines()) == 9
    data = _fewrel_json(tmp_path / "own.json", toy_table(["Q91", "Q92", "Q93"], 6, seed=3))
    result = score.score(["--data", str(data), "--models", "regrab@v0.1.0:nyt25", "--out",
                          str(tmp_path / "scores"), "--settings", "2w1s", "--episodes", "5",
                          "--params", str(project["params"])])
    assert set(result["metrics"]["own"]) == {"regrab", "floor"}
    out = capsys.readouterr().out
    assert "model regrab@v0.1.0 = regrab@v0.1.0, commit" in out and "models of nyt25" in out
    copied = project["root"] / ".regrab/registry/regrab/v0.1.0/benchmark/nyt25/split_0/regrab"
    assert sorted(p.name for p in copied.iterdir()) == ["model.safetensors"]  # no curves


def error_line(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_each_mistake_is_one_error_line(project, tmp_path, monkeypatch, capsys):
    run = ["--support", str(project["support"]), "--queries", str(project["queries"]),
           "--out", str(tmp_path / "p.jsonl"), "--device", "cpu"]
    monkeypatch.chdir(project["root"])
    assert "regrab@v9.0.0 is not registered (versions: v0.1.0, v0.2.0)" in error_line(
        predict.main, ["--model", "regrab@v9.0.0", *run], capsys)
    assert "no model fewrel/split_0/regrab" in error_line(
        predict.main, ["--model", "regrab:fewrel/split_0/regrab", *run], capsys)
    assert "promote takes one version" in error_line(models.main, ["promote", "regrab"], capsys)
    data = _fewrel_json(tmp_path / "own.json", toy_table(["Q91", "Q92", "Q93"], 6, seed=3))
    assert "after the colon give a benchmark only" in error_line(
        score.main, ["--data", str(data), "--models", "regrab:nyt25/split_0/regrab", "--out",
                     str(tmp_path / "s"), "--params", str(project["params"])], capsys)
    assert not (tmp_path / "p.jsonl").exists()

    # A project whose only version is not promoted, and whose bytes were never pushed.
    other = new_project(tmp_path / "other", tmp_path / "empty-remote")
    monkeypatch.chdir(other)
    assert "no version of regrab is registered" in " ".join(_listed(capsys))
    (other / MEMBER).mkdir(parents=True)
    shutil.copy(project["v1"], other / MEMBER / "model.safetensors")
    commit(other, "a model", None)
    registry.register(other)
    assert "no version of regrab is assigned to prod" in error_line(
        predict.main, ["--model", "regrab", *run], capsys)
    assert "no earlier version to roll back to" in error_line(models.main, ["rollback"],
                                                               capsys)
    assert "no version is promoted" in _listed(capsys)[-1]
    shutil.rmtree(other / ".dvc" / "cache")
    assert "dvc push" in error_line(predict.main, ["--model", "regrab@v0.1.0", *run], capsys)

    monkeypatch.chdir(tmp_path)  # no git repository
    assert "is not inside a git repository" in error_line(models.main, ["list"], capsys)
    assert "is not inside a git repository" in error_line(
        predict.main, ["--model", "regrab", *run], capsys)
    assert not (tmp_path / "p.jsonl").exists()


def _listed(capsys) -> list[str]:
    models.main(["list"])
    return capsys.readouterr().out.splitlines()


def test_a_file_of_the_same_name_wins(project, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # no git repository: the file is read, not the registry
    shutil.copy(project["v1"], tmp_path / "regrab")
    assert predicted(project, "regrab", tmp_path / "p.jsonl")
    assert "model regrab" not in capsys.readouterr().out
    os.remove(tmp_path / "regrab")
