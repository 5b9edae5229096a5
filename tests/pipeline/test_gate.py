"""pipeline/gate.py: the champion/challenger decision on synthetic paired tables."""

from __future__ import annotations

import math

import pytest

from pipeline.errors import PipelineError
from pipeline.gate import NO_CHAMPION, UNCHANGED, PromoteConfig, decide, headline

SETTINGS = ("5w1s", "10w1s")
CFG = PromoteConfig(benchmarks=("nyt25",), settings=SETTINGS, headline_margin=0.0,
                    setting_margin=2.0, episodes=0, webhook="")


def cell(per_split: dict[str, float], base: float = 80.0, episode_ci95: float = 0.5) -> dict:
    """One paired_runs cell: B - A per split (points), A at ``base``."""
    diff = sum(per_split.values()) / len(per_split)
    return {"a": base, "b": base + diff, "diff": diff, "ci95": None,
            "episode_ci95": episode_ci95, "per_split": per_split}


def table(**settings: dict[str, float]) -> dict:
    return {"regrab": {s: cell(v) for s, v in settings.items()}}


def test_no_champion_promotes_the_first_version():
    decision = decide(None, CFG)
    assert decision.promote and decision.gate == NO_CHAMPION
    assert decision.summary() == "promoted (gate: no champion)"


def test_promotes_a_challenger_that_is_not_worse():
    tables = {"nyt25": table(**{"5w1s": {"split_0": 0.5, "split_1": -0.3, "split_2": 0.1},
                                "10w1s": {"split_0": -1.0, "split_1": 0.4, "split_2": 0.2}})}
    decision = decide(tables, CFG)
    assert decision.promote, decision.reasons
    assert decision.gate == "passed"
    head = next(r for r in decision.rows if r["setting"] == "headline")
    # The headline's difference: each split's mean over the settings, then their mean.
    assert head["diff"] == pytest.approx(round((-0.25 + 0.05 + 0.15) / 3, 2))
    assert head["verdict"] == "ok"


def test_refuses_a_headline_worse_beyond_its_interval():
    # Every split about a point worse in both settings: a tight interval below zero,
    # while no single setting falls by the 2-point margin.
    tables = {"nyt25": table(**{"5w1s": {"split_0": -1.0, "split_1": -1.1, "split_2": -0.9},
                                "10w1s": {"split_0": -1.2, "split_1": -1.0, "split_2": -1.1}})}
    decision = decide(tables, CFG)
    assert not decision.promote
    assert decision.gate == "failed"
    assert len(decision.reasons) == 1 and "nyt25 headline" in decision.reasons[0]
    assert decision.summary().startswith("not promoted: nyt25 headline -1.05")
    # A wide enough margin lets the same challenger through.
    relaxed = PromoteConfig(**{**CFG.__dict__, "headline_margin": 1.0})
    assert decide(tables, relaxed).promote


def test_a_noisy_headline_inside_its_interval_passes():
    tables = {"nyt25": table(**{"5w1s": {"split_0": -3.0, "split_1": 2.0, "split_2": 0.5},
                                "10w1s": {"split_0": -2.0, "split_1": 1.5, "split_2": 0.0}})}
    assert decide(tables, CFG).promote


def test_refuses_one_setting_falling_by_more_than_its_margin():
    # The headline is flat (a gain in 5w1s offsets it), but 10w1s falls 2.5 points.
    tables = {"nyt25": table(**{"5w1s": {"split_0": 3.0, "split_1": 2.0, "split_2": 2.5},
                                "10w1s": {"split_0": -2.0, "split_1": -3.0, "split_2": -2.5}})}
    decision = decide(tables, CFG)
    assert not decision.promote
    assert decision.reasons == ("nyt25 10w1s -2.50 points, below -2",)
    verdicts = {r["setting"]: r["verdict"] for r in decision.rows}
    assert verdicts == {"5w1s": "ok", "10w1s": "falls", "headline": "ok"}


def test_every_benchmark_must_pass():
    good = table(**{"5w1s": {"split_0": 0.1, "split_1": 0.2},
                    "10w1s": {"split_0": 0.0, "split_1": 0.3}})
    bad = table(**{"5w1s": {"split_0": -4.0, "split_1": -5.0},
                   "10w1s": {"split_0": 0.0, "split_1": 0.1}})
    cfg = PromoteConfig(**{**CFG.__dict__, "benchmarks": ("nyt25", "fewrel")})
    decision = decide({"nyt25": good, "fewrel": bad}, cfg)
    assert not decision.promote
    assert all(r.startswith("fewrel") for r in decision.reasons)
    with pytest.raises(PipelineError, match="no paired table for fewrel"):
        decide({"nyt25": good}, cfg)


def test_one_split_uses_the_pooled_episode_interval():
    one = {"regrab": {"5w1s": cell({"split_0": -0.5}, episode_ci95=0.6),
                      "10w1s": cell({"split_0": -0.5}, episode_ci95=0.8)}}
    head = headline(one, SETTINGS)
    assert head["diff"] == pytest.approx(-0.5)
    assert head["ci95"] == pytest.approx(math.sqrt(0.6**2 + 0.8**2) / 2)


def test_missing_setting_is_one_clear_error():
    with pytest.raises(PipelineError, match="no regrab score for 10w1s"):
        headline(table(**{"5w1s": {"split_0": 1.0}}), SETTINGS)


def test_an_unchanged_benchmark_passes_and_says_so_while_the_other_decides():
    cfg = PromoteConfig(benchmarks=("nyt25", "fewrel"), settings=SETTINGS, headline_margin=0.0,
                        setting_margin=2.0, episodes=0, webhook="")
    worse = table(**{"5w1s": {"split_0": -1.0, "split_1": -1.1, "split_2": -0.9},
                     "10w1s": {"split_0": -1.2, "split_1": -1.0, "split_2": -1.1}})
    decision = decide({"nyt25": UNCHANGED, "fewrel": worse}, cfg)
    assert not decision.promote and len(decision.reasons) == 1
    assert decision.reasons[0].startswith("fewrel headline")
    nyt = [r for r in decision.rows if r["benchmark"] == "nyt25"]
    assert [r["setting"] for r in nyt] == [*SETTINGS, "headline"]
    assert all(r["verdict"] == UNCHANGED and r["diff"] == 0.0 and r["champion"] is None
               for r in nyt)
    decision = decide({"nyt25": UNCHANGED, "fewrel": UNCHANGED}, cfg)
    assert decision.promote and decision.gate == "passed"
