"""orchestration/champion_gate.py: the promoted toy models against a run's, end to end.

A toy project (tiny encoder, two splits, REGRAB trained for 2 steps) in git + DVC, its models
registered and promoted; a run's workspace restores the same models from the shared cache, and
the gate copies the champion out of DVC, scores both with scripts/paired_runs.py in a
subprocess and decides. The same models differ by nothing on every episode: promoted.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestration import champion_gate, workspace
from pipeline import registry
from pipeline.gate import PromoteConfig
from pipeline.io import write_parquet
from pipeline.schemas import FEWSHOT_SCHEMA
from stages import train
from tests.conftest import ROOT, project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_table, toy_train_sections

pytestmark = pytest.mark.slow  # trains a toy model, scores it twice in a subprocess

CFG = PromoteConfig(benchmarks=("nyt25",), settings=("2w1s",), headline_margin=0.0,
                    setting_margin=2.0, episodes=4, webhook="")


def sh(cwd: Path, *cmd: str) -> None:
    subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True, timeout=300)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("gate") / "repo"
    enc, splits, graph, features = toy_project(root, n_splits=2)
    sections = toy_train_sections(enc)
    sections["train"]["methods"] = ["regrab"]
    params = project_params(**sections)
    params["benchmarks"] = {"nyt25": {"splits": "splits", "title": "toy"}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--out", str(root / "models" / "nyt25"),
                "--params", str(root / "params.yaml")])
    (root / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "paired_runs.py", root / "scripts")
    (root / "dvc.yaml").write_text("stages: {}\n")
    sh(root, "git", "init", "-q", "-b", "main")
    sh(root, sys.executable, "-m", "dvc", "init", "-q")
    sh(root, sys.executable, "-m", "dvc", "add", "-q", "models/nyt25")
    (root / ".gitignore").write_text(".prefect-run/\n.regrab/\n")
    sh(root, "git", "add", "-A")
    sh(root, "git", "-c", "user.name=t", "-c", "user.email=t@x", "commit", "-qm", "toy")
    version = registry.register(root)
    registry.promote(root, version.version)
    return root


def test_the_champion_s_own_models_pass_unscored(project: Path):
    """A run whose models are the champion's bytes (new data reached only another benchmark)
    is not scored: every paired difference would be 0, and at full size the scoring took 9
    minutes."""
    champion = registry.resolve(project, "regrab")
    ws = workspace.create(project, "gate")
    try:
        workspace.dvc(ws.path, "checkout")  # the challenger: the same models, from the cache
        logged: list[str] = []
        decision = champion_gate.score(ws, champion, CFG, logged.append)
        copied = ws.path / champion_gate.CHAMPION_DIR / "nyt25"
        assert sorted(p.name for p in copied.iterdir()) == ["split_0", "split_1"]
        assert (copied / "split_0" / "regrab" / "model.safetensors").is_file()
        assert champion_gate.same_models(copied, ws.path / "models" / "nyt25")
        # One byte changed in one split's model: not the same models.
        model = ws.path / "models" / "nyt25" / "split_1" / "regrab" / "model.safetensors"
        data = bytearray(model.read_bytes())
        data[-1] ^= 1
        model.unlink()  # a link into the shared cache: never write through it
        model.write_bytes(bytes(data))
        assert not champion_gate.same_models(copied, ws.path / "models" / "nyt25")
    finally:
        workspace.remove(ws, keep_branch=False)
    assert decision.promote and decision.gate == "passed", decision
    rows = {r["setting"]: r for r in decision.rows}
    assert set(rows) == {"2w1s", "headline"}
    assert all(r["verdict"] == "unchanged" and r["diff"] == 0.0 for r in rows.values())
    assert any("byte for byte; not scored" in line for line in logged)
    assert not any("paired_runs.py" in line for line in logged)


def test_no_champion_scores_nothing(project: Path):
    decision = champion_gate.score(None, None, CFG, print)  # type: ignore[arg-type]
    assert decision.promote and decision.gate == "no champion" and decision.rows == ()


def challenger_on(ws: workspace.Workspace, parts: dict[str, list[str]], seed: int) -> None:
    """New data in the workspace: each split's files rewritten with ``parts``' relations
    (new sentences), and its REGRAB retrained on them, as a run with new data would."""
    for split in ("split_0", "split_1"):
        for name, rels in parts.items():
            write_parquet(toy_table(rels, 12, seed=seed + len(name)),
                          ws.path / "splits" / split / f"{name}.parquet", FEWSHOT_SCHEMA)
    shutil.rmtree(ws.path / "models" / "nyt25")
    graph = ws.path / "graph.parquet"
    train.main(["--splits", str(ws.path / "splits"), "--graph", str(graph), "--features",
                str(ws.path / "features.parquet"), "--relations", str(labels_of(graph)),
                "--out", str(ws.path / "models" / "nyt25"),
                "--params", str(ws.path / "params.yaml")])


def test_a_champion_trained_before_new_data_is_scored_beside_the_challenger(project: Path):
    """The challenger trained on more data than the champion (the point of a retrain): the
    champion's checkpoints record other training files, and are still scored on the same
    test episodes, since they never saw a test relation."""
    champion = registry.resolve(project, "regrab")
    ws = workspace.create(project, "newdata")
    try:
        workspace.dvc(ws.path, "checkout")
        challenger_on(ws, {"train": ["P1", "P2", "P3"]}, seed=50)
        decision = champion_gate.score(ws, champion, CFG, print)
    finally:
        workspace.remove(ws, keep_branch=False)
    assert decision.gate in ("passed", "failed") and decision.rows, decision
    rows = {r["setting"]: r for r in decision.rows}
    assert 0 <= rows["2w1s"]["champion"] <= 100 and 0 <= rows["2w1s"]["challenger"] <= 100


def test_a_champion_that_trained_on_a_test_relation_is_not_comparable(project: Path):
    """New data moved P1 from training to test: the champion trained on it, so no paired
    comparison is fair; the gate says so instead of failing the run."""
    champion = registry.resolve(project, "regrab")
    ws = workspace.create(project, "moved")
    try:
        workspace.dvc(ws.path, "checkout")
        challenger_on(ws, {"train": ["P2", "P3", "P6"], "test": ["P1", "P7", "P8"]}, seed=60)
        decision = champion_gate.score(ws, champion, CFG, print)
    finally:
        workspace.remove(ws, keep_branch=False)
    assert not decision.promote and decision.gate == "not comparable" and decision.rows == ()
    (reason,) = decision.reasons
    assert reason.startswith("not comparable: nyt25: ") and "'P1'" in reason, reason
    assert decision.summary().startswith("not promoted: not comparable: nyt25")
