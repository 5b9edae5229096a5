"""The ``model`` section of ``params.yaml`` and the config a model is rebuilt from.

``params.yaml`` holds the values, the frozen dataclasses the schema
(:class:`~model.encoder.config.EncoderConfig`, :class:`~model.prior.config.GraphPriorConfig`,
:class:`~model.posterior.config.LangevinConfig`, and here the sizes of the comparison heads
that have networks of their own); :func:`pipeline.config.parse_section` validates them.
:class:`ModelParams` is the section, :class:`RegrabConfig` one method's share of it, which a
checkpoint stores so that the model can be rebuilt without ``params.yaml``.

This module knows no method registry and no checkpoint code: which methods exist, and
which head sizes a method reads, is :mod:`model.methods.registry`'s business
(:func:`~model.methods.registry.config_for_method`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from model.encoder.config import EncoderConfig
from model.posterior.config import LangevinConfig
from model.prior.config import GraphPriorConfig
from pipeline.config import field, parse_section, register_section
from pipeline.errors import PipelineError

#: Upper limits of the head sizes. A checkpoint anybody can hand over carries these sizes and
#: the model is built from them before its weights are read, so a hostile size must be refused
#: before it allocates; real heads stay far below (params.yaml: widths 16 to 256, 1 or 2
#: layers).
MAX_WIDTH = 16_384
MAX_LAYERS = 64
#: Limit of the chunk sizes: a chunk bounds the memory of one forward pass (params.yaml's
#: largest is 2^20).
MAX_CHUNK = 1 << 28


def chunk_field(what: str) -> Any:
    """A head's chunk size field: at most this many ``what`` per forward pass."""
    return field(ge=1, le=MAX_CHUNK,
                 doc=f"at most this many {what} per forward pass; larger batches of episodes "
                     "are split into chunks (exact: episodes are independent), which bounds "
                     "evaluation memory")


def metric_temperature_field(adds: str, alone: str) -> Any:
    """A head's ``metric_temperature`` field: the fixed Euclidean term ``adds`` says where
    goes (:func:`model.methods.base.metric_log_gain`), ``alone`` what scores without it."""
    return field(ge=0, le=1e4,
                 doc=f"T of the fixed Euclidean term -|e_i - e_j|^2 / (2 T) on the encodings "
                     f"that {adds} adds; its gain is learned from 1 / T; 0: none ({alone})")


@dataclass(frozen=True)
class GNNConfig:
    """``model.heads.gnn``: sizes of the few-shot GNN (:mod:`model.methods.gnn`)."""

    width: int = field(ge=1, le=MAX_WIDTH,
                       doc="node features after projecting the D-dimensional encoding")
    growth: int = field(ge=1, le=MAX_WIDTH,
                        doc="features each hidden graph convolution adds (dense "
                            "concatenation)")
    layers: int = field(ge=0, le=MAX_LAYERS, doc="hidden graph convolutions before the output one")
    metric_hidden: int = field(ge=1, le=MAX_WIDTH, doc="width of P and of the hidden layer of each "
                                                       "adjacency MLP")
    chunk_pairs: int = chunk_field("(node, neighbour) pairs")
    metric_temperature: float = metric_temperature_field("every adjacency",
                                                         "the learned metric alone")


@dataclass(frozen=True)
class SnailConfig:
    """``model.heads.snail``: sizes of the SNAIL head (:mod:`model.methods.snail`)."""

    width: int = field(ge=1, le=MAX_WIDTH,
                       doc="features after projecting the D-dimensional encoding")
    filters: int = field(ge=1, le=MAX_WIDTH, doc="features each dense block adds")
    dilations: tuple[int, ...] = field(ge=1, le=MAX_WIDTH,
                                       doc="the dilations of the dense blocks of one TC "
                                           "block")
    attention: tuple[tuple[int, int], ...] = field(doc="(key size, value size) of each "
                                                       "attention block; TC blocks sit "
                                                       "between them")
    chunk_positions: int = chunk_field("sequence positions")
    metric_temperature: float = metric_temperature_field("each attention block",
                                                         "the learned keys alone")

    def __post_init__(self) -> None:
        if not self.attention or any(len(a) != 2 or not 1 <= min(a) <= max(a) <= MAX_WIDTH
                                     for a in self.attention):
            raise ValueError(f"snail attention {list(self.attention)[:4]} must be one or more "
                             f"[key size, value size] pairs of sizes 1 to {MAX_WIDTH}")


@dataclass(frozen=True)
class PairConfig:
    """``model.heads.pair``: sizes of the pair head (:mod:`model.methods.pair`)."""

    blocks: int = field(ge=1, le=MAX_LAYERS,
                        doc="readout blocks of the encoding, one token each (4 for "
                            "markers_mean); 1 is used when D is not a multiple of it")
    width: int = field(ge=1, le=MAX_WIDTH, doc="token width of the pair encoder")
    heads: int = field(ge=1, le=MAX_LAYERS, doc="attention heads of each layer (must divide width)")
    layers: int = field(ge=1, le=MAX_LAYERS, doc="transformer encoder layers over a pair's tokens")
    ff: int = field(ge=1, le=4 * MAX_WIDTH, doc="hidden width of each layer's feed-forward")
    dropout: float = field(ge=0, lt=1, doc="dropout of each layer (attention weights, "
                                           "residual branches, feed-forward)")
    chunk_pairs: int = chunk_field("(query, support) pairs")
    metric_temperature: float = metric_temperature_field("each pair score",
                                                         "the learned [CLS] score alone")

    def __post_init__(self) -> None:
        if self.width % self.heads:
            raise ValueError(f"pair heads {self.heads} must divide its width {self.width}")


@dataclass(frozen=True)
class HeadsConfig:
    """``model.heads``: the sizes of the comparison heads that have networks of their own.

    A method's config carries only its own head's sizes (:class:`RegrabConfig`), so
    changing one head's sizes retrains that method alone.
    """

    gnn: GNNConfig = field(doc="the few-shot GNN (Garcia and Bruna)")
    snail: SnailConfig = field(doc="SNAIL (Mishra et al.)")
    pair: PairConfig = field(doc="the pair classifier (BERT-PAIR, Gao et al.)")


@register_section("model")
@dataclass(frozen=True)
class ModelParams:
    """``params.yaml`` section ``model``: one subsection per component."""

    encoder: EncoderConfig = field(doc="the sentence encoder")
    prior: GraphPriorConfig = field(doc="the graph (and label) prior over prototypes")
    langevin: LangevinConfig = field(doc="the posterior over prototypes and its sampler")
    heads: HeadsConfig = field(doc="sizes of the comparison methods' own heads")


@dataclass(frozen=True)
class RegrabConfig:
    """Everything needed to rebuild a model: the method plus its component configs.

    ``gnn``, ``snail`` and ``pair`` hold the head sizes of that method alone (None for every
    other method), so a method's config, and with it its checkpoints and training
    fingerprint, never depends on another method's sizes.
    """

    method: str
    encoder: EncoderConfig
    prior: GraphPriorConfig
    langevin: LangevinConfig
    gnn: GNNConfig | None = None
    snail: SnailConfig | None = None
    pair: PairConfig | None = None

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data; head sizes a method does not use are left out, so the
        configs of methods without them are what versions before ``model.heads`` wrote."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "checkpoint config") -> RegrabConfig:
        """Validate a config as any version wrote it (see :func:`upgrade`); a value outside
        the schema's limits raises one line naming the file's key."""
        try:
            return parse_section(cls, upgrade(d), where)
        except PipelineError as exc:
            # parse_section words its lines for params.yaml; this config is a file's.
            msg = str(exc).removeprefix("params.yaml ").removesuffix("; fix params.yaml")
            raise PipelineError(f"{msg}; retrain or re-export the model") from None


#: The head sizes older versions built ``gnn``, ``snail`` and ``pair`` with, as code defaults,
#: before ``model.heads`` existed; their checkpoints do not store them.
OLD_HEAD_SIZES: dict[str, dict[str, Any]] = {
    "gnn": {"width": 128, "growth": 64, "layers": 2, "metric_hidden": 16,
            "chunk_pairs": 1 << 20, "metric_temperature": 0.0},
    "snail": {"width": 128, "filters": 16, "dilations": (1, 2, 4, 8, 16, 32),
              "attention": ((32, 16), (64, 32), (128, 64)), "chunk_positions": 1 << 16,
              "metric_temperature": 0.0},
    "pair": {"blocks": 4, "width": 128, "heads": 4, "layers": 1, "ff": 256, "dropout": 0.1,
             "chunk_pairs": 1 << 14, "metric_temperature": 0.0},
}


#: What a checkpoint written before a key existed did, as (section, key, value): each
#: value keeps that behaviour. Added in this order, after the keys the checkpoint wrote.
OLD_DEFAULTS: tuple[tuple[str, str, Any], ...] = (
    ("encoder", "block_norm", False),  # the encoding was normalised as one
    ("prior", "text", False),  # the prior read the graph only
    ("prior", "descriptions", False),  # the prior read names only
    ("prior", "zero_shot_mean", False),  # zero-shot training sampled
    ("prior", "named", "fallback"),  # a named relation's graph term was the fallback vector
    ("prior", "mix", "fixed"),  # h_r as trained
    ("langevin", "eval_samples", 0),  # evaluation drew ``samples``
    ("langevin", "prior_trust", "fixed"),  # every way had precision lambda
    ("langevin", "predictive", "samples"),  # the average of the samples
    ("langevin", "predictive_dims", 1.0),  # unused with samples
    ("langevin", "prototype_scoring", "mean"),  # plain support means
    ("langevin", "balanced_members", 0),  # oversampled to equal shots
)


def upgrade(d: Any) -> Any:
    """A config dict with the keys older versions did not write, at the values they used
    (:data:`OLD_DEFAULTS`, then a head's sizes and metric temperature).

    Anything that is not a dict is returned as it is, for :func:`parse_section` to refuse;
    so is a section that is not a dict.
    """
    if not isinstance(d, dict):
        return d
    d = dict(d)
    for section, key, value in OLD_DEFAULTS:
        if isinstance(d.get(section), dict) and key not in d[section]:
            d[section] = {**d[section], key: value}
    method = d.get("method")
    if isinstance(method, str) and method in OLD_HEAD_SIZES and method not in d:
        # Written before model.heads existed: the head had the code's sizes.
        d[method] = dict(OLD_HEAD_SIZES[method])
    if isinstance(method, str) and method in OLD_HEAD_SIZES \
            and isinstance(d.get(method), dict) and "metric_temperature" not in d[method]:
        # Written before model.heads.*.metric_temperature existed: no fixed metric.
        d[method] = {**d[method], "metric_temperature": 0.0}
    return d
