"""Tests for model/transe/training.py: triples to ids, the held-out slice, checkpoints and
:func:`train` called directly (the stage's own runs are in tests/stages/test_train_transe.py)."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from model.transe.model import TransE
from model.transe.optim import make_optimizer
from model.transe.training import (
    CHECKPOINT_NAME,
    TrainTransEParams,
    encode_triples,
    load_transe,
    save_transe,
    split_heldout,
    train,
)
from pipeline.config import load_section
from tests.stages.test_train_transe import TINY_CONFIG, _table, geo_triples, write_params


def test_split_keeps_every_id_in_training():
    data = encode_triples(_table(geo_triples(10, 3, 2)))
    train_ids, held = split_heldout(data.triples, 0.3, seed=3)
    assert len(held) > 0 and len(train_ids) + len(held) == len(data.triples)
    assert set(map(tuple, held)).isdisjoint(map(tuple, train_ids))
    assert set(held[:, [0, 2]].ravel()) <= set(train_ids[:, [0, 2]].ravel())
    assert set(held[:, 1]) <= set(train_ids[:, 1])


def test_ids_do_not_depend_on_row_order():
    triples = geo_triples(4, 2, 2)
    a = encode_triples(_table(triples))
    b = encode_triples(_table(triples[::-1] + triples[:3]))  # reversed, three repeated
    np.testing.assert_array_equal(a.triples, b.triples)
    np.testing.assert_array_equal(a.relations, b.relations)
    assert (a.duplicates, b.duplicates) == (0, 3)


def test_checkpoint_round_trip_and_refusal(tmp_path, caplog):
    gen = torch.Generator().manual_seed(0)
    model = TransE(6, 2, TINY_CONFIG, gen)
    path = tmp_path / CHECKPOINT_NAME
    save_transe(path, model, make_optimizer(model), gen, 2, [0.5, 0.4], "h", {"k": 1},
                ["P1", "P2"])
    state = load_transe(path, TINY_CONFIG, "h")
    assert state["epoch"] == 2 and state["losses"] == [0.5, 0.4]
    torch.testing.assert_close(state["model"]["relations"], model.relations.detach())
    # More epochs continue the same trajectory; anything else starts over, with a notice.
    more = load_transe(path, dataclasses.replace(TINY_CONFIG, epochs=9), "h")
    assert more["epoch"] == 2 and more["losses"] == [0.5, 0.4]
    with caplog.at_level(logging.WARNING, logger="model.transe.training"):
        assert load_transe(path, TINY_CONFIG, "other") is None
        assert load_transe(path, dataclasses.replace(TINY_CONFIG, lr=0.01), "h") is None
    assert "other triples" in caplog.text and "other params" in caplog.text


def test_train_returns_the_relation_table_and_report(tmp_path):
    write_params(tmp_path / "params.yaml")
    params = load_section(TrainTransEParams, "train_transe", tmp_path / "params.yaml")
    table, report = train(_table(geo_triples()), params, "cpu")
    assert table.column("relation").to_pylist() == ["P1376", "P150", "P17", "P30", "P36"]
    assert report["resumed_from_epoch"] == 0 and report["epochs"] == TINY_CONFIG.epochs
    assert not list(tmp_path.glob("**/" + CHECKPOINT_NAME))  # no folder: no checkpoint
