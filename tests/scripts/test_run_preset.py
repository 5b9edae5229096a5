"""scripts/run_preset.sh: the preset's params, and with DEADLINE_S one split at a time.

The stages are replaced by a stand-in interpreter that records which splits each stage was
asked for; the params handling around them is the script's own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

#: A subprocess pipeline (bash, then Python children for every stage call): the slow suite.
pytestmark = [pytest.mark.slow, pytest.mark.long(minutes=1)]

ROOT = Path(__file__).resolve().parents[2]

SHIM = """#!/usr/bin/env bash
# Record stage calls (and the splits in their params); run everything else for real.
if [ "$1" = -m ] && [[ "$2" == stages.* ]]; then
  stage=$2; shift 2
  while [ $# -gt 0 ]; do [ "$1" = --params ] && params=$2; shift; done
  echo "$stage $(python_real -c "import sys, yaml; p = yaml.safe_load(open(sys.argv[1])); \
print(','.join(p['train' if sys.argv[2] == 'stages.train' else 'evaluate']['splits']))" \
"$params" "$stage")" >> calls.log
  exit 0
fi
exec python_real "$@"
"""


def run_preset(tmp_path: Path, deadline: str, **extra: str) -> list[str]:
    for i in range(3):
        (tmp_path / "data" / "splits" / f"split_{i}").mkdir(parents=True)
    shutil.copy(ROOT / "params.yaml", tmp_path)
    shutil.copy(ROOT / "params-gpu.yaml", tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # A wrapper, not a symlink: a symlink outside the venv would start the bare interpreter.
    real = bin_dir / "python_real"
    real.write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n')
    real.chmod(0o755)
    shim = bin_dir / "shim"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    env = {**os.environ, "PYTHON": str(shim), "OUT_DIR": str(tmp_path / "out"),
           "DEADLINE_S": deadline, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), **extra}
    res = subprocess.run(["bash", str(ROOT / "scripts" / "run_preset.sh")], cwd=tmp_path,
                         env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    return (tmp_path / "calls.log").read_text().splitlines()


def test_deadline_passed_trains_one_split_and_evaluates_it(tmp_path):
    calls = run_preset(tmp_path, "0")
    assert calls == ["stages.train split_0", "stages.evaluate split_0"]
    params = yaml.safe_load((tmp_path / "out" / "params.yaml").read_text())
    assert params["evaluate"]["splits"] == ["split_0"]
    assert params["train"]["splits"] == []  # the preset's own params are left as they were


def test_far_deadline_trains_every_split_one_by_one(tmp_path):
    calls = run_preset(tmp_path, "100000")
    assert calls == ["stages.train split_0", "stages.train split_1", "stages.train split_2",
                     "stages.evaluate split_0,split_1,split_2"]


def test_params_are_the_preset_and_the_encoder_over_params_yaml(tmp_path):
    # The overrides are checked before they are written: the encoder folder must exist.
    encoder = tmp_path / ".enc" / "mini lm"
    encoder.mkdir(parents=True)
    (encoder / "config.json").write_text("{}")
    run_preset(tmp_path, "100000", ENCODER=".enc/mini lm")  # a folder name with a space
    params = yaml.safe_load((tmp_path / "out" / "params.yaml").read_text())
    preset = yaml.safe_load((ROOT / "params-gpu.yaml").read_text())
    assert params["model"]["encoder"]["name"] == ".enc/mini lm"
    assert params["train"]["steps"] == preset["train"]["steps"]
    assert params["train"]["lr_encoder"] == preset["train"]["lr_encoder"]
