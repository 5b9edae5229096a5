"""Bad flow overrides: one ``error:`` line before Prefect starts, params.yaml left as it was."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from orchestration.flows import retrain
from orchestration.overrides import apply, resolve, restore
from pipeline.errors import PipelineError
from tests.pipeline.test_bad_inputs import ROOT

# ------------------------------------------------------------ flow overrides (2, 3)


def test_overrides_are_checked_against_the_section_schema_only_where_it_applies(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    assert resolve(params, {"train.steps": "7"})[0] == {"train.steps": 7}
    with pytest.raises(PipelineError, match="expected a number >= 0"):
        resolve(params, {"model.langevin.steps": "-1"})
    # Another project's `train` section is not this project's: left to its own stage.
    params.write_text("train:\n  scale: 2\n")
    assert resolve(params, {"train.scale": "abc"})[0] == {"train.scale": "abc"}


def test_set_and_restore_keep_params_yaml_byte_for_byte(tmp_path):
    params = tmp_path / "params.yaml"
    shutil.copy(ROOT / "params.yaml", params)
    original = params.read_text()
    new, old = resolve(params, {"train.lr_encoder": "1e-3", "train_transe.model.seed": "1"})
    texts = apply(params, new)
    changed = [(a, b) for a, b in zip(original.splitlines(), params.read_text().splitlines(),
                                      strict=True) if a != b]
    assert sorted(b.split("#")[0].split() for _, b in changed) == [["lr_encoder:", "0.001"],
                                                                   ["seed:", "1"]]
    restore(params, texts, old)
    assert params.read_text() == original
    # Edited while the run went on: only the keys go back, the edit stays.
    texts = apply(params, new)
    params.write_text(params.read_text().replace("steps: 300", "steps: 301"))
    restore(params, texts, old)
    assert "steps: 301" in params.read_text() and "seed: 0" in params.read_text()


LAYOUT = """\
fetch:
  n: 4
  flaky: false
  # a value longer than a YAML writer's default line width
  mirror: https://example.com/a/long/path/that/goes/on/and/on/for/more/than/eighty/chars.json
  extra:
    - 1
    - 2
train:
  scale: 2
  fail: false
"""


@pytest.mark.parametrize("fail", [False, True])
def test_override_run_leaves_params_yaml_as_it_was(prefect_server, tiny_repo, fail):
    (tiny_repo / "params.yaml").write_text(LAYOUT)
    subprocess.run(["git", "commit", "-qam", "layout"], cwd=tiny_repo, check=True)
    state = retrain(overrides={"train.scale": 3, "train.fail": fail},
                    repo_dir=str(tiny_repo), return_state=True)
    assert state.is_failed() if fail else state.is_completed(), state
    # The next scheduled run starts from the same params.yaml, byte for byte.
    assert (tiny_repo / "params.yaml").read_text() == LAYOUT
