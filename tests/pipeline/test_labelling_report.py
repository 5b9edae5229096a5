"""The active-labelling summary: curves over splits, paired gains over random, the bar."""

import numpy as np
import pytest

from pipeline import labelling_report, report


def _acc(curves):
    """(T, B=2, A) accuracies whose episode means are ``curves`` (T, A), in fractions."""
    c = np.asarray(curves, dtype=float) / 100
    return np.stack([c - 0.01, c + 0.01], axis=1)


def test_curves_gains_and_the_bar_are_paired_per_split():
    axis = labelling_report.labels_axis(1, 2, 2)
    assert axis == [1.0, 1.5, 2.0, 2.5, 3.0]
    strategies = {"regrab": ["bald", "random"], "proto": ["entropy"]}
    bald = {"split_0": [50, 60, 70, 80, 90], "split_1": [50, 56, 66, 70, 80]}
    rand = {"split_0": [50, 52, 54, 56, 58], "split_1": [50, 50, 60, 62, 64]}
    acc = {"set": {
        "regrab": {s: _acc(np.stack([bald[s], rand[s]], 1)) for s in bald},
        "proto": {s: _acc(np.array(rand[s])[:, None]) for s in bald}}}
    out = labelling_report.summarise(acc, strategies, axis, bar_labels=2)
    curve = out["set"]["regrab"]["bald"]
    assert curve["accuracy"] == [50.0, 58.0, 68.0, 75.0, 85.0]
    assert curve["ci95"][0] == 0.0
    assert curve["ci95"][3] == pytest.approx(report.interval([80, 70])["ci95"], abs=0.01)
    assert curve["per_split"]["split_1"] == bald["split_1"]
    gain = curve["minus_random"]
    diffs = [np.mean(np.subtract(bald[s], rand[s])) for s in bald]
    assert gain["diff"] == pytest.approx(np.mean(diffs), abs=0.01)
    assert gain["ci95"] == pytest.approx(report.interval(diffs)["ci95"], abs=0.01)
    assert "minus_random" not in out["set"]["regrab"]["random"]
    assert "minus_random" not in out["set"]["proto"]["entropy"]  # proto runs no random
    bar = out["bar"]["set"]
    assert (bar["bald_labels"], bar["random_labels"]) == (2.0, 3.0)
    assert bar["per_split"] == {"split_0": 70 - 58, "split_1": 66 - 64}
    assert bar["diff"] == 7.0 and (bar["bald"], bar["random"]) == (68.0, 61.0)
    table = labelling_report.markdown(out, {"set": "A set"}, "note")
    assert "| regrab | bald | 50.0 ± 0.0 | 68.0 ± " in table
    assert "The bar: REGRAB+BALD with 2 labels per relation (68.0) minus random with 3 " \
           "(61.0): +7.0 ± " in table
    lines = labelling_report.curves_csv(out, ["set"]).splitlines()
    assert lines[0] == "labels_per_relation,set_regrab_bald,set_regrab_random,set_proto_entropy"
    assert lines[2] == "1.5,58.00,51.00,51.00"
