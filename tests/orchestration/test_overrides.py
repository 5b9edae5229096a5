import re
import shutil
from pathlib import Path

import pytest
import yaml

from orchestration.overrides import (
    apply,
    flatten,
    overrides,
    parse_value,
    resolve,
    write_params,
)
from pipeline.errors import PipelineError


def test_flatten_and_overrides() -> None:
    base = {"model": {"encoder": "minilm", "steps": 1}, "train": {"ways": [5]}}
    profile = {"model": {"encoder": "bert-base-uncased"}, "train": {"ways": [5, 10]}}
    assert flatten(base) == {"model.encoder": "minilm", "model.steps": 1, "train.ways": [5]}
    assert overrides(profile, base) == [
        "-S", 'model.encoder="bert-base-uncased"', "-S", "train.ways=[5,10]",
    ]


def test_unknown_key_rejected() -> None:
    with pytest.raises(PipelineError, match="model.nope is not a key"):
        overrides({"model": {"nope": 1}}, {"model": {"encoder": "x"}})


def test_paper_gpu_set_only_names_real_keys() -> None:
    base = yaml.safe_load(Path("params.yaml").read_text())
    profile = yaml.safe_load(Path("params-paper-gpu.yaml").read_text())
    args = overrides(profile, base)
    assert 'model.encoder.name="bert-base-uncased"' in args


def test_whitespace_value_rejected() -> None:
    with pytest.raises(PipelineError, match="whitespace"):
        overrides({"model": {"encoder": "a b"}}, {"model": {"encoder": "x"}})


def test_values_read_like_dvc_exp_run_set_param() -> None:
    assert parse_value("a.b", "5") == 5
    assert parse_value("a.b", "'5'") == "5"
    assert parse_value("a.b", "2e-4") == pytest.approx(2e-4)
    assert parse_value("a.b", "[1, 2]") == [1, 2]
    assert parse_value("a.b", "null") is None
    with pytest.raises(PipelineError, match=r"cannot read the value of a.b=\[1,"):
        parse_value("a.b", "[1,")
    with pytest.raises(PipelineError, match="is a sweep"):
        parse_value("a.b", "1,2")


def test_resolve_and_apply_keep_the_file_layout(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("# top comment\ntrain:\n  steps: 300  # why 300\n  ways: [5, 10]\n")
    new, old = resolve(path, {"train.steps": "5", "train.ways.1": 20})
    assert new == {"train.steps": 5, "train.ways.1": 20}
    assert old == {"train.steps": 300, "train.ways.1": 10}
    apply(path, new)
    text = path.read_text()
    assert "# top comment" in text and "# why 300" in text
    assert yaml.safe_load(text) == {"train": {"steps": 5, "ways": [5, 20]}}
    apply(path, old)
    assert yaml.safe_load(path.read_text()) == {"train": {"steps": 300, "ways": [5, 10]}}
    with pytest.raises(PipelineError, match="train.stpes is not a key of params.yaml"):
        resolve(path, {"train.stpes": 1})
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def typed(path: Path) -> dict:
    """Leaves of a params file; ``3e-05`` (a string to PyYAML, a float to the schema) a float."""
    exponent = re.compile(r"[-+]?\d+(\.\d*)?e[-+]?\d+")
    return {key: float(value) if isinstance(value, str) and exponent.fullmatch(value) else value
            for key, value in flatten(yaml.safe_load(path.read_text())).items()}


@pytest.mark.parametrize("preset", ["params-gpu.yaml", "params-gpu-mpnet.yaml"])
def test_written_params_are_what_dvc_exp_run_with_the_preset_sees(tmp_path: Path, preset):
    # run_preset.sh (no DVC) writes the file; `dvc exp run -S ...` edits params.yaml in place.
    shutil.copy("params.yaml", tmp_path / "params.yaml")
    args = overrides(yaml.safe_load(Path(preset).read_text()),
                     yaml.safe_load(Path("params.yaml").read_text()))
    written = tmp_path / "written.yaml"
    encoder = tmp_path / "mini lm"  # checked as train will resolve it: it must exist
    encoder.mkdir()
    (encoder / "config.json").write_text("{}")
    write_params(written, tmp_path / "params.yaml", [Path(preset)],
                 [f"model.encoder.name='{encoder}'", "train.splits=[split_0,split_1]"])
    sets = dict(a.split("=", 1) for a in args[1::2])
    sets |= {"model.encoder.name": f"'{encoder}'", "train.splits": "[split_0,split_1]"}
    apply(tmp_path / "params.yaml", resolve(tmp_path / "params.yaml", sets)[0])
    assert typed(written) == typed(tmp_path / "params.yaml")
    assert yaml.safe_load(written.read_text())["train"]["splits"] == ["split_0", "split_1"]


def test_write_params_refuses_unknown_keys_and_sets_without_a_value(tmp_path: Path) -> None:
    base = tmp_path / "params.yaml"
    base.write_text("train:\n  steps: 3\n")
    (tmp_path / "p.yaml").write_text("train:\n  stepz: 1\n")
    with pytest.raises(PipelineError, match="train.stepz is not a key of params.yaml"):
        write_params(tmp_path / "out.yaml", base, [tmp_path / "p.yaml"], [])
    with pytest.raises(PipelineError, match="-S train.steps: write it as key=value"):
        write_params(tmp_path / "out.yaml", base, [], ["train.steps"])
    write_params(base, base, [], ["train.steps=4"])  # in place
    assert yaml.safe_load(base.read_text()) == {"train": {"steps": 4}}


#: A fetch key under a file whose path has dots and slashes: its id has neither.
SHA = "fetch.files.wd50k_train.sha256"
FOLLOW = "fetch.files.wd50k_train.follow"


def test_fetch_keys_are_overridden_like_any_key(tmp_path: Path) -> None:
    """The key the checksum-mismatch message names is accepted; a follow rule with the pin
    still set is refused; the old path-named key is not a key."""
    out = tmp_path / "params.yaml"
    write_params(out, Path("params.yaml"), [], [f"{SHA}=null", f"{FOLLOW}=headers"])
    written = yaml.safe_load(out.read_text())["fetch"]["files"]["wd50k_train"]
    assert written["sha256"] is None and written["follow"] == "headers"
    assert written["path"] == "wikidata/triples/wd50k-train.csv"
    write_params(None, Path("params.yaml"), [], [f"{SHA}=null"])
    with pytest.raises(PipelineError, match=r"-S fetch.files.wd50k_train.follow=headers: .*"
                                            r"pins sha256 too; set sha256: null"):
        write_params(None, Path("params.yaml"), [], [f"{FOLLOW}=headers"])
    with pytest.raises(PipelineError, match="is not a key of params.yaml"):
        write_params(None, Path("params.yaml"), [],
                     ["fetch.files.wikidata/triples/wd50k-train.csv.sha256=null"])


def test_fetch_keys_read_as_dvc_exp_run_set_param_applies_them(tmp_path: Path) -> None:
    """DVC's own -S code (``dvc.utils.hydra.apply_overrides``) sets the same values."""
    from dvc.utils.hydra import apply_overrides

    sets = [f"{SHA}=null", f"{FOLLOW}=https://dumps.example.org/20261201/sha1sums.txt"]
    ours = tmp_path / "ours.yaml"
    write_params(ours, Path("params.yaml"), [], sets)
    shutil.copy("params.yaml", tmp_path / "dvc.yaml")
    apply_overrides(str(tmp_path / "dvc.yaml"), sets)
    theirs = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["fetch"]
    assert theirs == yaml.safe_load(ours.read_text())["fetch"]


@pytest.mark.slow
def test_dvc_exp_run_takes_a_fetch_key(tmp_path: Path) -> None:
    """A real ``dvc exp run --dry -S fetch.files.<id>.sha256=null`` in a scratch repository
    (the tracked files, no data): DVC accepts the key, and refuses the path-named one."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (ROOT / name).is_file() and not name.startswith("data/"):
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, tmp_path / name)
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "x"]):
        subprocess.run(cmd, cwd=tmp_path, check=True, env=env)

    def exp_run(*sets: str) -> subprocess.CompletedProcess:
        args = [a for s in sets for a in ("-S", s)]
        return subprocess.run([sys.executable, "-m", "dvc", "exp", "run", "--dry", *args,
                               "check_params"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)

    done = exp_run(f"{SHA}=null", f"{FOLLOW}=headers")
    assert done.returncode == 0, done.stderr
    bad = exp_run("fetch.files.wikidata/triples/wd50k-train.csv.sha256=null")
    assert bad.returncode != 0 and "mismatched input '/'" in bad.stdout + bad.stderr
