import math

import numpy as np
import pytest
import torch

from model.baselines import PrototypeHead, build_head
from model.graph_prior import RelationGraph
from model.langevin import LangevinConfig
from model.regrab import (
    RegrabConfig,
    RegrabHead,
    build_model,
    config_from_params,
    load_checkpoint,
    mc_log_predictive,
    save_checkpoint,
)
from pipeline.errors import PipelineError
from tests.model.tiny_regrab import tiny_encoder


def _graph(r=5, f=4):
    g = torch.Generator().manual_seed(0)
    ei = torch.tensor([[0, 1, 1, 2, 3, 4], [1, 0, 2, 1, 4, 3]])
    return RelationGraph([f"P{i}" for i in range(r)], torch.randn(r, f, generator=g), ei,
                         torch.ones(6))


def test_mc_log_predictive_matches_direct_average():
    logits = torch.randn(2, 4, 3, 5, dtype=torch.float64)
    direct = torch.log(torch.softmax(logits, -1).mean(1))
    assert torch.allclose(mc_log_predictive(logits), direct)
    # logsumexp stays finite where the naive average underflows
    assert torch.isfinite(mc_log_predictive(logits * 1e4)).all()


def test_zero_shot_uses_the_prior_only():
    cfg = config_from_params({}, "regrab")
    head = build_head(cfg, _graph(), dim=6).eval()
    states = head.prior_states()
    rows = torch.tensor([[0, 2, 4]])
    h = head.prior_means(states, rows)
    query = torch.randn(1, 7, 6)
    out = head.log_predictive(torch.zeros(1, 3, 0, 6), query, h)
    expected = torch.log_softmax(query @ h[0].T / cfg.langevin.temperature, -1)
    assert torch.allclose(out, expected, atol=1e-6)
    with pytest.raises(PipelineError, match="zero-shot"):
        RegrabHead(LangevinConfig(), None, 6).log_predictive(torch.zeros(1, 3, 0, 6), query,
                                                               torch.zeros(1, 3, 6))


def test_regrab_gradients_reach_support_query_and_prior():
    cfg = config_from_params({"samples": 3, "langevin_steps": 2}, "regrab")
    head = build_head(cfg, _graph(), dim=6).train()
    support = torch.randn(2, 3, 2, 6, requires_grad=True)
    query = torch.randn(2, 4, 6, requires_grad=True)
    h = head.prior_means(head.prior_states(), torch.tensor([[0, 1, 2], [2, 3, -1]]))
    log_p = head.log_predictive(support, query, h, torch.Generator().manual_seed(0))
    assert log_p.shape == (2, 4, 3)
    assert torch.allclose(log_p.exp().sum(-1), torch.ones(2, 4), atol=1e-5)
    (-log_p[..., 0].mean()).backward()
    assert support.grad.abs().sum() > 0 and query.grad.abs().sum() > 0
    assert head.prior.convs[0].lin.weight.grad.abs().sum() > 0
    assert head.prior.fallback.grad.abs().sum() > 0  # way 3 of episode 2 is unknown


def test_baselines_through_the_same_path():
    support, query = torch.randn(1, 3, 2, 4), torch.randn(1, 5, 4)
    mtb = build_head(config_from_params({}, "mtb"), None, 4)
    proto = build_head(config_from_params({}, "proto"), None, 4)
    assert isinstance(mtb, PrototypeHead) and proto.config.similarity == "euclidean"
    m = support.mean(2)
    assert torch.allclose(mtb.log_predictive(support, query),
                          torch.log_softmax(query @ m[0].T / 10.0, -1))
    d = -0.5 * torch.cdist(query[0], m[0]) ** 2 / 10.0
    assert torch.allclose(proto.log_predictive(support, query)[0], torch.log_softmax(d, -1),
                          atol=1e-5)
    no_prior = build_head(config_from_params({}, "regrab_no_prior"), None, 4).eval()
    h = no_prior.prior_means(None, torch.tensor([[0, 1, 2]]))
    assert torch.equal(h, torch.zeros(1, 3, 4))
    with pytest.raises(PipelineError, match="unknown keys"):
        config_from_params({"temprature": 3}, "regrab")
    with pytest.raises(PipelineError):
        RegrabConfig(method="maml")


def test_checkpoint_roundtrip_without_params(tmp_path):
    enc_dir = tiny_encoder(tmp_path / "bert")
    cfg = config_from_params({"encoder": str(enc_dir), "train_layers": 1}, "regrab")
    model = build_model(cfg, _graph())
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    save_checkpoint(tmp_path / "m.pt", model, {"step": 7})
    loaded, payload = load_checkpoint(tmp_path / "m.pt")
    assert payload["step"] == 7 and loaded.config == cfg
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(model.head.prior_states(), loaded.head.prior_states())
    assert math.isclose(float(np.sum([v.numel() for v in payload["state"].values()])),
                        sum(v.numel() for v in model.trainable_state().values()))
    with pytest.raises(PipelineError):
        load_checkpoint(tmp_path / "missing.pt")
