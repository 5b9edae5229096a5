"""The checkpoint of a REGRAB or baseline model: one typed record, and its file.

A :class:`Checkpoint` holds what a trained model is rebuilt from (its config, what it kept of
the relation graph, its trained weights) and what the trainer keeps beside it (the run's
fingerprint, step, validation accuracy, summary and history, and in the resume point the
optimizer, scheduler and RNG states). Every module reads and writes checkpoints through it;
only this module knows the keys of the file's data tree (:meth:`Checkpoint.to_payload`,
:meth:`Checkpoint.from_payload`).

The file is safetensors plus JSON (:mod:`model.files.tensor_file`, format :data:`MODEL_FORMAT`):
loading it runs no code. An exported model folder is read by :mod:`model.files.model_folder`,
and a model is rebuilt from either by :func:`model.files.loader.load_model`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from model.config import RegrabConfig
from model.files import tensor_file
from model.files.score_quantiles import MAX_VAL_SETTINGS, ScoreQuantiles
from model.files.suspicion_cutoff import SuspicionCutoff
from model.files.tensor_file import TRANSE_FORMAT
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from model.methods.base import FewShotModel
    from model.prior.gcn import GraphPrior

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
class GraphShape:
    """What a checkpoint keeps of the relation graph: its relation ids and sizes.

    The graph's tensors are not kept apart: the prior's copies of them are trained weights
    (buffers) of the model, in :attr:`Checkpoint.state`.
    """

    relations: list[str]
    feature_dim: int
    edges: int

    @classmethod
    def of(cls, prior: GraphPrior | None) -> GraphShape | None:
        """The shape of the graph ``prior`` reads (None without a prior)."""
        if prior is None:
            return None
        return cls(prior.relations, int(prior.features.shape[1]), int(prior.edge_index.shape[1]))

    @classmethod
    def parse(cls, relations: Any, feature_dim: Any, edges: Any, where: str
              ) -> GraphShape | None:
        """A graph description as stored (None when ``relations`` is None); raises one
        line when it is malformed."""
        if relations is None:
            return None
        try:
            if not isinstance(relations, list):
                raise TypeError
            shape = cls([str(r) for r in relations], int(feature_dim), int(edges))
            if shape.feature_dim < 0 or shape.edges < 0:
                raise ValueError
        except (TypeError, ValueError) as exc:
            raise PipelineError(f"{where} has a malformed graph description "
                                f"({type(exc).__name__}); retrain or re-export it") from None
        return shape


@dataclass(frozen=True)
class ResumePoint:
    """What a killed run continues from beside the weights (``state.safetensors`` only)."""

    best: float
    optimizer: dict[str, Any]
    scheduler: dict[str, Any]
    rng_numpy: dict[str, Any]
    rng_torch: torch.Tensor
    rng_noise: torch.Tensor


@dataclass(frozen=True)
class Checkpoint:
    """A model checkpoint (the best model or the resume point of a run).

    Attributes:
        config: what the model is rebuilt from.
        graph: what it kept of the relation graph (None for methods without one).
        state: the trained weights (``encoder.*`` top layers, ``head.*``).
        params: the run's fingerprint (:func:`model.training.config.fingerprint`).
        step: the training step it was written at.
        val_acc: validation accuracy (%) of the best model.
        done: whether training finished (the best model is then reused by a rerun).
        relations: the relation ids it was trained and validated on (``train``, ``val``).
        summary: the train stage's summary, written when training finished.
        history: loss (and validation accuracy) per step.
        resume: optimizer, scheduler and RNG states (the resume point only).
        encoder_files: the copy of the pre-trained encoder an exported folder carries (read
            from a folder, never written to a file).
        val_scores: the model's uncertainty on its validation relations per setting
            (:class:`~model.files.score_quantiles.ScoreQuantiles`), written when training
            finished; None in files of older versions.
        support_noise: the cutoff above which a support sentence is flagged as possibly
            mislabelled (:class:`~model.files.suspicion_cutoff.SuspicionCutoff`), chosen on
            the validation relations when training finished; None in files of older versions.
    """

    config: RegrabConfig
    graph: GraphShape | None
    state: dict[str, torch.Tensor]
    params: dict[str, Any] | None = None
    step: int | None = None
    val_acc: float | None = None
    done: bool | None = None
    relations: dict[str, list[str]] | None = None
    summary: dict[str, Any] | None = None
    history: list[dict[str, Any]] | None = None
    resume: ResumePoint | None = None
    encoder_files: str | None = None
    val_scores: tuple[ScoreQuantiles, ...] | None = None
    support_noise: SuspicionCutoff | None = None

    @classmethod
    def of(cls, model: FewShotModel, **fields: Any) -> Checkpoint:
        """The checkpoint of ``model`` now, with ``fields`` (step, params...).

        Only trained weights are kept; frozen layers come back from the encoder files named
        in the config, which keeps twenty MiniLM checkpoints to a few MB each.
        """
        state = {k: v.detach().cpu() for k, v in model.trainable_state().items()}
        return cls(model.config, GraphShape.of(model.prior), state, **fields)

    def to_payload(self) -> dict[str, Any]:
        """The file's data tree (the keys and their order are the file format's)."""
        graph = self.graph
        payload: dict[str, Any] = {
            "config": self.config.to_dict(),
            "graph_relations": None if graph is None else graph.relations,
            "graph_feature_dim": None if graph is None else graph.feature_dim,
            "graph_edges": None if graph is None else graph.edges,
            "state": self.state,
        }
        resume = self.resume
        optional = {
            "params": self.params, "step": self.step,
            "best": None if resume is None else resume.best,
            "val_acc": self.val_acc, "done": self.done, "relations": self.relations,
            "summary": self.summary, "history": self.history, **stored_scores(self),
        }
        if resume is not None:
            optional.update({k: getattr(resume, k) for k in (
                "optimizer", "scheduler", "rng_numpy", "rng_torch", "rng_noise")})
        payload.update({k: v for k, v in optional.items() if v is not None})
        return payload

    @classmethod
    def from_payload(cls, payload: dict[str, Any], where: str) -> Checkpoint:
        """Validate a file's data tree; anything malformed raises one line naming ``where``.

        A config written by an older version gets the keys added since, at the values that
        version used (:func:`model.config.upgrade`).
        """
        for key in ("config", "state"):
            if not isinstance(payload.get(key), dict):
                raise PipelineError(f"{where} has no {key!r}; retrain it")
        state = payload["state"]
        if not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise PipelineError(f"{where} has weights that are not tensors; retrain it")
        resume = None
        if any(k in payload for k in _RESUME):
            resume = ResumePoint(**{k: _typed(payload, k, t, where, required=True)
                                    for k, t in _RESUME.items()})
        return cls(
            config=RegrabConfig.from_dict(payload["config"], f"{where} config"),
            graph=GraphShape.parse(payload.get("graph_relations"),
                                   payload.get("graph_feature_dim"),
                                   payload.get("graph_edges"), where),
            state=state,
            resume=resume,
            **optional_fields(payload, where),
        )


#: The optional keys of a checkpoint's data tree and their types.
_OPTIONAL: dict[str, type | tuple[type, ...]] = {
    "params": dict, "step": int, "val_acc": (int, float), "done": bool, "relations": dict,
    "summary": dict, "history": list, "val_scores": list, "support_noise": dict,
}
#: The keys of a resume point, all present or none.
_RESUME: dict[str, type | tuple[type, ...]] = {
    "best": (int, float), "optimizer": dict, "scheduler": dict, "rng_numpy": dict,
    "rng_torch": torch.Tensor, "rng_noise": torch.Tensor,
}


def optional_fields(source: dict[str, Any], where: str) -> dict[str, Any]:
    """The optional fields of a checkpoint (or a model folder's config.json), checked down to
    the parts that export and the model card read; anything malformed raises one line."""
    fields = {k: _typed(source, k, t, where) for k, t in _OPTIONAL.items()}
    relations, summary, params = fields["relations"], fields["summary"], fields["params"]
    if relations is not None and not all(
            isinstance(k, str) and isinstance(v, list) and all(isinstance(r, str) for r in v)
            for k, v in relations.items()):
        raise PipelineError(f"{where} has 'relations' that are not lists of relation ids; "
                            "retrain it")
    for key in ("split", "method"):
        if summary is not None and not isinstance(summary.get(key), (str, type(None))):
            raise PipelineError(f"{where} has a summary whose {key!r} is not text; retrain it")
    if params is not None and not isinstance(params.get("inputs", {}), dict):
        raise PipelineError(f"{where} has params whose 'inputs' is not a mapping; retrain it")
    if fields["history"] is not None and not all(isinstance(h, dict) for h in fields["history"]):
        raise PipelineError(f"{where} has a history that is not a list of records; retrain it")
    scores = fields["val_scores"]
    if scores is not None:
        try:
            if len(scores) > MAX_VAL_SETTINGS:
                raise ValueError(f"{len(scores)} settings, over {MAX_VAL_SETTINGS}")
            fields["val_scores"] = tuple(ScoreQuantiles.parse(t) for t in scores)
        except ValueError as exc:
            raise PipelineError(f"{where} has malformed validation scores ({exc}); retrain "
                                "it") from None
    if fields["support_noise"] is not None:
        try:
            fields["support_noise"] = SuspicionCutoff.parse(fields["support_noise"])
        except ValueError as exc:
            raise PipelineError(f"{where} has a malformed support_noise cutoff ({exc}); "
                                "retrain it") from None
    return fields


def stored_scores(checkpoint: Checkpoint) -> dict[str, Any]:
    """The validation scores and the suspicion cutoff as a file or model folder stores them
    (nothing when none)."""
    noise = checkpoint.support_noise
    out = {} if noise is None else {"support_noise": noise.to_tree()}
    if checkpoint.val_scores is None:
        return out
    return out | {"val_scores": [{**dataclasses.asdict(s), "quantiles": {
        k: list(v) for k, v in s.quantiles.items()}} for s in checkpoint.val_scores]}


def _typed(payload: dict[str, Any], key: str, types: type | tuple[type, ...], where: str,
           required: bool = False) -> Any:
    """``payload[key]`` when it has one of ``types`` (or is absent or None, unless
    ``required``); else one line naming the key."""
    value = payload.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, types):
        got = "nothing" if value is None else type(value).__name__
        raise PipelineError(f"{where} has {got} for {key!r}; retrain it")
    return value


def save_checkpoint(path: str | os.PathLike[str], checkpoint: Checkpoint) -> None:
    """Write ``checkpoint`` atomically (a kill never leaves half a file)."""
    save_payload(path, checkpoint.to_payload())


def read_checkpoint(path: str | os.PathLike[str]) -> Checkpoint:
    """The checkpoint in the file ``path``; a pickle is refused with the command that
    converts it, anything malformed with one line."""
    return Checkpoint.from_payload(read_payload(path), f"checkpoint {path}")


def save_payload(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write a checkpoint's data tree as it is (tools that convert files, tests that write old
    or hostile ones); code saves a :class:`Checkpoint` (:func:`save_checkpoint`).

    The format tag lives in the file's header, not in the tree.
    """
    tensor_file.save(path, payload, MODEL_FORMAT)


def read_payload(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A checkpoint file's data tree as it is, unchecked (see :func:`save_payload`); code
    reads a :class:`Checkpoint` (:func:`read_checkpoint`)."""
    _, payload = tensor_file.load(Path(path), MODEL_FORMAT, "checkpoint",
                                  "run the train stage to make it")
    return payload


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
    tag = payload.get("format") if isinstance(payload, dict) else None
    # A hostile tag can be a list or a dict, which no lookup takes: only str and int are tags.
    ok = isinstance(tag, (str, int)) and not isinstance(tag, bool)
    fmt = LEGACY_FORMATS.get(tag) if ok else None
    if fmt is None:
        got = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise PipelineError(f"cannot convert {src}: format {str(got)[:40]!r} is not an older "
                            "REGRAB model or TransE state; retrain it")
    try:
        tensor_file.save(dst, {k: v for k, v in payload.items() if k != "format"}, fmt)
    except (TypeError, ValueError, RuntimeError, KeyError) as exc:
        # What the restricted unpickler admits is more than the format stores (bytes, sets,
        # tuple or float keys, sparse tensors).
        first = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
        raise PipelineError(
            f"cannot convert {src}: it is not a checkpoint of tensors and plain data "
            f"({type(exc).__name__}: {first}); retrain the model instead"
        ) from None
    return fmt
