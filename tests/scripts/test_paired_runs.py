"""scripts/paired_runs.py: two runs of a method scored on the same episodes."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.gate import NOT_COMPARABLE_EXIT
from stages import train
from tests.conftest import project_params
from tests.model.tiny_regrab import labels_of, toy_project, toy_train_sections

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import paired_runs  # noqa: E402


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("paired")
    enc, splits, graph, features = toy_project(root, n_splits=2)
    sections = toy_train_sections(enc)
    sections["evaluate"]["episodes"] = 6
    params = project_params(**sections)
    p = root / "params.yaml"
    p.write_text(yaml.safe_dump(params))
    train.main(["--splits", str(splits), "--graph", str(graph), "--features", str(features),
                "--relations", str(labels_of(graph)), "--out", str(root / "a"), "--params",
                str(p)])
    shutil.copytree(root / "a", root / "b")
    # Run B lacks proto.
    for split in ("split_0", "split_1"):
        shutil.rmtree(root / "b" / split / "proto")
    return root, splits, p


def test_the_same_run_twice_differs_by_nothing(runs):
    root, splits, p = runs
    out = paired_runs.main(["--splits", str(splits), "--a", str(root / "a"), "--b",
                            str(root / "a"), "--methods", "regrab,proto", "--settings",
                            "2w1s,2w0s", "--params", str(p)])
    assert set(out) == {"regrab", "proto"} and set(out["regrab"]) == {"2w1s", "2w0s"}
    for row in (out["regrab"]["2w1s"], out["proto"]["2w1s"]):
        assert row["diff"] == 0.0 and row["ci95"] == 0.0 and row["episode_ci95"] == 0.0
        assert row["a"] == row["b"] and 0.0 <= row["a"] <= 100.0
        assert set(row["per_split"]) == {"split_0", "split_1"}


def test_a_method_missing_from_one_run_is_an_error(runs):
    root, splits, p = runs
    with pytest.raises(PipelineError, match="proto"):
        paired_runs.main(["--splits", str(splits), "--a", str(root / "a"), "--b",
                          str(root / "b"), "--methods", "regrab,proto", "--settings", "2w1s",
                          "--params", str(p)])


def test_a_crash_while_writing_out_leaves_the_old_file(runs, tmp_path, monkeypatch):
    root, splits, p = runs
    out = tmp_path / "diff.json"
    out.write_text('{"old": 1}\n')
    real = Path.write_text

    def crash(self, text, *args, **kwargs):  # half the text reaches the disk, then a crash
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(Path, "write_text", crash)
    with pytest.raises(RuntimeError, match="mid-write"):
        paired_runs.main(["--splits", str(splits), "--a", str(root / "a"), "--b",
                          str(root / "a"), "--methods", "proto", "--settings", "2w1s",
                          "--params", str(p), "--out", str(out)])
    monkeypatch.undo()
    assert out.read_text() == '{"old": 1}\n' and sorted(tmp_path.iterdir()) == [out]


def test_relation_descriptions_reach_both_runs_as_evaluate_reads_them(runs, tmp_path,
                                                                      monkeypatch):
    root, splits, p = runs
    texts = tmp_path / "pid2name.json"
    texts.write_text('{"R0": ["first", "the first relation"], "R1": ["second"]}')
    seen = []
    real = paired_runs.evaluate_split

    def spy(*args, descriptions=None, **kwargs):
        seen.append(descriptions)
        return real(*args, descriptions=descriptions, **kwargs)

    monkeypatch.setattr(paired_runs, "evaluate_split", spy)
    paired_runs.main(["--splits", str(splits), "--a", str(root / "a"), "--b", str(root / "a"),
                      "--methods", "proto", "--settings", "2w1s", "--params", str(p),
                      "--relations", str(texts)])
    assert len(seen) == 4  # two splits, two runs each
    assert all(d == {"R0": "the first relation", "R1": None} for d in seen)
    # Without --relations: the pipeline's file when the project has one, else none.
    for there in (True, False):
        seen.clear()
        monkeypatch.setattr(paired_runs, "RELATIONS", texts if there else tmp_path / "none.json")
        paired_runs.main(["--splits", str(splits), "--a", str(root / "a"), "--b",
                          str(root / "a"), "--methods", "proto", "--settings", "2w1s",
                          "--params", str(p)])
        assert seen == [{"R0": "the first relation", "R1": None} if there else {}] * 4


def test_episodes_scores_fewer_episodes_than_evaluate(runs, monkeypatch):
    root, splits, p = runs
    seen = []
    real = paired_runs.evaluate_split

    def spy(split_dir, models, cfg, *args, **kwargs):
        seen.append(cfg.episodes)
        return real(split_dir, models, cfg, *args, **kwargs)

    monkeypatch.setattr(paired_runs, "evaluate_split", spy)
    args = ["--splits", str(splits), "--a", str(root / "a"), "--b", str(root / "a"),
            "--methods", "proto", "--settings", "2w1s", "--params", str(p)]
    paired_runs.main([*args, "--episodes", "3"])
    assert seen == [3] * 4
    with pytest.raises(PipelineError, match="--episodes"):
        paired_runs.main([*args, "--episodes", "-1"])


def test_a_champion_trained_on_other_data_is_paired_unless_it_saw_a_test_relation(runs,
                                                                                   tmp_path):
    """The scheduled retrain's gate: the promoted models trained before new training data
    (own relations) are scored on the run's test episodes all the same."""
    import dataclasses

    import numpy as np
    import pyarrow.parquet as pq

    from model.evaluation.config import EvalConfig
    from pipeline.config import load_section

    root, splits, p = runs
    moved = tmp_path / "splits"
    shutil.copytree(splits, moved)
    for split in moved.glob("split_*"):  # new training data: one sentence fewer
        table = pq.read_table(split / "train.parquet")
        pq.write_table(table.slice(0, table.num_rows - 1), split / "train.parquet")
    args = ["--splits", str(moved), "--a", str(root / "a"), "--b", str(root / "a"),
            "--methods", "regrab", "--settings", "2w1s", "--params", str(p)]
    with pytest.raises(PipelineError, match="trained on another split"):
        paired_runs.main(args)
    with pytest.raises(PipelineError, match="trained on another split"):  # B still is checked
        paired_runs.main([*args, "--a-trained-elsewhere"])
    cfg = dataclasses.replace(load_section(EvalConfig, "evaluate", p), settings=("2w1s",),
                              methods=("regrab",), floor=False, nota_rates=(),
                              nota_settings=(), temperature_episodes=0)
    got = paired_runs.episodes_of(root / "a", moved / "split_0", 0, cfg, same_inputs=False)
    want = paired_runs.episodes_of(root / "a", splits / "split_0", 0, cfg)
    assert got.keys() == want.keys() and got["regrab"].keys() == want["regrab"].keys()
    for setting, scores in want["regrab"].items():
        np.testing.assert_array_equal(got["regrab"][setting], scores)
    # Test relations it trained on: refused, other training or not.
    shutil.copy(splits / "split_0" / "train.parquet", moved / "split_0" / "test.parquet")
    with pytest.raises(PipelineError, match="holds relations"):
        paired_runs.episodes_of(root / "a", moved / "split_0", 0, cfg, same_inputs=False)
    with pytest.raises(SystemExit) as stopped:  # the gate's "not comparable"
        paired_runs.main([*args, "--a-trained-elsewhere"])
    assert stopped.value.code == NOT_COMPARABLE_EXIT
