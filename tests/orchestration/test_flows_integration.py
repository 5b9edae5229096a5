"""The flows against a real ``prefect server``: deployed on the work pool, and from a fresh clone.

Everything goes through ``scripts/prefect_stack.sh`` (the commands behind the
``make prefect-*`` targets), on 127.0.0.1 with a free port and a temporary
PREFECT_HOME. Teardown stops what was started by PID (the worker first, then the server),
even when the test failed, and checks that both are gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestration.deploy import DEFAULT_CRON, check_server
from pipeline.errors import PipelineError
from tests.orchestration.test_scheduled import PROMOTE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "prefect_stack.sh"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stack(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@contextlib.contextmanager
def prefect_stack(run_dir: Path, **extra: str):
    """Environment for the stack script; on exit, stop whatever it started, by PID."""
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PREFECT_RUN_DIR": str(run_dir),
        "PREFECT_PORT": str(free_port()),
        "PREFECT_START_TIMEOUT": "150",
        "PREFECT_RUN_TIMEOUT": "150",
        # The worker picks up triggered runs within 2 s instead of the default 10 s.
        "PREFECT_WORKER_QUERY_SECONDS": "2",
        **extra,
    }
    env.pop("PREFECT_API_URL", None)
    try:
        yield env
    except BaseException:
        stop_stack(env, run_dir, check=False)  # keep the test's own error as the one raised
        raise
    stop_stack(env, run_dir)


def stop_stack(env: dict[str, str], run_dir: Path, check: bool = True) -> None:
    started = {}
    for name in ("worker", "server"):
        pid_file = run_dir / f"{name}.pid"
        if pid_file.exists():
            started[name] = int(pid_file.read_text())
    stopped = stack(env, "stop", timeout=120)
    leftovers = {name: pid for name, pid in started.items() if alive(pid)}
    for pid in leftovers.values():  # never leave a server behind, even if stop failed
        os.kill(pid, signal.SIGKILL)
    output = stopped.stdout + stopped.stderr
    assert not check or not leftovers, f"still running after stop: {leftovers}\n{output}"


@pytest.fixture
def stack_env(tmp_path: Path, tiny_repo: Path):
    """Stack environment deploying for the tiny project; teardown stops whatever it started."""
    (tiny_repo / ".gitignore").write_text(".prefect-run/\nfetch_attempts.txt\n*_dask.txt\n")
    (tiny_repo / "params.yaml").write_text((tiny_repo / "params.yaml").read_text() + PROMOTE)
    git(tiny_repo, "commit", "-qam", "promote section")
    with prefect_stack(tmp_path / "prefect-run", REGRAB_REPO_DIR=str(tiny_repo)) as env:
        yield env


def test_run_without_server_says_what_to_do(tmp_path: Path):
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PREFECT_RUN_DIR": str(tmp_path / "run"),
        "PREFECT_PORT": str(free_port()),
    }
    for command in ("run", "worker-start"):
        done = stack(env, command, timeout=60)
        assert done.returncode == 2, done
        assert "no Prefect server answers" in done.stderr
        assert "server-start" in done.stderr
    with pytest.raises(PipelineError, match="PREFECT_API_URL is not set"):
        check_server(None)
    with pytest.raises(PipelineError, match="no Prefect server answers"):
        check_server(f"http://127.0.0.1:{free_port()}/api", timeout_s=2)


def final_states(api: str, run_ids: list[str], timeout_s: float) -> dict[str, list]:
    """``{run id: [its states, oldest first]}`` once every run is in a final state."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout_s
    with temporary_settings(updates={PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            while True:
                runs = [client.read_flow_run(i) for i in run_ids]
                if all(r.state.is_final() for r in runs):
                    return {i: client.read_flow_run_states(i) for i in run_ids}
                assert time.monotonic() < deadline, [r.state for r in runs]
                time.sleep(2)


@pytest.mark.integration
@pytest.mark.long(minutes=1)
def test_worker_runs_one_weekly_retrain_at_a_time(stack_env: dict[str, str], tiny_repo: Path):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.settings import PREFECT_API_URL, temporary_settings

    up = stack(stack_env, "server-start", timeout=200)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "server up in" in up.stdout
    worker = stack(stack_env, "worker-start", timeout=300)
    assert worker.returncode == 0, worker.stdout + worker.stderr
    assert "work pool 'regrab' created" in worker.stdout

    # Two runs triggered at once: the second must not run beside the first.
    start = time.monotonic()
    cmd = [sys.executable, "-m", "prefect", "deployment", "run", "regrab-scheduled/weekly"]
    env = {**stack_env, "PREFECT_API_URL": f"http://127.0.0.1:{stack_env['PREFECT_PORT']}/api",
           "PREFECT_HOME": str(Path(stack_env["PREFECT_RUN_DIR"]) / "home")}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    ids = [re.search(r"UUID: ([0-9a-f-]{36})", out).group(1) for out in outs]
    api = env["PREFECT_API_URL"]
    states = final_states(api, ids, timeout_s=240)
    print(f"two triggered runs settled in {time.monotonic() - start:.1f} s")
    names = sorted(s[-1].name for s in states.values())
    assert names == ["Cancelled", "Completed"], states
    (cancelled,) = [h for h in states.values() if h[-1].name == "Cancelled"]
    assert all(s.type != StateType.RUNNING for s in cancelled)  # it never ran
    assert "concurrency limit" in cancelled[-1].message
    (done,) = [h for h in states.values() if h[-1].name == "Completed"]
    assert done[-1].message == "promoted (gate: no champion)"
    assert "regrab@v0.1.0" in git(tiny_repo, "tag")

    with temporary_settings(updates={PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("regrab-scheduled/weekly")
            upcoming = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(
                    any_=[StateType.SCHEDULED]))))
    assert deployment.parameters["repo_dir"] == str(tiny_repo)
    assert deployment.work_pool_name == "regrab"
    assert [s.schedule.cron for s in deployment.schedules] == [DEFAULT_CRON]
    # Prefect 3 keeps the limit as a global concurrency limit of the deployment.
    limit = deployment.concurrency_limit or deployment.global_concurrency_limit.limit
    assert limit == 1
    assert deployment.concurrency_options.collision_strategy == "CANCEL_NEW"
    assert upcoming and all(r.expected_start_time.weekday() == 0 for r in upcoming)

    # The experiment deployment, through the same worker: a DVC experiment in the project.
    triggered = stack({**stack_env, "PREFECT_DEPLOYMENT": "regrab-retrain/experiment"}, "run",
                      "--param", 'overrides={"train.scale": 5}', timeout=200)
    log = triggered.stdout + triggered.stderr
    assert triggered.returncode == 0 and "Completed" in log, log
    shown = subprocess.run([sys.executable, "-m", "dvc", "exp", "show", "--json"], cwd=tiny_repo,
                           capture_output=True, text=True, check=True, timeout=120).stdout
    exps = {rev["name"]: rev["data"] for row in json.loads(shown)
            for exp in row.get("experiments") or [] for rev in exp["revs"]}
    (name,) = exps
    assert exps[name]["params"]["params.yaml"]["data"]["train"]["scale"] == 5


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=120
    ).stdout


def fresh_clone(tmp_path: Path) -> Path:
    """``git clone`` of this working tree as it is now: what a new user gets.

    The files git would commit (tracked and untracked-not-ignored, uncommitted edits
    included) become one commit of a scratch origin, which is then cloned. The clone has
    no ``data/`` outputs and no DVC cache, whatever this workspace has.
    """
    origin = tmp_path / "origin"
    listed = git(ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
    for name in filter(None, listed.split("\0")):
        src = ROOT / name
        if src.is_file() or src.is_symlink():  # a deleted tracked file is listed, not copied
            (origin / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, origin / name, follow_symlinks=False)
    git(origin, "init", "-q", "-b", "main")
    git(origin, "add", "-A")
    git(origin, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "tree")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(origin), str(clone))
    return clone


@pytest.mark.integration
@pytest.mark.long(minutes=1)
def test_flow_runs_from_a_fresh_clone(tmp_path: Path, mirror: Path):
    """Planning needed the DVC cache's ``.dir`` entries, which a clone lacks."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    clone = fresh_clone(tmp_path)
    assert not (clone / ".dvc" / "cache").exists()
    assert not (clone / "data" / "raw").exists()
    with prefect_stack(tmp_path / "prefect-run") as env:
        up = stack(env, "server-start", timeout=200)
        assert up.returncode == 0, up.stdout + up.stderr
        api = f"http://127.0.0.1:{env['PREFECT_PORT']}/api"
        start = time.monotonic()
        # Run from the clone, so its own pipeline package is the one imported.
        done = subprocess.run(
            [sys.executable, "-m", "orchestration.flows", "--target", "split_nyt"],
            cwd=clone,
            env={**env, "PREFECT_API_URL": api, "REGRAB_DATA_MIRROR": str(mirror)},
            capture_output=True,
            text=True,
            timeout=600,
        )
        log = done.stdout + done.stderr
        assert done.returncode == 0, log[-4000:]
        print(f"fresh-clone flow up to split_nyt: {time.monotonic() - start:.1f} s")
        with temporary_settings(updates={PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                (run,) = client.read_flow_runs()
                tasks = client.read_task_runs()
    assert run.state.is_completed(), run.state
    stage_runs = {t.name: t for t in tasks if not t.name.startswith("publish-metrics")}
    assert set(stage_runs) == {"check_params", "check_sources", "fetch", "prepare_fewshot",
                               "split_nyt"}
    assert all(t.state.is_completed() for t in tasks)
    assert sorted(p.name for p in (clone / "data" / "splits").iterdir())
    # DVC recorded what the flow ran: nothing up to split_nyt is left to reproduce.
    status = subprocess.run(
        [sys.executable, "-m", "dvc", "status", "--json", "split_nyt"],
        cwd=clone,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert json.loads(status.stdout) == {}, status.stdout
