"""REGRAB: prototypes with a graph prior, sampled by Langevin dynamics (paper section 4).

``log p(y_Q | x_Q, x_S, y_S, G) ~= log (1/S) sum_s p(y_Q | x_Q, v_s)`` with ``v_s`` drawn by
:class:`~model.langevin.LangevinSampler` from ``p(v | x_S, y_S, G)`` whose prior mean comes
from :class:`~model.graph_prior.GraphPrior` (Eq. 11, computed with logsumexp). Training
maximises it on the queries; every piece is differentiable, so gradients reach the encoder
through the support and the query encodings and through the Langevin steps, and reach the GCN
through h_r. Zero-shot (K = 0): the prototypes are the prior means, ``v_r = h_r``.

This module also holds the one place where ``params.yaml``'s ``model`` section becomes
configs (:func:`config_from_params`) and the checkpoint format (:func:`save_checkpoint`,
:func:`load_checkpoint`).

Shapes:
    B episodes, S samples, N ways, K shots, M queries (all ways together), D encoding size.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.encoder import EncoderConfig, SentenceEncoder
from model.graph_prior import GraphPrior, GraphPriorConfig, RelationGraph
from model.langevin import LangevinConfig, LangevinSampler, similarity_logits
from pipeline.errors import PipelineError
from pipeline.io import atomic_path

METHODS = ("regrab", "regrab_no_prior", "mtb", "proto")


@dataclass(frozen=True)
class RegrabConfig:
    """Everything needed to rebuild a model: method plus component configs."""

    method: str = "regrab"
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    graph: GraphPriorConfig = field(default_factory=GraphPriorConfig)
    langevin: LangevinConfig = field(default_factory=LangevinConfig)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise PipelineError(f"method {self.method!r} unknown; use one of {METHODS}")

    @property
    def uses_graph(self) -> bool:
        return self.method == "regrab"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RegrabConfig:
        return cls(
            method=d["method"],
            encoder=EncoderConfig(**d["encoder"]),
            graph=GraphPriorConfig(**d["graph"]),
            langevin=LangevinConfig(**d["langevin"]),
        )


def config_from_params(model: dict[str, Any], method: str) -> RegrabConfig:
    """Build a :class:`RegrabConfig` from ``params.yaml``'s ``model`` section.

    Unknown keys raise, so a typo in ``params.yaml`` is not silently ignored.
    """
    keys = {
        "encoder": ("encoder", "name"),
        "pooling": ("encoder", "pooling"),
        "markers": ("encoder", "markers"),
        "marker_init": ("encoder", "marker_init"),
        "train_layers": ("encoder", "train_layers"),
        "max_length": ("encoder", "max_length"),
        "dropout": ("encoder", "dropout"),
        "freeze_top_kv": ("encoder", "freeze_top_kv"),
        "normalize": ("encoder", "normalize"),
        "gcn_layers": ("graph", "layers"),
        "gcn_hidden": ("graph", "hidden"),
        "gcn_normalize_features": ("graph", "normalize_features"),
        "gcn_scale": ("graph", "scale"),
        "samples": ("langevin", "samples"),
        "langevin_steps": ("langevin", "steps"),
        "step_size": ("langevin", "step_size"),
        "step_decay": ("langevin", "step_decay"),
        "init_prior_weight": ("langevin", "init_prior_weight"),
        "init_mean_weight": ("langevin", "init_mean_weight"),
        "temperature": ("langevin", "temperature"),
        "similarity": ("langevin", "similarity"),
        "prior_weight": ("langevin", "prior_weight"),
        "noise_train": ("langevin", "noise_train"),
        "noise_eval": ("langevin", "noise_eval"),
    }
    unknown = sorted(set(model) - set(keys) - {"methods"})
    if unknown:
        raise PipelineError(f"params.yaml model section has unknown keys {unknown}; remove them")
    parts: dict[str, dict[str, Any]] = {"encoder": {}, "graph": {}, "langevin": {}}
    for key, value in model.items():
        if key in keys:
            part, name = keys[key]
            parts[part][name] = value
    langevin = dict(parts["langevin"])
    if method == "proto":  # Proto = Euclidean prototypes (Snell et al.)
        langevin["similarity"] = "euclidean"
    elif method == "mtb":  # MTB = dot-product prototypes (Baldini Soares et al.)
        langevin["similarity"] = "dot"
    return RegrabConfig(
        method=method,
        encoder=EncoderConfig(**parts["encoder"]),
        graph=GraphPriorConfig(**parts["graph"]),
        langevin=LangevinConfig(**langevin),
    )


def mc_log_predictive(logits: torch.Tensor) -> torch.Tensor:
    """``log (1/S) sum_s softmax(logits_s)`` computed stably with logsumexp.

    Shapes:
        logits: (B, S, M, N) -> (B, M, N)
    """
    log_p = torch.log_softmax(logits, dim=-1)  # (B, S, M, N)
    return torch.logsumexp(log_p, dim=1) - math.log(logits.shape[1])


class RegrabHead(nn.Module):
    """Posterior over prototypes (graph prior x support likelihood) and the MC predictive.

    With ``prior=None`` the prior mean is 0, i.e. a standard normal prior and no graph (the
    ``regrab_no_prior`` ablation).
    """

    def __init__(self, config: LangevinConfig, prior: GraphPrior | None, dim: int) -> None:
        super().__init__()
        self.config = config
        self.prior = prior
        self.dim = dim
        self.sampler = LangevinSampler(config)

    def prior_states(self) -> torch.Tensor | None:
        """GCN output for the whole graph, computed once per step or evaluation.

        Shapes:
            -> (R, D) or None without a graph
        """
        return None if self.prior is None else self.prior.node_states()

    def prior_means(self, states: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
        """h_r for the ways of each episode (``rows`` from :meth:`GraphPrior.index`).

        ``states=None`` computes only the rows needed (cheapest for one training episode).

        Shapes:
            states: (R, D) or None, rows: (B, N) -> (B, N, D)
        """
        if self.prior is None:
            return torch.zeros(*rows.shape, self.dim, device=rows.device)
        if states is None:
            return self.prior(rows)
        h = states[rows.clamp(min=0)]  # (B, N, D)
        unknown = (rows < 0)[..., None]
        return torch.where(unknown, self.prior.fallback.expand_as(h), h)

    def log_predictive(
        self,
        support: torch.Tensor,
        query: torch.Tensor,
        h: torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """MC estimate of ``log p(y_q = n | x_q, x_S, y_S, G)`` for every query and way.

        Shapes:
            support: (B, N, K, D) (K may be 0), query: (B, M, D), h: (B, N, D) -> (B, M, N)
        """
        cfg = self.config
        if support.shape[2] == 0:
            if self.prior is None:
                raise PipelineError(
                    f"zero-shot needs the graph prior; method {cfg} has none (use regrab)"
                )
            v = h[:, None]  # (B, 1, N, D): the prior alone
        else:
            v = self.sampler(support, h, generator)  # (B, S, N, D)
        logits = similarity_logits(query[:, None], v, cfg.similarity, cfg.temperature)
        return mc_log_predictive(logits)  # (B, M, N)


class FewShotModel(nn.Module):
    """Encoder + head; the head is REGRAB or a baseline (see :mod:`model.baselines`)."""

    def __init__(self, config: RegrabConfig, encoder: SentenceEncoder, head: nn.Module) -> None:
        super().__init__()
        self.config = config
        self.encoder = encoder
        self.head = head

    @property
    def prior(self) -> GraphPrior | None:
        return getattr(self.head, "prior", None)

    def rows(self, relations: list[str]) -> torch.Tensor:
        """Graph rows of relation ids (all -1 without a graph)."""
        if self.prior is None:
            return torch.full((len(relations),), -1, dtype=torch.long)
        return self.prior.index(relations)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Weights a checkpoint must store: trained encoder layers and the whole head."""
        state = {f"encoder.{k}": v for k, v in self.encoder.trainable_state().items()}
        state.update({f"head.{k}": v for k, v in self.head.state_dict().items()})
        return state


def build_model(config: RegrabConfig, graph: RelationGraph | None) -> FewShotModel:
    """Instantiate encoder and head for ``config.method``."""
    from model.baselines import build_head

    encoder = SentenceEncoder.from_config(config.encoder)
    head = build_head(config, graph, encoder.out_dim)
    return FewShotModel(config, encoder, head)


def save_checkpoint(
    path: str | os.PathLike[str], model: FewShotModel, extra: dict[str, Any]
) -> None:
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
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(
    path: str | os.PathLike[str], device: str | torch.device = "cpu"
) -> tuple[FewShotModel, dict[str, Any]]:
    """Rebuild a model from a checkpoint alone (no params.yaml, no graph files)."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"checkpoint {path} not found; run the train stage first")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # a truncated or foreign file
        raise PipelineError(f"checkpoint {path} is unreadable ({exc}); retrain it") from exc
    config = RegrabConfig.from_dict(payload["config"])
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
