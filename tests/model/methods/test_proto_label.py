"""``proto_label``: the support mean combined with the relation label's encoding."""

import pytest
import torch

from model.methods import registry
from model.methods.base import PrototypeHead
from model.methods.proto_label import METHODS, LabelPrior, ProtoLabelHead
from model.prior.gcn import GraphPriorConfig
from pipeline.errors import PipelineError
from tests.model.prior.test_graph_prior import _labelled_graph
from tests.model.tiny_regrab import random_episode, registered, train_evaluate_reload


def _prior(text=True, dim=6):
    cfg = GraphPriorConfig(kind="gcn", layers=1, hidden=5, normalize_features=True, scale=1.0,
                           text=text, descriptions=False, mix="fixed",
                           zero_shot_mean=False, named="graph_mean")
    return LabelPrior(cfg, _labelled_graph({"P1": "w1", "P2": "w2 w3"}), out_dim=dim)


def test_label_weight_zero_is_proto_on_the_same_episode():
    head = ProtoLabelHead(_prior(), "euclidean", 5.0)
    support, query = random_episode(n=4, k=3, q=7, dim=6)
    h = torch.randn(2, 4, 6, generator=torch.Generator().manual_seed(2), dtype=torch.double)
    with torch.no_grad():
        head.label_weight.fill_(0.0)
    proto = PrototypeHead("euclidean", 5.0)
    assert torch.allclose(head.log_predictive(support, query, h),
                          proto.log_predictive(support, query), atol=1e-6)
    with torch.no_grad():
        head.label_weight.fill_(2.0)
    v = head.prototypes(support, h)
    assert torch.allclose(v, (support.sum(2) + 2.0 * h) / 5.0, atol=1e-6)
    assert not torch.allclose(head.log_predictive(support, query, h),
                              proto.log_predictive(support, query))
    # no support: the label mean alone classifies (zero-shot)
    assert torch.equal(head.prototypes(support[:, :, :0], h), h)


def test_the_label_mean_reads_no_graph():
    prior = _prior()
    prior.set_text([0, 1], torch.randn(2, 6, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        prior.base.normal_()
        prior.text_gain.fill_(0.5)
    rows = prior.index(["P1", "P2", "P3", "P99"])
    h = prior(rows)
    assert torch.allclose(h[0], prior.base + 0.5 * prior.text[0])
    assert torch.allclose(h[2], prior.base)  # in the list, no label
    assert torch.equal(h[3], prior.fallback)  # unknown relation
    assert [prior.prior_kind(r) for r in ("P1", "P3", "P99")] == ["label", "fallback", "fallback"]
    prior.labels = None  # as loaded from a checkpoint: the label strings are not saved
    assert [prior.prior_kind(r) for r in ("P1", "P3", "P99")] == ["label", "fallback", "fallback"]
    assert len(prior.convs) == 0 and torch.allclose(prior.node_states()[rows[:3]], h[:3])
    with pytest.raises(PipelineError, match="prior.text: true"):
        _prior(text=False)


def test_proto_label_trains_evaluates_and_loads(tmp_path):
    with registered(*METHODS):
        assert "proto_label" in registry.names()
        model, metrics = train_evaluate_reload(tmp_path, ["proto_label", "proto"], ("2w1s", "2w0s"))
    assert isinstance(model.head, ProtoLabelHead) and float(model.head.label_weight) != 1.0
    assert {"2w1s", "2w0s"} <= set(metrics["nyt25"]["proto_label"])
    assert "2w0s" not in metrics["nyt25"]["proto"]
