"""scripts/adapt_trial.py: an objective's own options read from its name, and halves that
never share a sentence."""

import numpy as np
import pytest

from model.adapt.run import AdaptOptions
from scripts.adapt_trial import halves, options_of
from tests.model.tiny_regrab import toy_table


def test_an_objective_carries_its_own_options():
    base = AdaptOptions(lr=1e-5, share=0.5)
    got = options_of("pseudo:lr=3e-5:share=0.2:relabel=false:steps=7", base)
    assert (got.objective, got.lr, got.share, got.relabel, got.steps) == (
        "pseudo", 3e-5, 0.2, False, 7)
    assert isinstance(got.lr, float) and isinstance(got.steps, int)
    assert options_of("masked", base) == AdaptOptions(objective="masked", lr=1e-5, share=0.5)
    with pytest.raises(KeyError):
        options_of("pseudo:rate=1", base)


def test_the_halves_split_each_relation_and_share_no_sentence():
    table = toy_table(["P1", "P2"], 7, seed=0)
    first, second = halves(table, 0)
    a, b = (set(t.column("instance_id").to_pylist()) for t in (first, second))
    assert not a & b and len(a | b) == table.num_rows
    rel = np.asarray(first.column("relation").to_pylist())
    assert (rel == "P1").sum() == 3 and (rel == "P2").sum() == 3
