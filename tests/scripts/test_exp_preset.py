"""scripts/exp_preset.sh: a preset file becomes one named ``dvc exp run`` with its -S arguments.

``dvc`` is a stand-in that records its arguments; no experiment runs here (the presets are
GPU runs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from model.encoder.files import packaged_encoders_dir
from orchestration.overrides import flatten

#: A subprocess pipeline (bash, then Python children that each check params.yaml): the slow suite.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FAKE_DVC = """#!/usr/bin/env bash
exec "{python}" -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"
"""


def exp_preset(tmp_path: Path, preset: str, *extra: str, **env: str):
    shutil.copy(ROOT / "params.yaml", tmp_path)
    if (ROOT / preset).is_file():
        shutil.copy(ROOT / preset, tmp_path)
    dvc = tmp_path / "dvc"
    dvc.write_text(FAKE_DVC.format(python=sys.executable))
    dvc.chmod(0o755)
    return subprocess.run(
        ["bash", str(ROOT / "scripts" / "exp_preset.sh"), preset, *extra], cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable, "DVC": str(dvc),
             "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, timeout=120, check=False)


def sets(argv: list[str]) -> dict[str, object]:
    """``{key: value}`` of the ``-S key=value`` pairs, values read back as JSON."""
    pairs = [argv[i + 1].partition("=") for i, a in enumerate(argv) if a == "-S"]
    return {key: json.loads(value) for key, _, value in pairs}


@pytest.mark.parametrize("preset", ["params-gpu.yaml", "params-gpu-mpnet.yaml",
                                    "params-paper-gpu.yaml"])
def test_every_leaf_of_the_preset_is_one_set_param(tmp_path, preset):
    done = exp_preset(tmp_path, preset, "--queue")
    if "mpnet" in preset and not (packaged_encoders_dir() / "all-mpnet-base-v2").is_dir():
        # Checked as train will read it: an encoder not installed here is refused up front.
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert "run `make encoder-mpnet` first; change the override" in done.stderr
        return
    assert done.returncode == 0, done.stderr
    argv = json.loads(done.stdout)
    name = preset.removeprefix("params-").removesuffix(".yaml")
    assert argv[:4] == ["exp", "run", "--name", name] and argv[-1] == "--queue"
    assert sets(argv) == flatten(yaml.safe_load((ROOT / preset).read_text()))


def test_name_and_later_options_can_be_given(tmp_path):
    done = exp_preset(tmp_path, "params-gpu.yaml", "-S", "train.steps=10", NAME="gpu-short")
    argv = json.loads(done.stdout)
    assert argv[2:4] == ["--name", "gpu-short"]
    assert argv[-2:] == ["-S", "train.steps=10"]  # after the preset's own, so it wins
    assert sets(argv)["train.steps"] == 10


@pytest.mark.parametrize("option", [["-S", "train.steps=-5"], ["--set-param=train.steps=-5"]])
def test_a_bad_set_param_runs_nothing(tmp_path, option):
    done = exp_preset(tmp_path, "params-gpu.yaml", *option)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: -S train.steps=-5: params.yaml train.steps = -5: expected")


def test_a_preset_with_an_unknown_key_runs_nothing(tmp_path):
    (tmp_path / "params-typo.yaml").write_text("train:\n  stepz: 10\n")
    done = exp_preset(tmp_path, "params-typo.yaml")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: train.stepz is not a key of params.yaml; use section.key")
    missing = exp_preset(tmp_path, "params-none.yaml")
    assert missing.returncode == 2 and "params-none.yaml not found" in missing.stderr
