"""The model option of ``regrab-predict`` and ``regrab-suggest``: a checkpoint, a model folder
or a registry reference (``regrab``, ``regrab@v0.2.0``, ``regrab#prod:fewrel/split_0/regrab``;
:mod:`pipeline.versions` resolves it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.text import shown
from pipeline import versions

HELP = ("model.safetensors of the train stage, a model folder (regrab-models export), or a "
        "registered version: regrab (the promoted one), regrab@vX.Y.Z, optionally "
        ":BENCHMARK/split_K/METHOD (default :nyt25/split_0/regrab); list them with "
        "regrab-models list")


def add_model_option(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint`` (or ``--model``): what :func:`model_file` reads."""
    parser.add_argument("--checkpoint", "--model", type=Path, required=True, help=HELP)


def model_file(value: Path) -> Path:
    """The checkpoint or folder to load for ``value``; a registry reference is checked out
    first (copied out of DVC once), and a line says which version it is."""
    path, line = versions.checkout_model(value)
    if line is not None:
        print(shown(line))
    return path
