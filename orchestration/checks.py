"""Checks made before any stage runs: a whole params tree as the stages read it, a cluster.

:func:`check_params` runs the ``check_params`` stage's command (the DVC stage that runs first
in every ``dvc repro``) on a changed params tree: every section with its registered schema,
then the checks that span sections. A mistake is then one line before Prefect or DVC starts,
not a failed stage after an hour of upstream work. The command runs in a child Python, as
every stage does, so this floor imports no stage (nor the model, whose checks it runs).

:func:`check_scheduler` checks a Dask scheduler address: the form, a TCP connection and
Dask's handshake, each bounded, so an address that accepts connections but is not a
scheduler (a proxy, another service) is refused within seconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from pipeline.cluster import HANDSHAKE_TIMEOUT_S, check_cluster
from pipeline.errors import PipelineError

__all__ = ["HANDSHAKE_TIMEOUT_S", "check_params", "check_scheduler"]

#: The project's code: the child Python imports its stages from here.
PROJECT = Path(__file__).resolve().parents[1]


def check_params(before: dict[str, Any], after: dict[str, Any], changed: dict[str, str],
                 root: Path) -> None:
    """Check ``after`` (``before`` with overrides) as every stage will read it.

    Runs ``python -m stages.check_params --overrides <request>`` (the stage's check, see
    :mod:`pipeline.params_check`) and turns its ``error:`` line into an exception.

    Args:
        before: the params tree as in the file.
        after: the same with the overrides applied.
        changed: ``{key: "-S key=value"}`` of the overrides, to name in the message.
        root: the folder the stages run in (relative paths are found from there).

    Raises:
        PipelineError: ``-S key=value: what the stage would say; change the override``.
    """
    with tempfile.TemporaryDirectory(prefix="params-check-") as tmp:
        request = Path(tmp) / "request.yaml"
        request.write_text(yaml.safe_dump({"before": before, "after": after,
                                           "changed": changed, "root": str(root)},
                                          sort_keys=False))
        path = os.pathsep.join(p for p in (str(PROJECT), os.environ.get("PYTHONPATH")) if p)
        done = subprocess.run(
            [sys.executable, "-m", "stages.check_params", "--overrides", str(request),
             "--out", str(Path(tmp) / "checked")],
            cwd=root, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True,
            check=False)
    if done.returncode == 0:
        return
    lines = done.stderr.strip().splitlines()
    said = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    raise PipelineError(said[-1] if said else "the params check (python -m "
                        f"stages.check_params) failed with exit {done.returncode}: "
                        f"{lines[-1] if lines else 'no message'}")


def check_scheduler(address: str | None, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> str | None:
    """Normalise a Dask scheduler address and check that a scheduler answers there.

    Returns:
        ``tcp://host:port``, or None for no cluster.

    Raises:
        PipelineError: a malformed address, nothing listening, or no Dask handshake within
            ``timeout_s`` seconds.
    """
    # The stages make the same check before they connect (pipeline.cluster).
    return check_cluster(address, handshake_s=timeout_s)
