"""Balanced subsamples (model/posterior/subsample.py): maml, versa and bmaml on ways with
unequal shots, and the support check's padded episode (model/predict/support_check.py)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from model.config import RegrabConfig
from model.episodes import log_predictive_batches
from model.evaluation.shots import step_share
from model.evaluation.support_noise import support_suspicion
from model.methods import registry
from model.methods.base import PrototypeHead
from model.methods.bmaml import BmamlHead
from model.methods.maml import MamlHead
from model.methods.regrab import RegrabHead
from model.methods.versa import VersaHead
from model.posterior.shots import head_logits
from model.posterior.subsample import balanced_members, member_slots
from model.predict.support_check import check_support
from pipeline.errors import PipelineError
from tests.conftest import model_config
from tests.model.posterior.test_unequal_shots import step_protocol

D = 16


def _langevin(**kw):
    return dataclasses.replace(model_config().langevin, **kw)


def _heads(members: int, dim: int = D, temperature: float = 2.5) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    cfg = _langevin(balanced_members=members, temperature=temperature, eval_samples=8,
                    samples=4)
    return {"maml": MamlHead(temperature, dim, members=members).eval(),
            "versa": VersaHead(cfg, dim).eval(), "bmaml": BmamlHead(cfg, dim).eval()}


def _unequal(seed: int = 0, b: int = 4, n: int = 3, k: int = 5):
    g = torch.Generator().manual_seed(seed)
    support = torch.randn(b, n, k, D, generator=g)
    shots = torch.randint(1, k + 1, (b, n), generator=g)
    shots[:, 0] = k
    shots[0, 1], shots[1, 1] = 1, 2  # two smallest counts in one batch
    return support, shots, torch.randn(b, 6, D, generator=g)


def test_members_take_distinct_sentences_in_turn_and_cover_the_largest_way():
    shots = torch.tensor([[5, 1, 3], [5, 2, 2]])
    slots = member_slots(shots, 5, 1)  # (B, M, N, c)
    assert slots[0, :, 0, 0].tolist() == [0, 1, 2, 3, 4]  # every sentence of the 5-shot way
    assert slots[0, :, 1, 0].tolist() == [0] * 5
    assert slots[0, :, 2, 0].tolist() == [0, 1, 2, 0, 1]
    two = member_slots(shots[1:], 3, 2)[0]  # c = 2: (M, N, c)
    assert two[:, 0].tolist() == [[0, 1], [2, 3], [4, 0]]
    assert all(len(set(pair)) == 2 for pair in two[:, 1].tolist())
    support = torch.randn(2, 3, 5, D)
    got = balanced_members(support, shots, 5, 1)
    assert torch.equal(got[0, 3, 0, 0], support[0, 0, 3])


@pytest.mark.parametrize("name", ["maml", "versa", "bmaml"])
def test_equal_shots_score_exactly_as_before(name):
    support, _, query = _unequal()
    full = torch.full(support.shape[:2], support.shape[2])
    with torch.no_grad():
        old = _heads(0)[name]
        new = _heads(3)[name]
        new.load_state_dict(old.state_dict())
        want = old.sample_logits(support, query, None, torch.Generator().manual_seed(1))
        got = head_logits(new, support, query, None, torch.Generator().manual_seed(1), full)
        assert torch.equal(got, want)
        # The evaluation loop: counts that are all K take the balanced path too.
        enc = support.reshape(-1, D)
        rows = np.arange(enc.shape[0]).reshape(support.shape[:3])
        batches = [list(log_predictive_batches(
            h, torch.cat([enc, query.reshape(-1, D)]), np.zeros((4, 3), dtype=np.int64), rows,
            enc.shape[0] + np.arange(24).reshape(4, 6), torch.full((1,), -1),
            generator=torch.Generator().manual_seed(2), shots=s))[0]
            for h, s in ((old, None), (new, full.numpy()))]
        assert torch.equal(*batches)


@pytest.mark.parametrize("name", ["maml", "versa", "bmaml"])
def test_unequal_shots_are_the_members_fits_side_by_side(name):
    support, shots, query = _unequal(1)
    head = _heads(3)[name]
    with torch.no_grad():
        got = head_logits(head, support, query, None, torch.Generator().manual_seed(0), shots)
        # A sampling head spreads its S samples over the members: ceil(S / M) each.
        each = math.ceil(head.draws() / 3) if name != "maml" else 1
        assert got.shape == (4, 3 * each, 6, 3)
        if name == "maml":  # deterministic: member m is the head on its own cut support
            for b in range(4):
                c = int(shots[b].min())
                for m in range(3):
                    cut = torch.stack([support[b, n, [(m * c + j) % int(shots[b, n])
                                                      for j in range(c)]] for n in range(3)])
                    want = head.sample_logits(cut[None], query[b:b + 1])[0, 0]
                    torch.testing.assert_close(got[b, m], want)
        with pytest.raises(PipelineError, match="K >= 1"):
            head_logits(head, support, query, None, None, shots * 0)


@pytest.mark.parametrize("name", ["maml", "versa", "bmaml"])
def test_the_step_protocol_gives_the_five_sentence_way_its_share_only(name):
    # One way with 5 sentences, four with 1, every relation's encodings around its own
    # centre (far apart against the spread, as a trained encoder's are): oversampled, the
    # meta-learners give the 5-sentence way most of the queries; balanced members about 1/N.
    support, query, shots = step_protocol(b=200)
    share = {}
    for members in (0, 3):
        head = _heads(members, support.shape[-1], temperature=1.0)[name]
        with torch.no_grad():
            log_p = head.log_predictive(support, query, None, torch.Generator().manual_seed(0),
                                        shots=shots)
        share[members] = float(step_share(log_p.argmax(-1).numpy(), shots.numpy()).mean())
    assert share[0] > 0.5
    assert 0.14 < share[3] < 0.26


def test_heads_take_the_key_and_old_checkpoints_keep_oversampling():
    for name in ("maml", "versa", "bmaml"):
        config = model_config(name, langevin={"balanced_members": 4})
        assert registry.get(name).build(config, None, D).balanced_members == 4
    cfg = model_config("maml").to_dict()
    del cfg["langevin"]["balanced_members"]
    assert RegrabConfig.from_dict(cfg).langevin.balanced_members == 0


def _old_check_scores(head, enc, used, h):
    """The support check's scores as it padded the support before: zeros, not repeats."""
    n, k = len(used), max(used)
    padded = enc.new_zeros(1, n, max(k, 1), enc.shape[-1], dtype=torch.float64)
    start = 0
    for i, u in enumerate(used):
        padded[0, i, :u] = enc[start:start + u].double()
        start += u
    found = support_suspicion(head, padded, None if h is None else h.double(),
                              torch.tensor([used]))[0]
    # A relation's only sentence is not checked (no sibling to judge it by).
    return [[None if math.isnan(v) or u == 1 else float(f"{v:.6g}")
             for v in found[i, :u].tolist()] for i, u in enumerate(used)]


@pytest.mark.parametrize("used", [[3, 1, 2], [2, 2, 2], [4, 0, 1], [0, 0, 0]])
def test_the_support_check_scores_are_those_of_the_zero_padded_support(used):
    torch.manual_seed(0)
    enc = torch.randn(sum(used), D)
    h = torch.randn(1, len(used), D)
    regrab = RegrabHead(_langevin(scales="fixed"), None, D).eval()
    relations = [f"P{i}" for i in range(len(used))]
    for head, prior in ((PrototypeHead("euclidean", 2.5), None), (regrab, h)):
        if 0 in used and prior is None:
            continue  # a point method needs sentences for every relation
        got = check_support(head, enc, used, prior, relations, None).scores
        assert got == _old_check_scores(head, enc, used, prior)
