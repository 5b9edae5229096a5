"""Tests for stages/check_params.py: the whole params file checked before any stage runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError, run_cli
from stages import check_params as cp

ROOT = Path(__file__).resolve().parents[2]


def _params(tmp_path: Path, edit=None) -> Path:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if edit is not None:
        edit(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def test_the_project_params_pass_and_the_output_is_a_fixed_sentence(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the encoder folder and relative paths resolve from the root
    out = tmp_path / "checked"
    cp.main(["--params", str(ROOT / "params.yaml"), "--out", str(out)])
    assert out.read_text() == cp.CHECKED


def test_a_bad_value_in_a_downstream_section_fails_and_writes_nothing(tmp_path, capsys):
    path = _params(tmp_path, lambda p: p["train"].__setitem__("steps", -5))
    out = tmp_path / "checked"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:  # as `python -m stages.check_params` runs it
        run_cli(cp.main, ["--params", str(path), "--out", str(out)])
    assert exc.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "train.steps" in lines[0] and "fix params.yaml" in lines[0]
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]  # no temporary left


def test_a_benchmark_override_is_checked_as_train_reads_it(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    path = _params(tmp_path, lambda p: p["benchmarks"]["fewrel"]["train"].__setitem__(
        "steps", "abc"))
    with pytest.raises(PipelineError, match="steps"):
        cp.main(["--params", str(path), "--out", str(tmp_path / "checked")])


def test_a_section_no_stage_reads_is_refused(tmp_path):
    path = _params(tmp_path, lambda p: p.__setitem__("trian", {"steps": 5}))
    with pytest.raises(PipelineError, match="trian.*no stage reads"):
        cp.main(["--params", str(path), "--out", str(tmp_path / "checked")])


def test_every_stage_runs_after_check_params():
    """DVC runs stages upstream first: check_params must be upstream of every other stage."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(ROOT)) as repo:
        graph = repo.index.graph  # edges point from a stage to the stages it depends on
        stages = {stage.addressing: stage for stage in graph.nodes}
        check = stages.pop("check_params")
        late = sorted(name for name, stage in stages.items()
                      if check not in nx.descendants(graph, stage))
    assert late == []
    # The whole file is tracked, so any changed value makes the check stale.
    with Repo(str(ROOT)) as repo:
        (stage,) = repo.stage.collect("check_params")
        (dep,) = stage.params
        assert Path(dep.def_path).name == "params.yaml" and not dep.params


@pytest.mark.parametrize(("section", "key", "value", "message"), [
    ("evaluate", "settings", ["5w1s", "1w1s"], "setting 1w1s has 1 way(s)"),
    ("fetch", "files", {}, "fetch.files is empty"),
    ("train", "device", "tpu", "train.device = 'tpu': expected auto, cpu, cuda or cuda:N"),
    ("train", "methods", ["regrab", "regrab"], "train.methods lists regrab more than once"),
])
def test_values_that_would_run_wrong_are_refused(tmp_path, monkeypatch, section, key, value,
                                                 message):
    monkeypatch.chdir(ROOT)
    path = _params(tmp_path, lambda p: p[section].__setitem__(key, value))
    with pytest.raises(PipelineError, match="fix params.yaml$") as err:
        cp.main(["--params", str(path), "--out", str(tmp_path / "checked")])
    assert message in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize(("key", "value", "message"), [
    ("evaluate.unequal_settings", ["5w1-999s"],
     "5w1-999s: 999 shots + evaluate.queries 5 = 1004 sentences per relation, more than the "
     "100 each nyt25 test relation holds"),
    ("evaluate.unequal_settings", ["30w1-5s"],
     "30w1-5s: 30 ways, more than the 10 test relations of each nyt25 split"),
    ("evaluate.settings", ["30w1s"], "30w1s: 30 ways, more than the 10 test relations"),
    ("evaluate.settings", ["5w96s"], "give at most 95 shots"),
    ("split_nyt.test_relations", 4, "5w1s: 5 ways, more than the 4 test relations"),
    ("split_fewrel.max_per_relation", 50, "more than the 50 each fewrel test relation holds"),
    ("evaluate.unequal_episodes", 10**12, "evaluate.unequal_episodes 1000000000000 would need"),
    ("evaluate.settings", ["5w1s", "5w5s", "5w1s"], "evaluate.settings lists 5w1s more than "
                                                    "once"),
    ("evaluate.unequal_settings", ["5w1-5s", "5w1-5s"], "evaluate.unequal_settings lists "
                                                         "5w1-5s more than once"),
    ("active_labelling.methods", {"regrab": ["bald"], "proto": ["bald"]},
     "active_labelling.methods.proto has bald"),
    ("active_labelling.methods", {"proto_label": ["entropy", "bald"]},
     "active_labelling.methods.proto_label has bald"),
])
def test_values_that_failed_after_training_are_refused(tmp_path, monkeypatch, key, value,
                                                       message):
    """Each passed every check and failed only when evaluate (or the labelling simulation)
    drew its episodes, after the models had trained."""
    monkeypatch.chdir(ROOT)
    section, name = key.split(".")
    if key == "split_fewrel.max_per_relation":  # 50 sentences: 5w50s no longer fits
        def edit(p):
            p[section][name] = value
            p["evaluate"]["settings"] = ["5w1s", "5w50s"]
    else:
        def edit(p):
            p[section][name] = value
    path = _params(tmp_path, edit)
    with pytest.raises(PipelineError, match="fix params.yaml$") as err:
        cp.main(["--params", str(path), "--out", str(tmp_path / "checked")])
    assert message in str(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


def test_the_largest_settings_that_fit_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)

    def edit(p):
        p["evaluate"]["settings"] = ["10w95s"]
        p["evaluate"]["unequal_settings"] = ["10w1-95s"]
        p["active_labelling"]["methods"] = {"versa": ["bald"], "bmaml": ["bald"]}
    path = _params(tmp_path, edit)
    cp.check_params(yaml.safe_load(path.read_text()), yaml.safe_load(path.read_text()), {},
                    ROOT)
