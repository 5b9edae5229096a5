"""Which model a serving process answers with, and its name in every answer.

A model is either a checkpoint path (a train-stage ``model.safetensors`` or a folder of
``regrab-models export``), named by its path and a short sha256 of its weights
(``models/x/model.safetensors@sha256:1a2b3c4d5e6f``), or a reference of the model registry
(:mod:`pipeline.registry`: ``regrab`` is the promoted version), named by its version
(``regrab@v0.2.0``, with ``:member`` when it is not the default one).

A :class:`Loaded` model owns one worker thread: every forward pass, support encoding
included, runs there, one at a time, so the predictor's support set can be switched between
calls (:meth:`~model.predict.predictor.Predictor.use_support`) without a lock. It is retired
when a newer version replaces it and the last request that started on it has finished.
"""

from __future__ import annotations

import dataclasses
import hashlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model.predict.predictor import Predictor
from pipeline import registry
from pipeline.config import set_threads
from pipeline.errors import PipelineError

#: Hex digits of the weights' sha256 in a path's version name.
SHA_DIGITS = 12


@dataclass(frozen=True)
class ModelSpec:
    """A model to load: ``checkpoint`` (a path) or ``ref`` (a registry reference)."""

    checkpoint: Path | None = None
    ref: str | None = None

    def __post_init__(self) -> None:
        if (self.checkpoint is None) == (self.ref is None):
            raise PipelineError("give a checkpoint path or a registry reference, not both")
        if self.ref is not None:
            registry.parse_ref(self.ref)  # one line naming the forms it takes

    def __str__(self) -> str:
        return str(self.checkpoint) if self.checkpoint is not None else str(self.ref)


def weights_file(path: Path) -> Path:
    """The file holding the trained weights of a checkpoint path (a folder's
    ``model.safetensors``)."""
    return path / registry.MODEL_FILE if path.is_dir() else path


def weights_sha256(path: Path) -> str:
    """The sha256 of a checkpoint's weights, read in blocks.

    Raises:
        PipelineError: the file is missing or unreadable.
    """
    file = weights_file(path)
    digest = hashlib.sha256()
    try:
        with file.open("rb") as fh:
            while block := fh.read(1 << 20):
                digest.update(block)
    except OSError as exc:
        raise PipelineError(f"checkpoint {path}: cannot read {file} ({exc.strerror}); give "
                            "a train-stage model.safetensors or a regrab-models export "
                            "folder") from None
    return digest.hexdigest()


def resolve(spec: ModelSpec, root: Path) -> tuple[str, Path, str | None]:
    """``(version name, checkpoint path, registry tag)`` of ``spec``; a registry version is
    resolved once (a promotion meanwhile cannot give the name of one version to the bytes of
    another) and copied out of DVC (:func:`pipeline.registry.checkout`)."""
    if spec.checkpoint is not None:
        return (f"{spec.checkpoint}@sha256:{weights_sha256(spec.checkpoint)[:SHA_DIGITS]}",
                spec.checkpoint, None)
    ref = registry.parse_ref(str(spec.ref))
    version = registry.resolve(root, ref)
    name = version.tag + ("" if ref.member == registry.DEFAULT_MEMBER else f":{ref.member}")
    pinned = dataclasses.replace(ref, version=version.version, stage=None)
    return name, registry.checkout(root, pinned), version.tag


def registry_version(spec: ModelSpec, root: Path) -> str | None:
    """The version tag a registry reference resolves to now (None for a checkpoint path)."""
    if spec.ref is None:
        return None
    return registry.resolve(root, registry.parse_ref(spec.ref)).tag


class Loaded:
    """A model loaded for serving: its version name, predictor and worker thread.

    Args:
        version: the name answers carry.
        predictor: the predictor (its support set is switched per call).
        spec: what was loaded (to compare a registry's new version against).
        tag: the registry version tag (None for a checkpoint path).
        threads: torch's threads, set in the worker thread itself, where every pass runs
            (0: as the process has them).
    """

    def __init__(self, version: str, predictor: Predictor, spec: ModelSpec,
                 tag: str | None = None, threads: int = 0) -> None:
        self.version, self.predictor, self.spec, self.tag = version, predictor, spec, tag
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="regrab-model",
                                           initializer=set_threads, initargs=(threads,))
        #: Requests that started on this version and have not finished.
        self.active = 0
        self.retired = False
        self.batcher: Any = None  # set by the service: a serve.batcher.Batcher

    @classmethod
    def load(cls, spec: ModelSpec, root: Path, device: str, threads: int = 0,
             **predictor_kwargs: Any) -> Loaded:
        """Resolve ``spec`` and load its checkpoint (seconds: run it off the event loop)."""
        version, path, tag = resolve(spec, root)
        predictor = Predictor.from_checkpoint(path, device, **predictor_kwargs)
        return cls(version, predictor, spec, tag, threads)

    def acquire(self) -> Loaded:
        self.active += 1
        return self

    def release(self) -> None:
        self.active -= 1
        if self.retired and self.active == 0:
            self.executor.shutdown(wait=False)

    def retire(self) -> None:
        """No new request starts here; the worker stops once the last one has finished."""
        self.retired = True
        if self.active == 0:
            self.executor.shutdown(wait=False)
