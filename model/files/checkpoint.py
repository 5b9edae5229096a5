"""Configs from ``params.yaml`` and the checkpoints of REGRAB and its baselines, in one place.

``params.yaml`` holds the values, the frozen dataclasses of each component the schema
(:class:`~model.encoder.sentence.EncoderConfig`, :class:`~model.prior.gcn.GraphPriorConfig`,
:class:`~model.posterior.langevin.LangevinConfig`); :func:`pipeline.config.parse_section` validates
them. A method is REGRAB or one of its baselines; the baselines differ only in how
prototypes are formed and compared (:func:`config_for_method`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from model.encoder.sentence import EncoderConfig, SentenceEncoder
from model.files import model_folder, tensor_file
from model.methods import registry
from model.methods.registry import Head
from model.methods.regrab import FewShotModel
from model.posterior.langevin import LangevinConfig
from model.prior.gcn import GraphPriorConfig, RelationGraph
from model.transe.training import TRANSE_FORMAT
from pipeline.config import parse_section
from pipeline.errors import PipelineError

#: Format tag of a model checkpoint (:mod:`model.files.tensor_file`); a file of another version is
#: refused. TransE states have their own (:mod:`model.transe.training`).
MODEL_FORMAT = "regrab-model-3"
#: File names inside a model folder of the train stage: the best model, and the resume point
#: that exists only while a model is training.
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"
#: The same files as older versions wrote them (pickles): refused, convertible on request.
LEGACY_FILES = ("model.pt", "state.pt")
#: Format tags of those pickles, which ``regrab-models convert`` accepts.
LEGACY_FORMATS = {"regrab-model-2": MODEL_FORMAT, 1: TRANSE_FORMAT}

@dataclass(frozen=True)
class ModelParams:
    """``params.yaml`` section ``model``: one subsection per component."""

    encoder: EncoderConfig
    prior: GraphPriorConfig
    langevin: LangevinConfig


@dataclass(frozen=True)
class RegrabConfig:
    """Everything needed to rebuild a model: the method plus its component configs."""

    method: str
    encoder: EncoderConfig
    prior: GraphPriorConfig
    langevin: LangevinConfig

    def __post_init__(self) -> None:
        registry.check([self.method], "model config")

    @property
    def uses_graph(self) -> bool:
        return registry.get(self.method).uses_graph

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "checkpoint config") -> RegrabConfig:
        encoder = d.get("encoder") if isinstance(d, dict) else None
        if isinstance(encoder, dict) and "block_norm" not in encoder:
            # Checkpoints written before block_norm existed normalised the encoding as one.
            d = {**d, "encoder": {**encoder, "block_norm": False}}
        return parse_section(cls, d, where)


def config_for_method(params: ModelParams | dict[str, Any], method: str) -> RegrabConfig:
    """The config of ``method`` from the ``model`` section (a dict is validated first).

    A method may fix the similarity (proto: Euclidean, mtb: dot product); everything else
    (temperature, encoder) comes from the same section.
    """
    if not isinstance(params, ModelParams):
        params = parse_section(ModelParams, params, "model")
    spec = registry.get(method)
    langevin = params.langevin
    if spec.similarity is not None:
        langevin = dataclasses.replace(langevin, similarity=spec.similarity)
    return RegrabConfig(method, params.encoder, params.prior, langevin)


def build_head(config: RegrabConfig, graph: RelationGraph | None, dim: int) -> Head:
    """The head of ``config.method`` (the registry's builder)."""
    return registry.get(config.method).build(config, graph, dim)


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
        "config": model.config.to_dict(),
        "graph_relations": None if prior is None else prior.relations,
        "graph_feature_dim": None if prior is None else int(prior.features.shape[1]),
        "graph_edges": None if prior is None else int(prior.edge_index.shape[1]),
        "state": {k: v.detach().cpu() for k, v in model.trainable_state().items()},
        **extra,
    }
    save_payload(path, payload)


def save_payload(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write a checkpoint payload atomically (a kill never leaves half a file).

    The file is safetensors plus JSON (:mod:`model.files.tensor_file`): loading it runs no code.
    Its format tag lives in the file's header, not in the payload.
    """
    tensor_file.save(path, payload, MODEL_FORMAT)


def read_payload(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The raw payload of a model checkpoint (config, params, weights, summary...).

    A model folder made by ``regrab-models export`` is read too (its ``config.json`` and
    weights); a pickle is refused with the command that converts it.
    """
    path = Path(path)
    if path.is_dir():
        return model_folder.read(path)
    _, payload = tensor_file.load(path, MODEL_FORMAT, "checkpoint",
                                  "run the train stage to make it")
    for key in ("config", "state"):
        if not isinstance(payload.get(key), dict):
            raise PipelineError(f"checkpoint {path} has no {key!r}; retrain it")
    return payload


def load_model(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[FewShotModel, dict[str, Any]]:
    """Rebuild a model from a checkpoint file or model folder alone (no params.yaml, no graph
    files)."""
    payload = read_payload(path)
    raw = payload["config"]
    if isinstance(raw, dict) and isinstance(raw.get("prior"), dict) and "text" not in raw["prior"]:
        # Written before model.prior.text existed: the prior read the graph only.
        raw = {**raw, "prior": {**raw["prior"], "text": False}}
    if (isinstance(raw, dict) and isinstance(raw.get("langevin"), dict)
            and "eval_samples" not in raw["langevin"]):
        # Written before model.langevin.eval_samples existed: evaluation drew ``samples``.
        raw = {**raw, "langevin": {**raw["langevin"], "eval_samples": 0}}
    config = RegrabConfig.from_dict(raw, f"checkpoint {path} config")
    if payload.get("encoder_files"):
        # An exported folder carries its own copy of the pre-trained encoder.
        config = dataclasses.replace(
            config, encoder=dataclasses.replace(config.encoder, name=payload["encoder_files"]))
    graph = None
    if payload.get("graph_relations") is not None:
        try:
            n, f = len(payload["graph_relations"]), int(payload["graph_feature_dim"])
            e = int(payload["graph_edges"])
            graph = RelationGraph(
                [str(r) for r in payload["graph_relations"]],
                torch.zeros(n, f),
                torch.zeros(2, e, dtype=torch.long),
                torch.zeros(e),
            )
        except (TypeError, ValueError, RuntimeError) as exc:
            raise PipelineError(f"checkpoint {path} has a malformed graph description "
                                f"({type(exc).__name__}); retrain or re-export it") from None
    model = build_model(config, graph)
    state = payload["state"]
    if not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise PipelineError(f"checkpoint {path} has weights that are not tensors; retrain it")
    enc_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    head_state = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    missing = set(model.encoder.trainable_state()) - set(enc_state)
    if missing:
        raise PipelineError(f"checkpoint {path} lacks encoder weights {sorted(missing)[:3]}")
    model.encoder.load_state_dict(enc_state, strict=False)
    model.head.load_state_dict(head_state, strict=True)
    return model.to(device), payload


def model_file(folder: Path) -> Path:
    """The model file of a train-stage model folder.

    An older version's ``model.pt`` is returned when it is the only one there, so that
    loading it stops with the line that says how to convert it rather than "missing".
    """
    path, legacy = folder / MODEL_FILE, folder / LEGACY_FILES[0]
    return legacy if not path.exists() and legacy.exists() else path


def convert_legacy(src: Path, dst: Path) -> str:
    """Rewrite a pickle checkpoint of an older version as safetensors + JSON.

    Only for files the user trusts, on request (``regrab-models convert``). The pickle is
    read by torch's restricted unpickler (``weights_only=True``: tensors and plain
    containers only, no other callables), so even then no code in it is run; a file that
    needs anything else is refused.

    Returns:
        The format tag written (a model or a TransE state).
    """
    if not src.is_file():
        raise PipelineError(f"{src} not found; give the path of an old model.pt or state.pt")
    try:
        payload = torch.load(src, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - every unloadable pickle is refused alike
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise PipelineError(
            f"cannot convert {src}: it is not a checkpoint of tensors and plain data "
            f"({type(exc).__name__}: {first}); retrain the model instead"
        ) from None
    fmt = LEGACY_FORMATS.get(payload.get("format")) if isinstance(payload, dict) else None
    if fmt is None:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise PipelineError(f"cannot convert {src}: format {str(got)[:40]!r} is not an older "
                            "REGRAB model or TransE state; retrain it")
    tensor_file.save(dst, {k: v for k, v in payload.items() if k != "format"}, fmt)
    return fmt
