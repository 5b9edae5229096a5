"""The regrab-retrain flow on a tiny DVC project, against a temporary Prefect server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from uuid import UUID

import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)

from orchestration import flows
from orchestration.flows import (
    StageError,
    artifact_key,
    check_cluster,
    metric_rows,
    plan_stages,
    retrain,
    stage_task,
    validate_overrides,
)
from pipeline.errors import PipelineError

ROOT = Path(__file__).resolve().parents[2]


def dvc_experiments(repo: Path) -> dict[str, dict]:
    """``{experiment name: data}`` from ``dvc exp show --json``."""
    out = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    found = {}
    for row in json.loads(out):
        for exp in row.get("experiments") or []:
            for rev in exp["revs"]:
                found[rev["name"]] = rev["data"]
    return found


def task_runs(flow_run_id: UUID) -> dict[str, list]:
    """Task runs of one flow run, by task run name."""
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    by_name: dict[str, list] = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    return by_name


def flow_run_logs(flow_run_id: UUID, needle: str, timeout_s: float = 20.0) -> str:
    """All log text of a flow run, waiting (bounded) until ``needle`` has arrived."""
    deadline = time.monotonic() + timeout_s
    while True:
        with get_client(sync_client=True) as client:
            logs = client.read_logs(
                log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
        text = "\n".join(log.message for log in logs)
        if needle in text or time.monotonic() > deadline:
            return text
        time.sleep(0.5)


# ----------------------------------------------------------------- no server needed


def test_plan_follows_the_dag_not_the_file_order(tiny_repo: Path):
    stages = plan_stages(tiny_repo)
    assert [s.name for s in stages] == ["fetch", "train", "evaluate"]
    assert [s.name for s in plan_stages(tiny_repo, ["train"])] == ["fetch", "train"]
    # The uncached metrics file is git-tracked, so the experiment must carry it.
    assert "metrics/tiny.json" in dict((s.name, s.files) for s in stages)["evaluate"]


def test_unknown_target_names_the_valid_stages(tiny_repo: Path):
    with pytest.raises(PipelineError, match="valid stages: .*fetch"):
        plan_stages(tiny_repo, ["trian"])


def test_not_a_dvc_repo(tmp_path: Path):
    with pytest.raises(PipelineError, match="not a DVC pipeline"):
        plan_stages(tmp_path)


def test_validate_overrides_renders_values_like_dvc_cli(tiny_repo: Path):
    args = validate_overrides(tiny_repo, {"train.scale": 3, "train.fail": False, "fetch.n": "7"})
    assert args == ["train.scale=3", "train.fail=false", "fetch.n=7"]
    assert validate_overrides(tiny_repo, None) == []


def test_unknown_override_key_names_key_and_sections(tiny_repo: Path):
    with pytest.raises(PipelineError) as err:
        validate_overrides(tiny_repo, {"train.scael": 3})
    assert "train.scael" in str(err.value)
    assert "fetch, train" in str(err.value)


def test_frozen_stage_does_not_pull_its_upstream(tiny_repo: Path):
    subprocess.run(
        [sys.executable, "-m", "dvc", "freeze", "train"], cwd=tiny_repo, check=True, timeout=120
    )
    assert [s.name for s in plan_stages(tiny_repo, ["evaluate"])] == ["train", "evaluate"]


def test_cluster_address_is_checked(tmp_path: Path):
    assert check_cluster(None) is None
    assert check_cluster("10.0.0.5:8786", connect=False) == "tcp://10.0.0.5:8786"
    for bad in ("10.0.0.5", "http://h:8786", "tcp://:8786", "tcp://h:port"):
        with pytest.raises(PipelineError, match="not a Dask scheduler address"):
            check_cluster(bad, connect=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound but not listening: nothing answers
        with pytest.raises(PipelineError, match=f"cannot reach Dask scheduler at tcp://127.0.0.1:{port}"):
            check_cluster(f"127.0.0.1:{port}")


def cli(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """``python -m orchestration.flows ARGS`` with no Prefect server configured."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    return subprocess.run(
        [sys.executable, "-m", "orchestration.flows", "--repo-dir", str(repo), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-S", "train.scale"], "-S expects key=value"),
        (["-S", "train.scael=3"], "train.scael is not a key of params.yaml"),
        (["-S", "train.scale=[1,"], "cannot read the value of train.scale=[1,"),
        (["--target", "trian"], "unknown target trian; valid stages: evaluate, train, fetch"),
        (["--cluster", "nohost"], "cluster address 'nohost' is not a Dask scheduler address"),
    ],
)
def test_cli_errors_come_first_as_one_line(tiny_repo: Path, args: list[str], message: str):
    done = cli(tiny_repo, *args)
    assert done.returncode == 2, done
    lines = (done.stdout + done.stderr).strip().splitlines()
    # One line, and no temporary Prefect server was started for it.
    assert lines == [f"error: {lines[0].removeprefix('error: ')}"], lines
    assert message in lines[0]


@pytest.mark.slow
def test_cli_errors_for_a_folder_that_is_no_project(tiny_repo: Path, tmp_path: Path):
    done = cli(tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path.resolve()} is not a DVC pipeline (needs .dvc/ and dvc.yaml); "
        "pass --repo-dir (repo_dir) pointing at the project root"
    ]
    no_git = tmp_path / "no-git"
    subprocess.run(["cp", "-r", str(tiny_repo), str(no_git)], check=True)
    subprocess.run(["rm", "-rf", str(no_git / ".git")], check=True)
    done = cli(no_git, "-S", "train.scale=3")
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {no_git.resolve()} is not a git repository")


def test_only_the_network_stages_retry():
    assert stage_task("fetch").retries == 2
    assert stage_task("check_sources").retries == 2  # HEAD requests and checksum lists
    assert stage_task("train").retries == 0
    assert stage_task("evaluate").retries == 0


def test_metric_rows_and_artifact_key():
    rows = metric_rows({"proto": {"5-1": {"acc": 0.5, "ci95": 0.1}}, "n": 3})
    assert rows == [{"name": "(top)", "n": 3}, {"name": "proto/5-1", "acc": 0.5, "ci95": 0.1}]
    assert artifact_key("metrics/nyt25.json") == "regrab-nyt25-metrics"
    assert artifact_key("metrics/FewRel_5way.json") == "regrab-fewrel-5way-metrics"


# ----------------------------------------------------------------- flow runs


def leaves(data: dict, prefix: str = "") -> dict[str, float]:
    """``{"a/b/acc": 0.5, ...}`` for comparing nested metrics with pytest.approx."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(leaves(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = value
    return out


def test_retrain_returns_metrics_and_publishes_table(
    prefect_server, tiny_repo: Path, expected_metrics
):
    result = retrain(repo_dir=str(tiny_repo))
    assert list(result) == ["metrics/tiny.json"]
    assert leaves(result["metrics/tiny.json"]) == pytest.approx(leaves(expected_metrics()))
    # No overrides: a plain `dvc repro`, no experiment recorded.
    assert dvc_experiments(tiny_repo) == {}
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["regrab-tiny-metrics"]))
        )
    assert arts, "table artifact regrab-tiny-metrics was not created"
    assert arts[-1].type == "table"
    rows = arts[-1].data if isinstance(arts[-1].data, list) else json.loads(arts[-1].data)
    assert {r["name"] for r in rows} == {"proto/5-way-1-shot", "regrab/5-way-1-shot"}


def test_overrides_make_a_dvc_experiment(prefect_server, tiny_repo: Path, expected_metrics):
    state = retrain(overrides={"train.scale": 3}, repo_dir=str(tiny_repo), return_state=True)
    assert state.is_completed(), state
    want = leaves(expected_metrics(scale=3))
    assert leaves(state.result()["metrics/tiny.json"]) == pytest.approx(want)
    exps = dvc_experiments(tiny_repo)
    assert len(exps) == 1, exps
    ((name, data),) = exps.items()
    assert data["params"]["params.yaml"]["data"]["train"]["scale"] == 3
    assert leaves(data["metrics"]["metrics/tiny.json"]["data"]) == pytest.approx(want)
    # Named after the flow run, so the UI and `dvc exp show` point at each other.
    with get_client(sync_client=True) as client:
        run = client.read_flow_run(state.state_details.flow_run_id)
    assert name.startswith(run.name)
    runs = task_runs(state.state_details.flow_run_id)
    assert {"fetch", "train", "evaluate"} <= set(runs)


def test_unknown_override_key_fails_before_any_stage(prefect_server, tiny_repo: Path):
    params_before = (tiny_repo / "params.yaml").read_text()
    state = retrain(overrides={"train.nope": 1}, repo_dir=str(tiny_repo), return_state=True)
    assert state.is_failed()
    with pytest.raises(PipelineError, match="train.nope is not a key of params.yaml"):
        state.result()
    assert task_runs(state.state_details.flow_run_id) == {}
    assert (tiny_repo / "params.yaml").read_text() == params_before
    assert not (tiny_repo / "data.txt").exists()


def test_stage_failure_fails_the_run_with_the_stage_error(prefect_server, tiny_repo: Path):
    state = retrain(overrides={"train.fail": True}, repo_dir=str(tiny_repo), return_state=True)
    assert state.is_failed()
    with pytest.raises(StageError, match="boom: train.fail is set") as err:
        state.result()
    assert "stage 'train'" in str(err.value)
    runs = task_runs(state.state_details.flow_run_id)
    assert runs["train"][0].state.is_failed()
    assert "evaluate" not in runs  # nothing ran after the failure
    # The stage died mid-write: no model, no temp file, no metrics, no experiment.
    assert not (tiny_repo / "model.txt").exists()
    assert not list(tiny_repo.glob(".model.txt.*"))
    assert not (tiny_repo / "metrics" / "tiny.json").exists()
    assert dvc_experiments(tiny_repo) == {}
    # The failed run's override does not linger for the next scheduled run.
    assert yaml.safe_load((tiny_repo / "params.yaml").read_text())["train"]["fail"] is False
    logs = flow_run_logs(state.state_details.flow_run_id, "boom")
    assert "boom: train.fail is set, giving up" in logs


def test_cluster_address_reaches_only_the_cluster_stages(
    prefect_server, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delenv("REGRAB_DASK_ADDRESS", raising=False)
    # The tiny project has no parse_wikidata; let `train` stand in for it.
    monkeypatch.setattr(flows, "CLUSTER_STAGES", frozenset({"train"}))
    from distributed import LocalCluster

    # A real scheduler: the flow checks Dask's handshake, not only that a port answers.
    with LocalCluster(n_workers=0, processes=False, protocol="tcp://",
                      dashboard_address=":0") as scheduler:
        address = scheduler.scheduler_address.removeprefix("tcp://")
        state = retrain(
            repo_dir=str(tiny_repo), targets=["train"], cluster=address, return_state=True
        )
    assert state.is_completed(), state
    assert (tiny_repo / "train_dask.txt").read_text() == f"tcp://{address}"
    assert (tiny_repo / "fetch_dask.txt").read_text() == ""


def test_fetch_is_retried(prefect_server, tiny_repo: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(flows, "NETWORK_RETRY_DELAY_S", 0.0)
    state = retrain(
        overrides={"fetch.flaky": True},
        repo_dir=str(tiny_repo),
        targets=["fetch"],
        return_state=True,
    )
    assert state.is_completed(), state
    (fetch_run,) = task_runs(state.state_details.flow_run_id)["fetch"]
    assert fetch_run.run_count == 2
    assert (tiny_repo / "fetch_attempts.txt").read_text() == "2"


def test_network_retry_delay_reads_the_environment():
    assert flows.network_retry_delay(None) == flows.network_retry_delay("") == 60.0
    assert flows.network_retry_delay("0.5") == 0.5
    for bad in ("soon", "-1", "nan", "inf"):
        with pytest.raises(PipelineError, match="REGRAB_NETWORK_RETRY_DELAY_S='"):
            flows.network_retry_delay(bad)


def test_a_failed_stage_is_told_by_its_error_line_not_its_progress_bars():
    from orchestration.dvc_access import failure_detail

    tail = ["\x1b[A | data.bz2:   0%|          | 0.00/26.9k [00:00<?, ?B/s]",
            "fetch:  44%|####      | 4/9 [00:00<00:00, 61.85file/s]",
            "error: could not download data.bz2 (got 13 of 26 bytes); check the network",
            "ERROR: failed to reproduce 'fetch': failed to run: python -m stages.fetch"]
    assert failure_detail(tail) == tail[2]
    assert failure_detail(["boom: giving up", tail[1], "ERROR: failed"]) == \
        "boom: giving up | ERROR: failed"
    assert failure_detail([tail[0]]) == "no output"
