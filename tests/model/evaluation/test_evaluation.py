"""Tests for model/evaluation/splits.py and split_episodes.py without trained models:
episodes, NOTA keys, the split check.

Scoring trained models is tested through the stage (tests/stages/test_evaluate.py) and
``regrab-score`` (tests/cli/test_score.py).
"""

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from model.evaluation.config import EvalConfig
from model.evaluation.split_episodes import SplitEpisodes, detection_cell, nota_key
from model.evaluation.splits import TrainedOnTest, check_trained_on
from model.files.checkpoint import Checkpoint
from pipeline.errors import PipelineError
from pipeline.io import read_fewshot
from tests.conftest import model_config, section_config
from tests.model.tiny_regrab import toy_splits


def config(**overrides) -> EvalConfig:
    return section_config(EvalConfig, "evaluate", **{
        "settings": ["2w1s", "3w2s"], "episodes": 4, "queries": 2, "nota_rates": [],
        **overrides})


def test_nota_key_has_no_dot():
    assert nota_key("5w1s", 0.15) == "5w1s_r15" and nota_key("10w5s", 0.5) == "10w5s_r50"


def test_episodes_from_a_table_are_those_read_from_the_split_folder(tmp_path):
    """``regrab-score`` samples from an in-memory table what ``evaluate`` samples from files."""
    split = toy_splits(tmp_path) / "split_0"
    cfg = config()
    read = SplitEpisodes.read(split, cfg, 3)
    given = SplitEpisodes("split_0", read_fewshot(split / "test.parquet"), cfg, 3)
    assert read.name == given.name == "split_0" and given.val is None
    # The folder's validation relations are read for temperature scaling (not the test ones).
    assert cfg.temperature_episodes > 0 and set(read.calib) == {
        s for s in cfg.settings if not s.endswith("w0s")}
    assert not set(read.val.relations) & set(read.test.relations)
    for name in cfg.settings:
        for part in ("relation", "support", "query"):
            np.testing.assert_array_equal(getattr(read.plain[name], part),
                                          getattr(given.plain[name], part))
    other = SplitEpisodes("split_0", read_fewshot(split / "test.parquet"), cfg, 4)
    assert not np.array_equal(other.plain["2w1s"].support, read.plain["2w1s"].support)


def test_nota_needs_validation_sentences(tmp_path):
    split = toy_splits(tmp_path) / "split_0"
    cfg = config(settings=["2w1s"], nota_rates=[0.3], nota_settings=["2w1s"], nota_episodes=3)
    eps = SplitEpisodes.read(split, cfg, 0)
    assert eps.table.num_rows == eps.n_test + read_fewshot(split / "val.parquet").num_rows
    assert len(eps.nota_test["2w1s"]) == len(eps.nota_val["2w1s"]) == 1
    with pytest.raises(PipelineError, match="split_0 has no validation sentences"):
        SplitEpisodes("split_0", read_fewshot(split / "test.parquet"), cfg, 0)
    (split / "val.parquet").unlink()
    with pytest.raises(PipelineError, match="has no val.parquet"):
        SplitEpisodes.read(split, cfg, 0)


def test_check_trained_on_refuses_another_split():
    split, path = Path("splits/split_0"), Path("models/split_0/proto/model.safetensors")
    bare = Checkpoint(model_config("proto"), None, {})
    trained = dataclasses.replace(bare, params={"inputs": {"train": "a", "val": "b"}},
                                  relations={"train": ["P1"], "val": ["P2"]})
    check_trained_on(trained, split, {"train": "a", "val": "b"}, path, ["P6"])
    with pytest.raises(PipelineError, match="trained on another split"):
        check_trained_on(trained, split, {"train": "a", "val": "c"}, path, ["P6"])
    with pytest.raises(PipelineError, match="records no digest"):
        check_trained_on(bare, split, {"train": "a"}, path, ["P6"])
    with pytest.raises(PipelineError, match=r"holds relations \['P2'\]"):
        check_trained_on(trained, split, {"train": "a", "val": "b"}, path, ["P2", "P6"])
    # Trained on other training data (a champion before new data): scored unless it saw a
    # test relation.
    check_trained_on(trained, split, {"train": "x", "val": "y"}, path, ["P6"], same_inputs=False)
    with pytest.raises(TrainedOnTest, match=r"holds relations \['P1'\]"):
        check_trained_on(trained, split, {"train": "x", "val": "y"}, path, ["P1"],
                         same_inputs=False)


def test_data_without_validation_relations_makes_its_choices_on_other_episodes(tmp_path):
    """A transfer set passes itself as ``val``: NOTA thresholds and temperatures come from
    other episodes of the same sentences, read from the same encodings."""
    split = toy_splits(tmp_path) / "split_0"
    test = read_fewshot(split / "test.parquet")
    cfg = config(settings=["2w1s"], nota_rates=[0.3], nota_settings=["2w1s"], nota_episodes=3)
    eps = SplitEpisodes("split_0", test, cfg, 0, val=test)
    assert eps.table is test and eps.val_start == 0
    assert eps.val.relations == eps.test.relations
    assert set(eps.calib) == {"2w1s"} and len(eps.nota_val["2w1s"]) == 1
    assert not np.array_equal(eps.nota_val["2w1s"][0].support, eps.plain["2w1s"].support)
    own = SplitEpisodes.read(split, cfg, 0)
    assert own.val_start == own.n_test


def test_detection_cell_chooses_scores_on_validation():
    rng = np.random.default_rng(0)
    outside = rng.random((4, 30)) < 0.5
    good, noise = outside + rng.normal(0, 0.3, outside.shape), rng.normal(size=outside.shape)
    # On validation, mutual information separates best and entropy_ts is the best point score.
    val = {"max_prob": noise, "entropy_ts": good, "mutual_information": good + outside}
    test = {"max_prob": good, "entropy_ts": noise, "mutual_information": noise}
    cell = detection_cell(test, outside, val, outside)
    assert cell["best"] == "mutual_information" and cell["best_point"] == "entropy_ts"
    # The test numbers are those of the chosen score on test, whatever they are.
    assert cell["detection"]["max_prob"]["auroc"] > 90 > cell["detection"]["entropy_ts"]["auroc"]
    assert len(cell["roc"]) == 51 and cell["roc"][-1] == 100.0
