"""Turn a partial params file into ``dvc exp run -S`` arguments.

A parameter set such as ``params-paper-gpu.yaml`` holds only the keys it changes.
``python -m pipeline.overrides params-paper-gpu.yaml`` prints one ``-S key=value``
per leaf, so ``dvc exp run $(python -m pipeline.overrides FILE)`` runs the pipeline
with that set as a DVC experiment while ``params.yaml`` keeps the defaults.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from pipeline.errors import PipelineError, run_cli


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists stay values."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def overrides(profile: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """``-S`` arguments for every leaf of ``profile``; each key must exist in ``base``."""
    known = flatten(base)
    args = []
    for key, value in flatten(profile).items():
        if key not in known:
            raise PipelineError(f"{key} is not a key of params.yaml; fix the parameter set")
        text = json.dumps(value, separators=(",", ":"))
        if any(ch.isspace() for ch in text):
            # The output is meant for $(...), which splits on whitespace.
            raise PipelineError(f"{key} has whitespace in its value; pass it with -S by hand")
        args += ["-S", f"{key}={text}"]
    return args


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", type=Path, help="partial params file (params-paper-gpu.yaml)")
    parser.add_argument("--params", type=Path, default=Path("params.yaml"))
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        raise PipelineError(f"{args.profile} not found; give a partial params YAML file")
    profile = yaml.safe_load(args.profile.read_text()) or {}
    base = yaml.safe_load(args.params.read_text()) or {}
    print(" ".join(overrides(profile, base)))


if __name__ == "__main__":
    run_cli(main)
