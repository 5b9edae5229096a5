"""The regrab-scheduled flow on the tiny project, through a temporary Prefect server.

The tiny project trains no REGRAB model, so the champion's scoring (scripts/paired_runs.py on
real checkpoints) is replaced here by a task that returns a synthetic paired table; the gate
itself (pipeline.gate.decide) is the real one.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from prefect import task
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

from orchestration import scheduled
from pipeline.gate import decide
from tests.orchestration.test_outcome import Receiver

# Several flow runs with dvc subprocesses: about half a minute each.
pytestmark = [pytest.mark.slow, pytest.mark.long(minutes=0.5)]

PROMOTE = """\
promote:
  benchmarks: [nyt25]
  settings: [5w1s]
  headline_margin: 0.0
  setting_margin: 2.0
  episodes: 0
  webhook: ''
"""


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()


def set_param(repo: Path, old: str, new: str) -> None:
    (repo / "params.yaml").write_text((repo / "params.yaml").read_text().replace(old, new))
    git(repo, "commit", "-qam", f"params: {new.strip()}")


def artifacts(key: str) -> list:
    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))


def task_names(run_id) -> set[str]:
    with get_client(sync_client=True) as client:
        return {t.name.rsplit("-", 1)[0] if t.name.count("-") > 1 else t.name
                for t in client.read_task_runs() if t.flow_run_id == run_id}


@pytest.fixture
def repo(tiny_repo: Path) -> Path:
    (tiny_repo / ".gitignore").write_text(".prefect-run/\nfetch_attempts.txt\n*_dask.txt\n")
    (tiny_repo / "params.yaml").write_text((tiny_repo / "params.yaml").read_text() + PROMOTE)
    git(tiny_repo, "commit", "-qam", "promote section")
    return tiny_repo


def falling(ws, champion, cfg):
    """A challenger whose 5w1s falls 3 points on every split."""
    cell = {"a": 80.0, "b": 77.0, "diff": -3.0, "ci95": 0.2, "episode_ci95": 0.5,
            "per_split": {"split_0": -3.1, "split_1": -2.9}}
    return decide({"nyt25": {"regrab": {"5w1s": cell}}}, cfg)


def test_promote_then_nothing_new_then_not_promoted(prefect_server, repo: Path, monkeypatch):
    base = len(artifacts("regrab-tiny-metrics"))  # other tests of the session publish it too
    with Receiver() as hook:
        first = scheduled.scheduled_retrain(repo_dir=str(repo), webhook=hook.url,
                                            return_state=True)
        assert first.is_completed() and first.message == "promoted (gate: no champion)"
        promoted = git(repo, "rev-parse", "HEAD")
        assert git(repo, "tag", "--points-at", promoted).split() == ["regrab#prod#1",
                                                                    "regrab@v0.1.0"]
        assert sorted(git(repo, "show", "--name-only", "--format=", promoted).split()) == [
            ".gitignore", "dvc.lock", "metrics/tiny.json"]
        assert not any((repo / ".prefect-run" / "workspaces").iterdir())
        assert "retrain/" not in git(repo, "branch")
        assert not (repo / "model.txt").exists()  # made in the workspace, never here
        assert len(artifacts("regrab-tiny-metrics")) == base + 1
        metrics = max(artifacts("regrab-tiny-metrics"), key=lambda a: a.created)
        assert "written by stage evaluate in this run" in metrics.description
        assert hook.received[-1][1]["decision"] == "promoted"

        start = time.monotonic()
        second = scheduled.scheduled_retrain(repo_dir=str(repo), webhook=hook.url,
                                             return_state=True)
        assert second.is_completed() and second.message.startswith("nothing new")
        assert time.monotonic() - start < 60
        assert task_names(second.state_details.flow_run_id) == {"prepare-workspace",
                                                                "check-new"}
        assert len(artifacts("regrab-tiny-metrics")) == base + 1  # nothing new published
        assert git(repo, "rev-parse", "HEAD") == promoted

        set_param(repo, "scale: 2", "scale: 3")
        moved = git(repo, "rev-parse", "HEAD")
        monkeypatch.setattr(scheduled, "score_champion",
                            task(name="score-champion")(falling))
        third = scheduled.scheduled_retrain(repo_dir=str(repo), webhook=hook.url,
                                            return_state=True)
        assert third.is_completed() and third.name == "Not promoted"
        assert third.message.startswith("not promoted: nyt25 headline -3.00 ± 1.27 points")
        assert third.message.endswith("; nyt25 5w1s -3.00 points, below -2")
        assert git(repo, "rev-parse", "HEAD") == moved  # the user's branch stays
        assert "regrab@v0.2.0" not in git(repo, "tag")
        (branch,) = [b.strip() for b in git(repo, "branch").splitlines() if "retrain/" in b]
        assert "dvc.lock" in git(repo, "show", "--name-only", "--format=", branch)
        gate = max(artifacts("regrab-gate"), key=lambda a: a.created)
        assert "not promoted" in gate.description
        payload = hook.received[-1][1]
        assert payload["decision"] == "not promoted"
        assert [r["setting"] for r in payload["table"]] == ["5w1s", "headline"]
        assert len(artifacts("regrab-tiny-metrics")) == base + 2  # the third run's own


def test_a_failed_run_publishes_the_stage_not_the_committed_metrics(prefect_server,
                                                                       repo: Path):
    set_param(repo, "fail: false", "fail: true")
    before = len(artifacts("regrab-tiny-metrics"))
    with Receiver() as hook:
        state = scheduled.scheduled_retrain(repo_dir=str(repo), webhook=hook.url,
                                            return_state=True)
    assert state.is_failed()
    assert "failed at train" in state.message and "kept for inspection" in state.message
    (kept,) = (repo / ".prefect-run" / "workspaces").iterdir()
    assert (kept / "dvc.yaml").is_file()
    assert len(artifacts("regrab-tiny-metrics")) == before
    summary = max(artifacts("regrab-scheduled-summary"), key=lambda a: a.created)
    assert "failed at stage `train`" in summary.data
    assert hook.received[-1][1]["decision"] == "failed"
    assert hook.received[-1][1]["stage"] == "train"


CHECK = """\
import os
from pathlib import Path
Path("sources.txt").write_text(Path(os.environ["TINY_SOURCE"]).read_text())
"""


def passing(ws, champion, cfg):
    """A challenger level with the champion (none at first)."""
    if champion is None:
        return decide(None, cfg)
    cell = {"a": 80.0, "b": 80.0, "diff": 0.0, "ci95": 0.1, "episode_ci95": 0.5,
            "per_split": {"split_0": 0.0, "split_1": 0.0}}
    return decide({"nyt25": {"regrab": {"5w1s": cell}}}, cfg)


def test_a_moved_source_is_new_work(prefect_server, repo: Path, tmp_path: Path, monkeypatch):
    """The sources check (always_changed) runs first; only a changed source makes work."""
    source = tmp_path / "upstream.txt"
    source.write_text("release 1\n")
    monkeypatch.setenv("TINY_SOURCE", str(source))
    (repo / "check.py").write_text(CHECK)
    # As in the project: the check reads check_params' output, which a new workspace lacks.
    dvc_yaml = (repo / "dvc.yaml").read_text().replace(
        "  fetch:\n    cmd: python fetch.py\n    deps: [fetch.py]\n",
        "  check_params:\n    cmd: python -c \"open('checked.txt', 'w').write('ok')\"\n"
        "    outs: [checked.txt]\n"
        "  check_sources:\n    cmd: python check.py\n    always_changed: true\n"
        "    deps: [checked.txt]\n"
        "    outs:\n      - sources.txt:\n          cache: false\n"
        "  fetch:\n    cmd: python fetch.py\n    deps: [fetch.py, sources.txt]\n")
    (repo / "dvc.yaml").write_text(dvc_yaml)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "check the sources")
    monkeypatch.setattr(scheduled, "score_champion", task(name="score-champion")(passing))

    first = scheduled.scheduled_retrain(repo_dir=str(repo), return_state=True)
    assert first.message == "promoted (gate: no champion)"
    same = scheduled.scheduled_retrain(repo_dir=str(repo), return_state=True)
    assert same.message.startswith("nothing new"), same.message
    assert task_names(same.state_details.flow_run_id) == {"prepare-workspace", "check_params",
                                                          "check_sources", "check-new"}
    source.write_text("release 2\n")
    moved = scheduled.scheduled_retrain(repo_dir=str(repo), return_state=True)
    assert moved.message == "promoted (gate: passed)"
    assert git(repo, "show", "HEAD:sources.txt") == "release 2"
    assert "regrab#prod#2" in git(repo, "tag", "--points-at", "HEAD").split()


def test_missing_resume_state_alone_runs_no_stage(prefect_server, repo: Path, monkeypatch):
    """A new workspace never has a stage's resume state (persist + cache: false: TransE's
    checkpoints); when that is all the stage lacks, the run must not train it again (at full
    size a run with new own relations retrained TransE from scratch for the same bytes)."""
    (repo / "train.py").write_text((repo / "train.py").read_text()
                                   + "Path('ckpt').mkdir(exist_ok=True)\n"
                                   + "Path('ckpt/last.txt').write_text('step 9')\n")
    (repo / "dvc.yaml").write_text((repo / "dvc.yaml").read_text().replace(
        "    outs: [model.txt]\n",
        "    outs:\n      - model.txt\n      - ckpt:\n          persist: true\n"
        "          cache: false\n"))
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "train keeps resume state")
    monkeypatch.setattr(scheduled, "score_champion", task(name="score-champion")(passing))
    first = scheduled.scheduled_retrain(repo_dir=str(repo), return_state=True)
    assert first.message == "promoted (gate: no champion)"
    assert "train" in task_names(first.state_details.flow_run_id)

    (repo / "evaluate.py").write_text((repo / "evaluate.py").read_text() + "# reworded\n")
    git(repo, "commit", "-qam", "evaluate edited")
    second = scheduled.scheduled_retrain(repo_dir=str(repo), return_state=True)
    assert second.message == "promoted (gate: passed)", second.message
    ran = task_names(second.state_details.flow_run_id)
    assert "evaluate" in ran and "train" not in ran and "fetch" in ran
