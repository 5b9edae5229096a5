"""The few-shot GNN head (model/methods/gnn.py): a brute-force graph, way equivariance, independent
queries, any N and K, learning, and the whole train / evaluate / load path."""

import dataclasses

import pytest
import torch
from torch.nn import functional as F

from model.config import GNNConfig
from model.methods.gnn import METHODS, GNNHead
from tests.conftest import model_config
from tests.model import tiny_regrab as toy


def head_sizes(**changes) -> GNNConfig:
    """params.yaml's ``model.heads.gnn``, with ``changes``."""
    return dataclasses.replace(model_config("gnn").gnn, **changes)


@pytest.fixture(autouse=True)
def one_thread():
    with toy.single_thread():
        yield


def head(dim: int = 8, **sizes) -> GNNHead:
    torch.manual_seed(0)
    return GNNHead(head_sizes(**sizes), dim).double()


class TestCandidateWays(toy.CandidateWayHeadChecks):
    """Way equivariance, independent queries, any N and K in chunks, K = 0, learning."""

    head = staticmethod(head)
    ways_shots = [(2, 1), (5, 1), (5, 5), (10, 5), (1, 1)]

    @staticmethod
    def one_episode_per_chunk() -> GNNHead:
        return GNNHead(head_sizes(chunk_pairs=1), 8).double()

    @staticmethod
    def learner() -> GNNHead:
        return GNNHead(head_sizes(width=32, growth=16), 16)


def reference_scores(h: GNNHead, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """The module doc's equations, one candidate way and one query at a time, with explicit
    loops over the nodes (independent of the batched, masked implementation).

    Shapes:
        support: (N, K, D), query: (Q, D) -> (Q, N)
    """
    n, k, _ = support.shape
    out = torch.zeros(query.shape[0], n, dtype=support.dtype)
    for c in range(n):
        for j in range(query.shape[0]):
            sup = [torch.cat([h.embed(support[w, i]), support.new_tensor([float(w == c), 1.0])])
                   for w in range(n) for i in range(k)]
            qry = torch.cat([h.embed(query[j]), query.new_tensor([1.0 / n, 0.0])])
            enc = [support[w, i] for w in range(n) for i in range(k)]  # for the fixed metric
            g = h.log_gain.exp() if h.config.metric_temperature > 0 else 0.0
            layers = [*zip(h.adjacency, h.convs, strict=True), (h.out_adjacency, h.out)]
            for depth, (adj, conv) in enumerate(layers):
                def read(x, skip, adj=adj, sup=sup, enc=enc, g=g, x_q=query[j]):
                    """sum_j A_xj s_j over the supports j other than ``skip``."""
                    nb = [s for i, s in enumerate(sup) if i != skip]
                    if not nb:
                        return torch.zeros_like(x)
                    x_enc = x_q if skip is None else enc[skip]
                    e = torch.stack([adj.mlp((adj.project(x) - adj.project(s)).abs())[0]
                                     - g / 2 * (x_enc - enc[i]).pow(2).sum()
                                     for i, s in enumerate(sup) if i != skip])
                    return (torch.softmax(e, 0)[:, None] * torch.stack(nb)).sum(0)

                def gc(x, skip, conv=conv, read=read):
                    return conv.linear(torch.cat([x, read(x, skip)]))

                if depth == len(layers) - 1:
                    out[j, c] = gc(qry, None)[0]
                else:
                    new_sup = [torch.cat([s, F.leaky_relu(gc(s, i))]) for i, s in enumerate(sup)]
                    qry = torch.cat([qry, F.leaky_relu(gc(qry, None))])
                    sup = new_sup
    return out


def test_scores_match_the_graph_computed_node_by_node():
    h = head(layers=2, width=6, growth=4, metric_hidden=5)
    support, query = toy.random_episode(3, 2, 2)
    with torch.no_grad():
        got = h.sample_logits(support, query)  # (B, 1, Q, N)
        for b in range(2):
            torch.testing.assert_close(got[b, 0], reference_scores(h, support[b], query[b]))


def test_gnn_trains_evaluates_and_loads(tmp_path):
    with toy.registered(*METHODS):  # trained on 2w1s; 3w2s has more ways and shots
        model, metrics = toy.train_evaluate_reload(tmp_path, ["gnn"], ways=[2], shots=[1])
    assert isinstance(model.head, GNNHead) and model.config.method == "gnn"
    norm = model.head.embed[1].weight
    assert not torch.equal(norm, torch.ones_like(norm))  # its parameters trained
    for setting in ("2w1s", "3w2s"):
        assert 0 <= metrics["nyt25"]["gnn"][setting] <= 100
