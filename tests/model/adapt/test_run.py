"""Adapting an encoder to unlabelled sentences (model/adapt/): what each objective changes,
the budget, and the adapted checkpoint."""

import itertools

import numpy as np
import pytest
import torch

from model.adapt.objectives import (
    fold_moments,
    info_nce,
    masked_copy,
    pooled_moments,
)
from model.adapt.run import AdaptOptions, adapt, adapted_checkpoint, over_length, tokenize
from model.encoder.frozen_cache import LowerCache, encode_all
from model.files.checkpoint import read_checkpoint, save_checkpoint
from model.files.loader import load_model
from model.predict.sentences import Sentence, parse_sentence
from pipeline.errors import PipelineError
from tests.model.predict.test_predictor import tiny_checkpoint
from tests.model.tiny_regrab import toy_table


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return tiny_checkpoint(tmp_path_factory.mktemp("adapt"))


@pytest.fixture(scope="module")
def domain():
    rows = toy_table(["P1", "P2", "P3", "P4"], 8, seed=5).to_pylist()
    return [parse_sentence(r) for r in rows]


def _quiet(options, model, domain, **kw):
    return adapt(model, domain, options, progress=False, say=lambda line: None, **kw)


def test_centring_folds_the_domain_mean_out_of_the_pooled_states(ckpt, domain):
    model, _ = load_model(ckpt)
    tokens, cache = tokenize(model, domain), LowerCache()
    mu, sigma, count = pooled_moments(model.encoder, tokens, cache)
    assert count > len(domain) and mu.abs().max() > 0.05  # the untrained states are offset
    fold_moments(model.encoder, mu, None)
    after, same_sigma, _ = pooled_moments(model.encoder, tokens, cache)
    assert after.abs().max() < 1e-4
    assert torch.allclose(same_sigma, sigma, atol=1e-4)


def test_whitening_gives_every_dimension_the_same_spread(ckpt, domain):
    model, _ = load_model(ckpt)
    tokens, cache = tokenize(model, domain), LowerCache()
    mu, sigma, _ = pooled_moments(model.encoder, tokens, cache)
    assert sigma.max() / sigma.min() > 1.5
    fold_moments(model.encoder, mu, sigma)
    after_mu, after_sigma, _ = pooled_moments(model.encoder, tokens, cache)
    assert after_mu.abs().max() < 1e-4
    assert torch.allclose(after_sigma, torch.full_like(after_sigma, float(sigma.mean())),
                          rtol=1e-3)


def test_info_nce_matches_its_definition():
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 6, generator=gen), torch.randn(5, 6, generator=gen)
    na, nb = a / a.norm(dim=1, keepdim=True), b / b.norm(dim=1, keepdim=True)
    sim = (na @ nb.T / 0.1).double()
    rows = -(sim.diag() - sim.logsumexp(1)).mean()
    cols = -(sim.diag() - sim.logsumexp(0)).mean()
    assert float(info_nce(a, b, 0.1)) == pytest.approx(float((rows + cols) / 2), rel=1e-5)
    assert float(info_nce(a, a, 0.1)) < float(info_nce(a, b, 0.1))


def test_the_masked_copy_hides_the_entities_and_keeps_the_spans():
    s = Sentence(("a", "b", "c", "d", "e"), (0, 2), (3, 4))
    m = masked_copy(s, "[MASK]")
    assert m.tokens == ("[MASK]", "[MASK]", "c", "[MASK]", "e")
    assert (m.head, m.tail) == (s.head, s.tail)


@pytest.mark.parametrize("objective", ["contrastive", "masked", "centre"])
def test_adapting_changes_the_stored_encoder_weights_only(ckpt, domain, objective):
    model, source = load_model(ckpt)
    before = {k: v.clone() for k, v in model.trainable_state().items()}
    record = _quiet(AdaptOptions(objective=objective, steps=3, batch_size=8, lr=1e-3),
                    model, domain)
    after = model.trainable_state()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith("encoder.") for k in moved)
    assert record["objective"] == objective and record["sentences"] == len(domain)
    assert record["steps"] == (0 if objective == "centre" else 3)
    out = adapted_checkpoint(source, model, record)
    assert out.config == source.config and out.val_scores == source.val_scores
    assert all(torch.equal(out.state[k], after[k]) for k in moved)


def test_the_adapted_checkpoint_loads_and_records_the_adaptation(ckpt, domain, tmp_path):
    model, source = load_model(ckpt)
    record = _quiet(AdaptOptions(steps=2, batch_size=8), model, domain)
    path = tmp_path / "adapted.safetensors"
    save_checkpoint(path, adapted_checkpoint(source, model, record))
    again, stored = load_model(path)
    assert stored.summary["adaptation"][0]["digest"] == record["digest"]
    tokens = tokenize(model, domain)
    model.eval()
    assert torch.allclose(encode_all(again.encoder, tokens, None),
                          encode_all(model.encoder, tokens, None), atol=1e-6)
    # Adapting the adapted model keeps both records.
    twice = adapted_checkpoint(stored, again, record)
    assert len(twice.summary["adaptation"]) == 2
    assert read_checkpoint(path).summary["adaptation"][0]["steps"] == 2


def test_seeded_runs_repeat_exactly(ckpt, domain):
    states = []
    for _ in range(2):
        model, _ = load_model(ckpt)
        rec = _quiet(AdaptOptions(steps=2, batch_size=8, lr=1e-3, seed=3), model, domain)
        states.append((model.trainable_state(), rec["loss_last"]))
    assert states[0][1] == states[1][1]
    assert all(torch.equal(v, states[1][0][k]) for k, v in states[0][0].items())


def test_a_budget_that_cannot_fit_one_step_is_refused_before_any_change(ckpt, domain):
    model, _ = load_model(ckpt)
    before = {k: v.clone() for k, v in model.trainable_state().items()}
    ticks = itertools.count(step=30.0)  # every reading of the clock 30 s later
    with pytest.raises(PipelineError, match="cannot fit one step"):
        _quiet(AdaptOptions(minutes=0.5, steps=5, batch_size=8), model, domain,  # 30 s a step
               clock=lambda: next(ticks))
    assert all(torch.equal(v, model.trainable_state()[k]) for k, v in before.items())


def test_a_budget_too_short_for_every_sentence_adapts_to_a_drawn_part(ckpt, domain):
    model, _ = load_model(ckpt)
    ticks = itertools.count(step=1.0)  # 1/32 s per sentence (32 timed), 1 s per step
    notes = []
    rec = adapt(model, domain, AdaptOptions(minutes=1.5 / 60, steps=5, batch_size=8),
                progress=False, say=notes.append, clock=lambda: next(ticks))
    assert (rec["sentences"], rec["given"]) == (16, len(domain))
    assert any("holds 16 of the 32 sentences" in line for line in notes)


def test_steps_are_cut_to_the_budget(ckpt, domain):
    model, _ = load_model(ckpt)
    ticks = itertools.count(step=1.0)
    rec = _quiet(AdaptOptions(minutes=0.1, steps=1000, batch_size=8), model, domain,
                 clock=lambda: next(ticks))  # 6 s: 1 s for the sentences, 1 s a step
    assert 0 < rec["steps"] <= 5


def test_sentences_longer_than_the_encoder_reads_are_refused(ckpt, domain):
    model, _ = load_model(ckpt)
    long = Sentence(tuple(["w1"] * 200), (0, 1), (5, 6))
    assert over_length(model, [*domain, long]) == [len(domain)]
    with pytest.raises(PipelineError, match="longer than the encoder's"):
        tokenize(model, [*domain, long])
    with pytest.raises(PipelineError, match="no sentences"):
        tokenize(model, [])


@pytest.mark.parametrize("bad", [{"minutes": 0}, {"lr": float("nan")}, {"steps": 0},
                                 {"batch_size": 1}, {"objective": "mlm"}, {"anchor": -1.0}])
def test_bad_options_are_one_line(bad):
    with pytest.raises(PipelineError):
        AdaptOptions(**bad)


def test_rows_of_the_masked_view_follow_the_sentences(ckpt, domain):
    from model.adapt.run import views

    model, _ = load_model(ckpt)
    tokens, offset = views(model, domain, "masked")
    assert offset == len(domain) and len(tokens) == 2 * len(domain)
    mask_id = model.encoder.tokenizer.mask_token_id
    i = 0
    start, end = tokens.head[offset + i][1:]
    assert np.all(tokens.ids[offset + i][start:end] == mask_id)
    assert views(model, domain, "contrastive")[1] == 0
