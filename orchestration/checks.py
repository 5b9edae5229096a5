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

import asyncio

from pipeline.cluster import check_cluster
from pipeline.errors import PipelineError
from stages.check_params import check_params

__all__ = ["HANDSHAKE_TIMEOUT_S", "check_params", "check_scheduler"]

#: Seconds Dask's handshake may take; a scheduler answers in milliseconds.
HANDSHAKE_TIMEOUT_S = 5.0


def check_scheduler(address: str | None, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> str | None:
    """Normalise a Dask scheduler address and check that a scheduler answers there.

    Returns:
        ``tcp://host:port``, or None for no cluster.

    Raises:
        PipelineError: a malformed address, nothing listening, or no Dask handshake within
            ``timeout_s`` seconds.
    """
    url = check_cluster(address)
    if url is None:
        return None
    from distributed.comm import connect

    async def handshake() -> None:
        comm = await connect(url, timeout=timeout_s)
        await comm.close()

    try:
        # connect's own timeout does not bound the handshake: a silent peer would hang it.
        asyncio.run(asyncio.wait_for(handshake(), timeout_s))
    except OSError as exc:  # TimeoutError too
        reason = str(exc) or f"no Dask handshake within {timeout_s:g} s"
        raise PipelineError(
            f"no Dask scheduler answers at {url} ({reason}); start one (`dask scheduler`), "
            "fix the address, or drop --cluster to use a local cluster") from exc
    return url
