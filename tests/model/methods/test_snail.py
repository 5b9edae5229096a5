"""The SNAIL head (model/methods/snail.py): causal blocks against a loop, one sequence per query,
way equivariance, any N and K, learning, and the whole train / evaluate / load path."""

import dataclasses

import pytest
import torch

from model.config import SnailConfig
from model.methods.snail import METHODS, AttentionBlock, DenseBlock, SnailHead
from tests.conftest import model_config
from tests.model import tiny_regrab as toy


def head_sizes(**changes) -> SnailConfig:
    """params.yaml's ``model.heads.snail``, with ``changes``."""
    return dataclasses.replace(model_config("snail").snail, **changes)


def head(dim: int = 8, **sizes) -> SnailHead:
    torch.manual_seed(0)
    return SnailHead(head_sizes(**sizes), dim).double()


@pytest.fixture(autouse=True)
def one_thread():
    with toy.single_thread():
        yield


def test_blocks_match_the_paper_equations_position_by_position():
    """On one plain sequence (no queries after it), each block against a loop over t."""
    torch.manual_seed(0)
    x = torch.randn(2, 7, 5, dtype=torch.double)
    dense = DenseBlock(5, 3, dilation=2).double()
    attn = AttentionBlock(5, 4, 3).double()
    with torch.no_grad():
        got_d, got_a = dense(x, 7), attn(x, 7)
        for t in range(7):
            before = x[:, t - 2] if t >= 2 else torch.zeros_like(x[:, t])
            z = dense.conv(torch.cat([x[:, t], before], -1))
            want = torch.cat([x[:, t], torch.tanh(z[:, :3]) * torch.sigmoid(z[:, 3:])], -1)
            torch.testing.assert_close(got_d[:, t], want)
            past = x[:, :t + 1]  # positions u <= t
            logits = (attn.query(x[:, t])[:, None] * attn.key(past)).sum(-1) / 2.0
            read = (torch.softmax(logits, -1)[..., None] * attn.value(past)).sum(1)
            torch.testing.assert_close(got_a[:, t], torch.cat([x[:, t], read], -1))


def test_sharing_the_prefix_is_one_sequence_per_query():
    h = head()
    support, query = toy.random_episode(3, 2, 4)
    x = h.sequences(support, query)  # (G, M + Q, F)
    m = 6
    shared = h.trunk(x, m)
    for i in range(4):
        alone = h.trunk(x[:, [*range(m), m + i]], m + 1)  # the sequence [s_1 .. s_M, q_i]
        torch.testing.assert_close(alone[:, -1], shared[:, m + i])
        torch.testing.assert_close(alone[:, :m], shared[:, :m])


def test_supports_are_ordered_by_content_and_labelled_by_the_candidate_way():
    h = head(dim=4)
    h.direction.copy_(torch.tensor([1.0, 0.0, 0.0, 0.0]))
    support = torch.zeros(1, 2, 2, 4, dtype=torch.double)
    support[0, :, :, 0] = torch.tensor([[3.0, 1.0], [0.0, 2.0]])  # order: w1, w0, w1, w0
    x = h.sequences(support, torch.zeros(1, 1, 4, dtype=torch.double))  # (2, 5, F)
    torch.testing.assert_close(x[:, :4, -2], torch.tensor([[0.0, 1, 0, 1], [1, 0, 1, 0]],
                                                          dtype=torch.double))
    assert (x[:, :4, -1] == 1).all() and (x[:, 4, -2:] == 0).all()


class TestCandidateWays(toy.CandidateWayHeadChecks):
    """Way equivariance, independent queries, any N and K in chunks, K = 0, learning."""

    ways_shots = [(2, 1), (5, 1), (5, 5), (10, 5), (1, 1), (10, 10)]
    head = staticmethod(head)

    @staticmethod
    def learner() -> SnailHead:
        return SnailHead(head_sizes(width=32, filters=8), 16)

    @staticmethod
    def one_episode_per_chunk() -> SnailHead:
        return SnailHead(head_sizes(chunk_positions=1), 8).double()


def test_snail_trains_evaluates_and_loads(tmp_path):
    with toy.registered(*METHODS):  # trained on 2w1s; 3w2s has more ways and shots
        model, metrics = toy.train_evaluate_reload(tmp_path, ["snail"], ways=[2], shots=[1])
    assert isinstance(model.head, SnailHead) and model.config.method == "snail"
    fresh = SnailHead(head_sizes(), model.head.direction.shape[0])
    torch.testing.assert_close(model.head.direction, fresh.direction)  # the order is saved
    norm = model.head.embed[1].weight
    assert not torch.equal(norm, torch.ones_like(norm))  # its parameters trained
    for setting in ("2w1s", "3w2s"):
        assert 0 <= metrics["nyt25"]["snail"][setting] <= 100
