"""``train`` and ``evaluate`` on a real Dask cluster: a ``dask scheduler`` and two ``dask
worker`` processes on loopback, each started in an empty folder with no clone and no data
(stand-ins for other machines: they share nothing with the stage but the installed project
and the encoder's folder). The outputs are byte for byte those of a run on this machine, and
a worker killed in the middle of a training job changes neither the exit code nor them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from stages import evaluate, train
from tests.conftest import ROOT, project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_train_sections

distributed = pytest.importorskip("distributed")
pytestmark = pytest.mark.slow

ENV = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
ENV.pop("REGRAB_DASK_ADDRESS", None)


class Cluster:
    """A scheduler and named workers, each a process started in an empty folder of its own."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.processes: dict[str, subprocess.Popen] = {}
        file = root / "scheduler.json"
        self._start("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", "0",
                                  "--no-dashboard", "--scheduler-file", str(file)])
        end = time.monotonic() + 120
        while not file.exists() and time.monotonic() < end:
            time.sleep(0.1)
        self.address = json.loads(file.read_text())["address"]

    def _start(self, name: str, args: list[str]) -> None:
        folder = self.root / name
        folder.mkdir()
        log = (self.root / f"{name}.log").open("w")
        self.processes[name] = subprocess.Popen(
            [str(Path(sys.executable).with_name("dask")), *args], cwd=folder, env=ENV,
            stdout=log, stderr=subprocess.STDOUT)

    def add_worker(self, name: str) -> None:
        self._start(name, ["worker", self.address, "--name", name, "--host", "127.0.0.1",
                           "--nthreads", "1", "--no-nanny", "--no-dashboard",
                           "--local-directory", str(self.root / name)])

    def wait_for(self, count: int) -> None:
        with distributed.Client(self.address, timeout=60) as client:
            client.wait_for_workers(count, timeout=120)

    def close(self) -> None:
        for process in reversed(list(self.processes.values())):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        for name in ("w1", "w2"):
            started.add_worker(name)
        started.wait_for(2)
        yield started
    finally:
        started.close()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    root = tmp_path_factory.mktemp("project")
    enc, splits, graph, features = toy_project(root)
    sections = toy_train_sections(enc)
    sections["train"] |= {"methods": ["regrab", "proto", "proto_label"], "steps": 24,
                          "checkpoint_every": 2, "val_every": 12}
    sections["evaluate"] |= {"methods": ["regrab", "proto", "proto_label"],
                             "settings": ["2w1s"], "episodes": 4, "nota_rates": []}
    params = root / "params.yaml"
    params.write_text(yaml.safe_dump(project_params(**sections)))
    return root, splits, graph, features, params


def _train_args(project, out: Path) -> list[str]:
    root, splits, graph, features, params = project
    return ["--splits", str(splits), "--graph", str(graph), "--features", str(features),
            "--relations", str(labels_of(graph)), "--out", str(out), "--params", str(params)]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


@pytest.fixture(scope="module")
def local(project, tmp_path_factory):
    """The models of a run on this machine alone, the reference."""
    out = tmp_path_factory.mktemp("local") / "models"
    train.main(_train_args(project, out))
    return out


def test_train_and_evaluate_on_the_cluster_write_the_local_run_s_outputs(
        project, local, cluster, tmp_path, caplog):
    caplog.set_level("INFO", logger="stages.train")
    root, splits, graph, features, params = project
    out = tmp_path / "models"
    train.main([*_train_args(project, out), "--cluster", cluster.address])
    assert _files(out) == _files(local) and len(_files(out)) == 4  # 3 models, summary
    lines = [r.getMessage() for r in caplog.records if " done in " in r.getMessage()]
    assert len(lines) == 3 and all(" on w1 (" in line or " on w2 (" in line for line in lines)

    def scored(models: Path, where: Path, *extra: str) -> dict[str, bytes]:
        evaluate.main(["--splits", str(splits), "--models", str(models), "--metrics",
                       str(where / "m.json"), "--plot", str(where / "p.png"), "--params",
                       str(params), *extra])
        return {name: (where / name).read_bytes()
                for name in ("m.json", "m_report.json", "m.md", "p_selective.csv")}

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert scored(out, tmp_path / "a", "--cluster", cluster.address) == scored(
        local, tmp_path / "b")


def test_a_worker_killed_mid_training_changes_nothing(project, local, cluster, tmp_path):
    """The stage runs as DVC runs it (the address in ``$REGRAB_DASK_ADDRESS``); one worker
    is killed (SIGKILL, no nanny to restart it) once a job on it has saved a training
    state, and the other worker trains that model again from the start."""
    out = tmp_path / "models"
    log = (tmp_path / "train.log").open("w")
    stage = subprocess.Popen([sys.executable, "-m", "stages.train", *_train_args(project, out)],
                             cwd=ROOT, env={**ENV, "REGRAB_DASK_ADDRESS": cluster.address},
                             stdout=log, stderr=subprocess.STDOUT)
    killed = None
    end = time.monotonic() + 600
    while killed is None and stage.poll() is None and time.monotonic() < end:
        for name in ("w1", "w2"):
            if any((cluster.root / name).glob("**/regrab-job-*/**/state.safetensors")):
                cluster.processes[name].send_signal(signal.SIGKILL)
                killed = name
                break
        time.sleep(0.02)
    assert stage.wait(timeout=600) == 0, (tmp_path / "train.log").read_text()[-3000:]
    assert killed is not None, "no job was caught mid-training"
    text = (tmp_path / "train.log").read_text()
    assert _files(out) == _files(local)
    survivor = {"w1": "w2", "w2": "w1"}[killed]
    assert text.count(f" on {survivor} (") == 3, text[-3000:]
