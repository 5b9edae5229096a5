import logging

import pyarrow as pa
import pytest
import torch

from model.graph_prior import GraphPrior, GraphPriorConfig, RelationGraph
from pipeline.schemas import GRAPH_SCHEMA


def _config(layers=1, hidden=5, kind="gcn"):
    """A full GraphPriorConfig (the dataclass has no defaults)."""
    return GraphPriorConfig(kind=kind, layers=layers, hidden=hidden, normalize_features=True,
                            scale=1.0)


def _graph(dim=6):
    rel = ["P1", "P2", "P3", "P4"]
    feats = torch.randn(4, dim, generator=torch.Generator().manual_seed(0))
    features = pa.table({"relation": rel, "embedding": pa.FixedSizeListArray.from_arrays(
        pa.array(feats.numpy().reshape(-1)), dim)})
    edges = pa.table({"src": ["P1", "P2", "P2", "P3", "P9"], "dst": ["P2", "P1", "P3", "P2", "P1"],
                      "weight": pa.array([1.0, 1.0, 0.5, 0.5, 1.0], pa.float32())},
                     schema=GRAPH_SCHEMA)
    return RelationGraph.from_tables(edges, features), feats


def test_from_tables_drops_edges_to_unknown_nodes():
    g, feats = _graph()
    assert g.edge_index.shape == (2, 4)  # the P9 edge is gone
    assert torch.allclose(g.features, feats)


@pytest.mark.parametrize("layers", [1, 2])
def test_prior_shapes_and_fallback(layers):
    g, _ = _graph()
    prior = GraphPrior(_config(layers=layers, hidden=5), g, out_dim=10)
    rows = prior.index(["P2", "P77", "P1"])
    assert rows.tolist() == [1, -1, 0]
    h = prior(rows[None])
    assert h.shape == (1, 3, 10)
    assert torch.equal(h[0, 1], prior.fallback)
    assert prior.node_states().shape == (4, 10)
    h.sum().backward()  # gradients reach the GCN weights and the fallback
    assert prior.convs[0].lin.weight.grad is not None and prior.fallback.grad is not None


def test_coverage_warns_and_falls_back(caplog):
    g, _ = _graph()
    prior = GraphPrior(_config(), g, out_dim=4)
    with caplog.at_level(logging.WARNING):
        assert prior.coverage(["P1", "P99"]) == ["P99"]
    assert "P99" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # another domain: every way gets the fallback
        assert prior.coverage(["P98", "P99"]) == ["P98", "P99"]
    assert "none of the 2" in caplog.text
    h = prior(prior.index(["P98", "P99"]))
    assert torch.equal(h, prior.fallback.expand(2, -1))


@pytest.mark.parametrize("layers", [1, 2])
def test_precomputed_propagation_equals_gcnconv(layers):
    g, _ = _graph()
    prior = GraphPrior(_config(layers=layers, hidden=5), g, out_dim=7)
    x = prior.features
    for i, conv in enumerate(prior.convs):
        x = conv(x, prior.edge_index, prior.edge_weight)
        if i < layers - 1:
            x = torch.relu(x)
    assert torch.allclose(prior.node_states(), x * prior.scale, atol=1e-5)
    rows = torch.tensor([[3, 0], [1, 1]])
    assert torch.allclose(prior(rows), (x * prior.scale)[rows], atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2])
def test_mlp_prior_is_a_feed_forward_network_over_each_embedding(layers):
    g, feats = _graph()
    prior = GraphPrior(_config(layers=layers, kind="mlp"), g, out_dim=3)
    x = feats / feats.norm(dim=1, keepdim=True)
    for i, conv in enumerate(prior.convs):
        x = conv.lin(x) + conv.bias
        if i < layers - 1:
            x = torch.relu(x)
    assert torch.allclose(prior.node_states(), x, atol=1e-6)
    assert torch.allclose(prior(torch.tensor([0, 2])), x[[0, 2]], atol=1e-6)
