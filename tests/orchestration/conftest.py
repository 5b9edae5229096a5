"""A tiny DVC project for the flow tests: git + DVC, three stages, a metrics file.

The stages are little Python scripts, so a whole ``dvc repro`` takes seconds. Their
order in ``dvc.yaml`` is deliberately not the run order (evaluate is listed first),
so a flow that followed file order instead of the DAG would fail.

Params switch on the failure modes under test: ``train.fail`` makes ``train`` die
half-way through writing its output, ``fetch.flaky`` makes the first ``fetch``
attempt fail (to exercise retries).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PARAMS = """\
fetch:
  n: 4
  flaky: false
train:
  scale: 2
  fail: false
"""

DVC_YAML = """\
stages:
  evaluate:
    cmd: python evaluate.py
    deps: [evaluate.py, model.txt]
    metrics:
      - metrics/tiny.json:
          cache: false
  train:
    cmd: python train.py
    deps: [train.py, data.txt]
    params: [train]
    outs: [model.txt]
  fetch:
    cmd: python fetch.py
    deps: [fetch.py]
    params: [fetch]
    outs: [data.txt]
"""

FETCH = """\
import os, sys
from pathlib import Path
import yaml
Path("fetch_dask.txt").write_text(os.environ.get("REGRAB_DASK_ADDRESS", ""))
p = yaml.safe_load(open("params.yaml"))["fetch"]
counter = Path("fetch_attempts.txt")
attempt = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(attempt))
print(f"fetch attempt {attempt}")
if p["flaky"] and attempt < 2:
    print("network down: connection reset", file=sys.stderr)
    sys.exit(4)
Path("data.txt").write_text("\\n".join(str(i) for i in range(p["n"])) + "\\n")
"""

TRAIN = """\
import os, sys
from pathlib import Path
import yaml
from pipeline.io import atomic_path
Path("train_dask.txt").write_text(os.environ.get("REGRAB_DASK_ADDRESS", ""))
p = yaml.safe_load(open("params.yaml"))["train"]
total = sum(int(x) for x in open("data.txt").read().split())
with atomic_path("model.txt") as tmp:
    with open(tmp, "w") as fh:
        fh.write("partial ")
        fh.flush()
        if p["fail"]:
            print("boom: train.fail is set, giving up", file=sys.stderr)
            sys.exit(3)
        fh.write(str(total * p["scale"]))
print("trained")
"""

EVALUATE = """\
import json, os
value = float(open("model.txt").read().split()[-1])
acc = value / (value + 10.0)
os.makedirs("metrics", exist_ok=True)
metrics = {"proto": {"5-way-1-shot": {"acc": acc, "ci95": 0.01}},
           "regrab": {"5-way-1-shot": {"acc": acc / 2, "ci95": 0.02}}}
with open("metrics/tiny.json", "w") as fh:
    json.dump(metrics, fh)
"""


def _expected_metrics(n: int = 4, scale: float = 2) -> dict:
    """What the tiny pipeline must report, computed independently of it."""
    value = sum(range(n)) * scale
    acc = value / (value + 10.0)
    return {
        "proto": {"5-way-1-shot": {"acc": acc, "ci95": 0.01}},
        "regrab": {"5-way-1-shot": {"acc": acc / 2, "ci95": 0.02}},
    }


def _run(cmd: list[str], cwd: Path) -> None:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True, timeout=120)


def build_tiny_repo(root: Path) -> Path:
    """Create the tiny project at ``root`` with one git commit (no dvc.lock yet)."""
    root.mkdir(parents=True, exist_ok=True)
    _run(["git", "init", "-q", "-b", "main"], root)
    _run(["git", "config", "user.email", "tests@example.com"], root)
    _run(["git", "config", "user.name", "tests"], root)
    _run([sys.executable, "-m", "dvc", "init", "-q"], root)
    for name, text in {
        "params.yaml": PARAMS,
        "dvc.yaml": DVC_YAML,
        "fetch.py": FETCH,
        "train.py": TRAIN,
        "evaluate.py": EVALUATE,
        ".gitignore": "fetch_attempts.txt\n*_dask.txt\n",
    }.items():
        (root / name).write_text(text)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-q", "-m", "tiny pipeline"], root)
    return root


@pytest.fixture(scope="session")
def prefect_server():
    """One temporary Prefect server (SQLite in a temp dir) for the whole session.

    Defined here, once, so every test module shares it: a second harness in the same
    process would swap the first one's settings under it.
    """
    from prefect.testing.utilities import prefect_test_harness

    with pytest.MonkeyPatch.context() as mp:
        # Offline here; the telemetry heartbeat only adds SQLite lock errors to the log.
        mp.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        with prefect_test_harness(server_startup_timeout=120):
            yield


@pytest.fixture(scope="session")
def tiny_repo_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built once per session; tests get copies (git init + dvc init cost seconds)."""
    return build_tiny_repo(tmp_path_factory.mktemp("template") / "repo")


@pytest.fixture
def tiny_repo(tiny_repo_template: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny DVC project for one test."""
    dst = tmp_path / "repo"
    shutil.copytree(tiny_repo_template, dst, symlinks=True)
    return dst


@pytest.fixture
def expected_metrics():
    """``f(n=4, scale=2)``: the tiny pipeline's metrics, computed without running it."""
    return _expected_metrics
