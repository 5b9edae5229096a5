"""Checks made before any stage runs: a whole params tree as the stages read it, a cluster.

:func:`check_params` (from :mod:`stages.check_params`, the DVC stage that runs it first in
every ``dvc repro``) validates every section of a changed params tree with its registered
schema, then the checks that span sections. A mistake is then one line before Prefect or DVC
starts, not a failed stage after an hour of upstream work.

:func:`check_scheduler` checks a Dask scheduler address: the form, a TCP connection and
Dask's handshake, each bounded, so an address that accepts connections but is not a
scheduler (a proxy, another service) is refused within seconds.
"""

from __future__ import annotations

from pipeline.cluster import HANDSHAKE_TIMEOUT_S, check_cluster
from stages.check_params import check_params

__all__ = ["HANDSHAKE_TIMEOUT_S", "check_params", "check_scheduler"]


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
