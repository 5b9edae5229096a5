"""Parameters, the data mirror setting and device choice, in one place."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PipelineError

#: Environment variable naming a local folder laid out like ``shared/data``.
MIRROR_ENV = "REGRAB_DATA_MIRROR"


def load_params(path: str | os.PathLike[str] = "params.yaml", section: str | None = None) -> Any:
    """Load ``params.yaml`` (or one section of it)."""
    path = Path(path)
    if not path.exists():
        raise PipelineError(f"{path} not found; run from the project root or pass --params")
    with path.open() as fh:
        params = yaml.safe_load(fh) or {}
    if section is None:
        return params
    if section not in params:
        raise PipelineError(f"{path} has no section '{section}'; add it (see the README)")
    return params[section]


def data_mirror() -> Path | None:
    """The data mirror folder from ``REGRAB_DATA_MIRROR``, or None when unset."""
    value = os.environ.get(MIRROR_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise PipelineError(
            f"{MIRROR_ENV}={value} is not a folder; point it at a copy of shared/data"
        )
    return path


def select_device(requested: str = "auto") -> str:
    """Pick the torch device once at an entry point: CUDA when present, else CPU."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise PipelineError(
            f"device '{requested}' requested but CUDA is not available; use 'auto' or 'cpu'"
        )
    return requested
