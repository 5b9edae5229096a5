"""Self-training on the prior's pseudo-labels (model/adapt/pseudo.py): which sentences are kept,
the loss, and that adapting with it changes the stored encoder weights only."""

import math

import numpy as np
import pytest
import torch

from model.adapt.pseudo import PseudoTarget, prior_means, relations_digest, select
from model.adapt.run import AdaptOptions, adapt, adapted_checkpoint
from model.files.loader import load_model
from model.predict.sentences import parse_sentence
from pipeline.errors import PipelineError
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table

#: A team's relations, none of them in the toy graph (P1..P9), named after the toy verbs.
NAMED = {"R1": ("verb1", "w1 verb1 w2"), "R2": ("verb2", None), "R3": ("verb3 of", None)}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("pseudo"))


@pytest.fixture(scope="module")
def domain():
    rows = toy_table(["P1", "P2", "P3"], 8, seed=6).to_pylist()
    return [parse_sentence(r) for r in rows]


def _quiet(options, model, domain, **kw):
    return adapt(model, domain, options, progress=False, say=lambda line: None, **kw)


def test_each_relation_keeps_its_equal_part_most_confident_first():
    # Relation 0 is given sentences 0-7, relation 1 sentences 8-9.
    conf = np.array([0.6, 0.9, 0.7, 0.95, 0.55, 0.8, 0.65, 0.75, 0.9, 0.6])
    probs = np.stack([conf, 1 - conf], 1)
    probs[8:] = probs[8:, ::-1]
    kept = select(probs, share=0.4)  # at most ceil(0.4 * 10 / 2) = 2 per relation
    assert kept.tolist() == [1, 3, 8, 9]
    # Even keeping all it may, relation 0 keeps only its equal part, 5 of its 8.
    assert select(probs, share=1.0).tolist() == [1, 2, 3, 5, 7, 8, 9]
    assert len(select(np.tile(probs, (10, 1)), share=0.1)) == 2 * math.ceil(0.1 * 100 / 2)


def test_the_loss_is_the_cross_entropy_of_the_euclidean_logits():
    gen = torch.Generator().manual_seed(0)
    x, means = torch.randn(4, 6, generator=gen), torch.randn(3, 6, generator=gen)
    labels = np.array([2, -1, 0, 1, 1, 0])
    rows = np.array([0, 2, 3, 5])
    target = PseudoTarget(labels, means, "euclidean", 2.5)
    logits = -((x[:, None] - means[None]) ** 2).sum(-1) / (2 * 2.5)  # (4, 3)
    want = -(logits.log_softmax(1)[torch.arange(4), torch.tensor([2, 0, 1, 0])]).mean()
    assert float(target.loss(x, rows)) == pytest.approx(float(want), rel=1e-5)
    assert target.kept.tolist() == [0, 2, 3, 4, 5]


def test_the_prior_reads_the_team_s_names(ckpt):
    model, _ = load_model(ckpt)
    model.eval()
    means = prior_means(model, NAMED, None)
    assert means.shape == (3, model.prior.fallback.shape[0])
    assert (means[0] - means[1]).abs().max() > 1e-3  # the names, not one fallback for all
    renamed = prior_means(model, {**NAMED, "R1": ("verb7", None)}, None)
    assert torch.allclose(renamed[1:], means[1:]) and not torch.allclose(renamed[0], means[0])


def test_pseudo_changes_the_stored_encoder_weights_only(ckpt, domain):
    model, source = load_model(ckpt)
    before = {k: v.clone() for k, v in model.trainable_state().items()}
    options = AdaptOptions(objective="pseudo", steps=6, batch_size=8, lr=1e-3, share=0.5)
    record = _quiet(options, model, domain, relations=NAMED)
    after = model.trainable_state()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("encoder.") for k in moved)
    assert record["steps"] == 6 and record["loss"] == "cross-entropy"
    assert record["relations"] == 3 and record["relations_digest"] == relations_digest(NAMED)
    first, second = record["labelling"]  # labelled again half-way
    assert 0 < first["kept"] <= 3 * math.ceil(0.5 * len(domain) / 3)
    assert first["most_per_relation"] <= math.ceil(0.5 * len(domain) / 3)
    assert 0 <= second["same_label"] <= 1
    out = adapted_checkpoint(source, model, record)
    assert out.config == source.config
    assert all(torch.equal(out.state[k], source.state[k]) for k in source.state
               if not k.startswith("encoder."))
    # The names the prior read are not saved: the adapted model knows only its graph.
    again, _ = load_model(ckpt)
    assert again.prior.named == [] and again.rows(["R1"]).tolist() == [-1]


def test_without_relabelling_the_sentences_are_labelled_once(ckpt, domain):
    model, _ = load_model(ckpt)
    record = _quiet(AdaptOptions(objective="pseudo", steps=2, batch_size=8, relabel=False),
                    model, domain, relations=NAMED)
    assert len(record["labelling"]) == 1


def test_seeded_pseudo_runs_repeat_exactly(ckpt, domain):
    states = []
    for _ in range(2):
        model, _ = load_model(ckpt)
        rec = _quiet(AdaptOptions(objective="pseudo", steps=2, batch_size=8, lr=1e-3, seed=2),
                     model, domain, relations=NAMED)
        states.append((model.trainable_state(), rec["loss_last"], rec["labelling"]))
    assert states[0][1:] == states[1][1:]
    assert all(torch.equal(v, states[1][0][k]) for k, v in states[0][0].items())


@pytest.mark.parametrize("relations", [None, {}, {"R1": ("verb1", None)}])
def test_pseudo_without_two_named_relations_is_refused_before_any_change(ckpt, domain,
                                                                          relations):
    model, _ = load_model(ckpt)
    before = {k: v.clone() for k, v in model.trainable_state().items()}
    with pytest.raises(PipelineError, match="--relations"):
        _quiet(AdaptOptions(objective="pseudo", steps=2, batch_size=8), model, domain,
               relations=relations)
    assert all(torch.equal(v, model.trainable_state()[k]) for k, v in before.items())


def test_pseudo_needs_a_prior_that_reads_names(tmp_path, domain):
    model, _ = load_model(tiny_checkpoint(tmp_path, method="proto"))
    with pytest.raises(PipelineError, match="reads relation names"):
        _quiet(AdaptOptions(objective="pseudo", steps=2, batch_size=8), model, domain,
               relations=NAMED)


@pytest.mark.parametrize("share", [0, -0.5, 1.5, float("nan")])
def test_a_bad_share_is_one_line(share):
    with pytest.raises(PipelineError, match="--share"):
        AdaptOptions(objective="pseudo", share=share)


def test_pseudo_has_its_own_defaults_the_best_measured():
    assert (AdaptOptions(objective="pseudo").lr, AdaptOptions(objective="pseudo").share) == (
        3e-5, 0.2)
    assert AdaptOptions(objective="masked").lr == 1e-4
    assert AdaptOptions(objective="pseudo", lr=1e-3).lr == 1e-3
