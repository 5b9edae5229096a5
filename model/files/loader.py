"""A trained model back from a checkpoint file or an exported model folder, and nothing else.

No ``params.yaml`` and no graph files are read: the checkpoint holds the model's config, the
shape of its relation graph and its trained weights (:class:`~model.files.checkpoint.Checkpoint`);
the frozen encoder layers come from the encoder files its config names (or the copy an
exported folder carries).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch

from model.files import model_folder
from model.files.checkpoint import Checkpoint, GraphShape, read_checkpoint
from model.methods.base import FewShotModel
from model.methods.registry import build_model
from model.prior.graph import RelationGraph
from pipeline.errors import PipelineError


def read(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint in a file, or in a folder made by ``regrab-models export``."""
    path = Path(path)
    return model_folder.read(path) if path.is_dir() else read_checkpoint(path)


def empty_graph(shape: GraphShape) -> RelationGraph:
    """A graph of ``shape`` with zero tensors, which the checkpoint's weights then fill."""
    n, e = len(shape.relations), shape.edges
    return RelationGraph(list(shape.relations), torch.zeros(n, shape.feature_dim),
                         torch.zeros(2, e, dtype=torch.long), torch.zeros(e))


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu"
               ) -> tuple[FewShotModel, Checkpoint]:
    """Rebuild a model from a checkpoint file or model folder alone (no params.yaml, no graph
    files), with the checkpoint it came from."""
    checkpoint = read(path)
    config = checkpoint.config
    if checkpoint.encoder_files:
        # An exported folder carries its own copy of the pre-trained encoder.
        config = dataclasses.replace(
            config, encoder=dataclasses.replace(config.encoder, name=checkpoint.encoder_files))
    graph = None if checkpoint.graph is None else empty_graph(checkpoint.graph)
    model = build_model(config, graph)
    state = checkpoint.state
    enc_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    head_state = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    missing = set(model.encoder.trainable_state()) - set(enc_state)
    if missing:
        raise PipelineError(f"checkpoint {path} lacks encoder weights {sorted(missing)[:3]}")
    model.encoder.load_state_dict(enc_state, strict=False)
    model.head.load_state_dict(head_state, strict=True)
    return model.to(device), checkpoint
