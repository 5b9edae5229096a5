"""The method registry: a new method is one module plus one registry line."""

import json

import pytest
import torch
from torch import nn

from model.methods import registry
from model.methods.base import Head
from model.methods.registry import Method
from model.posterior.logits import similarity_logits
from tests.conftest import project_params
from tests.model.tiny_regrab import registered, train_evaluate_reload


class MedianHead(nn.Module):
    """A toy method: the prototype is the support's coordinate-wise median, cosine logits
    with a learned scale. It lives in this test module alone."""

    prior = None
    couples_ways = False
    unequal_shots = False

    def __init__(self, config, graph, dim: int) -> None:
        super().__init__()
        self.log_scale = nn.Parameter(torch.tensor(1.0))

    def prior_states(self):
        return None

    def prior_means(self, states, rows, text=None):
        return None

    def sample_logits(self, support, query, h=None, generator=None):
        v = support.median(2).values  # (B, N, D)
        return similarity_logits(query, v, "cosine", 1.0)[:, None] * self.log_scale.exp()

    def log_predictive(self, support, query, h=None, generator=None):
        return torch.log_softmax(self.sample_logits(support, query)[:, 0], -1)

    def evidence(self, x, h):
        return None

    def fit_heldout(self, groups, h):
        return None


@pytest.fixture
def toy_method():
    with registered(Method("median_toy", MedianHead, "median prototypes (test)")) as methods:
        yield methods[0]


def test_a_registered_method_trains_evaluates_and_loads(toy_method, tmp_path):
    assert isinstance(MedianHead(None, None, 4), Head)
    model, metrics = train_evaluate_reload(tmp_path, ["median_toy", "proto"])
    assert isinstance(model.head, MedianHead) and model.config.method == "median_toy"
    before = float(MedianHead(None, None, 4).log_scale)
    assert float(model.head.log_scale) != before  # its parameter trained
    assert set(metrics["nyt25"]) >= {"median_toy", "proto"}
    assert "median_toy_minus_regrab" not in json.dumps(metrics)  # no regrab here to pair with
    assert 0 <= metrics["nyt25"]["median_toy"]["2w1s"] <= 100


def test_unknown_methods_are_refused_everywhere():
    from model.training.config import TrainConfig
    from pipeline.config import parse_section
    from pipeline.errors import PipelineError

    raw = project_params()["train"]
    with pytest.raises(PipelineError, match=r"train.methods has unknown method\(s\) \['nope'\]"):
        parse_section(TrainConfig, {**raw, "methods": ["proto", "nope"]}, "train")
    with pytest.raises(PipelineError, match="unknown method 'nope'; use one of regrab"):
        registry.get("nope")


def test_modules_name_the_methods_each_defines_and_a_drift_is_refused(monkeypatch):
    """The params checks read the names in ``MODULES``; loading the registry checks them."""
    import importlib

    for module, declared in registry.MODULES.items():
        assert tuple(m.name for m in importlib.import_module(module).METHODS) == declared
    assert registry._known() == list(registry.names())
    monkeypatch.setattr(registry, "MODULES", {**registry.MODULES,
                                              "model.methods.proto": ("proto",)})
    monkeypatch.setattr(registry, "_loaded", False)
    with pytest.raises(ValueError, match=r"defines the methods \['mtb', 'proto'\], but "
                                         r"registry.MODULES names \['proto'\]"):
        registry._load()


def test_a_registered_method_passes_the_params_check(toy_method):
    registry.check(["median_toy", "proto"], "train.methods")
    with pytest.raises(ValueError, match=r"unknown method\(s\) \['nope'\]; use some of "
                                         r"\['regrab', .*'pair', 'median_toy'\]"):
        registry.check(["nope"], "train.methods")


def test_registry_order_is_the_seed_order():
    """Seeds depend on a method's position: the first four keep their places."""
    assert registry.names()[:4] == ("regrab", "regrab_no_prior", "mtb", "proto")


def test_a_name_cannot_be_taken_twice(toy_method):
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(Method("median_toy", MedianHead, "another"))


def test_a_methods_seed_is_its_own_not_its_place_in_the_registry():
    # The built-ins keep the streams their committed models were trained with.
    assert {n: registry.get(n).seed_stream for n in registry.names()} == {
        "regrab": 0, "regrab_no_prior": 1, "mtb": 2, "proto": 3, "proto_label": 4, "maml": 5,
        "versa": 6, "bmaml": 7, "gnn": 8, "snail": 9, "pair": 10}
    # A method that names none gets one from its name alone, wherever it is registered.
    toy = Method("median_toy", MedianHead, "median prototypes (test)")
    assert toy.seed_stream == Method("median_toy", None, "other").seed_stream != 0
    with registered(toy):
        assert registry.get("median_toy").seed_stream == toy.seed_stream


def test_two_methods_with_one_seed_stream_are_refused():
    with pytest.raises(ValueError, match="seed stream of 'regrab'"):
        registry.register(Method("copycat", MedianHead, "same stream", seed=0))
    assert "copycat" not in registry.names()


@pytest.mark.parametrize("method", ["gnn", "snail", "pair"])
def test_a_head_built_from_sizes_refuses_a_config_without_them(method):
    """One check for every head whose sizes come from ``model.heads``."""
    import dataclasses

    from model.methods.registry import build_head
    from pipeline.errors import PipelineError
    from tests.conftest import model_config

    config = dataclasses.replace(model_config(method), **{method: None})
    with pytest.raises(PipelineError, match=f"model.heads.{method}; its config has none"):
        build_head(config, None, 16)
    head = build_head(model_config(method), None, 16)  # the method's own head, its sizes
    assert type(head).__name__ == {"gnn": "GNNHead", "snail": "SnailHead",
                                   "pair": "PairHead"}[method]
