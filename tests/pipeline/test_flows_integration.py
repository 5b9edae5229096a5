"""The served deployment end to end: real ``prefect server``, ``flow.serve``, CLI trigger.

Everything goes through ``scripts/prefect_stack.sh`` (the commands behind the
``make prefect-*`` targets), on 127.0.0.1 with a free port and a temporary
PREFECT_HOME. Teardown stops what was started by PID (serve process first, then the
server), even when the test failed, and checks that both are gone.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.deploy import DEFAULT_CRON, check_server
from pipeline.errors import PipelineError

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


@pytest.fixture
def stack_env(tmp_path: Path, tiny_repo: Path):
    """Environment for the stack script; teardown stops whatever it started."""
    run_dir = tmp_path / "prefect-run"
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PREFECT_RUN_DIR": str(run_dir),
        "PREFECT_PORT": str(free_port()),
        "PREFECT_START_TIMEOUT": "150",
        "PREFECT_RUN_TIMEOUT": "150",
        # Pick up triggered runs within 2 s instead of the default 10 s.
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
        "REGRAB_REPO_DIR": str(tiny_repo),
    }
    env.pop("PREFECT_API_URL", None)
    yield env
    started = {}
    for name in ("serve", "server"):
        pid_file = run_dir / f"{name}.pid"
        if pid_file.exists():
            started[name] = int(pid_file.read_text())
    stopped = stack(env, "stop", timeout=120)
    leftovers = {name: pid for name, pid in started.items() if alive(pid)}
    for pid in leftovers.values():  # never leave a server behind, even if stop failed
        os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"still running after stop: {leftovers}\n{stopped.stdout}{stopped.stderr}"


def test_run_without_server_says_what_to_do(tmp_path: Path):
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "PREFECT_RUN_DIR": str(tmp_path / "run"),
        "PREFECT_PORT": str(free_port()),
    }
    for command in ("run", "serve-start"):
        done = stack(env, command, timeout=60)
        assert done.returncode == 2, done
        assert "no Prefect server answers" in done.stderr
        assert "server-start" in done.stderr
    with pytest.raises(PipelineError, match="PREFECT_API_URL is not set"):
        check_server(None)
    with pytest.raises(PipelineError, match="no Prefect server answers"):
        check_server(f"http://127.0.0.1:{free_port()}/api", timeout_s=2)


@pytest.mark.integration
def test_served_deployment_runs_on_trigger(stack_env: dict[str, str], tiny_repo: Path):
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
    served = stack(stack_env, "serve-start", timeout=200)
    assert served.returncode == 0, served.stdout + served.stderr

    start = time.monotonic()
    triggered = stack(stack_env, "run", "--param", 'overrides={"train.scale": 5}', timeout=200)
    log = triggered.stdout + triggered.stderr
    assert triggered.returncode == 0, log
    assert "Completed" in log
    print(f"triggered run finished in {time.monotonic() - start:.1f} s")

    api = f"http://127.0.0.1:{stack_env['PREFECT_PORT']}/api"
    with temporary_settings(updates={PREFECT_API_URL: api}):
        with get_client(sync_client=True) as client:
            deployment = client.read_deployment_by_name("regrab-retrain/scheduled")
            run_id = re.search(r"UUID: ([0-9a-f-]{36})", log).group(1)
            run = client.read_flow_run(run_id)
            # The cron schedule has queued the next Mondays as well.
            upcoming = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    state=FlowRunFilterState(
                        type=FlowRunFilterStateType(any_=[StateType.SCHEDULED])
                    )
                )
            )
    assert deployment.parameters["repo_dir"] == str(tiny_repo)
    assert [s.schedule.cron for s in deployment.schedules] == [DEFAULT_CRON]
    assert run.deployment_id == deployment.id
    assert run.state.is_completed()
    assert upcoming and all(r.expected_start_time.weekday() == 0 for r in upcoming)

    # The run was a DVC experiment in the tiny repo, named after the flow run.
    shown = subprocess.run(
        [sys.executable, "-m", "dvc", "exp", "show", "--json"],
        cwd=tiny_repo,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    exps = {
        rev["name"]: rev["data"]
        for row in json.loads(shown)
        for exp in row.get("experiments") or []
        for rev in exp["revs"]
    }
    (name,) = exps
    assert name.startswith(run.name)
    assert exps[name]["params"]["params.yaml"]["data"]["train"]["scale"] == 5
