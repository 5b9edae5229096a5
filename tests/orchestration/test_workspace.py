"""orchestration/workspace.py on the tiny git + DVC project: a run apart from the checkout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestration import workspace
from pipeline.errors import PipelineError

pytestmark = pytest.mark.slow  # git and dvc subprocesses: seconds


def sh(cwd: Path, *cmd: str) -> str:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=True,
                          timeout=120).stdout


def repro(path: Path) -> None:
    workspace.dvc(path, "repro", "-q")  # the flow's environment: its python runs the stages


@pytest.fixture
def repo(tiny_repo: Path) -> Path:
    (tiny_repo / ".gitignore").write_text(".prefect-run/\nfetch_attempts.txt\n*_dask.txt\n")
    sh(tiny_repo, "git", "commit", "-qam", "ignore runs")
    return tiny_repo


def test_workspace_shares_the_cache_and_leaves_the_checkout_alone(repo: Path):
    (repo / "train.py").write_text((repo / "train.py").read_text() + "# an edit of yours\n")
    ws = workspace.create(repo, "run 1/a")
    assert ws.branch == "retrain/run-1-a"
    assert ws.path == repo / ".prefect-run" / "workspaces" / "run-1-a"
    assert ws.start == sh(repo, "git", "rev-parse", "HEAD").strip()
    # The workspace is HEAD: the user's uncommitted edit is not in it.
    assert "an edit of yours" not in (ws.path / "train.py").read_text()
    assert f"dir = {repo / '.dvc' / 'cache'}" in (ws.path / ".dvc" / "config.local").read_text()
    repro(ws.path)
    # Outputs went into the project's cache; the user's checkout has none of them.
    assert (repo / ".dvc" / "cache" / "files").is_dir()
    assert not (repo / "model.txt").exists() and not (repo / "dvc.lock").exists()
    assert sh(repo, "git", "status", "--porcelain") == " M train.py\n"
    # A second workspace restores every output from that cache: nothing is stale.
    ws2 = workspace.create(repo, "run-2")
    workspace.dvc(ws2.path, "checkout", check=False)
    assert workspace.stale_stages(ws2, []) != {}  # dvc.lock is not committed yet
    for w in (ws, ws2):
        workspace.remove(w, keep_branch=False)
    assert not (repo / ".prefect-run" / "workspaces" / "run-1-a").exists()
    assert "retrain/" not in sh(repo, "git", "branch")
    assert sh(repo, "git", "worktree", "list").count("\n") == 1


def test_results_fast_forward_a_clean_unmoved_checkout(repo: Path):
    ws = workspace.create(repo, "ok")
    repro(ws.path)
    sha = workspace.commit(ws, "results", ["metrics/tiny.json", "dvc.yaml"])
    assert sha is not None
    changed = sh(ws.path, "git", "show", "--name-only", "--format=", sha).split()
    assert sorted(changed) == [".gitignore", "dvc.lock", "metrics/tiny.json"]
    assert workspace.fast_forward(ws) is None
    assert sh(repo, "git", "rev-parse", "HEAD").strip() == sha
    assert workspace.commit(ws, "again", ["metrics/tiny.json"]) is None  # nothing changed
    # Nothing new now: the new workspace's checkout is whole and matches dvc.lock.
    workspace.remove(ws, keep_branch=False)
    ws2 = workspace.create(repo, "next")
    workspace.dvc(ws2.path, "checkout")
    assert workspace.stale_stages(ws2, []) == {}
    assert workspace.changed_since(ws2, sha, ("dvc.yaml", "dvc.lock", "params.yaml")) == []
    workspace.remove(ws2, keep_branch=False)


@pytest.mark.parametrize("change", ["dirty", "moved"])
def test_results_stay_on_their_branch_when_the_checkout_changed(repo: Path, change: str):
    ws = workspace.create(repo, "blocked")
    repro(ws.path)
    sha = workspace.commit(ws, "results", ["metrics/tiny.json"])
    if change == "dirty":
        (repo / "params.yaml").write_text((repo / "params.yaml").read_text() + "# mine\n")
    else:
        (repo / "notes.txt").write_text("mine\n")
        sh(repo, "git", "add", "notes.txt")
        sh(repo, "git", "commit", "-qm", "my work")
    before = sh(repo, "git", "rev-parse", "HEAD").strip()
    reason = workspace.fast_forward(ws)
    assert reason and ("uncommitted" in reason if change == "dirty" else "moved" in reason)
    assert sh(repo, "git", "rev-parse", "HEAD").strip() == before
    workspace.remove(ws, keep_branch=True)
    assert sh(repo, "git", "rev-parse", ws.branch).strip() == sha
    assert not ws.path.exists()


def test_a_workspace_left_by_a_failed_run_is_named(repo: Path):
    ws = workspace.create(repo, "kept")
    with pytest.raises(PipelineError, match="exists already"):
        workspace.create(repo, "kept")
    workspace.remove(ws, keep_branch=False)


def test_always_changed_stages_are_found(repo: Path):
    text = (repo / "dvc.yaml").read_text().replace(
        "  fetch:\n", "  check_sources:\n    cmd: echo ok\n    always_changed: true\n  fetch:\n")
    (repo / "dvc.yaml").write_text(text)
    sh(repo, "git", "commit", "-qam", "sources check")
    ws = workspace.create(repo, "sources")
    assert workspace.always_changed(ws) == ["check_sources"]
    workspace.remove(ws, keep_branch=False)


def test_push_says_when_there_is_no_remote(repo: Path):
    ws = workspace.create(repo, "push")
    assert workspace.push(ws).startswith("no DVC remote configured")
    remote = repo.parent / "remote"
    # Kept relative to .dvc/ as the project's own default is: from the workspace, two
    # folders deeper, the same words would name another folder.
    sh(repo, sys.executable, "-m", "dvc", "remote", "add", "-d", "store", "../remote")
    assert "url = ../../remote" in (repo / ".dvc" / "config").read_text()
    sh(repo, "git", "commit", "-qam", "remote")
    workspace.remove(ws, keep_branch=False)
    ws = workspace.create(repo, "push2")
    repro(ws.path)
    assert workspace.push(ws) == "dvc push to store done"
    assert any((remote / "files").rglob("*"))
    assert not (ws.path.parent / "remote").exists()
    workspace.remove(ws, keep_branch=False)


def test_a_folder_remote_with_a_long_path_is_pinned_whole(repo: Path):
    """dvc remote list wraps a long url over lines (as under pytest-xdist's deeper temp
    folders); the pinned url must still be the whole absolute path, or the run pushes into
    the workspace."""
    far = "a-remote-folder-with-a-name-long-enough-to-wrap-" * 3
    sh(repo, sys.executable, "-m", "dvc", "remote", "add", "-d", "store", f"../{far}")
    sh(repo, sys.executable, "-m", "dvc", "remote", "add", "cloud", "s3://bucket/path")
    pinned = workspace.local_remotes(repo)
    assert pinned == f"['remote \"store\"']\n    url = {(repo.parent / far).resolve()}\n"


def test_missing_resume_state_is_not_stale(tmp_path: Path, monkeypatch):
    """A new workspace never has a stage's persist + cache: false output (TransE's resume
    checkpoints: neither git nor DVC keeps them); that alone must not make the run think
    there is work, as it did at full size (train_transe reported stale, then rerun)."""
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  train_transe:\n    cmd: x\n    outs:\n      - data/features/transe.parquet\n"
        "      - data/checkpoints/transe:\n          persist: true\n          cache: false\n"
        "  fit:\n    cmd: y\n    outs:\n      - model.bin\n")
    status = {"train_transe": [{"changed outs": {"data/checkpoints/transe": "deleted"}}],
              "fit": [{"changed outs": {"model.bin": "deleted"}}],
              "check_sources": ["always changed"]}
    monkeypatch.setattr(workspace, "dvc", lambda *a, **k: subprocess.CompletedProcess(
        a, 0, stdout=json.dumps(status), stderr=""))
    ws = workspace.Workspace(tmp_path, tmp_path, "retrain/x", "0" * 40)
    assert workspace.resume_outputs(ws) == {"data/checkpoints/transe"}
    assert workspace.resume_stages(ws) == {"train_transe"}
    assert workspace.stale_stages(ws, ["check_sources"]) == {
        "fit": [{"changed outs": {"model.bin": "deleted"}}]}
    status["train_transe"][0]["changed outs"]["data/features/transe.parquet"] = "modified"
    assert set(workspace.stale_stages(ws, ["check_sources"])) == {"fit", "train_transe"}
