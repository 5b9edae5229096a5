import math

import numpy as np
import pytest
import torch

from model.files.checkpoint import Checkpoint, read_payload, save_checkpoint, save_payload
from model.files.loader import load_model
from model.methods.base import PrototypeHead, mc_log_predictive
from model.methods.registry import build_head, build_model, config_for_method
from model.methods.regrab import RegrabHead
from model.prior.graph import RelationGraph
from pipeline.errors import PipelineError
from tests.conftest import model_config
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
    cfg = model_config("regrab", langevin={"likelihood": "softmax", "similarity": "dot"})
    head = build_head(cfg, _graph(), dim=6).eval()
    states = head.prior_states()
    rows = torch.tensor([[0, 2, 4]])
    h = head.prior_means(states, rows)
    query = torch.randn(1, 7, 6)
    out = head.log_predictive(torch.zeros(1, 3, 0, 6), query, h)
    expected = torch.log_softmax(query @ h[0].T / cfg.langevin.temperature, -1)
    assert torch.allclose(out, expected, atol=1e-6)
    no_prior = build_head(model_config("regrab_no_prior"), None, 6)
    with pytest.raises(PipelineError, match="zero-shot"):
        no_prior.log_predictive(torch.zeros(1, 3, 0, 6), query, torch.zeros(1, 3, 6))


@pytest.mark.parametrize("similarity", ["euclidean", "dot"])
def test_flat_prior_without_noise_is_proto(similarity):
    """lambda -> 0, no noise: the posterior mode is the support mean, so REGRAB = proto.

    eps = 2 with the exact preconditioner is a Newton step: the chain lands on the mode.
    """
    torch.manual_seed(0)
    cfg = model_config("regrab_no_prior", langevin={
        "likelihood": "gaussian", "prior_precision": 1e-9, "scales": "fixed",
        "noise_eval": False, "similarity": similarity, "steps": 3, "step_size": 2.0,
        "init_prior_weight": 0.3, "init_mean_weight": 0.0})
    head = build_head(cfg, None, 6).eval()
    proto = PrototypeHead(similarity, cfg.langevin.temperature).eval()
    support, query = torch.randn(3, 4, 2, 6), torch.randn(3, 8, 6)
    h = torch.randn(3, 4, 6)  # ignored as lambda -> 0, whatever the start a * h_r
    got = head.log_predictive(support, query, h)
    want = proto.log_predictive(support, query)
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert torch.allclose(got, want, atol=1e-3)


def test_evaluation_sampling_is_seeded():
    cfg = model_config("regrab", langevin={"noise_eval": True, "likelihood": "gaussian"})
    head = build_head(cfg, _graph(), dim=6).eval()
    support, query = torch.randn(2, 3, 1, 6), torch.randn(2, 5, 6)
    h = head.prior_means(head.prior_states(), torch.tensor([[0, 1, 2], [2, 3, -1]]))
    a = head.sample_logits(support, query, h, torch.Generator().manual_seed(3))
    b = head.sample_logits(support, query, h, torch.Generator().manual_seed(3))
    c = head.sample_logits(support, query, h, torch.Generator().manual_seed(4))
    assert a.shape == (2, cfg.langevin.draws(training=False), 5, 3)
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("likelihood", ["gaussian", "softmax_mean"])
def test_regrab_gradients_reach_support_query_prior_and_scales(likelihood):
    cfg = model_config("regrab", langevin={"samples": 3, "steps": 2, "likelihood": likelihood,
                                            "scales": "learned", "noise_train": True})
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
    assert head.sampler.log_precision.grad.abs() > 0


def test_baselines_through_the_same_path():
    support, query = torch.randn(1, 3, 2, 4), torch.randn(1, 5, 4)
    mtb = build_head(model_config("mtb"), None, 4)
    proto = build_head(model_config("proto"), None, 4)
    t = model_config("proto").langevin.temperature
    assert isinstance(mtb, PrototypeHead) and proto.similarity == "euclidean"
    assert mtb.similarity == "dot"
    m = support.mean(2)
    assert torch.allclose(mtb.log_predictive(support, query),
                          torch.log_softmax(query @ m[0].T / t, -1))
    d = -0.5 * torch.cdist(query[0], m[0]) ** 2 / t
    assert torch.allclose(proto.log_predictive(support, query)[0], torch.log_softmax(d, -1),
                          atol=1e-5)
    no_prior = build_head(model_config("regrab_no_prior"), None, 4).eval()
    h = no_prior.prior_means(None, torch.tensor([[0, 1, 2]]))
    assert torch.equal(h, torch.zeros(1, 3, 4))
    assert isinstance(no_prior, RegrabHead)
    with pytest.raises(PipelineError, match="temprature"):
        model_config(langevin={"temprature": 3})
    with pytest.raises(PipelineError, match="no_such"):
        config_for_method(__import__("tests.conftest").conftest.project_params()["model"],
                          "no_such")


def test_checkpoint_from_before_the_label_prior_loads_as_graph_only(tmp_path):
    enc_dir = tiny_encoder(tmp_path / "bert")
    cfg = model_config("regrab", encoder={"name": str(enc_dir), "train_layers": 1},
                       prior={"text": False})
    model = build_model(cfg, _graph())
    save_checkpoint(tmp_path / "m.pt", Checkpoint.of(model, step=1))
    payload = read_payload(tmp_path / "m.pt")
    del payload["config"]["prior"]["text"]  # as written before model.prior.text existed
    save_payload(tmp_path / "m.pt", payload)
    loaded, _ = load_model(tmp_path / "m.pt")
    assert loaded.config.prior.text is False
    assert torch.equal(model.head.prior_states(), loaded.head.prior_states())


def test_checkpoint_from_before_eval_samples_draws_its_training_samples(tmp_path):
    enc_dir = tiny_encoder(tmp_path / "bert")
    cfg = model_config("regrab", encoder={"name": str(enc_dir), "train_layers": 1},
                       langevin={"samples": 3, "eval_samples": 7})
    save_checkpoint(tmp_path / "m.pt", Checkpoint.of(build_model(cfg, _graph()), step=1))
    assert load_model(tmp_path / "m.pt")[0].config.langevin.draws(training=False) == 7
    payload = read_payload(tmp_path / "m.pt")
    del payload["config"]["langevin"]["eval_samples"]  # as written before it existed
    save_payload(tmp_path / "m.pt", payload)
    loaded, _ = load_model(tmp_path / "m.pt")
    assert loaded.config.langevin.eval_samples == 0
    assert loaded.config.langevin.draws(training=False) == 3


def test_checkpoint_roundtrip_without_params(tmp_path):
    enc_dir = tiny_encoder(tmp_path / "bert")
    cfg = model_config("regrab", encoder={"name": str(enc_dir), "train_layers": 1},
                       langevin={"scales": "learned", "likelihood": "gaussian"})
    model = build_model(cfg, _graph())
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.1)
    save_checkpoint(tmp_path / "m.pt", Checkpoint.of(model, step=7))
    loaded, checkpoint = load_model(tmp_path / "m.pt")
    assert checkpoint.step == 7 and loaded.config == cfg
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert torch.equal(model.head.prior_states(), loaded.head.prior_states())
    assert math.isclose(float(np.sum([v.numel() for v in checkpoint.state.values()])),
                        sum(v.numel() for v in model.trainable_state().values()))
    with pytest.raises(PipelineError, match="not found"):
        load_model(tmp_path / "missing.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PipelineError, match="unreadable"):
        read_payload(tmp_path / "junk.pt")
    torch.save({"format": "old"}, tmp_path / "old.pt")
    with pytest.raises(PipelineError, match="old pickle format.*regrab-models convert"):
        read_payload(tmp_path / "old.pt")


@pytest.mark.parametrize("mean", [True, False])
def test_zero_shot_training_scores_against_the_prior_mean_when_asked(mean):
    cfg = model_config("regrab", prior={"text": False, "zero_shot_mean": mean})
    head = build_head(cfg, _graph(), dim=6).train()
    rows = torch.tensor([[0, 2, 4]])
    h = head.prior_means(head.prior_states(), rows)
    query = torch.randn(1, 7, 6)
    logits = head.sample_logits(torch.zeros(1, 3, 0, 6), query, h,
                                torch.Generator().manual_seed(0))
    exact = -torch.cdist(query, h) ** 2 / (2 * cfg.langevin.temperature)
    if mean:  # one "sample": v = h, the zero-shot rule of evaluation
        assert logits.shape == (1, 1, 7, 3)
        assert torch.allclose(logits[:, 0], exact, atol=1e-4)
    else:  # samples of the prior, lambda = 1: far from the mean's logits
        assert logits.shape[1] == cfg.langevin.samples
        assert not torch.allclose(logits[:, 0], exact, atol=1e-2)
