"""The ``train_transe`` section of ``params.yaml``: TransE's hyper-parameters and its run.

The schema alone: it imports no torch, so the params checks (``check_params``, the flow's
``-S`` overrides) read it in a fraction of a second; :mod:`model.transe.model` and
:mod:`model.transe.training` build and train from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pipeline.config import DEVICE_FIELD, field, register_section


@dataclass(frozen=True)
class TransEConfig:
    """Hyper-parameters of TransE and of its training schedule.

    Attributes:
        dim: Embedding size D of entities and relations.
        epochs: Passes over the training triples.
        batch_size: Positive triples per optimiser step.
        negatives: Corrupted entities contrasted with every positive.
        chunk_size: Positives that share one draw of ``negatives`` entities.
        lr: Learning rate of the row-wise Adam (:class:`~model.transe.optim.RowAdam`).
        loss: ``margin`` (pairwise hinge, Bordes et al.) or ``adversarial``
            (self-adversarial negative sampling, Sun et al. 2019, as GraphVite).
        margin: Hinge margin, or gamma of the adversarial loss.
        adversarial_temperature: Inverse softmax temperature weighting negatives.
        p_norm: 1 or 2, the norm in ``||h + r - t||_p``.
        normalize_entities: Project entity vectors onto the unit sphere (Bordes et al.);
            GraphVite leaves them free and relies on a large margin instead.
        seed: Seed of initialisation, shuffling and negative sampling.
    """

    dim: int = field(ge=1, doc="embedding size D of entities and relations")
    epochs: int = field(ge=1, doc="passes over the training triples")
    batch_size: int = field(ge=1, doc="positive triples per optimiser step")
    negatives: int = field(ge=1, doc="corrupted entities contrasted with every positive")
    chunk_size: int = field(ge=1, doc="positives that share one draw of `negatives` entities (at "
                                      "most batch_size)")
    lr: float = field(gt=0, doc="learning rate of the row-wise Adam")
    loss: Literal["margin", "adversarial"] = field(doc="margin (pairwise hinge, Bordes et al.) or "
                                                       "adversarial (self-adversarial negative "
                                                       "sampling, Sun et al. 2019, as GraphVite)")
    margin: float = field(ge=0, doc="hinge margin, or gamma of the adversarial loss")
    adversarial_temperature: float = field(gt=0, doc="inverse softmax temperature weighting the "
                                                     "negatives (loss: adversarial only)")
    p_norm: Literal[1, 2] = field(doc="1 or 2, the norm in ||h + r - t||_p")
    normalize_entities: bool = field(doc="project entity vectors onto the unit sphere (Bordes et "
                                         "al.); GraphVite leaves them free and relies on a large "
                                         "margin instead")
    seed: int = field(doc="seed of initialisation, shuffling and negative sampling")

    def __post_init__(self) -> None:
        if self.chunk_size > self.batch_size:
            raise ValueError(
                f"chunk_size ({self.chunk_size}) must not exceed batch_size ({self.batch_size})"
            )



@register_section("train_transe")
@dataclass(frozen=True)
class TrainTransEParams:
    """The ``train_transe`` section of ``params.yaml``.

    Attributes:
        model: TransE and schedule hyper-parameters.
        device: ``auto`` (CUDA when present), ``cpu`` or ``cuda[:n]``.
        threads: CPU threads for torch; 0 keeps torch's default (all cores). params.yaml
            holds 1: with torch's default, runs on a busy machine gave other embeddings
            than runs on an idle one; one thread splits no sum, whatever the load.
        checkpoint_every: Write a checkpoint every this many epochs (and after the last).
        heldout_fraction: Share of triples kept out of training for the MRR check.
        eval_batch_size: Held-out queries ranked against all entities at once.
    """

    model: TransEConfig = field(doc="TransE and its training schedule")
    device: str = field(match=DEVICE_FIELD, doc="auto (CUDA when present), cpu or cuda[:N]")
    threads: int = field(ge=0, doc="CPU threads for torch; 0 keeps torch's default (all cores); 1 "
                                   "gives the same bytes on an idle and a busy machine")
    checkpoint_every: int = field(ge=1, doc="write a checkpoint every this many epochs (and after "
                                            "the last)")
    heldout_fraction: float = field(ge=0.0, lt=0.5, doc="share of triples kept out of training "
                                                        "for the MRR check")
    eval_batch_size: int = field(ge=1, doc="held-out queries ranked against all entities at once")
