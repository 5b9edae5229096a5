"""The pair head (model/methods/pair.py): pair logits against a loop over (query, way, shot) through
the plain transformer layers, a joint (non-additive) pair score, ways that read only their
own shots, way equivariance, exact chunks, learning, and the train / evaluate / load path."""

import dataclasses

import pytest
import torch

from model.config import PairConfig
from model.methods.pair import METHODS, PairHead
from tests.conftest import model_config
from tests.model import tiny_regrab as toy


def head_sizes(**changes) -> PairConfig:
    """params.yaml's ``model.heads.pair``, with ``changes``."""
    return dataclasses.replace(model_config("pair").pair, **changes)


@pytest.fixture(autouse=True)
def one_thread():
    with toy.single_thread():
        yield


def head(dim: int = 8, **sizes) -> PairHead:
    """A seeded float64 head in eval mode (dropout off, so repeated calls agree)."""
    torch.manual_seed(0)
    return PairHead(head_sizes(**sizes), dim).double().eval()


class TestCandidateWays(toy.CandidateWayHeadChecks):
    """Way equivariance, shot invariance, independent queries, any N and K in chunks,
    K = 0, learning."""

    head = staticmethod(head)
    ways_shots = [(2, 1), (5, 1), (5, 5), (10, 5), (1, 1), (10, 10)]
    # A pair head scores a way from its own shots alone: the inherited check of coupled
    # ways does not apply; test_a_way_reads_only_its_own_shots checks the opposite.
    test_it_is_a_head_whose_ways_are_coupled = None

    @staticmethod
    def one_episode_per_chunk() -> PairHead:
        return PairHead(head_sizes(chunk_pairs=1), 8).double().eval()

    @staticmethod
    def learner() -> PairHead:
        # Two layers: the toy's classes are isotropic, so block i of the query must meet
        # block i of the support, which takes token-to-token attention to learn in 60 steps.
        return PairHead(head_sizes(width=64, layers=2, dropout=0.0), 16)


def test_a_way_reads_only_its_own_shots():
    h = head()
    assert not h.couples_ways and h.prior is None
    support, query = toy.random_episode(4, 3, 5)
    with torch.no_grad():
        logits = h.sample_logits(support, query)  # (B, 1, Q, N)
        other = support.clone()
        other[:, 1:] = torch.randn_like(other[:, 1:]) * 3  # every way but way 0
        changed = h.sample_logits(other, query)
        torch.testing.assert_close(changed[..., 0], logits[..., 0])
        assert not torch.allclose(changed[..., 1:], logits[..., 1:], atol=1e-3)
        # Each way's shots in its own order: every logit stays.
        shuffled = torch.stack([support[:, w, torch.randperm(3, generator=torch.Generator()
                                                             .manual_seed(w))]
                                for w in range(4)], dim=1)
        torch.testing.assert_close(h.sample_logits(shuffled, query), logits)


@pytest.mark.parametrize("layers", [1, 2])
def test_a_pair_is_scored_jointly_not_as_a_sum(layers):
    """s(q1, x1) + s(q2, x2) == s(q1, x2) + s(q2, x1) for every scorer a(q) + b(x);
    one-shot ways make the way logits the pair scores."""
    h = head(layers=layers)
    support, query = toy.random_episode(2, 1, 2, b=1)
    with torch.no_grad():
        s = h.sample_logits(support, query)[0, 0]  # (Q, N): s[i, n] = s(q_i, x_n)
    mixed = s[0, 0] + s[1, 1] - s[0, 1] - s[1, 0]
    assert mixed.abs() > 1e-4 * s.abs().max()


def reference_logits(h: PairHead, support: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """One pair at a time: the sequence ``[CLS] q_1..q_T x_1..x_T`` built by hand, every
    position through the plain ``nn.TransformerEncoderLayer``s, [CLS]'s output scored, the
    scores averaged over each way's shots.

    Shapes:
        support: (N, K, D), query: (Q, D) -> (Q, N)
    """
    n, k, d = support.shape
    t = h.blocks
    out = torch.zeros(query.shape[0], n, dtype=support.dtype)
    for i in range(query.shape[0]):
        for w in range(n):
            shots = []
            for j in range(k):
                tokens = [h.cls]
                for segment, x in ((0, query[i]), (1, support[w, j])):
                    for b in range(t):
                        block = x[b * d // t:(b + 1) * d // t]
                        tokens.append(h.norm(h.project(block) + h.segment[segment] + h.slot[b]))
                seq = torch.stack(tokens)[None]  # (1, 2 T + 1, W)
                for layer in h.layers:
                    seq = layer(seq)
                near = -0.5 * (query[i] - support[w, j]).pow(2).sum()  # the fixed metric
                shots.append(h.out(seq[0, 0])[0] + (h.log_gain.exp() * near
                                                    if h.config.metric_temperature > 0 else 0))
            out[i, w] = torch.stack(shots).mean()
    return out


@pytest.mark.parametrize("layers, dim", [(1, 8), (2, 8), (1, 6)])
def test_logits_match_a_loop_over_pairs(layers, dim):
    """Also the [CLS]-only last layer against the whole layer; D = 6 is not a multiple of 4
    blocks, so each sentence is one token."""
    h = head(dim, layers=layers, width=12, heads=3, ff=10)
    assert h.blocks == (4 if dim == 8 else 1)
    support, query = toy.random_episode(3, 2, 4, dim=dim)
    with torch.no_grad():
        got = h.sample_logits(support, query)  # (B, 1, Q, N)
        for b in range(2):
            torch.testing.assert_close(got[b, 0], reference_logits(h, support[b], query[b]))


@pytest.mark.parametrize("chunk_pairs", [1, 2 * 4 * 3 * 2, 5 * 4 * 3 * 2 - 1])
def test_chunks_of_episodes_are_exact(chunk_pairs):
    """One episode per chunk, two (the last chunk holds one), and four; against one chunk."""
    h = head(layers=2)
    small = PairHead(head_sizes(layers=2, chunk_pairs=chunk_pairs), 8).double().eval()
    small.load_state_dict(h.state_dict())
    support, query = toy.random_episode(3, 2, 4, b=5)
    with torch.no_grad():
        torch.testing.assert_close(small.sample_logits(support, query),
                                   h.sample_logits(support, query))


def test_pair_trains_evaluates_and_loads(tmp_path):
    with toy.registered(*METHODS):  # trained on 2w1s; 3w2s has more ways and shots
        model, metrics = toy.train_evaluate_reload(tmp_path, ["pair"], ways=[2], shots=[1])
    assert isinstance(model.head, PairHead) and model.config.method == "pair"
    assert model.head.blocks == 4  # markers_mean: 4 blocks of the tiny encoder's H = 32
    norm = model.head.norm.weight
    assert not torch.equal(norm, torch.ones_like(norm))  # its parameters trained
    for setting in ("2w1s", "3w2s"):
        assert 0 <= metrics["nyt25"]["pair"][setting] <= 100
