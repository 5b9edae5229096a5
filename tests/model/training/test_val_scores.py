"""The uncertainty a checkpoint keeps of its validation relations (model/files/score_quantiles.py,
model/training/val_scores.py) and how ``Predictor`` abstains by it (model/predict/abstain.py)."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from model.encoder.frozen_cache import LowerCache, encode_all
from model.episodes import EpisodeSampler, Setting
from model.evaluation.uncertainty import POINT_SCORES, SCORES
from model.files.checkpoint import read_checkpoint, read_payload, save_checkpoint, save_payload
from model.files.loader import load_model
from model.files.model_folder import export
from model.files.model_folder import read as read_folder
from model.files.score_quantiles import LEVELS, ScoreQuantiles
from model.predict.abstain import cutoff_for, nearest
from model.predict.predictor import Predictor
from model.training import val_scores
from pipeline.errors import PipelineError
from tests.model.predict.test_predictor import RELATIONS, _queries, _support, tiny_checkpoint
from tests.model.tiny_regrab import toy_table


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("val_scores")


@pytest.fixture(scope="module")
def table():
    return toy_table(RELATIONS, 8, seed=5)


def synthetic(ways=5, shots=1, scores=POINT_SCORES, default="max_prob", spread=1.0):
    """A stored setting whose every score has quantiles 0, 0.01 * spread, ..., spread."""
    return ScoreQuantiles(ways, shots, 250, 0.8, {k: tuple(LEVELS * spread) for k in scores},
                          default, {k: 50.0 + i for i, k in enumerate(scores)}, "made up")


def with_scores(path, out, stored):
    """A copy of the checkpoint at ``path`` that stores ``stored`` at ``out``."""
    save_checkpoint(out, dataclasses.replace(read_checkpoint(path), val_scores=tuple(stored)))
    return out


def test_stored_scores_come_back_from_a_file_and_a_model_folder(folder):
    stored = (synthetic(), synthetic(shots=5, scores=SCORES, default="mutual_information"))
    path = with_scores(tiny_checkpoint(folder), folder / "m.safetensors", stored)
    back = read_checkpoint(path)
    assert back.val_scores == stored
    assert list(read_payload(path))[-1] == "val_scores"
    _, loaded = load_model(path)
    assert loaded.val_scores == stored
    out = export(back, path, folder / "exported", with_encoder=False)
    assert read_folder(out).val_scores == stored


def _setting(**change):
    tree = {**dataclasses.asdict(synthetic()), **change}
    tree["quantiles"] = {k: list(v) for k, v in tree["quantiles"].items()}
    return tree


MALFORMED = {
    "nan quantile": ([_setting(quantiles={"max_prob": [*LEVELS[:50], math.nan, *LEVELS[51:]]})],
                     "nan is not a finite number"),
    "text ways": ([_setting(ways="5")], "ways 5 is not a count"),
    "bool shots": ([_setting(shots=True)], "shots True is not a count"),
    "one way": ([_setting(ways=1)], "1 ways"),
    "huge list": ([_setting(quantiles={"max_prob": [0.0] * 100_000})],
                  "max_prob quantiles are not a list of 101"),
    "too many settings": ([_setting()] * 17, "17 settings, over 16"),
    "decreasing": ([_setting(quantiles={"max_prob": list(LEVELS[::-1])})], "decrease"),
    "default not stored": ([_setting(default="entropy", auroc={},
                                     quantiles={"max_prob": list(LEVELS)})],
                           "default 'entropy' is not a stored score"),
    "list as default": ([_setting(default=["max_prob"])], r"""max_prob'\]" is not a stored"""),
    "auroc over 100": ([_setting(auroc={"max_prob": 101.0})], "auroc is not a percentage"),
    "missing key": ([{k: v for k, v in _setting().items() if k != "reason"}],
                    "not a record of"),
    "tensor temperature": ([_setting(temperature=torch.ones(1))], "is not a finite number"),
    "zero temperature": ([_setting(temperature=0.0)], "temperature 0.0 is not a positive"),
    "odd score name": ([_setting(quantiles={"Max Prob!": list(LEVELS)}, default="Max Prob!",
                                 auroc={})], "is not a score"),
    "number as score name": ([_setting(quantiles={7: list(LEVELS)}, default=7, auroc={})],
                             "score name '7' is not a score"),
    "not a list": ({"5w1s": _setting()}, "has dict for 'val_scores'"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_stored_scores_are_refused_in_one_line(folder, case):
    value, message = MALFORMED[case]
    path = folder / "hostile.safetensors"
    save_payload(path, {**read_payload(tiny_checkpoint(folder)), "val_scores": value})
    with pytest.raises(PipelineError, match=message) as info:
        read_checkpoint(path)
    assert "\n" not in str(info.value) and "retrain it" in str(info.value)
    with pytest.raises(PipelineError, match=message):
        Predictor.from_checkpoint(path)


def test_a_checkpoint_without_stored_scores_abstains_only_when_told(folder, table):
    """An older file loads and predicts; its default is never to abstain, an explicit rate
    is refused with what to do, a threshold or a rate of 0 works."""
    path = tiny_checkpoint(folder)
    assert read_checkpoint(path).val_scores is None
    queries, _ = _queries(table)
    pred = Predictor.from_checkpoint(path)
    pred.set_support(_support(table, [2, 2, 2]))
    got = pred.predict(queries)
    assert not got.abstain.any() and got.abstain_score is None
    assert "stores no uncertainty on validation relations" in got.rule.text
    for kw in ({"abstain_rate": 0.1}, {"abstain_score": "entropy"}):
        with pytest.raises(PipelineError, match="retrain it, or abstain by a threshold"):
            Predictor.from_checkpoint(path, **kw)
    assert not Predictor(pred.model, abstain_rate=0.0).val_scores
    by_threshold = Predictor(pred.model, threshold=0.99, abstain_rate=0.3)
    by_threshold.set_support(_support(table, [2, 2, 2]))
    got = by_threshold.predict(queries)
    assert got.abstain.tolist() == (got.confidence < 0.99).tolist()
    assert "overrides the abstain rate" in got.rule.text


@pytest.mark.parametrize(("kw", "message"), [
    ({"abstain_rate": 1.0}, r"abstain rate 1.0 is not a share in \[0, 1\)"),
    ({"abstain_rate": -0.1}, "abstain rate -0.1"),
    ({"abstain_score": "confidence"}, "abstain score 'confidence' is unknown"),
    ({"threshold": 1.5}, "threshold 1.5 is not a probability"),
])
def test_bad_abstain_requests_are_refused(folder, kw, message):
    model = Predictor.from_checkpoint(tiny_checkpoint(folder)).model
    with pytest.raises(PipelineError, match=message):
        Predictor(model, val_scores=[synthetic()], **kw)


def test_abstain_fires_at_the_stored_quantile(folder, table):
    """Quantiles of the queries' own scores stored as the validation ones: a rate R abstains
    on the queries above the (1 - R) quantile, about R of them."""
    queries, _ = _queries(table, skip=1)
    pred = Predictor.from_checkpoint(tiny_checkpoint(folder), seed=3)
    pred.set_support(_support(table, [1, 1, 1]))
    scores = pred.predict(queries).scores
    quantiles = {k: tuple(np.quantile(v, LEVELS)) for k, v in scores.items()}
    quantiles["max_prob_ts"] = quantiles["max_prob"]  # what a temperature of 1 gives
    stored = ScoreQuantiles(3, 1, len(queries), 1.0, quantiles, "entropy", {}, "test")
    for rate in (0.5, 0.2, 0.0):
        pred = Predictor(pred.model, seed=3, abstain_rate=rate, val_scores=[stored])
        pred.set_support(_support(table, [1, 1, 1]))
        got = pred.predict(queries)
        assert got.rule.score == "entropy" and got.rule.setting == stored
        above = scores["entropy"] > np.quantile(scores["entropy"], 1 - rate)
        assert got.abstain.tolist() == (above if rate else np.zeros_like(above)).tolist()
        assert abs(got.abstain.mean() - rate) <= 1 / len(queries)
        assert [r["abstain_score"] for r in got.records()] == pytest.approx(scores["entropy"])
    assert got.rule.text == "never (abstain rate 0; abstain_score holds entropy)"
    # Another score can be named; the tempered ones use the stored temperature.
    pred = Predictor(pred.model, seed=3, abstain_rate=0.5, abstain_score="max_prob_ts",
                     val_scores=[stored])
    pred.set_support(_support(table, [1, 1, 1]))
    got = pred.predict(queries)
    np.testing.assert_allclose(got.scores["max_prob_ts"], scores["max_prob"], atol=1e-12)
    assert abs(got.abstain.mean() - 0.5) <= 1 / len(queries)
    assert "top_prob_ts below" in got.rule.text  # written as the tempered top probability
    assert "quantile on in-set queries of the checkpoint's validation setting 3w1s" in \
        got.rule.text
    assert [r["top_prob_ts"] for r in got.records()] == pytest.approx(
        1 - got.scores["max_prob_ts"])
    assert Predictor(pred.model, abstain_score="top_logit", val_scores=[stored]
                     ).abstain_score == "top_logit"  # the written name is accepted
    pred.val_scores = (dataclasses.replace(stored, temperature=0.5),)
    got = pred.predict(queries)
    tempered = np.exp(np.log(got.probs) / 0.5)
    np.testing.assert_allclose(got.scores["max_prob_ts"],
                               1 - (tempered / tempered.sum(1, keepdims=True)).max(1), rtol=1e-9)


def test_the_cutoff_is_read_for_the_support_s_shots(folder, table):
    """Not the setting of the support's fewest shots: between the stored 1- and 5-shot
    settings in 1/K, at the support's mean 1/K, so a 3-shot or a mostly 1-shot support gets
    its own cutoff; outside the stored shots, the nearest setting."""
    stored = [synthetic(shots=1), synthetic(shots=5, spread=0.5)]
    # Nearest in 1/K: 2 shots (0.5) are nearer 5 shots (0.2) than 1 (1.0).
    assert nearest(stored, 3, [2, 2]).shots == 5 and nearest(stored, 3, [1, 2]).shots == 1
    assert nearest(stored, 5, [0, 1]).shots == 1 and nearest(stored, 5, [3, 3]).shots == 5
    # 1/K: 1-shot 1.0, 5-shot 0.2; the 0.5 quantiles 0.5 and 0.25.
    for shots, want in (([1, 1, 1], 0.5), ([5, 5, 5], 0.25), ([8, 9, 10], 0.25),
                        ([3, 3, 3], 0.25 + 0.25 * (1 / 3 - 0.2) / 0.8),
                        ([5, 1, 1, 1, 1], 0.25 + 0.25 * (0.84 - 0.2) / 0.8),
                        ([0, 1, 1], 0.5)):
        got, used = cutoff_for(stored, len(shots), shots, "max_prob", 0.5)
        assert got == pytest.approx(want), shots
        assert len(used) == (2 if 0.25 < want < 0.5 else 1)
    # The nearest ways first: a 10-way setting is not mixed into a 5-way support's cutoff.
    wide = [*stored, synthetic(ways=10, shots=1, spread=2.0)]
    assert cutoff_for(wide, 4, [3, 3, 3, 3], "max_prob", 0.5)[0] == pytest.approx(
        cutoff_for(stored, 4, [3, 3, 3, 3], "max_prob", 0.5)[0])
    assert cutoff_for(wide, 9, [1] * 9, "max_prob", 0.5)[0] == pytest.approx(1.0)
    proto = tiny_checkpoint(folder, "proto")
    pred = Predictor.from_checkpoint(with_scores(proto, folder / "p.safetensors", stored),
                                     abstain_rate=0.5)
    for shots, cutoff, where in (
            ([1, 1, 1], 0.5, "validation setting 5w1s, nearest this 3-way 1-shot support"),
            ([5, 5, 5], 0.25, "validation setting 5w5s, nearest this 3-way 5-shot support"),
            ([1, 5, 1], 0.25 + 0.25 * (11 / 15 - 0.2) / 0.8,
             "validation settings 5w1s and 5w5s, interpolated in 1/K for this 3-way 1-5-shot "
             "(mean 1/K 0.73) support")):
        pred.set_support(_support(toy_table(RELATIONS, 8, seed=5), shots))
        rule = pred.abstain_rule()
        assert rule.cutoff == pytest.approx(cutoff) and rule.score == "max_prob"
        assert rule.written == "top_prob" and rule.written_cutoff == pytest.approx(1 - cutoff)
        assert rule.text == (f"top_prob below {1 - cutoff:.4g}, its 0.5 quantile on in-set "
                             f"queries of the checkpoint's {where}")
    with pytest.raises(PipelineError, match="mutual_information does not apply to this proto "
                                            "checkpoint .*give one of top_prob, top_gap"):
        Predictor(pred.model, abstain_score="mutual_information", val_scores=stored
                  ).set_support(_support(table, [1, 1, 1]))


@pytest.mark.parametrize(("relations", "default_is_fallback"), [(4, False), (2, True)])
def test_validation_scores_of_a_model(folder, relations, default_is_fallback):
    """Quantiles of every score on in-set validation queries; the default by AUROC on
    outside queries from the other validation relations, or max_prob with too few."""
    model = Predictor.from_checkpoint(tiny_checkpoint(folder)).model
    val = toy_table([f"P{i}" for i in range(1, relations + 1)], 12, seed=7)
    enc = encode_all(model.encoder, model.encoder.tokenize(val), LowerCache())
    sampler = EpisodeSampler(val.column("relation").to_pylist())
    rows = model.rows(sampler.relations)
    got = val_scores.setting_scores(model, enc, sampler, rows, Setting(5, 1), 5, seed=9)
    assert (got.ways, got.shots, got.queries) == (relations, 1, val_scores.EPISODES * relations
                                                  * 5)
    assert list(got.quantiles) == list(SCORES) and got.temperature > 0
    for q in got.quantiles.values():
        assert len(q) == 101 and all(b >= a for a, b in zip(q, q[1:], strict=False))
    assert got == val_scores.setting_scores(model, enc, sampler, rows, Setting(5, 1), 5, seed=9)
    if default_is_fallback:
        assert got.default == "max_prob" and got.auroc == {}
        assert "the 2 validation relations leave none outside" in got.reason
    else:
        assert set(got.auroc) == set(SCORES)
        assert got.auroc[got.default] == max(got.auroc.values())
        assert "3-way 1-shot validation episodes with 50%" in got.reason
    # K + Q beyond a relation's sentences: fewer queries; no query left: no record.
    assert val_scores.setting_scores(model, enc, sampler, rows, Setting(5, 12), 5, 9) is None
