"""Everything checked before Prefect or DVC starts; Ctrl-C ends a one-off run in seconds."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestration import interrupt
from orchestration.checks import HANDSHAKE_TIMEOUT_S, check_scheduler
from orchestration.flows import make_plan
from orchestration.overrides import main as overrides_main
from orchestration.overrides import resolve
from pipeline.errors import PipelineError, run_cli
from tests.pipeline.test_bad_inputs import ROOT, one_error_line, run


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A folder holding a copy of the project's params.yaml."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path


@pytest.mark.parametrize(("key", "value", "message"), [
    ("split_nyt.seeds", "[]", "-S split_nyt.seeds=[]: split_nyt.seeds is empty"),
    ("split_nyt.seeds", "[1, 1]", "split_nyt.seeds has duplicates [1, 1]"),
    ("model.encoder.name", "./no-such-encoder", "encoder path ./no-such-encoder does not exist"),
    ("model.encoder.name", "..", "encoder folder .. has no config.json"),
    ("benchmarks.fewrel.train.steps", "abc",
     "train (with benchmarks.fewrel.train).steps = 'abc': expected an integer"),
    ("train.ways", "[20]", "-S train.ways=[20]: comparison.max_ways 10 is below every train.ways"),
    ("prepare_fewshot.datasets", "[a, a]", "prepare_fewshot.datasets lists ['a'] more than once"),
    ("evaluate.settings", "[1w1s]", "setting 1w1s has 1 way(s)"),
    ("evaluate.settings", "[5w1s, 0w5s]", "every method would score 100%; give 2 or more ways"),
    ("train.val_settings", "[1w5s]", "setting 1w5s has 1 way(s)"),
    ("fetch.files", "{}", "fetch.files is empty; declare at least one input"),
    ("train.device", "tpu", "train.device = 'tpu': expected auto, cpu, cuda or cuda:N"),
    ("evaluate.device", "gpu", "evaluate.device = 'gpu': expected auto, cpu, cuda or cuda:N"),
    ("train.methods", "[regrab, regrab]", "train.methods lists regrab more than once"),
    ("evaluate.methods", "[proto, regrab, proto]", "evaluate.methods lists proto more than once"),
    ("evaluate.episodes", "1000000000000", "evaluate.episodes 1000000000000 would need about"),
    ("model.langevin.steps", "1000000000", "the Langevin chains of one split's training and "
                                           "evaluation would take about"),
])
def test_overrides_are_checked_as_every_stage_reads_them(project, key, value, message):
    with pytest.raises(PipelineError, match="change the override$") as err:
        resolve(project / "params.yaml", {key: value})
    assert message in str(err.value)


def test_a_good_override_passes_and_a_relative_encoder_is_found_from_the_root(project):
    (project / "enc").mkdir()
    (project / "enc" / "config.json").write_text("{}")
    assert resolve(project / "params.yaml", {"model.encoder.name": "enc"})[0] == {
        "model.encoder.name": "enc"}


#: Packages that take seconds to import: a bad override is refused before any of them loads.
HEAVY = {"prefect", "torch", "torch_geometric", "transformers", "dvc", "dask"}


@pytest.mark.parametrize(("override", "message"), [
    ("train.steps=abc", "-S train.steps=\"abc\": params.yaml train.steps = 'abc': expected an "
                        "integer; change the override"),
    ("split_nyt.seeds=[]", "-S split_nyt.seeds=[]: split_nyt.seeds is empty; give at least one "
                           "seed; change the override"),
    ("model.prior.kind=bogus", "-S model.prior.kind=\"bogus\": params.yaml model.prior.kind = "
                               "'bogus': expected one of ['gcn', 'mlp', 'none']; change the "
                               "override"),
])
def test_a_bad_override_is_one_line_before_prefect_or_torch_is_imported(override, message):
    done = run(["-X", "importtime", "-m", "orchestration.flows", "-S", override])
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    done.stderr = "".join(line + "\n" for line in done.stderr.splitlines()
                          if not line.startswith("import time:"))
    assert one_error_line(done) == f"error: {message}"
    heavy = {name.split(".")[0] for name in imported} & HEAVY
    assert "orchestration.flow_command" in imported and not heavy, heavy


#: Bad overrides of every section whose schema the model's code defines, each refused by its
#: own section's schema (no check across sections needs the model to say so).
SCHEMA_REFUSALS = {
    "model.langevin.steps=-1": "model.langevin.steps = -1: expected a number >= 0",
    "model.prior.kind=bogus": "model.prior.kind = 'bogus': expected one of",
    "model.encoder.pooling=bogus": "model.encoder.pooling = 'bogus': expected one of",
    "model.heads.gnn.width=0": "model.heads.gnn.width = 0: expected a number >= 1",
    "train.device=tpu": "train.device = 'tpu': expected auto, cpu, cuda or cuda:N",
    "train.methods=[regrab,regrab]": "train.methods lists regrab more than once",
    "train.methods=[bogus]": "train.methods has unknown method(s) ['bogus']",
    "comparison.methods=[bogus]": "comparison.methods has unknown method(s) ['bogus']",
    "evaluate.settings=[1w1s]": "setting 1w1s has 1 way(s)",
    "evaluate.methods=[proto,proto]": "evaluate.methods lists proto more than once",
    "train_transe.model.p_norm=3": "train_transe.model.p_norm = 3: expected one of",
    "transfer.settings=[1w1s]": "setting 1w1s has 1 way(s)",
    "active_labelling.ways=1": "active_labelling.ways = 1: expected a number >= 2",
    "active_labelling.methods.regrab=[bogus]": "active_labelling.methods.regrab = ['bogus']: "
                                               "list each of bald, entropy",
}


def test_the_schemas_refuse_bad_overrides_without_importing_torch():
    """Every section's schema lives apart from the code that imports torch, so checking one
    costs no torch import (seconds)."""
    script = f"""
import json, sys
from orchestration.flow_command import check_overrides
from pipeline.errors import PipelineError
said = {{}}
for override in {list(SCHEMA_REFUSALS)!r}:
    try:
        check_overrides(["--repo-dir", {str(ROOT)!r}, "-S", override])
    except PipelineError as exc:
        said[override] = str(exc)
print(json.dumps({{"said": said, "heavy": sorted(m for m in sys.modules if m in {HEAVY!r})}}))
"""
    done = run(["-c", script])
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    for override, message in SCHEMA_REFUSALS.items():
        assert message in result["said"].get(override, "(passed)"), (override, result["said"])
        assert result["said"][override].endswith("; change the override")
    assert result["heavy"] == []


def test_the_check_params_stage_refuses_a_bad_value_before_torch_is_imported(project):
    """``dvc exp run -S`` reaches the same schemas through the ``check_params`` stage."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["model"]["langevin"]["steps"] = -1
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = run(["-X", "importtime", "-m", "stages.check_params", "--params",
                str(project / "params.yaml"), "--out", str(project / "checked")])
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    done.stderr = "".join(line + "\n" for line in done.stderr.splitlines()
                          if not line.startswith("import time:"))
    assert one_error_line(done) == ("error: params.yaml model.langevin.steps = -1: expected a "
                                    "number >= 0; fix params.yaml")
    heavy = {name.split(".")[0] for name in imported} & HEAVY
    assert "model.config" in imported and not heavy, heavy
    assert not (project / "checked").exists()


def test_the_temporary_server_gets_the_time_a_busy_machine_needs(monkeypatch):
    from orchestration import flow_command

    monkeypatch.setattr(flow_command, "usable_cores", lambda: 2)
    monkeypatch.setattr(flow_command.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert flow_command.server_startup_s() == flow_command.STARTUP_IDLE_S
    monkeypatch.setattr(flow_command.os, "getloadavg", lambda: (4.0, 4.0, 4.0))
    assert flow_command.server_startup_s() == 3 * flow_command.STARTUP_IDLE_S
    monkeypatch.delenv(flow_command.STARTUP_ENV, raising=False)
    monkeypatch.delenv(flow_command.ANALYTICS_ENV, raising=False)
    flow_command.allow_server_startup()
    assert os.environ[flow_command.STARTUP_ENV] == str(3 * flow_command.STARTUP_IDLE_S)
    assert os.environ[flow_command.ANALYTICS_ENV] == "false"
    monkeypatch.setenv(flow_command.STARTUP_ENV, "999")  # the user's own settings stay
    monkeypatch.setenv(flow_command.ANALYTICS_ENV, "true")
    flow_command.allow_server_startup()
    assert os.environ[flow_command.STARTUP_ENV] == "999"
    assert os.environ[flow_command.ANALYTICS_ENV] == "true"


def test_a_server_that_does_not_start_is_one_line(monkeypatch, capsys):
    from orchestration import flows

    def timed_out(**kwargs):
        raise RuntimeError("Timed out while attempting to connect to ephemeral Prefect API "
                           "server. stdout: ... stderr: ...")

    monkeypatch.setattr(flows, "make_plan", lambda *args: None)
    monkeypatch.setattr(flows, "retrain", timed_out)
    with pytest.raises(SystemExit) as exc:
        run_cli(flows.main, ["--repo-dir", str(ROOT)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: Prefect's temporary server did not start within ")
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS higher" in err


def test_write_checks_before_writing_and_refuses_its_own_params_file(project, monkeypatch):
    monkeypatch.chdir(project)
    out = project / "out.yaml"
    with pytest.raises(PipelineError, match="train.steps = 'abc': expected an integer"):
        overrides_main(["--write", str(out), "-S", "train.steps=abc"])
    assert not out.exists()
    original = (project / "params.yaml").read_text()
    with pytest.raises(PipelineError, match="would overwrite the params file it reads"):
        overrides_main(["--write", "params.yaml", "-S", "train.steps=7"])
    assert (project / "params.yaml").read_text() == original
    # Named with --params too, in place is what it asks for (scripts/run_preset.sh).
    overrides_main(["--write", str(out), "-S", "train.steps=7"])
    overrides_main(["--write", str(out), "--params", str(out), "-S", "train.steps=8"])
    assert yaml.safe_load(out.read_text())["train"]["steps"] == 8


def test_check_writes_nothing_and_fails_on_a_bad_value(project, monkeypatch):
    monkeypatch.chdir(project)
    overrides_main(["--check", "-S", "train.steps=7"])
    with pytest.raises(PipelineError, match="expected a number >= 1; change the override"):
        overrides_main(["--check", "-S", "train.steps=-5"])
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml"]


def test_a_cluster_that_accepts_but_is_no_scheduler_is_refused(tiny_repo, monkeypatch):
    """A server that accepts and never answers: the handshake waits HANDSHAKE_TIMEOUT_S at
    most (run here with a shorter wait, so the test is fast), then one error."""
    waits, wait_for = [], asyncio.wait_for

    def recording(awaitable, timeout):
        if getattr(awaitable, "__qualname__", "").endswith("handshake"):
            waits.append(timeout)
            timeout = 0.2
        return wait_for(awaitable, timeout)

    monkeypatch.setattr(asyncio, "wait_for", recording)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        with pytest.raises(PipelineError, match=f"no Dask scheduler answers at tcp://{address}"):
            make_plan(str(tiny_repo), cluster=address)
    assert waits == [HANDSHAKE_TIMEOUT_S]


def test_a_dask_scheduler_passes_the_cluster_check():
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp://",
                      dashboard_address=":0") as cluster:
        assert check_scheduler(cluster.scheduler_address) == cluster.scheduler_address


def test_ctrl_c_undoes_marks_the_run_and_ends_with_130(capsys, monkeypatch):
    monkeypatch.setattr(signal, "signal", lambda *args: None)
    undone, marked, ended, stopped = [], [], [], []
    interrupt.set_run("run-1")
    with interrupt.cleanup(lambda: undone.append("params")), \
            interrupt.cleanup(lambda: undone.append("dvc")):
        interrupt.on_interrupt(mark=marked.append, stop=lambda: stopped.append(1),
                               end=ended.append)
    assert undone == ["dvc", "params"] and marked == ["run-1"] and stopped and ended == [130]
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: interrupted (Ctrl-C); flow run run-1 marked Cancelled")
    # An API that does not answer costs the bounded wait, not Prefect's minutes of retries.
    bounds, bounded = [], interrupt._bounded
    monkeypatch.setattr(interrupt, "_bounded",
                        lambda call, wait: bounds.append(wait) or bounded(call, wait))
    interrupt.on_interrupt(mark=lambda run: time.sleep(60), stop=lambda: None, end=ended.append,
                           timeout_s=0.05)
    assert bounds == [0.05] and ended == [130, 130]
    assert "could not be marked Cancelled" in capsys.readouterr().err
    interrupt.set_run(None)


SIGNALLED = """
import os, signal, time
from pathlib import Path
from orchestration import interrupt
with interrupt.handling():
    interrupt.set_run("00000000-0000-0000-0000-000000000000")
    with interrupt.cleanup(lambda: Path("undone").write_text("yes")):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(60)
"""


@pytest.mark.slow  # a Python with Prefect in a subprocess, timed
def test_a_real_sigint_ends_in_seconds_against_a_dead_api(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, not listening: the API is gone
        env = {**os.environ, "PYTHONPATH": str(ROOT),
               "PREFECT_API_URL": f"http://127.0.0.1:{sock.getsockname()[1]}/api"}
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-c", SIGNALLED], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == interrupt.INTERRUPTED, done.stderr[-2000:]
    assert time.monotonic() - start < 60
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: interrupted (Ctrl-C); flow run 00000000") and "Traceback" \
        not in done.stderr
    assert (tmp_path / "undone").read_text() == "yes"


@pytest.mark.parametrize("out", ["/proc/x.yaml", "/proc/no/such/x.yaml", "."])
def test_write_to_a_place_that_cannot_be_written_is_one_line(project, monkeypatch, out):
    monkeypatch.chdir(project)
    with pytest.raises(PipelineError, match=r"^--write .* (cannot be written|is a folder)"):
        overrides_main(["--write", out, "-S", "train.steps=7"])
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml"]
