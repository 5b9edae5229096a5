"""A relation's description in the prior, and a prior that knows when it is wrong."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pytest
import torch

from model.config import upgrade
from model.posterior.langevin import LangevinSampler
from model.posterior.target import gaussian_posterior, way_precision
from model.prior.gcn import GraphPrior
from model.prior.graph import RelationGraph
from model.prior.labels import DESCRIPTION_WORDS, description_words, label_sentence
from pipeline.schemas import GRAPH_SCHEMA, RELATION_TEXT_SCHEMA
from tests.model.posterior.test_langevin import _cfg
from tests.model.prior.test_graph_prior import _config, _graph, _tiny_encoder


def test_the_label_sentence_reads_the_description_after_the_entities():
    row = label_sentence("P175", "performer", "actor, musician or band")
    assert row["tokens"] == ["subject", "performer", "object", ":", "actor,", "musician", "or",
                             "band"]
    toks = row["tokens"]
    assert toks[row["head_start"]:row["head_end"]] == ["subject"]
    assert toks[row["tail_start"]:row["tail_end"]] == ["object"]
    assert label_sentence("P1", "a b", None)["tokens"] == ["subject", "a", "b", "object"]
    assert label_sentence("P1", "a b", "  ")["tokens"] == ["subject", "a", "b", "object"]


def test_a_description_is_cut_to_its_first_clause_and_a_few_words():
    said = ("located on the specified landform. Should not be used when the value is only "
            "political (P131)")
    assert description_words(said) == ["located", "on", "the", "specified", "landform"]
    assert description_words("a; b c") == ["a"]
    assert description_words("version 2.0 of the item") == ["version", "2.0", "of", "the",
                                                            "item"]
    long = " ".join(f"w{i}" for i in range(50))
    assert len(description_words(long)) == DESCRIPTION_WORDS


def _described_graph():
    g, _ = _graph()
    edges = pa.table({"src": ["P1"], "dst": ["P2"], "weight": pa.array([1.0], pa.float32())},
                     schema=GRAPH_SCHEMA)
    features = pa.table({"relation": g.relations, "embedding": pa.FixedSizeListArray.from_arrays(
        pa.array(g.features.numpy().reshape(-1)), g.features.shape[1])})
    relations = pa.table({"relation": ["P1", "P2", "P3"], "label": ["w1", "w2", None],
                          "description": ["w6 w7", None, "w8"]}, schema=RELATION_TEXT_SCHEMA)
    return RelationGraph.from_tables(edges, features, relations)


def test_the_graph_carries_descriptions_and_the_prior_reads_them_when_asked():
    g = _described_graph()
    assert g.descriptions == ["w6 w7", None, "w8", None]
    reads = GraphPrior(_config(text=True, descriptions=True), g, out_dim=8)
    rows, table = reads.label_rows()
    assert rows == [0, 1]  # P3 has a description but no label: no label sentence
    assert table.column("tokens").to_pylist() == [["subject", "w1", "object", ":", "w6", "w7"],
                                                  ["subject", "w2", "object"]]
    assert reads.described.tolist() == [True, False, False, False]
    names_only = GraphPrior(_config(text=True, descriptions=False), g, out_dim=8)
    _, table = names_only.label_rows()
    assert table.column("tokens").to_pylist() == [["subject", "w1", "object"],
                                                  ["subject", "w2", "object"]]
    assert "described" not in names_only.state_dict()


def test_text_kinds_say_what_each_way_read(tmp_path):
    encoder = _tiny_encoder(tmp_path)
    prior = GraphPrior(_config(text=True, descriptions=True), _described_graph(),
                       out_dim=encoder.out_dim)
    prior.read_labels(encoder, None, 4)
    prior.add_names({"w4_w5": "w4 w5", "w9": "w9", "P98": None}, encoder,
                    descriptions={"w4_w5": "w6 w7"})
    kinds = {r: prior.text_kind(r) for r in ("P1", "P2", "P3", "w4_w5", "w9", "P98")}
    assert kinds == {"P1": "name+description", "P2": "name", "P3": "no text",
                     "w4_w5": "name+description", "w9": "name", "P98": "no text"}
    # A description changes what the prior reads; names only ignores it.
    h = prior(prior.index(["w4_w5", "w9"]))
    plain = GraphPrior(_config(text=True, descriptions=False), _described_graph(),
                       out_dim=encoder.out_dim)
    plain.load_state_dict({k: v for k, v in prior.state_dict().items() if k != "described"})
    plain.add_names({"w4_w5": "w4 w5", "w9": "w9"}, encoder, descriptions={"w4_w5": "w6 w7"})
    assert plain.text_kind("w4_w5") == "name"
    g = plain(plain.index(["w4_w5", "w9"]))
    assert not torch.allclose(h[0], g[0]) and torch.allclose(h[1], g[1])


def test_episode_precision_keeps_lambda_near_the_prior_and_drops_it_far_away():
    torch.manual_seed(0)
    d, k, lam, var = 64, 5, 4.0, 0.5
    h = torch.zeros(2, 3, d)
    near = torch.randn(1, 3, k, d) * var ** 0.5  # support around h: the priors are right
    far = 3.0 + torch.randn(1, 3, k, d) * var ** 0.5  # support far from h: they are wrong
    support = torch.cat([near, far])
    prec = way_precision(support, h, lam, var)  # (2, 1, 1): one precision per episode
    assert prec.shape == (2, 1, 1)
    assert prec[0, 0, 0] == pytest.approx(lam)  # clamped: never more confident than lambda
    gap = (far.mean(2) - h[1:]).pow(2).sum(-1).mean() / d - var / k
    assert prec[1, 0, 0] == pytest.approx(float(1 / gap), rel=1e-5)
    assert prec[1, 0, 0] < lam / 20
    # The posterior then follows the support in the far episode: the closed form per way.
    mean, post_var = gaussian_posterior(support, h, prec, var)
    assert post_var.shape == (2, 3, 1)
    for b in range(2):
        p = float(prec[b, 0, 0])
        expect = (p * h[b] + support[b].sum(1) / var) / (p + k / var)
        assert torch.allclose(mean[b], expect, atol=1e-5)
        assert torch.allclose(post_var[b], torch.full((3, 1), 1 / (p + k / var)))


def test_the_sampler_uses_way_precision_only_when_asked():
    torch.manual_seed(1)
    support, h = 2.0 + torch.randn(2, 3, 2, 16), torch.zeros(2, 3, 16)
    base = _cfg(likelihood="gaussian", scales="fixed", prior_precision=2.0,
                likelihood_variance=0.5, noise_eval=False)
    fixed = LangevinSampler(dataclasses.replace(base, prior_trust="fixed")).eval()
    evidence = LangevinSampler(dataclasses.replace(base, prior_trust="evidence")).eval()
    assert fixed.support_precision(support, h) == 2.0
    assert evidence.support_precision(support, h).shape == (2, 1, 1)
    # Far support: the evidence prior pulls the prototypes less towards h = 0.
    v_fixed, v_evidence = fixed(support, h), evidence(support, h)
    assert v_evidence.norm() > v_fixed.norm()
    # Zero-shot has no evidence: both give the prior mean.
    empty = support[:, :, :0]
    assert torch.equal(fixed(empty, h), evidence(empty, h))


def test_the_softmax_likelihoods_keep_lambda():
    support, h = 2.0 + torch.randn(1, 2, 2, 8), torch.zeros(1, 2, 8)
    sampler = LangevinSampler(_cfg(likelihood="softmax", prior_trust="evidence"))
    assert sampler.support_precision(support, h) == sampler.precision


def test_checkpoints_written_before_keep_their_behaviour():
    old = upgrade({"prior": {"text": True}, "langevin": {"eval_samples": 0}})
    assert old["prior"]["descriptions"] is False
    assert old["langevin"]["prior_trust"] == "fixed"


def test_checkpoints_written_before_the_heldout_mix_keep_their_prior():
    old = upgrade({"prior": {"text": True}})["prior"]
    assert old["mix"] == "fixed" and old["zero_shot_mean"] is False
    assert old["named"] == "fallback"  # a named relation's graph term was the fallback
