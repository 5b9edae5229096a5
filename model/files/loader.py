"""A trained model back from a checkpoint file or an exported model folder, and nothing else.

No ``params.yaml`` and no graph files are read: the checkpoint holds the model's config, the
shape of its relation graph and its trained weights (:class:`~model.files.checkpoint.Checkpoint`);
the frozen encoder layers come from the encoder files its config names (or the copy an
exported folder carries), from local files only (:mod:`model.encoder.files`).

The file may come from anybody, so everything in it is checked before it is used: the graph
it describes must fit in memory before anything of that size is allocated, its weights must
be finite and fit the model its config builds, key by key; each failure is one line.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
from pathlib import Path

import torch
from torch import nn

from model.config import RegrabConfig
from model.encoder.files import PACKAGED_ENCODERS, resolve_encoder_path
from model.encoder.sentence import SentenceEncoder
from model.files import model_folder
from model.files.checkpoint import Checkpoint, GraphShape, read_checkpoint
from model.methods.base import FewShotModel
from model.methods.registry import build_head, get
from model.prior.graph import RelationGraph
from pipeline.errors import PipelineError

#: The widest relation features accepted (TransE's are 128 to 512 wide).
MAX_FEATURE_DIM = 65536
#: Floats of size R x F the graph prior holds at once while it is built (the zero features,
#: their normalised copy, the prior's copy, A_hat X and its accumulator).
_RF_COPIES = 5


def read(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint in a file, or in a folder made by ``regrab-models export``."""
    path = Path(path)
    return model_folder.read(path) if path.is_dir() else read_checkpoint(path)


def empty_graph(shape: GraphShape) -> RelationGraph:
    """A graph of ``shape`` with zero tensors, which the checkpoint's weights then fill."""
    n, e = len(shape.relations), shape.edges
    return RelationGraph(list(shape.relations), torch.zeros(n, shape.feature_dim),
                         torch.zeros(2, e, dtype=torch.long), torch.zeros(e))


def available_memory() -> int | None:
    """Bytes of memory a new allocation can get now (None where the system does not say)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_graph(shape: GraphShape, state: dict[str, torch.Tensor], where: str) -> None:
    """Refuse a graph description that does not fit the weights or the machine, before any
    tensor of its size is allocated (a hostile size would otherwise end in an OOM kill)."""
    r, f, e = len(shape.relations), shape.feature_dim, shape.edges
    if f > MAX_FEATURE_DIM:
        raise PipelineError(f"{where} describes relation features {f} wide, over the "
                            f"{MAX_FEATURE_DIM} any graph has; retrain or re-export it")
    # The prior keeps A_hat X (R, F) and the edges (2, E) as weights, so the description
    # must agree with them (a mismatch is a file edited by hand or corrupted).
    for key, want in ((".prior.propagated", (r, f)), (".prior.edge_index", (2, e))):
        got = [tuple(v.shape) for k, v in state.items() if k.endswith(key)]
        if got and got[0] != want and not (key.endswith("edge_index") and got[0] == (2, 0)):
            raise PipelineError(f"{where} describes a graph of {r} relations, {f} features "
                                f"and {e} edges, but its weight {key[1:]!r} has shape "
                                f"{list(got[0])}; retrain or re-export it")
    # Message passing gathers one F-wide row per edge and self-loop.
    need = 4 * f * (_RF_COPIES * r + e + r) + 24 * (e + r)
    free = available_memory()
    if free is not None and need > free:
        raise PipelineError(f"{where} describes a graph of {r} relations, {f} features and "
                            f"{e} edges, which needs {need / 2**30:.1f} GiB of memory "
                            f"({free / 2**30:.1f} GiB free); retrain or re-export it")


def check_head(config: RegrabConfig, shape: GraphShape | None, dim: int, where: str) -> None:
    """Refuse a head whose sizes need more memory than there is, before it is allocated.

    The head is built once on the ``meta`` device (shapes only, no memory). The graph
    prior's normalisation has no ``meta`` kernel; its sizes are bounded by :func:`check_graph`
    and the config's limits instead.
    """
    try:
        # Building draws initial weights from the global RNG: put its state back after.
        with torch.random.fork_rng(devices=[]), torch.device("meta"):
            head = build_head(config, None if shape is None else empty_graph(shape), dim)
    except NotImplementedError:
        return
    need = sum(t.numel() * t.element_size() for t in (*head.parameters(), *head.buffers()))
    free = available_memory()
    if free is not None and need > free:
        raise PipelineError(f"{where}: its config asks for a {config.method} head of "
                            f"{need / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free); retrain it")


def check_finite(state: dict[str, torch.Tensor], where: str) -> None:
    """Refuse weights holding NaN or infinity (a diverged or corrupted model)."""
    for key, value in state.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise PipelineError(f"{where} has non-finite weights (NaN or inf) in {key!r}; "
                                "retrain it")


def fit_state(module: nn.Module, state: dict[str, torch.Tensor], prefix: str, where: str,
              complete: bool) -> None:
    """Refuse weights that do not fit ``module``: a key it lacks, a wrong shape, or (with
    ``complete``) a key of it the state lacks; names the first such key."""
    own = module.state_dict()
    for key, value in state.items():
        if key not in own:
            raise PipelineError(f"{where} does not fit its config: it has weight "
                                f"{prefix + key!r}, which the model lacks; retrain it")
        if value.shape != own[key].shape:
            raise PipelineError(f"{where} does not fit its config: weight {prefix + key!r} has "
                                f"shape {list(value.shape)}, the model's "
                                f"{list(own[key].shape)}; retrain it")
    missing = [k for k in own if k not in state] if complete else []
    if missing:
        raise PipelineError(f"{where} does not fit its config: it lacks weight "
                            f"{prefix + missing[0]!r}; retrain it")


def load_encoder(checkpoint: Checkpoint, where: str) -> SentenceEncoder:
    """The encoder a checkpoint names, from local files only (see
    :func:`model.encoder.files.resolve_encoder_path`), or the copy an exported folder carries."""
    config = checkpoint.config.encoder
    name = checkpoint.encoder_files
    if name is None:
        name = config.name
        try:
            resolved = resolve_encoder_path(name, local_only=True)
        except PipelineError as exc:
            raise PipelineError(f"{where}: {exc}") from None
        if name not in ("minilm", *PACKAGED_ENCODERS) and not Path(name).expanduser().exists():
            # A hub id, found in the local cache: from_pretrained is given the cached folder,
            # since given the id it would ask the hub for a newer version.
            name = resolved
    config = dataclasses.replace(config, name=name)
    try:
        return SentenceEncoder.from_config(config)
    except pickle.UnpicklingError:
        # transformers reads a pytorch_model.bin with torch's restricted unpickler, which
        # refuses anything but tensors; a file it refuses may hold code.
        raise PipelineError(
            f"{where}: encoder folder {name} holds pickled weights that are not plain "
            "tensors (refused: loading them could run code); give an encoder folder saved as "
            "safetensors"
        ) from None


def load_model(path: str | os.PathLike[str], device: str | torch.device = "cpu"
               ) -> tuple[FewShotModel, Checkpoint]:
    """Rebuild a model from a checkpoint file or model folder alone (no params.yaml, no graph
    files), with the checkpoint it came from."""
    checkpoint = read(path)
    where = f"{'model folder' if Path(path).is_dir() else 'checkpoint'} {path}"
    state = checkpoint.state
    check_finite(state, where)
    get(checkpoint.config.method)  # an unknown method, before the encoder is loaded
    if checkpoint.graph is not None:
        check_graph(checkpoint.graph, state, where)
    encoder = load_encoder(checkpoint, where)
    config = checkpoint.config
    if checkpoint.encoder_files:
        # An exported folder carries its own copy of the pre-trained encoder.
        config = dataclasses.replace(config, encoder=encoder.config)
    check_head(config, checkpoint.graph, encoder.out_dim, where)
    graph = None if checkpoint.graph is None else empty_graph(checkpoint.graph)
    # build_model's steps, with the encoder loaded above from local files.
    model = FewShotModel(config, encoder, build_head(config, graph, encoder.out_dim))
    enc_state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
    head_state = {k[len("head."):]: v for k, v in state.items() if k.startswith("head.")}
    other = [k for k in state if not k.startswith(("encoder.", "head."))]
    if other:
        raise PipelineError(f"{where} does not fit its config: it has weight {other[0]!r}, "
                            "which the model lacks; retrain it")
    missing = set(model.encoder.trainable_state()) - set(enc_state)
    if missing:
        raise PipelineError(f"{where} lacks encoder weights {sorted(missing)[:3]}; retrain it")
    fit_state(model.encoder, enc_state, "encoder.", where, complete=False)
    fit_state(model.head, head_state, "head.", where, complete=True)
    model.encoder.load_state_dict(enc_state, strict=False)
    model.head.load_state_dict(head_state, strict=True)
    return model.to(device), checkpoint
