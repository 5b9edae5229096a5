"""DVC knows what each stage runs: editing an imported module marks the stage changed."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from scripts import stage_deps
from tests.conftest import ROOT


def test_dvc_yaml_deps_match_the_imports():
    assert stage_deps.main(["--check"]) == 0, "run python scripts/stage_deps.py"


def test_closure_follows_function_level_and_registry_imports():
    train = stage_deps.closure("stages.train")
    assert "model/methods/regrab.py" in train and "model/methods/proto.py" in train  # via MODULES
    assert "pipeline/io.py" in train and "stages/evaluate.py" not in train
    assert "model/methods/regrab.py" not in stage_deps.closure("stages.split_nyt")


@pytest.mark.parametrize("stage", ["train", "evaluate", "transfer"])
def test_model_stages_do_not_depend_on_transe_code(stage):
    """TransE only makes the graph's features (a data dep): editing its code must not mark the
    stages that train, evaluate or transfer the few-shot models as changed."""
    from ruamel.yaml import YAML

    assert not [f for f in stage_deps.closure(f"stages.{stage}") if f.startswith("model/transe/")]
    blocks = dict(stage_deps.stage_blocks(YAML().load((ROOT / "dvc.yaml").read_text())))
    deps = [str(d) for d in blocks[stage]["deps"]]
    assert "model/methods/regrab.py" in deps  # the code deps are there, TransE's are not
    assert [d for d in deps if d.startswith("model/transe/")] == []


def _importers(doc_stages: dict, path: str) -> set[str]:
    return {name for name, block in doc_stages if path in [str(d) for d in block["deps"]]}


@pytest.mark.slow
def test_editing_a_module_marks_every_stage_that_imports_it(tmp_path):
    """In a scratch copy (code, dvc.yaml, dvc.lock, params; no data), edit one module of
    pipeline/ and one of model/: `dvc status` reports each as modified for exactly the
    stages that import it."""
    from ruamel.yaml import YAML

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    for f in files:
        if (ROOT / f).is_file() and f.split("/")[0] in (*stage_deps.PACKAGES, ".dvc") or \
                f in ("dvc.yaml", "dvc.lock", "params.yaml", ".dvcignore"):
            (tmp_path / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / f, tmp_path / f)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    blocks = stage_deps.stage_blocks(YAML().load((tmp_path / "dvc.yaml").read_text()))
    edited = ["pipeline/io.py", "model/episodes.py"]
    for path in edited:
        with (tmp_path / path).open("a") as fh:
            fh.write("\n# edited by a test\n")
    done = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout or "{}")

    def modified(stage: str, path: str) -> bool:
        for change in status.get(stage, []):
            deps = change.get("changed deps", {}) if isinstance(change, dict) else {}
            if deps.get(path) == "modified":
                return True
        return False

    for path in edited:
        importers = _importers(blocks, path)
        assert importers, f"no stage imports {path}?"
        for name, _ in blocks:
            stages = [s for s in status if s == name or s.startswith(f"{name}@")] or [name]
            for s in stages:
                assert modified(s, path) == (name in importers), (s, path)


def test_a_crash_while_rewriting_leaves_dvc_yaml_whole(tmp_path, monkeypatch):
    from ruamel.yaml import YAML

    dvc_yaml = tmp_path / "dvc.yaml"
    text = (ROOT / "dvc.yaml").read_text()
    stale = text.replace("      - pipeline/io.py\n", "", 1)  # one stage's deps out of date
    assert stale != text
    dvc_yaml.write_text(stale)

    def crash(self, data, stream):  # a kill after the first bytes reached the file
        stream.write(text[:100])
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(YAML, "dump", crash)
    with pytest.raises(RuntimeError, match="mid-write"):
        stage_deps.main(["--dvc-yaml", str(dvc_yaml)])
    assert dvc_yaml.read_text() == stale and sorted(tmp_path.iterdir()) == [dvc_yaml]
