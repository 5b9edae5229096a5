"""Configs from ``params.yaml`` and every checkpoint (REGRAB, baselines, TransE), in one place.

``params.yaml`` holds the values, the frozen dataclasses of each component the schema
(:class:`~model.encoder.EncoderConfig`, :class:`~model.graph_prior.GraphPriorConfig`,
:class:`~model.langevin.LangevinConfig`); :func:`pipeline.config.parse_section` validates
them. A method is REGRAB or one of its baselines; the baselines differ only in how
prototypes are formed and compared (:func:`config_for_method`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from model.baselines import PrototypeHead
from model.encoder import EncoderConfig, SentenceEncoder
from model.graph_prior import GraphPrior, GraphPriorConfig, RelationGraph
from model.langevin import LangevinConfig
from model.regrab import FewShotModel, RegrabHead
from model.transe import TransE, TransEConfig
from pipeline.config import parse_section
from pipeline.errors import PipelineError
from pipeline.io import atomic_path

log = logging.getLogger(__name__)

#: Format tags of the two kinds of checkpoint; a file of another version is refused.
MODEL_FORMAT = "regrab-model-2"
TRANSE_FORMAT = 1

METHODS = ("regrab", "regrab_no_prior", "mtb", "proto")
Method = Literal["regrab", "regrab_no_prior", "mtb", "proto"]


@dataclass(frozen=True)
class ModelParams:
    """``params.yaml`` section ``model``: one subsection per component."""

    encoder: EncoderConfig
    prior: GraphPriorConfig
    langevin: LangevinConfig


@dataclass(frozen=True)
class RegrabConfig:
    """Everything needed to rebuild a model: the method plus its component configs."""

    method: Method
    encoder: EncoderConfig
    prior: GraphPriorConfig
    langevin: LangevinConfig

    @property
    def uses_graph(self) -> bool:
        return self.method == "regrab"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "checkpoint config") -> RegrabConfig:
        return parse_section(cls, d, where)


def config_for_method(params: ModelParams | dict[str, Any], method: str) -> RegrabConfig:
    """The config of ``method`` from the ``model`` section (a dict is validated first).

    Proto is Euclidean prototypes (Snell et al.), MTB dot-product prototypes (Baldini Soares
    et al.); both take the rest (temperature, encoder) from the same section.
    """
    if not isinstance(params, ModelParams):
        params = parse_section(ModelParams, params, "model")
    langevin = params.langevin
    if method == "proto":
        langevin = dataclasses.replace(langevin, similarity="euclidean")
    elif method == "mtb":
        langevin = dataclasses.replace(langevin, similarity="dot")
    return parse_section(
        RegrabConfig,
        {"method": method, "encoder": dataclasses.asdict(params.encoder),
         "prior": dataclasses.asdict(params.prior), "langevin": dataclasses.asdict(langevin)},
        "model",
    )


def build_head(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> nn.Module:
    """The head for ``config.method`` (the graph is needed by ``regrab`` only)."""
    if config.method in ("mtb", "proto"):
        return PrototypeHead(config.langevin.similarity, config.langevin.temperature)
    if config.method == "regrab_no_prior":
        return RegrabHead(config.langevin, None, dim)
    if graph is None:
        raise PipelineError("method regrab needs the relation graph; pass --graph and --features")
    return RegrabHead(config.langevin, GraphPrior(config.prior, graph, dim), dim)


def build_model(config: RegrabConfig, graph: RelationGraph | None) -> FewShotModel:
    """Instantiate encoder and head for ``config.method``."""
    encoder = SentenceEncoder.from_config(config.encoder)
    head = build_head(config, graph, encoder.out_dim)
    return FewShotModel(config, encoder, head)


# --- REGRAB and baseline checkpoints ----------------------------------------------------------


def save_model(path: str | os.PathLike[str], model: FewShotModel, extra: dict[str, Any]) -> None:
    """Write config, graph, trained weights and ``extra`` (step, params, optimizer, RNG...).

    Only trained weights are stored; frozen layers come back from the encoder files named
    in the config, which keeps twenty MiniLM checkpoints to a few MB each.
    """
    prior = model.prior
    payload = {
        "format": MODEL_FORMAT,
        "config": model.config.to_dict(),
        "graph_relations": None if prior is None else prior.relations,
        "graph_feature_dim": None if prior is None else int(prior.features.shape[1]),
        "graph_edges": None if prior is None else int(prior.edge_index.shape[1]),
        "state": {k: v.detach().cpu() for k, v in model.trainable_state().items()},
        **extra,
    }
    save_payload(path, payload)


def save_payload(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write a checkpoint payload atomically (a kill never leaves half a file)."""
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def read_payload(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw payload of a model checkpoint (config, params, weights, summary...)."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"checkpoint {path} not found; run the train stage first")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise PipelineError(f"checkpoint {path} is unreadable ({exc}); retrain it") from exc
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FORMAT:
        raise PipelineError(
            f"checkpoint {path} is not a model of this version (format "
            f"{payload.get('format') if isinstance(payload, dict) else '?'}, want "
            f"{MODEL_FORMAT}); retrain it with the train stage"
        )
    return payload


def load_model(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[FewShotModel, dict[str, Any]]:
    """Rebuild a model from a checkpoint alone (no params.yaml, no graph files)."""
    payload = read_payload(path)
    raw = payload["config"]
    if isinstance(raw, dict) and isinstance(raw.get("prior"), dict) and "text" not in raw["prior"]:
        # Written before model.prior.text existed: the prior read the graph only.
        raw = {**raw, "prior": {**raw["prior"], "text": False}}
    config = RegrabConfig.from_dict(raw, f"checkpoint {path} config")
    graph = None
    if payload["graph_relations"] is not None:
        n, f = len(payload["graph_relations"]), payload["graph_feature_dim"]
        e = payload["graph_edges"]
        graph = RelationGraph(
            payload["graph_relations"],
            torch.zeros(n, f),
            torch.zeros(2, e, dtype=torch.long),
            torch.zeros(e),
        )
    model = build_model(config, graph)
    state = payload["state"]
    enc_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    head_state = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    missing = set(model.encoder.trainable_state()) - set(enc_state)
    if missing:
        raise PipelineError(f"checkpoint {path} lacks encoder weights {sorted(missing)[:3]}")
    model.encoder.load_state_dict(enc_state, strict=False)
    model.head.load_state_dict(head_state, strict=True)
    return model.to(device), payload


# --- TransE checkpoints -----------------------------------------------------------------------


def _to_cpu(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    return obj


def save_transe(path: Path, model: TransE, optimizer: Any, generator: torch.Generator,
                epoch: int, losses: list[float], data_hash: str, params: dict[str, Any],
                relations: list[str]) -> None:
    """Write everything needed to continue TransE training, atomically.

    The stage params and relation names go in too, so the relation vectors can be read
    back from the checkpoint alone.
    """
    save_payload(path, {
        "format": TRANSE_FORMAT,
        "config": dataclasses.asdict(model.config),
        "params": params,
        "relations": list(relations),
        "fingerprint": data_hash,
        "epoch": epoch,
        "losses": list(losses),
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "optimizer": _to_cpu(optimizer.state_dict()),
        "generator": generator.get_state(),
    })


def load_transe(path: Path, config: TransEConfig, data_hash: str,
                resumable: tuple[str, ...] = ("epochs",)) -> dict | None:
    """The TransE checkpoint at ``path`` if it continues this run, else None (with a notice).

    Fields in ``resumable`` may differ: more epochs simply continue the same trajectory.
    """
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file means "start over"
        log.warning("checkpoint %s is unreadable (%s); starting over", path, type(exc).__name__)
        return None

    def comparable(d: dict) -> dict:
        return {k: v for k, v in d.items() if k not in resumable}

    reason = None
    if not isinstance(state, dict) or state.get("format") != TRANSE_FORMAT:
        reason = "has another format"
    elif comparable(state["config"]) != comparable(dataclasses.asdict(config)):
        reason = "was trained with other params"
    elif state["fingerprint"] != data_hash:
        reason = "was trained on other triples, or by other code or hardware"
    elif state["epoch"] > config.epochs:
        reason = f"is at epoch {state['epoch']} > epochs={config.epochs}"
    if reason:
        log.warning("checkpoint %s %s; starting over", path, reason)
        return None
    return state
