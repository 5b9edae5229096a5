from pathlib import Path

import pytest
import yaml

from pipeline.errors import PipelineError
from pipeline.overrides import flatten, overrides


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
    assert 'model.encoder="bert-base-uncased"' in args


def test_whitespace_value_rejected() -> None:
    with pytest.raises(PipelineError, match="whitespace"):
        overrides({"model": {"encoder": "a b"}}, {"model": {"encoder": "x"}})
