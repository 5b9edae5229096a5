"""The typed checkpoint record (model/files/checkpoint.py), the model config and its head sizes
(model/config.py), and files written before ``model.heads`` existed."""

import dataclasses

import pytest
import torch

from model.config import OLD_HEAD_SIZES, RegrabConfig, upgrade
from model.files.checkpoint import (
    Checkpoint,
    GraphShape,
    ResumePoint,
    read_checkpoint,
    read_payload,
    save_checkpoint,
    save_payload,
)
from model.files.loader import load_model
from model.methods.registry import build_model, config_for_method
from model.prior.graph import RelationGraph
from model.training.state import same_params
from pipeline.errors import PipelineError
from tests.conftest import model_config, project_params
from tests.model.tiny_regrab import tiny_encoder


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return {"name": str(tiny_encoder(tmp_path_factory.mktemp("enc") / "bert")),
            "train_layers": 1}


def _graph(r: int = 4, f: int = 3) -> RelationGraph:
    g = torch.Generator().manual_seed(0)
    return RelationGraph([f"P{i}" for i in range(r)], torch.randn(r, f, generator=g),
                         torch.tensor([[0, 1], [1, 0]]), torch.ones(2))


def _resume_point() -> ResumePoint:
    return ResumePoint(best=50.0, optimizer={"state": {0: {"step": torch.tensor(2.0)}},
                                             "param_groups": [{"lr": 0.1, "params": [0]}]},
                       scheduler={"last_epoch": 2}, rng_numpy={"state": {"state": 2**70}},
                       rng_torch=torch.get_rng_state(), rng_noise=torch.arange(3))


def test_a_checkpoint_comes_back_as_it_was_written(tmp_path, encoder):
    model = build_model(model_config("regrab", encoder=encoder), _graph())
    best = Checkpoint.of(model, params={"model": {"a": 1}}, step=3, val_acc=61.5, done=False,
                         relations={"train": ["P1"], "val": ["P2"]})
    save_checkpoint(tmp_path / "m", best)
    back = read_checkpoint(tmp_path / "m")
    assert back.config == model.config and back.graph == GraphShape(["P0", "P1", "P2", "P3"], 3, 2)
    assert (back.step, back.val_acc, back.done, back.relations, back.resume) == \
        (3, 61.5, False, {"train": ["P1"], "val": ["P2"]}, None)
    assert back.state.keys() == best.state.keys()
    assert all(torch.equal(back.state[k], v) for k, v in best.state.items())
    # The file's keys, in the order versions before the record wrote them.
    assert list(read_payload(tmp_path / "m")) == [
        "config", "graph_relations", "graph_feature_dim", "graph_edges", "state", "params",
        "step", "val_acc", "done", "relations"]
    save_checkpoint(tmp_path / "m", dataclasses.replace(back, done=True, summary={"s": 1},
                                                        history=[{"step": 1}]))
    assert list(read_payload(tmp_path / "m"))[-4:] == ["done", "relations", "summary", "history"]


def test_a_resume_point_keeps_every_state(tmp_path, encoder):
    model = build_model(model_config("proto", encoder=encoder), None)
    point = _resume_point()
    save_checkpoint(tmp_path / "s", Checkpoint.of(model, params={}, step=2, history=[],
                                                  resume=point))
    assert list(read_payload(tmp_path / "s"))[5:] == [
        "params", "step", "best", "history", "optimizer", "scheduler", "rng_numpy",
        "rng_torch", "rng_noise"]
    back = read_checkpoint(tmp_path / "s")
    assert back.graph is None and back.resume.best == 50.0
    assert back.resume.rng_numpy == {"state": {"state": 2**70}}
    assert torch.equal(back.resume.rng_torch, point.rng_torch)
    assert back.resume.optimizer["state"][0]["step"].item() == 2.0


@pytest.mark.parametrize(("change", "message"), [
    ({"state": {"w": [1.0]}}, "weights that are not tensors"),
    ({"step": "3"}, "has str for 'step'"),
    ({"graph_relations": "P1", "graph_feature_dim": 3, "graph_edges": 1},
     "malformed graph description"),
    ({"graph_relations": ["P1"], "graph_feature_dim": -3, "graph_edges": 1},
     "malformed graph description"),
    ({"optimizer": {}}, "has nothing for 'best'"),
    ({"config": {"method": "regrab"}}, "config.encoder is missing"),
    ({"summary": {"split": 3}}, "summary whose 'split' is not text"),
    ({"history": [1, 2]}, "history that is not a list of records"),
])
def test_a_malformed_checkpoint_is_refused_in_one_line(tmp_path, encoder, change, message):
    model = build_model(model_config("proto", encoder=encoder), None)
    save_checkpoint(tmp_path / "m", Checkpoint.of(model, step=1))
    payload = read_payload(tmp_path / "m")
    save_payload(tmp_path / "m", {**payload, **change})
    with pytest.raises(PipelineError, match=message) as info:
        read_checkpoint(tmp_path / "m")
    assert "\n" not in str(info.value)


def test_an_unknown_method_is_refused_when_the_model_is_built(tmp_path, encoder):
    model = build_model(model_config("proto", encoder=encoder), None)
    save_checkpoint(tmp_path / "m", Checkpoint.of(model, step=1))
    payload = read_payload(tmp_path / "m")
    save_payload(tmp_path / "m", {**payload, "config": {**payload["config"], "method": "nope"}})
    assert read_checkpoint(tmp_path / "m").config.method == "nope"  # readable as data
    with pytest.raises(PipelineError, match="unknown method 'nope'"):
        load_model(tmp_path / "m")


def test_a_method_config_holds_only_its_own_head_sizes():
    heads = project_params()["model"]["heads"]
    regrab, gnn, snail = (config_for_method(project_params()["model"], m)
                          for m in ("regrab", "gnn", "snail"))
    assert (regrab.gnn, regrab.snail, regrab.pair) == (None, None, None)
    assert not {"gnn", "snail", "pair"} & set(regrab.to_dict())
    assert gnn.snail is None and dataclasses.asdict(gnn.gnn) == heads["gnn"]
    assert dataclasses.asdict(snail.snail)["dilations"] == tuple(heads["snail"]["dilations"])
    # Another head's sizes change neither the config nor, so, the fingerprint of regrab.
    wider = model_config("regrab", heads={"gnn": {"width": 7}})
    assert wider == regrab and model_config("gnn", heads={"gnn": {"width": 7}}).gnn.width == 7


@pytest.mark.parametrize(("heads", "message"), [
    ({"pair": {"heads": 3}}, "pair heads 3 must divide its width 128"),
    ({"snail": {"attention": [[32, 16], [8]]}}, r"snail attention .* pairs"),
    ({"snail": {"dilations": [1, 0]}}, "model.heads.snail.dilations"),
    ({"gnn": {"widht": 3}}, r"model.heads.gnn has unknown key\(s\) \['widht'\]"),
    ({"gnn": {"width": 10**9}}, r"model.heads.gnn.width = 1000000000: .* <= 16384"),
    ({"snail": {"attention": [[32, 10**9]]}}, r"snail attention .* sizes 1 to 16384"),
    ({"pair": {"chunk_pairs": 10**12}}, r"model.heads.pair.chunk_pairs .* <= 268435456"),
])
def test_head_sizes_are_validated_by_the_schema(heads, message):
    with pytest.raises(PipelineError, match=message):
        model_config("regrab", heads=heads)


def test_the_checked_in_head_sizes_are_the_ones_models_were_trained_with():
    """params.yaml's model.heads holds the code defaults of the versions before it, but for
    metric_temperature (0 then): the gnn, snail and pair models trained then are retrained
    with the fixed metric, the other methods' are reused."""
    for method, sizes in OLD_HEAD_SIZES.items():
        now = dataclasses.asdict(getattr(model_config(method), method))
        assert now["metric_temperature"] > 0
        assert {**now, "metric_temperature": 0.0} == sizes


@pytest.mark.parametrize("method", ["gnn", "snail", "pair"])
def test_a_checkpoint_from_before_model_heads_loads_with_the_old_sizes(tmp_path, encoder,
                                                                        method):
    cfg = model_config(method, encoder=encoder)
    cfg = dataclasses.replace(cfg, **{method: dataclasses.replace(  # as built then
        getattr(cfg, method), metric_temperature=0.0)})
    model = build_model(cfg, None)
    with torch.no_grad():
        for p in model.head.parameters():
            p.add_(0.5)
    params = {"model": cfg.to_dict(), "train": {"steps": 3}}
    save_checkpoint(tmp_path / "m", Checkpoint.of(model, params=params, step=1, done=True))
    payload = read_payload(tmp_path / "m")
    old = {k: v for k, v in payload["config"].items() if k != method}  # as written then
    old_params = {**params, "model": old}
    save_payload(tmp_path / "m", {**payload, "config": old, "params": old_params})
    loaded, checkpoint = load_model(tmp_path / "m")
    assert getattr(loaded.config, method) == getattr(cfg, method)
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # Its fingerprint is the one the old params give, so the finished model was reused...
    assert checkpoint.params == old_params and same_params(checkpoint.params, params)
    # ...until the sizes change.
    other = model_config(method, heads={method: {"chunk_" + (
        "positions" if method == "snail" else "pairs"): 8}})
    assert not same_params(checkpoint.params, {**params, "model": other.to_dict()})
    # Today's params (the fixed metric on) retrain it.
    today = model_config(method, encoder=encoder).to_dict()
    assert not same_params(checkpoint.params, {**params, "model": today})


def test_upgrade_fills_only_missing_keys():
    cfg = model_config("gnn").to_dict()
    assert upgrade(cfg) == cfg
    bare = {k: v for k, v in cfg.items() if k != "gnn"}
    assert upgrade(bare)["gnn"] == OLD_HEAD_SIZES["gnn"] and "gnn" not in bare
    assert upgrade("not a dict") == "not a dict"
    old = dataclasses.replace(model_config("gnn").gnn, metric_temperature=0.0)
    assert RegrabConfig.from_dict(bare) == dataclasses.replace(model_config("gnn"), gnn=old)


def test_a_checkpoint_config_out_of_limits_is_refused_as_the_file_s_fault(tmp_path, encoder):
    """Sizes a real run never nears are refused before anything of that size is allocated,
    in a line that names the file (not params.yaml)."""
    model = build_model(model_config("proto", encoder=encoder), None)
    save_checkpoint(tmp_path / "m", Checkpoint.of(model, step=1))
    payload = read_payload(tmp_path / "m")
    for section, key in (("langevin", "samples"), ("langevin", "eval_samples"),
                         ("prior", "hidden")):
        config = {**payload["config"], section: {**payload["config"][section], key: 10**9}}
        save_payload(tmp_path / "m", {**payload, "config": config})
        with pytest.raises(PipelineError) as info:
            read_checkpoint(tmp_path / "m")
        line = str(info.value)
        assert line.startswith(f"checkpoint {tmp_path / 'm'} config.{section}.{key} = ")
        assert "retrain or re-export" in line and "params.yaml" not in line


def test_every_size_of_a_model_config_has_an_upper_limit():
    """Every integer size a checkpoint's config carries is bounded by the schema (or, for
    the snail attention pairs, by its own check)."""
    from model.config import GNNConfig, PairConfig, SnailConfig
    from model.posterior.langevin import LangevinConfig
    from model.prior.gcn import GraphPriorConfig

    unbounded = [f"{cls.__name__}.{f.name}"
                 for cls in (GNNConfig, SnailConfig, PairConfig, GraphPriorConfig)
                 for f in dataclasses.fields(cls)
                 if f.type in ("int", "tuple[int, ...]") and "le" not in f.metadata["limits"]]
    assert unbounded == []
    limits = {f.name: f.metadata["limits"] for f in dataclasses.fields(LangevinConfig)}
    assert "le" in limits["samples"] and "le" in limits["eval_samples"]


def test_a_regrab_checkpoint_from_before_the_prior_weights_loads_with_its_prior(tmp_path,
                                                                                encoder):
    """Written before model.prior.mix and zero_shot_mean: h_r as trained, sampled zero-shot
    training, and the same prior means after loading."""
    cfg = model_config("regrab", encoder=encoder,
                       prior={"text": False, "mix": "fixed", "zero_shot_mean": False})
    model = build_model(cfg, _graph())
    save_checkpoint(tmp_path / "m", Checkpoint.of(model, params={}, step=1, done=True))
    payload = read_payload(tmp_path / "m")
    old_prior = {k: v for k, v in payload["config"]["prior"].items()
                 if k not in ("mix", "zero_shot_mean")}  # as written then
    save_payload(tmp_path / "m", {**payload, "config": {**payload["config"],
                                                        "prior": old_prior}})
    loaded, _ = load_model(tmp_path / "m")
    assert loaded.prior.config.mix == "fixed" and loaded.prior.config.zero_shot_mean is False
    assert "head.prior.mix" not in loaded.trainable_state()
    rows = torch.tensor([[0, 1, 3]])
    model.eval(), loaded.eval()
    with torch.no_grad():
        assert torch.allclose(model.head.prior_means(model.head.prior_states(), rows),
                              loaded.head.prior_means(loaded.head.prior_states(), rows))
